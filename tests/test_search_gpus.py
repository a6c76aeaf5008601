"""GPU counts the search accepts: part of one node (1, 2 or 4 GPUs: a workstation) or multiples of the 8-GPU node on
every system, so on GB200 (NVLink domain of 72) a partial NVL72 rack too, placed as `plan` places it (the fewest
racks holding the GPUs)."""

from __future__ import annotations

import re

import pytest

from tessera_lab.errors import ConfigError, TooFewGPUsError
from tessera_lab.model.hardware import ParallelConfig, cluster_for
from tessera_lab.model.spec import load_model
from tessera_lab.plan import search as S
from tessera_lab.plan.make import make_plan


@pytest.mark.parametrize("gpu, gpus, ok", [("GB200", 8, True), ("GB200", 16, True), ("GB200", 64, True),
                                           ("GB200", 72, True), ("GB200", 80, True), ("GB200", 144, True),
                                           ("GB200", 12, False), ("GB200", 4, True), ("H200", 16, True),
                                           ("H200", 12, False), ("B300", 20, False), ("H100", 1, True),
                                           ("H100", 2, True), ("H100", 4, True), ("H100", 3, False),
                                           ("H100", 6, False)])
def test_gpu_counts_by_hand(gpu, gpus, ok):
    from tessera_lab.model.hardware import GPUSpec

    domain = GPUSpec.named(gpu).nvlink_domain
    model = load_model("qwen3-30b-a3b")
    if ok:
        assert S.check_search_inputs(model, gpus, 4096, 4096 * 64, domain) == 64
        # the same cluster as `plan` builds for that world size
        assert S.search_cluster(gpu, gpus) == cluster_for(ParallelConfig(pp=1, ep=gpus, dp=1), gpu)
    else:
        with pytest.raises(ConfigError) as info:
            S.check_search_inputs(model, gpus, 4096, 4096 * 64, domain)
        line = str(info.value)
        assert f"--gpus = {gpus} is out of range" in line and "\n" not in line
        assert "1, 2, 4 (part of one node)" in line
        assert ("8, 16, ..., 72 inside one NVLink domain of 72" in line if domain == 72
                else "a multiple of the 8 GPUs of an NVLink domain" in line)
        # the nearest accepted counts, worked out by hand: 12 -> 8 or 16, 20 -> 16 or 24, 3 -> 2 or 4, 6 -> 4 or 8
        near = {12: "(nearest: 8 or 16)", 20: "(nearest: 16 or 24)", 3: "(nearest: 2 or 4)", 6: "(nearest: 4 or 8)"}[gpus]
        assert line.endswith(near)


def test_search_on_a_partial_rack_matches_plan():
    """16 GB200 GPUs: the search plans on one NVL72 rack (16 GPUs used), and its first layout's iteration is what
    `plan` computes for that layout with the search's planner options."""
    res = S.search(load_model("qwen3-30b-a3b"), 16, gpu="GB200", global_batch_tokens=4096 * 256, top=1, max_plans=8)
    pl = _first_as_planned(res, "GB200")
    assert pl.cluster.num_gpus == 72 and pl.parallel.world_size == 16


def _first_as_planned(res, gpu: str):
    """`plan` of the search's first layout with the search's planner options; its iteration is the search's."""
    assert res.ranked, res.errors
    first = res.ranked[0]
    opts = dict(S.PLAN_OPTIONS, **({"method": S.VIRTUAL_METHOD, "limit": S.VIRTUAL_ILP_BUDGET}
                                   if first.layout.vpp > 1 else {}))
    pl = make_plan(load_model(res.model), first.layout.parallel(4096), None, gpu=gpu, **opts)
    assert pl.chosen.iteration_time_s == pytest.approx(first.result["iteration_time_s"], rel=1e-12)
    return pl


def test_plan_header_says_how_many_gpus_of_the_rack_it_uses(capsys):
    """64 GPUs on GB200 sit in one 72-GPU NVLink domain: the header says 64 GPUs of 1 x 72 are used; on H200 the 64 GPUs
    fill 8 nodes of 8 and the header names the nodes only."""
    from tessera_lab.cli.main import main

    assert main(["plan", "--gpu", "GB200"]) == 0
    assert "cluster 64 GPUs of 1 x 72 GB200 (a node is one NVLink domain of 72 GPUs);" in capsys.readouterr().out
    assert main(["plan"]) == 0
    assert "cluster 8 x 8 H200;" in capsys.readouterr().out


def test_a_four_gpu_workstation_searches_and_is_told_the_next_count():
    """4 H100 (a workstation, half a node): the search plans qwen3-8b there, every ranked layout uses the 4 GPUs and
    fits, and the first matches `plan` of that layout on the same single node. For olmoe-1b-7b on 1 GPU the refusal
    names 2 GPUs: its lightest parameter state, 6.92e9 parameters x 18 bytes (bf16 weight, fp32 gradient, fp32 master
    and two fp32 moments) = 116.0 GiB, does not fit 73.6 GiB on one GPU and 58.0 GiB (half of it, pp 2) does."""
    res = S.search(load_model("qwen3-8b"), 4, gpu="H100", global_batch_tokens=4096 * 64, top=2, max_plans=8)
    for cand in res.ranked:
        assert cand.layout.parallel(4096).world_size == 4 and cand.result["fits"]
    pl = _first_as_planned(res, "H100")
    assert pl.cluster.num_gpus == 8 and pl.parallel.world_size == 4

    with pytest.raises(ConfigError) as info:
        S.search(load_model("olmoe-1b-7b"), 1, gpu="H100", global_batch_tokens=4096 * 64, top=1, max_plans=4)
    line = str(info.value)
    assert "holds 116.0 GiB of parameter state per GPU" in line
    assert "at least 2 GPUs (part of one 8-GPU node;" in line and "58.0 GiB per GPU" in line


def test_the_named_count_passes_the_memory_bound_not_only_the_parameter_state():
    """qwen3-next on 4 GB200: by parameter state alone 8 GPUs would do (167.0 GiB per GPU against 167.2), but at 8
    every layout's lower bound with saved activations is over the capacity (brute force over every enumerated
    layout), so the refusal names 16, where some layout passes both bounds."""
    from tessera_lab.cost.memory import memory_capacity

    model = load_model("qwen3-next-80b-a3b")
    cluster = S.search_cluster("GB200", 8)
    cap, bounds, seqs = memory_capacity(cluster), S._Bounds(model, 4096, cluster), 1024

    def passes(n):
        return any(S.param_memory_bytes(model, lay, 4096) / lay.pp <= cap and bounds.memory(lay) <= cap
                   for lay in S.enumerate_layouts(model, n, seqs, gpus_per_node=72, seq_len=4096))

    assert S.fewest_gpus(model, 4, seqs, 4096, 72, cap, 64)[0] == 8  # the parameter state alone
    assert not passes(8) and passes(16)
    with pytest.raises(TooFewGPUsError) as info:
        S.search(model, 4, gpu="GB200", top=1, max_plans=4)
    assert info.value.needed == 16 and "at least 16 GPUs" in str(info.value)


@pytest.mark.parametrize("name,gpus,node", [("qwen3-next-80b-a3b", 256, 8), ("qwen3-next-80b-a3b", 72, 72),
                                            ("deepseek-v3", 64, 8), ("qwen3-8b", 24, 8)])
def test_the_suggested_global_batch_is_the_nearest_the_layouts_make(name, gpus, node):
    """Brute force: every sequence count up to 3 x gpus, whether enumerate_layouts makes it; the suggestion for each
    target is a count it makes, and none it makes is nearer (ties: the larger)."""
    model = load_model(name)
    makes = [k for k in range(1, 3 * gpus + 1) if S.enumerate_layouts(model, gpus, k, gpus_per_node=node,
                                                                          schedules=("1f1b",), vpps=(2,),
                                                                          recomputes=("none",))]
    assert makes
    for target in (1, 2.5, gpus / 3, gpus - 1, gpus + 0.5, 2 * gpus + 3):
        got = S.nearest_global_batch(model, gpus, target, gpus_per_node=node)
        want = min((k for k in makes), key=lambda k: (abs(k - target), -k))
        if want <= 2 * gpus:  # the brute-force range holds the true nearest
            assert got == want, (target, got, want)


def test_the_batch_errors_suggest_a_batch_the_search_accepts(capsys):
    model = load_model("qwen3-next-80b-a3b")
    for tokens in (4096, 1_000_000, 96 * 4096):
        with pytest.raises(ConfigError) as err:
            S.search(model, 256, gpu="H200", global_batch_tokens=tokens, top=1, max_plans=1)
        text = str(err.value)
        assert "nearest that a micro-batching of 256 GPUs makes" in text and "1 sequences" not in text
        named = [int(k.replace(",", "")) for k in re.findall(r"(?:makes|divides): [\d,]+, ([\d,]+) sequences?", text)]
        assert len(named) == 2 and named[1] == 256  # the nearest, then the nearest multiple of the GPU count
        for k in named:
            assert S.enumerate_layouts(model, 256, k, recomputes=("none",))
