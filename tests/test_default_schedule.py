"""`plan`/`report` without --schedule: Megatron-Core's EP overlap where it runs (MoE layers and EP > 1,
``overlap_moe_expert_parallel_comm``'s requirements), 1F1B elsewhere, and each in its interleaved form with --vpp."""

from tessera_lab.pipeline.schedules import default_ep_overlap, default_schedule


def test_default_schedule_by_case():
    assert default_schedule(None, 1) == "overlapped"
    assert default_schedule(None, 2) == "interleaved-overlapped"
    assert default_schedule(None, 1, ep_overlap=False) == "1f1b"
    assert default_schedule(None, 5, ep_overlap=False) == "interleaved"
    assert default_schedule("zb-h1", 1, ep_overlap=False) == "zb-h1"  # a given schedule is kept as given
    assert default_schedule("1f1b", 4) == "1f1b"  # (and refused later for its vpp, as before)


def test_default_ep_overlap_reads_any_options():
    """The rule plan and the CPU testbed's runner plan share: options without recompute fields (the runner's) recompute
    nothing; the virtual-stage rule is waived (the one-chunk overlapped schedule)."""
    from types import SimpleNamespace as NS

    assert default_ep_overlap(NS(ep=2, pp=2, vpp=1)) is True
    assert default_ep_overlap(NS(ep=1, pp=2, vpp=1)) is False
    assert default_ep_overlap(NS(ep=2, pp=2, vpp=1, recompute="full", recompute_modules=None)) is False
    assert default_ep_overlap(NS(ep=2, pp=2, vpp=1, recompute="selective", recompute_modules=["moe"])) is False
    assert default_ep_overlap(NS(ep=8, pp=1, vpp=1), NS(has_moe=False)) is False


def test_plan_picks_the_default_from_the_model_and_vpp():
    import argparse

    from tessera_lab.cli.common import parallel_from_args
    from tessera_lab.cli.plan import add_parser
    from tessera_lab.model.spec import load_model

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))

    def schedule(argv, model):
        args = parser.parse_args(["plan", *argv])
        return parallel_from_args(args, load_model(model)).schedule

    assert schedule(["--vpp", "2"], "qwen3-30b-a3b") == "interleaved-overlapped"
    assert schedule([], "qwen3-30b-a3b") == "overlapped"
    assert schedule(["--ep", "1"], "qwen3-30b-a3b") == "1f1b"  # no EP: nothing for the EP overlap to hide
    assert schedule(["--ep", "1", "--vpp", "5", "--tp", "4"], "llama-3.1-70b") == "interleaved"
    assert schedule(["--schedule", "zb-h2"], "qwen3-8b") == "zb-h2"
    # Megatron-Core refuses its EP overlap with full recompute or the moe recompute module (TransformerConfig)
    assert schedule(["--recompute", "full"], "qwen3-30b-a3b") == "1f1b"
    assert schedule(["--recompute", "selective", "--recompute-modules", "layernorm,moe"], "qwen3-30b-a3b") == "1f1b"
    assert schedule(["--recompute", "selective", "--recompute-modules", "layernorm,moe_act"],
                    "qwen3-30b-a3b") == "overlapped"


def test_overlap_rules_name_the_moe_module():
    from tessera_lab.model.hardware import VPP_RULE, ParallelConfig, overlap_rule_breaks

    p = ParallelConfig(pp=8, vpp=1, ep=8, recompute="selective", recompute_modules=("moe",))
    assert overlap_rule_breaks(p) == ["no moe recompute module", VPP_RULE]
    assert overlap_rule_breaks(p.replace(vpp=2, recompute="selective", recompute_modules=("moe_act",))) == []


def test_auto_leaves_out_the_ep_overlap_where_megatron_cannot_run_it():
    """`--schedule auto` tries the EP-overlap schedules only with MoE layers and EP > 1 (a dense model or EP 1 has
    nothing for Megatron-Core's EP overlap to hide, and it refuses to run it), as the layout search does."""
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import auto_candidates

    moe, dense = load_model("qwen3-30b-a3b"), load_model("qwen3-8b")
    names = {n for n, _ in auto_candidates(moe, ParallelConfig(pp=4, ep=8))}
    assert {"overlapped", "interleaved-overlapped"} <= names
    for m, ep in ((moe, 1), (dense, 1), (dense, 8)):
        got = auto_candidates(m, ParallelConfig(pp=4, ep=ep))
        assert not {"overlapped", "interleaved-overlapped"} & {n for n, _ in got}
        assert ("1f1b", 1) in got and ("interleaved", 2) in got
