"""--memory-reserve-gib: the GiB per GPU a plan or a search leaves free, checked against the HBM before any work,
carried by the cluster into every capacity the planner reads, and kept by the plan JSON."""

from __future__ import annotations

import json

import pytest

from tessera_lab.cli.main import main
from tessera_lab.cost.memory import GIB, memory_capacity, memory_reserve_gib
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, GPUSpec


def test_capacity_is_hbm_less_the_clusters_reserve():
    h200 = GPUSpec.named("H200")
    assert memory_capacity(Cluster.dgx("H200", 1)) == h200.memory_bytes - memory_reserve_gib() * GIB
    assert memory_capacity(Cluster.dgx("H200", 1, 30.0)) == h200.memory_bytes - 30 * GIB
    assert memory_capacity(Cluster.dgx("H200", 1, 0)) == h200.memory_bytes
    for bad in (-1.0, h200.memory_bytes / GIB, 1e9, float("nan"), float("inf"), True, "6"):
        with pytest.raises(ConfigError, match="field 'memory_reserve_gib'.*allowed: a number of GiB >= 0 and below"):
            Cluster.dgx("H200", 1, bad)


def test_plan_with_a_reserve_plans_against_the_smaller_capacity_and_records_it(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "--memory-reserve-gib", "30", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    hbm = GPUSpec.named("H200").memory_bytes / GIB
    assert f"memory limit {hbm - 30:.1f} GiB per GPU" in out
    d = json.loads(path.read_text())
    assert d["memory_reserve_gib"] == 30 and d["memory_capacity_bytes"] == pytest.approx((hbm - 30) * GIB)
    assert max(s["memory_bytes"] for s in d["stages"]) <= d["memory_capacity_bytes"]
    # report --plan re-evaluates on the recorded reserve, not the data file's
    from tessera_lab.plan.load import load_plan

    assert load_plan(path).memory_capacity_bytes == pytest.approx((hbm - 30) * GIB)
    # a plan without the option records no reserve (it reads as before)
    assert main(["plan", "--json", str(path)]) == 0
    assert "memory_reserve_gib" not in json.loads(path.read_text())


@pytest.mark.parametrize("command", [["plan"], ["report"], ["search", "--gpus", "64"]])
@pytest.mark.parametrize("value", ["200", "-1", "nan", "1e400"])
def test_a_bad_reserve_is_one_line_exit_2(command, value, capsys):
    assert main([*command, "--memory-reserve-gib", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--memory-reserve-gib" in err[0] and "allowed" in err[0]
    if value == "200":
        assert "below the H200's 140.40 GiB of HBM" in err[0]


def test_search_headroom_is_measured_against_the_reserve(capsys):
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.search import search

    res = search(load_model("gpt-oss-20b"), 16, top=3, max_plans=24, memory_reserve_gib=40.0)
    cap = GPUSpec.named("H200").memory_bytes / GIB - 40
    assert res.memory_reserve_gib == 40 and res.memory_reserve_given
    assert res.memory_capacity_bytes / GIB == pytest.approx(cap)
    assert res.ranked
    for c in res.ranked:
        assert c.result["peak_memory_gib"] <= cap + 1e-9
        assert c.result["peak_memory_gib"] + c.result["headroom_gib"] == pytest.approx(cap)
    assert res.as_dict()["memory_reserve_gib"] == 40


@pytest.mark.parametrize("vpp", [1, 2])
def test_report_states_the_largest_rank_memory_against_the_reserved_limit(tmp_path, capsys, vpp):
    """report's memory line: the largest per-GPU sum of a rank's stages (stage s on rank s mod pp), worked out here
    from the plan JSON's stage rows, against HBM less the reserve the user gave."""
    path = tmp_path / "report.json"
    args = ["report", "--memory-reserve-gib", "20", "--json", str(path)]
    if vpp > 1:
        args += ["--vpp", str(vpp), "--schedule", "interleaved"]
    assert main(args) == 0
    d = json.loads(path.read_text())
    pp = d["plan"]["parallel"]["pp"]
    per_rank = [0.0] * pp
    for i, st in enumerate(d["plan"]["stages"]):
        per_rank[i % pp] += st["memory_bytes"]
    rank = max(range(pp), key=lambda r: per_rank[r])
    hbm = GPUSpec.named("H200").memory_bytes / GIB
    mem = d["memory"]
    assert mem["rank"] == rank and mem["largest_gib"] == pytest.approx(per_rank[rank] / GIB)
    assert mem["limit_gib"] == pytest.approx(hbm - 20) and mem["hbm_gib"] == pytest.approx(hbm)
    assert mem["reserve_gib"] == 20 and mem["reserve_from"] == "--memory-reserve-gib"
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("memory per GPU")]
    what = "a rank's 2 chunks summed" if vpp > 1 else "one stage per rank"
    assert line == [f"memory per GPU (computed; {what}): largest {per_rank[rank] / GIB:.2f} GiB on rank {rank}, of "
                    f"{hbm - 20:.2f} GiB ({hbm:.2f} GiB HBM less a 20 GiB reserve, --memory-reserve-gib)"]
