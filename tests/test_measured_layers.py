"""The overlap measurement builds only the layers it measures, with only the rank's experts: the same values as the
whole model would give them, the shapes checked on the meta device at Qwen3-Next-80B-A3B's size, and
``measure --dry-run`` saying the host memory per process before anything starts."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tessera_lab.errors import ConfigError  # noqa: E402
from tessera_lab.model.spec import load_model  # noqa: E402
from tessera_lab.runner.measure.dryrun import GiB, host_memory, measured_layers_meta  # noqa: E402
from tessera_lab.runner.measure.harness import runner_config_for  # noqa: E402
from tessera_lab.runner.runtime.specs import TinyConfig  # noqa: E402
from tessera_lab.runner.runtime.topology import build_measured_stages, build_stages  # noqa: E402

CLI = [sys.executable, "-m", "tessera_lab"]


@pytest.mark.parametrize("local", [None, [2, 3], [5]])
def test_layers_built_alone_equal_the_whole_model_cut_to_them(local):
    """Peer check: the whole model built and cut (build_stages, as the training run does) against the layers
    built alone; every parameter name and value equal, the router bias too."""
    cfg = TinyConfig(num_experts=6, router_bias=tuple(0.1 * e for e in range(6)))
    _, whole = build_stages(cfg, [0, 1, 2, 3, 4], [1, 2], 4, local)
    alone = build_measured_stages(cfg, [1, 2], local, "cpu")
    for s in (1, 2):
        a, b = dict(whole[s].named_parameters()), dict(alone[s].named_parameters())
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert torch.equal(whole[s].layers[0].moe.router_bias, alone[s].layers[0].moe.router_bias)
        assert alone[s].layers[0].index == s and not alone[s].is_first and not alone[s].is_last
        kept = sorted(int(e) for e in alone[s].layers[0].moe.experts)
        assert kept == (list(range(6)) if local is None else local)


def test_first_and_last_layers_are_refused():
    with pytest.raises(ConfigError, match=r"allowed: 1\.\.2"):
        build_measured_stages(TinyConfig(), [0, 1], None, "meta")


def _layer_params(H, h, d, kv, E, E_local, W, S, mixer):
    """Hand count of one runner decoder layer's parameters (runtime/layers.py's modules)."""
    if mixer == "full":
        mix = H * (2 * h * d + 2 * kv * d) + 2 * d + h * d * H  # fused q/gate/k/v, q and k norms, out
    else:
        mix = H * (4 * h * d + 2 * h) + 2 * h + d + h * d * H  # fused q/k/v/z/a/b, A_log, dt_bias, norm, out
    norms = 2 * H  # input and post norms
    router, shared_gate = E * H, H
    return norms + mix + router + E_local * 3 * H * W + 3 * H * S + shared_gate


def test_measured_layers_on_the_meta_device_at_qwen3_next_shapes():
    """Qwen3-Next-80B-A3B at size factor 1 with EP 8 (config.json: hidden 2048, 16 heads of 256, 2 KV heads, 512
    experts of width 512, shared expert 512): 64 experts per rank, nothing allocated, and the host memory a
    measuring CUDA process needs is below 8 GiB (the routed experts alone of the whole 4-layer, 512-expert model
    are 24 GiB in fp32)."""
    cfg = runner_config_for(load_model("qwen3-next-80b-a3b"), 1.0, 4096)
    stages = measured_layers_meta(cfg, 8)
    params = [p for st in stages.values() for p in st.parameters()]
    assert params and all(p.is_meta for p in params)
    assert sorted(int(e) for e in stages[1].layers[0].moe.experts) == list(range(64))
    n = sum(p.numel() for p in params)
    want = (_layer_params(2048, 16, 256, 2, 512, 64, 512, 512, "full")
            + _layer_params(2048, 16, 256, 2, 512, 64, 512, 512, "linear"))
    assert n == want
    mem = host_memory(cfg, 8, 1, "cuda", base_bytes=0)
    # the largest host draw: twice linear attention's fused projection [4 * 16 * 256 + 2 * 16, 2048] (larger
    # than one input [1, 4096, 2048]), fp32
    assert mem["staging"] == 2 * (4 * 16 * 256 + 2 * 16) * 2048 * 4 > 4096 * 2048 * 4
    assert mem["total"] < 8 * GiB and mem["device"] == 2 * n * 4


def test_dry_run_prints_host_memory_first_and_starts_nothing(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run(CLI + ["measure", "--backend", "cuda", "--model", "qwen3-next-80b-a3b", "--ep", "8",
                                 "--dry-run", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    m = re.match(r"host memory per process: ([0-9.]+) GiB", first)
    assert m and float(m.group(1)) <= 8
    assert "estimated time:" in proc.stdout and "pair 4/4" in proc.stdout and "64 of 512 experts" in proc.stdout
    assert not out.exists()


def test_dry_run_is_refused_for_the_analytic_backend():
    proc = subprocess.run(CLI + ["measure", "--backend", "analytic", "--dry-run"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert [l for l in proc.stderr.splitlines() if l.strip()][-1].count("--dry-run") >= 1


@pytest.mark.parametrize("extra", [["--dry-run"], []])
def test_budget_over_timeout_is_refused(extra, tmp_path):
    """A budget the --timeout would cut short (the dry run printed 'at most about 1e+12 s' and the run would be
    killed after 600 s): one line naming both, exit 2, nothing started or written."""
    out = tmp_path / "p.json"
    proc = subprocess.run(CLI + ["measure", "--backend", "cpu", "--model", "tiny-runner", "--budget-s", "1e12",
                                 "--out", str(out), *extra], capture_output=True, text=True, timeout=120)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--budget-s = 1e+12 is over --timeout = 600" in lines[0]
    assert not out.exists()
