"""The parallel-configuration search: enumeration against a brute-force count, the bounds against what the planner
finds, pruning that never drops a layout that plans and fits, the same result for any ``--jobs``, the Megatron
export read back, and bad input refused in one line."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest

from tessera_lab.cost.memory import memory_capacity
from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.model.hardware import Cluster, ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.plan import search as S
from tessera_lab.plan import search_export as X
from tessera_lab.plan.make import make_plan


@pytest.fixture(scope="module")
def qwen():
    return load_model("qwen3-next-80b-a3b")


@pytest.fixture(scope="module")
def small(qwen):
    """A 64-GPU search of Qwen3-Next, 256 sequences, 24 plans."""
    return S.search(qwen, 64, global_batch_tokens=256 * 4096, top=4, max_plans=24)


def test_enumeration_matches_brute_force(qwen):
    """Every (tp, ep, spans, pp, dp, mbs, m) the rules allow, counted by brute force over all integer sizes."""
    gpus, seqs = 32, 64
    got = {(l.tp, l.ep, l.ep_spans_tp, l.pp, l.dp, l.micro_batch_size, l.microbatches)
           for l in S.enumerate_layouts(qwen, gpus, seqs)}
    want = set()
    for tp, ep, pp, dp, mbs in itertools.product(range(1, 9), range(1, 513), range(1, 49), range(1, 33), (1, 2, 4)):
        for spans in (False, True):
            if spans and (tp < 2 or ep % tp):
                continue
            if 16 % tp or 2 % tp or 8 % tp or 512 % ep or pp * dp * ep * (1 if spans else tp) != gpus:
                continue
            dense = ep * dp // (tp if spans else 1)
            if seqs % (mbs * dense):
                continue
            m = seqs // (mbs * dense)
            if pp > 1 and m < pp:
                continue
            want.add((tp, ep, spans, pp, dp, mbs, m))
    assert got == want
    for lay in S.enumerate_layouts(qwen, gpus, seqs):
        p = lay.parallel(4096)
        assert p.world_size == gpus and p.tokens_per_iteration == seqs * 4096
        if lay.vpp > 1:
            assert lay.microbatches % lay.pp == 0 and lay.pp * lay.vpp <= qwen.num_layers


def test_bubble_factor_by_hand():
    # pp 2, m 2: T >= W / (1 - (1/2)^2) = 4/3 W; over m W / pp = W: 4/3
    assert S.bubble_factor(2, 2) == pytest.approx(4 / 3)
    assert S.bubble_factor(1, 7) == 1.0
    for p, m in [(4, 8), (8, 32), (16, 16)]:
        # never above the balanced 1F1B fill (m + p - 1) / m, never below 1
        assert 1.0 <= S.bubble_factor(p, m) <= (m + p - 1) / m


def test_bounds_hold_for_every_planned_candidate(small):
    assert len(small.planned) == 24
    for c in small.planned:
        r = c.result
        if "iteration_time_s" not in r:
            continue
        assert c.lower_bound_s <= r["iteration_time_s"] * (1 + 1e-9), c.layout
        assert c.memory_bound_bytes <= r["peak_memory_gib"] * 2**30 * (1 + 1e-9), c.layout


def test_fsdp_free_group_bounds_the_fsdp_group(qwen):
    """The time bound of a Megatron-FSDP layout uses its group with the distributed optimizer: FSDP's gathers and
    reduce-scatters on streams of their own only lengthen a phase (checked on a sample of a 64-GPU search's groups,
    every recompute choice: the phase-time sums, the heaviest entry's phase time and the lane sums)."""
    cl = Cluster.dgx("H200", 8)
    choices = S.recompute_choices(qwen)
    assert ("selective", ("layernorm", "moe_act", "shared_experts")) in choices  # Qwen3-Next has a shared expert
    assert not any("mla_up_proj" in mods for _, mods in choices)  # and no MLA
    seen = 0
    for lay in S.enumerate_layouts(qwen, 64, 256)[::397]:
        if lay.megatron_dp <= 1:
            continue
        for rc, mods in choices:
            base = S._group(qwen, S.Layout(**{**lay.__dict__, "recompute": rc, "recompute_modules": mods,
                                              "fsdp": False}), 4096, cl)
            g = S._group(qwen, S.Layout(**{**lay.__dict__, "recompute": rc, "recompute_modules": mods,
                                           "fsdp": True}), 4096, cl)
            for x, y in zip(g.phase_sums() + g.sums(), base.phase_sums() + base.sums()):
                assert x >= y - 1e-12, lay
            seen += 1
    assert seen >= 10


def test_memory_pruned_layouts_do_not_fit(qwen):
    """A sample of layouts the memory bound prunes: the planner refuses them or plans them over capacity."""
    cl = Cluster.dgx("H200", 4)
    b = S._Bounds(qwen, 4096, cl)
    cap = memory_capacity(cl)
    pruned = [l for l in S.enumerate_layouts(qwen, 32, 256, schedules=("gpipe",), recomputes=("none",),
                                                dispatchers=("alltoall",), micro_batch_sizes=(1,))
              if b.memory(l) > cap and S.param_memory_bytes(qwen, l, 4096) / l.pp <= cap]
    assert pruned
    for lay in pruned[:4]:
        try:
            pl = make_plan(qwen, lay.parallel(4096), cl, method="dp")
        except TesseraError:
            continue
        assert not pl.chosen.fits_memory


def test_stage_cache_across_pp_and_dp_matches_fresh(qwen):
    """The stage-model cache is keyed on what the layer costs see: a plan after one of another pp/dp/schedule
    equals the plan made with empty caches."""
    from tessera_lab.overlap import search as osearch
    from tessera_lab.plan import stages

    def fresh(p):
        osearch._SEARCHED.clear()
        stages._COSTS.clear()
        stages._pair_result.cache_clear()
        return make_plan(qwen, p, method="dp")

    a = ParallelConfig(pp=8, ep=8, dp=4)
    b = ParallelConfig(pp=4, ep=8, dp=8, microbatches=16, schedule="1f1b")
    want = fresh(b)
    make_plan(qwen, a, method="dp")
    got = make_plan(qwen, b, method="dp")
    assert got.timing["stage_model"] == "cached"
    assert got.chosen.iteration_time_s == want.chosen.iteration_time_s
    assert [s.as_dict() for s in got.chosen.stages] == [s.as_dict() for s in want.chosen.stages]


def test_first_candidate_no_slower_than_each_planned(small):
    first = small.ranked[0]
    assert all(first.result["iteration_time_s"] <= c.result["iteration_time_s"] for c in small.ranked)
    # the planner's own result for the first layout
    cl = Cluster.dgx("H200", 8)
    pl = S.plan_layout(load_model("qwen3-next-80b-a3b"), first.layout, 4096, cl)
    assert pl["iteration_time_s"] == pytest.approx(first.result["iteration_time_s"], rel=1e-12)


def test_jobs_two_gives_the_same_result(qwen, small):
    two = S.search(qwen, 64, global_batch_tokens=256 * 4096, top=4, max_plans=24, jobs=2)
    assert [c.layout for c in two.ranked] == [c.layout for c in small.ranked]
    assert [c.result["iteration_time_s"] for c in two.ranked] == [c.result["iteration_time_s"] for c in small.ranked]
    assert two.pruned == small.pruned
    # the planner processes' CPU is counted (getrusage of the children), and the rate divides by both
    assert two.children_cpu_s > 0 and small.children_cpu_s == 0
    assert two.planned_per_cpu_s == pytest.approx(len(two.planned) / (two.cpu_s + two.children_cpu_s))


def test_first_layout_does_not_depend_on_top(qwen):
    """With a budget too small to plan every candidate, a larger --top must not spend it elsewhere: #1 is found by
    a first pass that prunes against the best plan, whatever top (the rest fills the top with what is left)."""
    runs = [S.search(qwen, 64, global_batch_tokens=256 * 4096, top=top, max_plans=40) for top in (1, 10)]
    assert runs[0].ranked[0].layout == runs[1].ranked[0].layout
    assert runs[0].ranked[0].result["iteration_time_s"] == runs[1].ranked[0].result["iteration_time_s"]
    assert len(runs[1].ranked) > 1


def test_megatron_export_round_trip(small):
    for c in small.ranked[:3]:
        out = X.megatron_arguments(c, 4096)
        lay, bounds = X.layout_from_megatron(out["argv"], 64, ep_spans_tp=c.layout.ep_spans_tp)
        want = c.layout
        if lay.recompute != want.recompute or lay.schedule != want.schedule:  # zero-bubble: not a Megatron schedule
            assert want.schedule not in X.MEGATRON_SCHEDULES and out["notes"]
            continue
        assert lay == want
        assert bounds == c.result["boundaries"]


def test_megatron_flags_by_hand():
    lay = S.Layout(4, 2, 8, 2, 2, 16, 1, "interleaved-overlapped", "full", "deepep", False)
    c = S.Candidate(lay, 0.0, 0.0, {"boundaries": [0, 6, 12, 18, 24, 30, 36, 42, 48], "fits": True})
    argv = X.megatron_arguments(c, 8192)["argv"]
    text = " ".join(argv)
    for part in ("--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 4",
                 "--num-virtual-stages-per-pipeline-rank 2", "--expert-model-parallel-size 8",
                 "--global-batch-size 256", "--seq-length 8192", "--sequence-parallel", "--recompute-granularity full",
                 "--moe-enable-deepep", "--overlap-moe-expert-parallel-comm",
                 "--pipeline-model-parallel-layout Etttttt|tttttt|tttttt|tttttt|tttttt|tttttt|tttttt|ttttttL"):
        assert part in text, part


@pytest.mark.parametrize("modules", [(), ("layernorm", "moe_act")])
def test_selective_export_names_the_planned_modules(modules):
    """Megatron-Core recomputes core_attn alone when --recompute-modules is absent (TransformerConfig.__post_init__
    at NVIDIA/Megatron-LM@d98e8a64); a bare selective layout here plans core_attn and moe_act, so the export must
    name them, and reading Megatron arguments back maps an absent flag to core_attn alone."""
    from tessera_lab.model.hardware import SELECTIVE_DEFAULT_MODULES

    lay = S.Layout(2, 1, 8, 1, 4, 16, 1, "1f1b", "selective", "alltoall", False, 1, modules)
    argv = X.megatron_arguments(S.Candidate(lay, 0.0, 0.0, {"fits": True}), 4096)["argv"]
    i = argv.index("--recompute-modules")
    assert tuple(argv[i + 1:i + 1 + len(modules or SELECTIVE_DEFAULT_MODULES)]) == (modules or ("core_attn", "moe_act"))
    assert X.layout_from_megatron(argv, 64)[0] == lay
    assert list(X.megatron_arguments(S.Candidate(lay, 0.0, 0.0, {"fits": True}), 4096)["layout"]["recompute_modules"]) == \
        list(modules or ("core_attn", "moe_act"))  # the JSON's layout names what the argv does
    bare = argv[:i] + argv[i + 1 + len(modules or SELECTIVE_DEFAULT_MODULES):]
    assert X.layout_from_megatron(bare, 64)[0].recompute_modules == ("core_attn",)
    # the search's JSON/CSV row (Candidate.as_dict) names the planned modules too, never [] for a bare selective
    assert S.Candidate(lay, 0.0, 0.0, {"fits": True}).as_dict()["recompute_modules"] == list(modules or
                                                                                             ("core_attn", "moe_act"))
    none = S.Layout(2, 1, 8, 1, 4, 16, 1, "1f1b", "none", "alltoall", False, 1, ())
    assert S.Candidate(none, 0.0, 0.0).as_dict()["recompute_modules"] == []


def test_dense_selective_export_names_core_attn_alone():
    """A model without MoE layers: a bare selective recomputes core_attn alone (moe_act acts on nothing, and
    Megatron-Core refuses it without --moe-grouped-gemm), so the export, its layout and the JSON row name core_attn
    only, and reading the arguments back (with or without the flag: Megatron-Core's own default) gives the bare
    selective layout again."""
    lay = S.Layout(2, 1, 1, 1, 4, 16, 1, "1f1b", "selective", "alltoall", False, 1, ())
    cand = S.Candidate(lay, 0.0, 0.0, {"fits": True})
    out = X.megatron_arguments(cand, 4096, moe=False)
    argv = out["argv"]
    i = argv.index("--recompute-modules")
    assert argv[i - 2:i + 3] == ["--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                 "--moe-token-dispatcher-type"]
    assert out["layout"]["recompute_modules"] == ["core_attn"]
    assert X.layout_from_megatron(argv, 8, moe=False)[0] == lay
    assert X.layout_from_megatron(argv[:i] + argv[i + 2:], 8, moe=False)[0] == lay  # the flag absent
    assert cand.as_dict(moe=False)["recompute_modules"] == ["core_attn"]
    listed = S.Layout(2, 1, 1, 1, 4, 16, 1, "1f1b", "selective", "alltoall", False, 1, ("layernorm",))
    assert X.megatron_arguments(S.Candidate(listed, 0.0, 0.0), 4096, moe=False)["layout"]["recompute_modules"] == \
        ["layernorm"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tessera_lab", "search", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, words", [
    (["--gpus", "12"], ["--gpus = 12", "multiple of the 8"]),
    (["--gpus", "64", "--global-batch-tokens", "4000"], ["--global-batch-tokens = 4,000", "multiple of 4,096"]),
    (["--model", "deepseek-v3", "--gpus", "8"], ["--gpus = 8", "too small", "at least 88 GPUs"]),
    (["--gpus", "64", "--global-batch-tokens", str(4096 * 3)], ["--global-batch-tokens = 12,288", "allowed"]),
])
def test_bad_input_one_line_exit_2(args, words):
    r = _cli(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_search_errors_before_work(qwen):
    with pytest.raises(ConfigError, match="--gpus = 9"):
        S.search(qwen, 9)
    assert math.isfinite(S.bubble_factor(3, 1))


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "deepseek-v3", "gpt-oss-20b", "nemotron-h-56b",
                                  "llama-4-scout-17b-16e"])
def test_kind_tasks_equal_decompose(name):
    """The bounds' per-kind decomposition gives the saved bytes and the analytic costs ``decompose`` gives."""
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.tasks import decompose

    m = load_model(name)
    p = ParallelConfig(pp=4, ep=8, dp=1, tp=2, recompute="selective")
    cm = CostModel(Cluster.dgx("H200", 8), p)
    got, want = S.kind_tasks(m, p), decompose(m, p)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.layer == w.layer and g.kind == w.kind
        assert sum(t.saved_bytes for t in g.F) == sum(t.saved_bytes for t in w.F)
        assert cm.layer_cost(g).total == pytest.approx(cm.layer_cost(w).total, rel=1e-12)


@pytest.mark.slow
def test_acceptance_qwen3_next_256(qwen):
    """The 256-GPU search plans at least 200 layouts and its first is no slower than `plan --pp 8 --ep 8 --dp 4`
    (same GPUs and 4,194,304 tokens per iteration, `plan`'s defaults)."""
    res = S.search(qwen, 256, global_batch_tokens=4194304)
    assert len(res.planned) >= 200
    ref = make_plan(qwen, ParallelConfig(pp=8, ep=8, dp=4, microbatches=32))
    assert ref.parallel.tokens_per_iteration == 4194304
    assert res.ranked[0].result["iteration_time_s"] <= ref.chosen.iteration_time_s


def test_cp_choices_and_layouts_by_hand(qwen):
    # Qwen3-Next: 16 Gated DeltaNet key heads, 16 attention heads; CP sizes are powers of two with seq_len a
    # multiple of 2 cp, 16 / tp GDN heads a multiple of cp, and >= 4,096 tokens of a sequence per rank; the CP group
    # may leave the NVLink domain (TP 4 x CP 4 = 16 ranks on nodes of 8, as Megatron-Core runs it)
    assert S.cp_choices(qwen, 32768, 1) == [1, 2, 4, 8]
    assert S.cp_choices(qwen, 32768, 4) == [1, 2, 4]  # cp 8: 16 / 4 = 4 heads a TP rank, not a multiple of 8
    assert S.cp_choices(qwen, 65536, 1) == [1, 2, 4, 8, 16]
    assert S.cp_choices(qwen, 8192, 1) == [1, 2]
    assert S.cp_choices(qwen, 4096, 1) == [1]
    lays = S.enumerate_layouts(qwen, 64, 64, seq_len=32768)
    assert {l.cp for l in lays} == {1, 2, 4, 8}
    for l in lays:  # every layout fills the GPUs: pp x dp x ep x (tp unless spanned) x cp
        assert l.parallel(32768).world_size == 64
    # the Megatron export carries CP and reads it back
    lay = next(l for l in lays if l.cp == 4 and l.schedule == "1f1b" and l.recompute == "none")
    out = X.megatron_arguments(S.Candidate(lay, 0.0, 0.0), 32768)
    assert out["argv"][out["argv"].index("--context-parallel-size") + 1] == "4"
    back, _ = X.layout_from_megatron(out["argv"], 64, ep_spans_tp=lay.ep_spans_tp)
    assert back == lay


def test_megatron_overlap_rules_named_in_the_export_notes():
    """Megatron-Core's TransformerConfig refuses --overlap-moe-expert-parallel-comm without EP > 1, with full
    recomputation, or at pp > 1 without virtual stages: the export says which rule a layout breaks (hand cases)."""
    from dataclasses import replace

    from tessera_lab.plan import search_export as X

    base = S.Layout(pp=4, vpp=2, ep=8, tp=1, dp=2, microbatches=8, micro_batch_size=1,
                    schedule="interleaved-overlapped", recompute="none", dispatcher="alltoall")
    assert X.overlap_rule_breaks(base) == [] and X.overlap_notes(base) == []
    (note,) = X.overlap_notes(replace(base, vpp=1, schedule="overlapped", recompute="full", ep=1))
    for rule in ("expert parallelism > 1", "a recompute granularity other than full", "virtual pipeline stages when pp > 1"):
        assert rule in note
    assert X.overlap_rule_breaks(replace(base, pp=1, vpp=1, schedule="overlapped")) == []


def test_enumeration_obeys_megatron_overlap_rules(qwen):
    """The search enumerates an EP-overlap schedule exactly where Megatron-Core's TransformerConfig accepts
    --overlap-moe-expert-parallel-comm: EP > 1, no full recomputation, virtual stages when pp > 1 (rules written
    out here, not taken from the code), and where it can pair anything: two micro-batches or more (with one,
    Megatron-Core runs it as plain 1F1B, the twin already enumerated); for every enumerated layout with the plain
    schedule of its chunk count (1f1b / interleaved), its overlapped twin is enumerated iff the rules hold."""
    from dataclasses import replace

    lays = S.enumerate_layouts(qwen, 32, 64)
    have = set(lays)
    twins = {"1f1b": "overlapped", "interleaved": "interleaved-overlapped"}
    checked = 0
    for lay in lays:
        if lay.schedule.endswith("overlapped"):
            assert lay.ep > 1 and lay.recompute != "full" and (lay.pp == 1 or lay.vpp > 1), lay
            assert lay.microbatches >= 2, lay
        if lay.schedule in twins and lay.vpp == (1 if lay.schedule == "1f1b" else lay.vpp):
            ok = lay.ep > 1 and lay.recompute != "full" and (lay.pp == 1 or lay.vpp > 1) and lay.microbatches >= 2
            assert (replace(lay, schedule=twins[lay.schedule]) in have) == ok, lay
            checked += ok
    assert checked > 0
    # pp 1 with EP runs the overlap (no virtual stages needed); full recompute never does
    assert any(l.pp == 1 and l.schedule == "overlapped" for l in lays)
    assert not any(l.schedule.endswith("overlapped") and l.recompute == "full" for l in lays)


def test_recompute_modules_and_fsdp_enumerated_and_exported(qwen):
    """Selective recompute with Megatron module sets and Megatron FSDP are search dimensions; the export writes them
    (--recompute-modules, --use-megatron-fsdp) and reads them back."""
    lays = S.enumerate_layouts(qwen, 32, 64)
    mods = {l.recompute_modules for l in lays if l.recompute == "selective"}
    assert mods == {(), ("layernorm", "moe_act"), ("layernorm", "moe_act", "shared_experts")}
    assert all(not l.recompute_modules for l in lays if l.recompute != "selective")
    assert any(l.fsdp for l in lays)
    assert all(l.megatron_dp > 1 for l in lays if l.fsdp)  # FSDP shards over a data-parallel group of 2 or more
    lay = next(l for l in lays if l.fsdp and l.recompute_modules == ("layernorm", "moe_act", "shared_experts"))
    out = X.megatron_arguments(S.Candidate(lay, 0.0, 0.0), 4096)
    text = " ".join(out["argv"])
    assert "--recompute-granularity selective --recompute-modules layernorm moe_act shared_experts" in text
    assert "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params" in text
    back, _ = X.layout_from_megatron(out["argv"], 32, ep_spans_tp=lay.ep_spans_tp)
    assert back == lay
    # DeepSeek-V3 has MLA: its set with the up projections is tried
    dsv3 = load_model("deepseek-v3")
    assert ("selective", ("layernorm", "mla_up_proj", "moe_act")) in S.recompute_choices(dsv3)


def test_plan_memory_refusal_names_cp_that_fits(qwen):
    """A long-sequence memory refusal of `plan` names the context-parallel size that fits, and it does: planning
    the same layout with that --cp fits memory (the planner's own answer), while the refused one does not."""
    import re

    r = subprocess.run([sys.executable, "-m", "tessera_lab", "plan", "--model", "qwen3-next-80b-a3b", "--pp", "8",
                        "--ep", "8", "--seq-len", "32768"], capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
    got = re.search(r"--cp (\d+) plans with a peak of ([\d.]+) GiB per GPU", lines[0])
    assert got, lines[0]
    cp, peak = int(got.group(1)), float(got.group(2))
    pl = make_plan(qwen, ParallelConfig(pp=8, ep=8, seq_len=32768, cp=cp))
    assert pl.chosen.fits_memory
    assert peak <= memory_capacity(pl.cluster) / 2**30
    # a short sequence gets no CP advice (CP would leave under 4,096 tokens per rank)
    r = subprocess.run([sys.executable, "-m", "tessera_lab", "plan", "--model", "deepseek-v3", "--pp", "2",
                        "--ep", "8"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--cp" not in r.stderr


def test_no_fit_hint_names_the_cp_searched():
    """The search's no-fit line says how far CP was searched at a long sequence (hand-made result), and says
    nothing of CP where only CP 1 was tried."""
    from types import SimpleNamespace

    from tessera_lab.cli.search import no_fit_hint

    planned = [S.Candidate(S.Layout(8, 1, 8, 1, 1, 8, 1, "1f1b", "full", "alltoall"), 1.0, 0.0,
                           {"peak_memory_gib": 201.6, "fits": False})]
    res = SimpleNamespace(planned=planned, memory_capacity_bytes=134.4 * 2**30, gpus=64, seq_len=65536, max_cp=8)
    line = no_fit_hint(res)
    assert "201.6 GiB against 134.4 GiB" in line and "1.50x the GPUs" in line and "--cp 8" in line
    assert "--cp" not in no_fit_hint(SimpleNamespace(**{**res.__dict__, "max_cp": 1}))
    # every planned candidate refused, the budget leaving layouts unplanned: the hint says both, the refusals counted
    # by what they prove (messages differ in their stage and GiB, so a count by message would cover few), and the
    # commonest message as an example
    refused = [S.Candidate(planned[0].layout, 1.0, 0.0, {"error": "no partition fits"}) for _ in range(3)]
    res2 = SimpleNamespace(planned=refused, memory_capacity_bytes=134.4 * 2**30, gpus=88, seq_len=4096, max_cp=1,
                           pruned={"budget": 1284}, errors={"no partition fits: stage 1": 2, "other": 1},
                           error_kinds={"no partition fits memory (proven)": 2, "other": 1})
    line = no_fit_hint(res2)
    assert line.startswith("every planned candidate (3) was refused by the planner (2 no partition fits memory "
                           "(proven), 1 other; for example: no partition fits: stage 1); 1,284 layouts were left "
                           "unplanned at the --max-plans budget"), line
    assert "--gpus 176" in line


def test_dense_model_rows_carry_no_moe_labels():
    """A dense model's search rows and separations name no EP and no dispatcher (it has no MoE layer); MoE rows print
    Megatron's data-parallel size beside the per-EP-group DP, N / (tp x cp x pp) worked out here."""
    from tessera_lab.cli.search import _row, format_search

    dense = load_model("qwen3-8b")
    res = S.search(dense, 16, top=3, max_plans=8)
    text = format_search(res, 3)
    assert res.ranked and not res.moe
    for word in ("dispatcher", "alltoall", "deepep", " ep "):
        assert word not in text, word
    assert "ep " not in res.ranked[0].layout.text(moe=False)
    # with the model, the first layout's MFU line: a dense model has no published band, the bare percentage
    mfu_line = next(ln for ln in format_search(res, 3, dense).splitlines() if ln.startswith("MFU of #1"))
    assert mfu_line == (f"MFU of #1 (simulated): {res.ranked[0].result['mfu']:.1%} (no published dense run of this "
                        "model's family on this GPU type in this precision)")
    lay = S.Layout(4, 2, 16, 2, 4, 8, 1, "interleaved-overlapped", "none", "deepep", True)  # EP spans TP
    row = _row(1, S.Candidate(lay, 0.0, 0.0, {"iteration_time_s": 1.0, "tokens_per_s": 1.0, "mfu": 0.1,
                                               "bubble_fraction": 0.1, "peak_memory_gib": 1.0, "headroom_gib": 1.0}))
    gpus = lay.parallel(4096).world_size
    assert row["DP (Megatron)"] == gpus // (lay.tp * lay.cp * lay.pp) == 32 and row["dp"] == 4


@pytest.mark.parametrize("schedule", ["interleaved-overlapped", "1f1b"])
def test_stage_cost_table_equals_cost(qwen, schedule):
    """The batched segment costs a partition solve reads are the stage cost model's own, bit for bit."""
    from tessera_lab.plan.make import planning_problem

    p = ParallelConfig(pp=4, vpp=2 if schedule.startswith("interleaved") else 1, ep=8, dp=2, schedule=schedule)
    problem, sm = planning_problem(qwen, p, Cluster.dgx("H200", 8))
    for s in range(problem.num_stages):
        seg = problem.segments(s)
        assert seg and problem.segment_costs(s, seg) == [sm.cost(s, i, j) for i, j in seg]


def test_stage_memory_row_equals_memory_bytes(qwen):
    """The batched memory a partition problem's segment list reads is the stage cost model's own, bit for bit."""
    from tessera_lab.plan.make import planning_problem

    _, sm = planning_problem(qwen, ParallelConfig(pp=4, vpp=2, ep=8, dp=2, schedule="interleaved-overlapped"),
                             Cluster.dgx("H200", 8))
    for s in range(sm.num_stages):
        for i in (0, 5, 20):
            js = list(range(i + 1, sm.num_layers + 1))
            assert sm.memory_row(s, i, js) == [sm.memory_bytes(s, i, j) for j in js]


def test_separation_names_the_real_share_or_the_spread():
    """The separation splits the iteration change into slowest stage x vpp x m, bubble seconds (fraction x
    iteration) and the rest, with shares of the summed absolute moves worked out here; never a 0.0% term."""
    from types import SimpleNamespace as N

    from tessera_lab.cli.search import _FIELDS, separation

    def cand(t, slowest_ms, bubble, m=8, vpp=1):
        lay = N(**{**{k: 0 for k in _FIELDS}, "microbatches": m, "vpp": vpp})
        return N(layout=lay, result={"iteration_time_s": t, "slowest_stage_ms": slowest_ms, "bubble_fraction": bubble})

    a = cand(1.0, 100.0, 0.1)
    # stage 8 x 110 - 8 x 100 = +80 ms, bubble 0.1 x 1.1 - 0.1 = +10 ms, rest 100 - 80 - 10 = +10 ms: 80 %, 10 %, 10 %
    assert separation(a, cand(1.1, 110.0, 0.1)).endswith(
        "+10.0% iteration; the term that moved most: slowest stage x m +80.0 ms (80% of the moved seconds)")
    # stage +40 ms, bubble 0.06 - 0.1 = -40 ms, rest 0: spread, 50 % each
    line = separation(a, cand(1.0, 105.0, 0.06))
    assert "spread across terms (shares of the moved seconds): " in line
    assert "slowest stage x m +40.0 ms (50%)" in line and "idle (pipeline bubble and waits) -40.0 ms (50%)" in line
    # the old wording picked the bubble here and printed "+0.0%": stage +0.8 ms, bubble 0.1003 x 1.01 - 0.1
    # = +1.303 ms, rest 10 - 0.8 - 1.303 = +7.897 ms of 10 ms moved: 79 %
    line = separation(a, cand(1.01, 100.1, 0.1003))
    assert line.endswith("the term that moved most: rest (sync, exposed comm, lighter ranks) +7.9 ms (79% of the "
                         "moved seconds)") and "0.0%" not in line
    # virtual stages: a rank runs vpp chunks per micro-batch, 2 x 8 x 60 - 8 x 100 = +160 ms; bubble 0.1 x 1.2 - 0.1
    # = +20 ms, rest +20 ms: 160 of 200 ms moved (80 %)
    assert separation(a, cand(1.2, 60.0, 0.1, vpp=2)).endswith(
        "slowest stage x vpp x m +160.0 ms (80% of the moved seconds)")
    assert separation(a, a).endswith("+0.0% iteration; no term moved")


def test_too_few_gpus_names_a_count_the_first_pass_accepts():
    """deepseek-v3 on 8 GPUs: the lightest layout holds 1406.1 GiB of parameter state per GPU against 134.4 GiB;
    by hand 1406.1 x 8 / 134.4 = 83.7 GPUs, the next multiple of 8 is 88. The count named is one the first pass
    (parameter-memory rule) accepts, and 80, one step fewer, is not."""
    from types import SimpleNamespace

    model = load_model("deepseek-v3")
    cap = memory_capacity(S.search_cluster("H200", 8))
    with pytest.raises(ConfigError) as err:
        S.search(model, 8)
    line = str(err.value)
    assert "\n" not in line and "1406.1 GiB" in line and "allowed: at least 88 GPUs (a multiple of 8" in line
    stub = SimpleNamespace(time=lambda lay: 0.0)
    for n, passes in ((80, False), (88, True)):
        lays = S.enumerate_layouts(model, n, S.DEFAULT_GLOBAL_SEQUENCES, gpus_per_node=8, seq_len=4096)
        assert bool(S._first_pass(model, lays, 4096, cap, stub)[0]) is passes, n
    # one sequence per iteration: no data parallelism shards the state, no count up to 4 x 88 = 352 holds it
    err = S.too_few_gpus(model, 8, 1, 4096, 8, cap, 1406.1 * 2**30)
    assert "allowed: more than 352 GPUs or a larger --global-batch-tokens" in str(err) and err.needed is None


def test_no_fit_answer_is_one_error_line_on_stderr(monkeypatch, capsys):
    """A search whose planned layouts all exceed memory exits 2 with one line on stderr, prefixed as every CLI error,
    naming the commonest refusal without the advice to run the search it is in; stdout keeps the report's header."""
    import tessera_lab.plan.search as search_mod
    from tessera_lab.cli.main import main

    lay = S.Layout(8, 1, 8, 1, 1, 8, 1, "1f1b", "none", "alltoall")
    from tessera_lab.plan.problem import SEARCH_POINTER

    reason = f"no partition fits in memory: stage 0 at 140.00 GiB {SEARCH_POINTER}"
    res = S.SearchResult("qwen3-next-80b-a3b", 64, "H200", 4096, 1024, 10,
                         [S.Candidate(lay, 1.0, 0.0, {"error": reason, "fits": False})], 100, {"memory (parameter state)": 0,
                         "memory": 0, "bound": 0, "budget": 12}, errors={reason: 1},
                         memory_capacity_bytes=134.4 * 2**30, unplanned_bound_s=2.5)
    monkeypatch.setattr(search_mod, "search", lambda *a, **k: res)
    assert main(["search", "--gpus", "64"]) == 2
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.splitlines() if ln.strip() and not ln.startswith("search:")]
    assert len(err) == 1 and err[0].startswith("tessera-lab search: error: no planned layout fits memory: every "
                                               "planned candidate (1) was refused"), cap.err
    assert "lists layouts that fit" not in err[0] and "12 layouts were left unplanned" in err[0]
    assert cap.out.startswith("search qwen3-next-80b-a3b on 64 x H200")


def test_unproven_top_is_said(monkeypatch):
    """Layouts left unplanned at the budget whose time bounds are below #1's planned time: the text says the top is
    not proven (hand-made result: one planned layout at 2.0 s, 7 left with bounds from 1.5 s)."""
    from tessera_lab.cli.search import format_search

    lay = S.Layout(8, 1, 8, 1, 1, 8, 1, "1f1b", "none", "alltoall")
    row = {"iteration_time_s": 2.0, "tokens_per_s": 1.0, "mfu": 0.1, "bubble_fraction": 0.1, "peak_memory_gib": 1.0,
           "headroom_gib": 1.0, "fits": True}
    res = S.SearchResult("m", 64, "H200", 4096, 1024, 10, [S.Candidate(lay, 1.0, 0.0, row)], 100,
                         {"memory (parameter state)": 0, "memory": 0, "bound": 92, "budget": 7},
                         memory_capacity_bytes=134.4 * 2**30, unplanned_bound_s=1.5)
    line = next(ln for ln in format_search(res, 3).splitlines() if ln.startswith("not proven"))
    assert line.startswith("not proven: 7 layouts left unplanned have time bounds from 1.500 s, below #1's 2.000 s")
    res.unplanned_bound_s = 2.5  # every bound above #1: proven
    assert not any(ln.startswith("not proven") for ln in format_search(res, 3).splitlines())


def test_refusals_counted_by_what_they_prove():
    """A planner refusal is classed by its exception type, not its text: a proven infeasibility, the ILP's limit
    without a fitting plan (not proven), or the message's head for anything else."""
    from tessera_lab.errors import ConfigError, InfeasiblePlanError, SolverLimitError
    from tessera_lab.plan.search import refusal_kind

    assert refusal_kind(InfeasiblePlanError("no partition into 48 virtual stages fits 134.40 GiB")) == \
        "no partition fits memory (proven)"
    assert refusal_kind(SolverLimitError("ILP stopped with status NotSolved (936 binaries over 400)")) == \
        "ILP work budget reached with no plan that fits (not proven infeasible)"
    assert refusal_kind(ConfigError("stage model: something else (42)")) == "stage model"


def test_an_ilp_limit_refusal_advises_the_search_user():
    """The search has no ILP limit options: an ILP-limit refusal in its rows names the search's own budget and
    planning the layout alone, where the planner's line named plan's options as if they were the search's."""
    from tessera_lab.errors import ConfigError, SolverLimitError
    from tessera_lab.plan.ilp import limit_text

    budget = S.VIRTUAL_ILP_BUDGET
    line = S._search_words(SolverLimitError(f"ILP stopped with status NotSolved and no solution within "
                                            f"{limit_text(budget)}; no heuristic plan fits memory either; allowed: "
                                            "a larger --ilp-max-binaries / --ilp-max-nodes or a --time-limit"))
    assert line.endswith("allowed: this layout planned alone with tessera-lab plan and a larger --ilp-max-binaries "
                         "/ --ilp-max-nodes or a --time-limit")
    assert f"({budget.max_binaries} binaries, {budget.max_nodes} nodes)" in line
    assert S._search_words(ConfigError("a: b; allowed: c\nmore")) == "a: b; allowed: c"


def test_search_counts_refusal_kinds(small):
    """The search's counts by kind add up to its refusals, and its fields hold what they name (CPU seconds of this
    search, the GPU's capacity in bytes)."""
    from tessera_lab.cost.memory import memory_capacity

    assert sum(small.error_kinds.values()) == sum(small.errors.values())
    assert 0 < small.cpu_s < 600 and small.memory_capacity_bytes == memory_capacity(S.search_cluster("H200", 64))


def test_separation_names_fields_as_the_table_does():
    """The fields that differ read as the table's columns: the optimizer (fsdp / dist-opt), EP spanning TP (yes /
    no) and the recompute with the modules it recomputes (a bare selective's are core_attn and moe_act)."""
    from tessera_lab.cli.search import separation

    res = {"iteration_time_s": 1.0, "slowest_stage_ms": 100.0, "bubble_fraction": 0.1}
    a = S.Layout(4, 1, 8, 2, 2, 8, 1, "1f1b", "selective", "alltoall", False, 1, (), True)
    b = S.Layout(4, 1, 8, 2, 2, 8, 1, "1f1b", "selective", "alltoall", True, 1, ("layernorm", "moe_act"), False)
    line = separation(S.Candidate(a, 0, 0, res), S.Candidate(b, 0, 0, res))
    assert line.startswith("EP spans TP no->yes, optimizer fsdp->dist-opt, recompute "
                           "selective(core_attn,moe_act)->selective(layernorm,moe_act): +0.0% iteration")
    same = S.Layout(4, 1, 8, 2, 2, 8, 1, "1f1b", "selective", "alltoall", False, 1, ("core_attn", "moe_act"), True)
    assert separation(S.Candidate(a, 0, 0, res), S.Candidate(same, 0, 0, res)).startswith("same layout")


def test_a_structure_that_fits_only_with_fsdp_is_planned_once_after_the_others():
    """_canonical_first, by hand: structure A (EP 8) fits with the distributed optimizer, structure B (EP 2) only with
    Megatron FSDP (its memory bound without FSDP is over capacity). A's plain layout comes first, then B's plain FSDP
    layout (although its bound is the smallest), then every other candidate in bound order."""
    def lay(ep, dp, rc, fsdp):
        return S.Layout(1, 1, ep, 1, dp, 4, 1, "1f1b", rc, "alltoall", False, 1, (), fsdp)

    class Bounds:
        def memory(self, layout):  # GiB: B without FSDP is over the 80 GiB capacity
            return (50 if layout.fsdp else 200 if layout.ep == 2 else 70) * 2**30

    b_fsdp, b_plain, a_sel = lay(2, 4, "none", True), lay(2, 4, "none", False), lay(8, 1, "selective", False)
    a_plain, a_fsdp = lay(8, 1, "none", False), lay(8, 1, "none", True)
    cands = [S.Candidate(x, t, 0.0) for x, t in ((b_fsdp, 1.0), (b_plain, 1.1), (a_sel, 1.5), (a_plain, 2.0),
                                                   (a_fsdp, 2.1))]
    got = [c.layout for c in S._canonical_first(cands, Bounds(), 80 * 2**30)]
    assert got == [a_plain, b_fsdp, b_plain, a_sel, a_fsdp]


def test_the_selective_legend_names_the_modules_that_act():
    """A model with MoE layers: the default set, core_attn and moe_act, written out by the export. Without MoE layers
    moe_act has nothing to act on: the legend names core_attn alone, as the separation line does."""
    from tessera_lab.model.hardware import selective_modules
    from tessera_lab.plan.search_export import selective_note

    def lay(recompute):
        return S.Layout(1, 1, 1, 1, 8, 4, 1, "1f1b", recompute, "alltoall", False, 1, (), False)

    assert selective_note([lay("selective")], moe=False) == (
        "selective: recompute module core_attn, Megatron-Core's own default; selective(...) names its modules")
    assert selective_note([lay("selective")]) == (
        "selective: recompute modules core_attn, moe_act (the export writes them out: Megatron-Core's own default is "
        "core_attn alone); selective(...) names its modules")
    assert selective_note([lay("none")], moe=False) is None
    assert selective_modules("selective", (), moe=False) == ("core_attn",)
    assert selective_modules("selective", ("layernorm", "moe_act", "shared_experts"), moe=False) == ("layernorm",)
    assert selective_modules("selective", ("layernorm", "moe_act")) == ("layernorm", "moe_act")
    assert selective_modules("full", (), moe=False) == ()


def test_separation_of_a_dense_model_names_only_the_modules_that_recompute():
    """Without MoE layers the MoE recompute modules recompute nothing: a bare selective reads core_attn alone."""
    from tessera_lab.cli.search import separation

    res = {"iteration_time_s": 1.0, "slowest_stage_ms": 100.0, "bubble_fraction": 0.1}
    a = S.Layout(4, 1, 8, 2, 2, 1, 1, "1f1b", "none", "alltoall", False, 1, (), False)
    b = S.Layout(4, 1, 8, 2, 2, 1, 1, "1f1b", "selective", "alltoall", False, 1, (), False)
    line = separation(S.Candidate(a, 0, 0, res), S.Candidate(b, 0, 0, res), moe=False)
    assert line.startswith("recompute none->selective(core_attn): +0.0% iteration"), line
    line = separation(S.Candidate(a, 0, 0, res), S.Candidate(b, 0, 0, res))
    assert line.startswith("recompute none->selective(core_attn,moe_act): +0.0% iteration"), line
