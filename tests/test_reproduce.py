"""`tessera-lab reproduce`: the paper's jobs as scenarios, a row per claim with a verdict computed from the numbers,
every number labelled reported / simulated / measured."""

from __future__ import annotations

import json
import math

import pytest

from tessera_lab.cli.main import main
from tessera_lab.errors import ConfigError
from tessera_lab.report import claims as C
from tessera_lab.report import scenarios as S


def test_verdict_rules_by_hand():
    # gain: within a factor of 2 reproduced, of 4 partly, else (or no gain) contradicted
    assert C.gain_verdict(0.24, 0.12)[0] == "reproduced"  # 0.5x
    assert C.gain_verdict(0.24, 0.48)[0] == "reproduced"  # 2x
    assert C.gain_verdict(0.24, 0.07)[0] == "partly"  # 0.29x
    assert C.gain_verdict(0.24, 0.05)[0] == "contradicted"  # 0.21x
    assert C.gain_verdict(0.034, -0.001)[0] == "contradicted"
    assert C.gain_verdict(0.034, math.nan)[0] == "not modelled"
    # value: inside the band; within 25% of the nearer edge partly
    assert C.value_verdict(0.20, (0.15, 0.258))[0] == "reproduced"  # a band within a factor of 2
    v, why = C.value_verdict(0.20, (0.098, 0.258))  # inside, but the band spans 2.6x: the knobs decide
    assert v == "partly" and "spans 2.6x" in why
    v, why = C.value_verdict(0.363, (0.164, 0.302))  # (0.363 - 0.302) / 0.302 = 20%
    assert v == "partly" and "above our band 16.4%-30.2%" in why and "20% from its edge" in why
    assert C.value_verdict(0.17, (0.508, 0.579))[0] == "contradicted"  # 67% below
    assert C.value_verdict(0.2, (math.nan, math.nan))[0] == "not modelled"
    # ranges: overlap reproduced; reaching half the lower end partly
    assert C.range_verdict((0.20, 0.33), (0.05, 0.25))[0] == "reproduced"
    assert C.range_verdict((0.20, 0.33), (0.0, 0.12))[0] == "partly"
    assert C.range_verdict((0.20, 0.33), (0.0, 0.071))[0] == "contradicted"
    assert C.combine("reproduced", "reproduced") == "reproduced"
    assert C.combine("reproduced", "contradicted") == "partly"
    assert C.combine("contradicted", "not modelled") == "contradicted"
    # an MFU pair is as good as its weaker part: a level inside the band with no gain is contradicted
    assert C.weaker("reproduced", "contradicted") == "contradicted"
    assert C.weaker("partly", "reproduced") == "partly"
    assert C.weaker("reproduced", "not modelled") == "not modelled"


def test_scenarios_load_and_place_their_gpus():
    scs = {s.id: s for s in S.load_scenarios()}
    want = {"qwen3-l-8192": 8192, "qwen3-xl-8192": 8192, "qwen3-next-m-4096": 4096, "qwen3-next-xl-12288": 12288,
            "dynamic-6144": 6144, "qwen3-next-1t-8192": 8192, "mid-5120": 5120, "megatron-256": 256}
    assert {k: s.gpus for k, s in scs.items()} == want
    for s in scs.values():
        par = s.parallel()
        assert par.world_size == s.gpus
        assert all(k in s.assume for k in ("dispatcher", "seq_len", "ep_placement", "layout"))
        if par.ep > 8:  # EP across nodes, on consecutive ranks
            assert par.ep_placement == "contiguous" and par.ep_link_ranks() == list(range(par.ep))
    with pytest.raises(ConfigError, match="field 'scenario' = 'nope'"):
        S.load_scenarios(["nope"])


def test_bad_scenario_file_names_the_field(tmp_path):
    d = json.loads((S.scenario_dir() / "megatron-256.json").read_text())
    d["gpus"] = 512
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="field 'gpus' = 512 differs from pp x ep x dp x tp = 256"):
        S.load_scenario(p)


def test_megatron_accounted_split_by_hand():
    # (94 + 2) / 8 = 12 slots a stage; the embedding takes one on the first, the loss one on the last
    b = S.accounted_split(94, 8)
    assert [y - x for x, y in zip(b, b[1:])] == [11] + [12] * 6 + [11]
    assert S.accounted_split(48, 8) is None  # 50 does not divide by 8: Megatron refuses it
    b = S.accounted_split(48, 16)  # 50 / 16 no; 48 + 2 = 50
    assert b is None
    b = S.accounted_split(46, 16)  # 48 / 16 = 3: [2, 3 x 14, 2]
    assert [y - x for x, y in zip(b, b[1:])] == [2] + [3] * 14 + [2]


def test_claim_rows_from_hand_made_results():
    # two production scenarios and the 256-GPU one; numbers made up, verdicts worked out by the rules above
    def res(rid, kind, job=None, after=0.2, band=(0.1, 0.3), mc_gain=0.1):
        return {"id": rid, "paper": {"kind": kind, **({"job": job} if job else {})}, "model": "m", "gpus": 1,
                "after": {"mfu": after, "ep_hidden": 0.5, "ep_exposed_share": 0.1, "pipeline_idle_share": 0.1},
                "mfu_band": list(band), "band": [],
                "baselines": {"megatron_core": {"fits": True, "gain": mc_gain, "mfu": after / (1 + mc_gain),
                                                "setup": "even split, 1f1b"},
                              "even_1f1b": {"fits": True, "gain": 0.13}, "even": {"fits": True, "gain": 0.05},
                              "parameters": {"fits": True, "gain": 0.03}, "standalone": {"fits": False, "gain": 0.0}},
                "ablation": {"fits": True, "total": 0.13, "balance": 0.08, "overlap": 0.05}}
    from tessera_lab.report.reproduce import reported

    results = [res("a", "production_job", "Qwen3-Next-M", after=0.2, band=(0.15, 0.25), mc_gain=0.2),
               res("b", "production_job", "Qwen3-L", after=0.2, band=(0.1, 0.25), mc_gain=0.02),
               res("c", "megatron_comparison", mc_gain=0.3)]
    rows = {r["claim"]: r for r in C.claim_rows(results, reported(), overlap_spreads={"simulated": 1.5},
                                                dynamic=None)}
    m = rows["MFU Qwen3-Next-M 16.7% -> 20.0% (4,096 GPUs)"]
    assert m["verdict"] == "reproduced"  # 20.0% inside 15-25%; +20% vs the paper's +19.8%
    q = rows["MFU Qwen3-L 29.7% -> 36.3% (8,192 GPUs)"]
    assert q["verdict"] == "contradicted"  # 36.3% is 45% above 25%; +2% is 0.09x of +22.0% (stated)
    assert rows["MFU Qwen3-XL 32.0% -> 39.0% (8,192 GPUs)"]["verdict"] == "not modelled"
    assert rows["up to 1.24x MFU over Megatron-Core MoE (256 GPUs)"]["verdict"] == "reproduced"  # 0.30 / 0.24
    assert rows["overlap gain differs up to 3x between layer combinations"]["verdict"] == "partly"  # (1.5 - 1) / (3 - 1) = 0.25x
    assert rows["throughput gain over the production baseline"]["verdict"] == "reproduced"  # 2%..20% meets 20%
    assert rows["dynamic optimizer alone: 641 ms idle removed, +3.4% (6,144 GPUs)"]["verdict"] == "not modelled"
    # static +13%: the median scenario (a) against its strongest fair baseline, parameters +3% (even_1f1b is not
    # fair: another schedule; standalone does not fit): 0.23x of +13% -> contradicted; balance 8 of 9 points ->
    # reproduced; combined: partly. Every fitting baseline is listed with its gain, each verdict names its rule
    st = rows["static plan +13%, about 9 points from stage balance"]
    assert st["verdict"] == "partly" and st["ours"].startswith("+3.0% vs parameters (the strongest fair baseline)")
    assert all(f"vs {k} {g}" in st["ours"] for k, g in (("even_1f1b", "+13.0%"), ("even", "+5.0%"),
                                                         ("megatron_core", "+20.0%"), ("parameters", "+3.0%")))
    assert "standalone" not in st["ours"]
    assert "within 2x" in st["rule"] and "+22.0% stated" in q["paper"]  # the paper's stated gain, not 22.2%
    assert "from the MFU ratio" in m["paper"]  # no stated gain for Qwen3-Next-M: derived, and said so
    assert len(rows) == 17  # every claim has a row, run or not (the two overlap jobs' one-layout rows included)
    assert all(r["verdict"] in C.VERDICTS and r["reason"] for r in rows.values())


@pytest.mark.slow
def test_reproduce_cli_subset(tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["reproduce", "--out", str(out), "--quick", "--scenario", "megatron-256", "--scenario",
                 "qwen3-next-m-4096", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    for name in ("mfu", "ablation", "overlap", "width"):
        assert (out / f"{name}.png").stat().st_size > 10_000
        sources = {row["source"] for row in d[name]}
        assert "simulated" in sources and sources <= {"reported", "simulated"} | {s for s in sources
                                                                                if s.startswith("measured (")}
    claims = {r["claim"]: r for r in d["claims"]}
    assert len(claims) == 17 and all(r["verdict"] in C.VERDICTS for r in claims.values())
    # the 256-GPU row: its gain is the scenario's gain over Megatron-Core's best, read by the gain rule
    sc = next(s for s in d["scenarios"] if s["id"] == "megatron-256")
    row = claims["up to 1.24x MFU over Megatron-Core MoE (256 GPUs)"]
    assert row["verdict"] == C.gain_verdict(0.24, sc["baselines"]["megatron_core"]["gain"])[0]
    # every baseline is shown separately, and the after beats or matches what it is compared with in simulation
    for s in d["scenarios"]:
        assert set(s["baselines"]) == {"even_1f1b", "even", "standalone", "parameters", "megatron_core"}
        assert s["mfu_band"][0] <= s["after"]["mfu"] <= s["mfu_band"][1]
        assert {b["knob"] for b in s["band"]} >= {"central", "dispatcher", "grouped_gemm", "seq_len"}
    # the static parts add up per scenario; a scenario the subset left out reads "not modelled"
    sim = [r for r in d["ablation"] if r["source"] == "simulated" and r["step"] != "dynamic filling"]
    by = {}
    for r in sim:
        by.setdefault(r["scenario"], {})[r["step"]] = r["gain"]
    for parts in by.values():
        if "static plan (total)" in parts:
            assert parts["of which stage balance"] + parts["of which overlap scheduling"] == pytest.approx(
                parts["static plan (total)"])
    assert claims["MFU Qwen3-L 29.7% -> 36.3% (8,192 GPUs)"]["verdict"] == "not modelled"
    readme = (out / "README.md").read_text()
    assert "## claims" in readme and "nan" not in readme.lower()
    # no fixed comparative sentence: each note names the values it compares
    assert not any("higher than the reported" in n for n in d["notes"])


def test_dynamic_scenario_states_the_routing_the_code_uses():
    # the scenario file's stated routing assumption is the one dynamic_at_scale runs
    from tessera_lab.report.scenarios import DYNAMIC_ROUTING, load_scenarios

    sc = load_scenarios(["dynamic-6144"])[0]
    assert sc.assume["routing"].split()[0] == DYNAMIC_ROUTING


def test_one_layout_verdict_by_hand():
    # a job claims hidden 73% and exposed 8.3%; variant a: 73% / 20% (exposed 141% off), b: 60% / 9% (hidden 18% off,
    # exposed 8% off): b is the best single layout, 18% <= 25% -> reproduced; without b, a's 2.4x is beyond 2x
    paper = {"ep_hidden": 0.73, "ep_exposed_share": 0.083}
    a = {"knob": "ep_placement", "value": "in_node", "fits": True, "ep_hidden": 0.73, "ep_exposed_share": 0.20}
    b = {"knob": "dispatcher", "value": "deepep", "fits": True, "ep_hidden": 0.60, "ep_exposed_share": 0.09}
    v, ours, why = C.one_layout_verdict(paper, [a, b])
    assert v == "reproduced" and "dispatcher = deepep" in ours and "18% from the paper" in why
    assert C.one_layout_verdict(paper, [a])[0] == "contradicted"
    assert C.one_layout_verdict(paper, [dict(a, fits=False)])[0] == "not modelled"
