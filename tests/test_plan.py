"""The main job end to end: plan on every shipped model, ILP = DP, metrics by hand."""

from __future__ import annotations

import pytest

from tessera_lab.model.hardware import Cluster, ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.plan.partition import solve_dp, solve_ilp
from tessera_lab.plan.make import make_plan


def test_default_plan_covers_all_48_layers(qwen3_next):
    """The main job with its defaults: overlapped 1F1B, the ILP on stage costs after overlap."""
    plan = make_plan(qwen3_next)
    layers = [l for st in plan.chosen.stages for l in st.layers]
    assert layers == list(range(48))
    assert len(plan.chosen.stages) == 8
    assert plan.chosen.partition.status == "Optimal"
    # the ILP's slowest stage is never worse than the uniform baseline's
    assert max(s.time_s for s in plan.chosen.stages) <= max(s.time_s for s in plan.baselines["uniform"].stages) + 1e-12


def test_plan_metrics_are_consistent(qwen3_next):
    plan = make_plan(qwen3_next)
    ev, p = plan.chosen, plan.parallel
    assert ev.tokens_per_s == pytest.approx(32 * 4096 * 8 / ev.iteration_time_s)
    assert ev.mfu == pytest.approx(plan.model_flops / (ev.iteration_time_s * 64 * 989e12))
    # the iteration is at least the pipeline's critical path: (m + p - 1) slowest-stage-ish lower bound
    slowest = max(s.time_s for s in ev.stages)
    assert ev.iteration_time_s >= p.microbatches * slowest
    assert 0 < ev.bubble_fraction < 1
    d = plan.as_dict()
    for key in ("model", "method", "stages", "iteration_time_s", "tokens_per_s", "mfu", "bubble_fraction", "baselines"):
        assert key in d
    for key in ("index", "layers", "time_s", "memory_bytes"):
        assert key in d["stages"][0]
    assert set(d["baselines"]) == {"uniform", "standalone", "parameters"}


@pytest.mark.parametrize("schedule", ["overlapped", "1f1b"])
@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-8b", "qwen3-next-80b-a3b",
                                  "kimi-linear-48b-a3b", "jamba-1.5-mini"])  # tests/test_families.py plans the others
def test_ilp_equals_dp_on_shipped_models(name, schedule):
    """The ILP and the exact DP reach the same optimum on the planner's own problem, memory limits included."""
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.plan.make import planning_problem

    model = load_model(name)
    pp = 16 if model.num_layers >= 60 else 8
    ep = 8 if model.moe.num_experts else 1
    # 671B without activation recompute: shard optimizer state over 4 replicas and halve the sequence to fit
    dp, seq = {"deepseek-v3": (4, 2048), "qwen3-235b-a22b": (2, 4096)}.get(name, (1, 4096))
    parallel = ParallelConfig(pp=pp, ep=ep, dp=dp, microbatches=2 * pp, seq_len=seq, schedule=schedule)
    prob, _ = planning_problem(model, parallel, cluster_for(parallel))
    dp_res, ilp = solve_dp(prob), solve_ilp(prob)
    assert ilp.status == "Optimal"
    assert ilp.objective == pytest.approx(dp_res.objective, rel=1e-9)


def test_more_stages_than_layers():
    from tessera_lab.errors import PartitionError

    with pytest.raises(PartitionError, match="pp"):
        make_plan(load_model("qwen3-8b"), ParallelConfig(pp=40, ep=1, microbatches=40))


def test_world_larger_than_cluster(qwen3_next):
    from tessera_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="world_size"):
        make_plan(qwen3_next, ParallelConfig(), Cluster.dgx("H200", 2))


def test_memory_infeasible_plan_is_clear(qwen3_next):
    from tessera_lab.errors import InfeasiblePlanError

    # 48 layers of 512 experts on 2 stages with ep=1: far beyond 141 GB per GPU
    with pytest.raises(InfeasiblePlanError, match="GiB"):
        make_plan(qwen3_next, ParallelConfig(pp=2, ep=1, microbatches=4), method="dp", baselines=())


def test_knob_changes_move_stage_costs(qwen3_next):
    base = make_plan(qwen3_next, baselines=())
    wide = make_plan(qwen3_next.with_changes(moe_intermediate_size=1024), baselines=())
    assert wide.chosen.iteration_time_s > base.chosen.iteration_time_s
    assert wide.model_flops > base.model_flops


def test_overlap_aware_plan_never_slower_than_baselines_on_qwen3_next(qwen3_next):
    plan = make_plan(qwen3_next)
    for name in ("uniform", "standalone", "parameters"):
        assert plan.chosen.iteration_time_s <= plan.baselines[name].iteration_time_s * (1 + 1e-9), name


@pytest.mark.parametrize("changes", [{"attention_ratio": 1}, {"attention_ratio": 7}, {"moe_intermediate_size": 256}])
def test_overlap_aware_plan_not_slower_than_uniform_on_variants(qwen3_next, changes):
    plan = make_plan(qwen3_next.with_changes(**changes))
    for name in ("uniform", "standalone"):
        assert plan.chosen.iteration_time_s <= plan.baselines[name].iteration_time_s * (1 + 1e-9), name
    # the chosen plan optimises the simulated iteration; the bottleneck optimum has the smallest slowest stage
    neck = make_plan(qwen3_next.with_changes(**changes), objective="bottleneck", baselines=())
    slowest = max(s.time_s for s in neck.chosen.stages)
    assert slowest <= max(s.time_s for s in plan.baselines["standalone"].stages) + 1e-12


def test_stage_cost_after_overlap_is_sum_of_pairs(qwen3_next):
    """Stage cost after overlap = sum over k of pair(F of layer i+k, B+W of layer j-1-k) (docs/concepts.md, "Stage cost after overlap")."""
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.plan.make import layer_pair_costs

    plan = make_plan(qwen3_next)
    pairs = layer_pair_costs(qwen3_next, plan.parallel, CostModel(cluster_for(plan.parallel), plan.parallel))
    st = plan.chosen.stages[1]  # a middle stage: no embedding or head
    kinds = [qwen3_next.stack.layers[l].kind for l in st.layers]
    by_hand = sum(pairs[(kinds[k], kinds[len(kinds) - 1 - k])] for k in range(len(kinds)))
    # plus the paired forwards' host waits the paired backwards' mlp nodes do not hide (cost/sync.py)
    assert st.paired_host_sync_s > 0
    assert st.overlap_s == pytest.approx(by_hand + st.paired_host_sync_s, rel=1e-12)
    plain = make_plan(qwen3_next, plan.parallel.replace(host_sync_s=0.0))
    assert plain.chosen.stages[1].paired_host_sync_s == 0.0
    # running pairs together is faster than one after the other for this model (all-to-all hides behind compute)
    assert st.overlap_s < st.standalone_s
    # and the pair costs differ between layer-kind combinations
    assert len(set(round(v, 12) for v in pairs.values())) > 1


def test_plan_says_when_megatron_core_does_not_run_its_ep_overlap():
    # TransformerConfig's rules for overlap_moe_expert_parallel_comm: EP > 1, no full recompute, virtual stages when
    # pp > 1 (the search's overlap_rule_breaks); the plan's notes name the broken one, and say nothing otherwise
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.plan.notes import megatron_overlap_note

    note = megatron_overlap_note(ParallelConfig(pp=8, ep=8, schedule="overlapped"))
    assert "virtual pipeline stages when pp > 1" in note and "overlapped" in note
    assert megatron_overlap_note(ParallelConfig(pp=1, ep=8, schedule="overlapped")) is None
    assert megatron_overlap_note(ParallelConfig(pp=4, vpp=2, ep=8, schedule="interleaved-overlapped")) is None
    assert "a recompute granularity other than full" in megatron_overlap_note(
        ParallelConfig(pp=1, ep=8, schedule="overlapped", recompute="full"))
    assert megatron_overlap_note(ParallelConfig(pp=8, ep=8, schedule="1f1b")) is None
    # pp 2 without virtual stages and EP 1 break two rules, both named
    both = megatron_overlap_note(ParallelConfig(pp=2, ep=1, schedule="overlapped"))
    assert "expert parallelism > 1; virtual pipeline stages when pp > 1" in both


def test_megatron_overlap_note_reaches_plan_json(tmp_path, capsys):
    # the note is one of the plan's own notes: the text prints it once and --json carries it
    import json

    from tessera_lab.cli.main import main

    out = tmp_path / "p.json"
    assert main(["plan", "--pp", "4", "--ep", "8", "-m", "8", "--schedule", "overlapped", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    notes = [n for n in json.loads(out.read_text())["notes"] if n.startswith("Megatron-Core does not run")]
    assert len(notes) == 1 and "virtual pipeline stages when pp > 1" in notes[0]
    assert text.count("note: Megatron-Core does not run the schedule overlapped") == 1


def test_stage_time_is_standalone_where_the_schedule_pairs_nothing(qwen3_next):
    # overlapped 1F1B (Megatron's combined 1F1B) runs 2 (pp - r - 1) + 1 forwards on rank r before its first
    # backward; with pp = 4 and m = 4 micro-batches ranks 0 (7 > 4) and 1 (5 > 4) never pair a forward with a
    # backward, rank 2 pairs F3 with B0 and rank 3 pairs three times. An unpaired stage's time per micro-batch is its
    # standalone F + B (the simulated iteration takes no pair credit there); a paired one keeps the pair makespan.
    plan = make_plan(qwen3_next, ParallelConfig(pp=4, ep=8, dp=2, microbatches=4, schedule="overlapped"),
                     method="uniform", baselines=())
    stages = plan.as_dict()["stages"]
    for st in stages[:2]:
        assert st["paired"] is False and st["overlap_s"] < st["f_s"] + st["b_s"]
        assert st["time_s"] == pytest.approx(st["f_s"] + st["b_s"], rel=1e-12)
    for st in stages[2:]:
        assert "paired" not in st and st["time_s"] == st["overlap_s"] < st["f_s"] + st["b_s"]
    # one stage, one micro-batch: nothing can pair, so the stage shows its standalone time (as plain 1F1B would)
    one = make_plan(qwen3_next, ParallelConfig(pp=1, ep=64, dp=64, microbatches=1, schedule="overlapped"),
                    method="uniform", baselines=())
    st = one.chosen.stages[0]
    assert not st.paired and st.time_s == pytest.approx(st.f_s + st.b_s, rel=1e-12) and st.overlap_s < st.time_s


def test_auto_schedule_table_says_whether_a_refused_schedule_fits(qwen3_next):
    # GPipe keeps all m = 32 micro-batches' activations until the backward: by the 1F1B plan's own stage bytes
    # (parameters + activations per micro-batch, additive over layers), the 8 stages need sum(param + 32 x act)
    # = 1,167.9 GiB > 8 x 134.4 GiB, so some stage exceeds memory whatever the partition: gpipe does not fit ("NO");
    # a refusal for another reason (method dp with virtual stages) is not planned, and says so
    from tessera_lab.cli.plan import _trial_lines
    from tessera_lab.cost.memory import memory_capacity

    one = make_plan(qwen3_next, ParallelConfig(pp=8, ep=8, schedule="1f1b"), method="dp", baselines=())
    need = sum(st.param_bytes + 32 * st.activation_bytes for st in one.chosen.stages)
    assert one.parallel.microbatches == 32 and need > 8 * memory_capacity(one.cluster)
    auto = make_plan(qwen3_next, ParallelConfig(pp=8, ep=8, schedule="auto"), method="dp", baselines=())
    by = {t["schedule"]: t for t in auto.schedule_trials}
    assert by["gpipe"]["fits_memory"] is False and "no partition fits in memory" in by["gpipe"]["error"]
    assert "fits_memory" not in by["interleaved"] and "method 'dp' needs vpp = 1" in by["interleaved"]["error"]
    rows = {line.split()[0]: line for line in "\n".join(_trial_lines(auto)).splitlines()
            if line.split() and line.split()[0] in by}
    assert rows["gpipe"].split()[2:] == ["refused", "-", "-", "NO"]
    assert rows["interleaved"].endswith("not planned (refused)") and rows["1f1b"].endswith("yes")
