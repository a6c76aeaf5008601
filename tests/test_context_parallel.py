"""Context parallelism and rack-scale hardware: communication volumes worked out by hand from the configs and
datasheets, the NVLink domain of each GPU type, and the planner's CP layouts."""

from __future__ import annotations

import json

import pytest

from tessera_lab.cli.main import main
from tessera_lab.cost.analytic import CostModel
from tessera_lab.errors import ConfigError
from tessera_lab.model.graph import Collective
from tessera_lab.model.hardware import ParallelConfig, cluster_for, cost_assumptions
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import layer_tasks


def _task(lt, phase, name):
    return next(t for t in getattr(lt, phase) if t.name == name)


def _layer(model, kind_letter_attention):
    return next(l for l in model.stack.layers if l.attention == kind_letter_attention)


# --------------------------------------------------------------------------------------------- volumes by hand
def test_full_attention_ring_bytes_by_hand():
    """qwen3-next gated attention: 2 KV heads of 256, seq 65536 over cp 4 -> 16384 tokens a rank. K and V of a rank:
    16384 x 2 x 2 x 256 x 2 bytes = 33,554,432; the ring's all-gather S = 4 x that = 134,217,728 bytes (each rank
    sends 3/4 of it); the backward sends K, V and their gradients: twice."""
    m = load_model("qwen3-next-80b-a3b")
    layer = _layer(m, "gated_gqa")
    p = ParallelConfig(pp=1, ep=8, cp=4, seq_len=65536, expert_load=1.0)
    lt = layer_tasks(m, layer, p)
    f, b = _task(lt, "F", "cp_kv"), _task(lt, "B", "cp_kv")
    assert (f.collective.kind, f.collective.group, f.collective.group_size) == ("all_gather", "cp", 4)
    assert f.collective.bytes == 134_217_728
    assert b.collective.bytes == 2 * 134_217_728
    # the attention core's FLOPs: causal pairs of the whole sequence over cp: 4 x 65536^2 / 2 x 16 heads x 256 / 4
    assert _task(lt, "F", "core").flops == pytest.approx(4 * 65536**2 / 2 * 16 * 256 / 4)
    # the ring overlaps the core: the core does not wait for it, its consumer does
    assert "cp_kv" not in _task(lt, "F", "core").deps
    assert "cp_kv" in _task(lt, "F", "output_gate").deps


def test_full_recompute_reruns_the_ring():
    m = load_model("qwen3-next-80b-a3b")
    p = ParallelConfig(pp=1, ep=8, cp=2, seq_len=8192, recompute="full", expert_load=1.0)
    lt = layer_tasks(m, _layer(m, "gated_gqa"), p)
    ring = _task(lt, "F", "cp_kv").collective.bytes
    assert ring == 2 * 4096 * 2 * 2 * 256 * 2  # cp x tokens x (K + V) x 2 heads x 256 x bf16
    assert _task(lt, "B", "cp_kv").collective.bytes == 3 * ring  # forward again, then K, V and their gradients


def test_gated_deltanet_all_to_alls_by_hand():
    """qwen3-next Gated DeltaNet, Megatron-Core's qkvzba all-to-all: q, k (16 heads x 128 each), v, z (32 heads x 128
    each), b, a (32 each) = 2 x 2048 + 2 x 4096 + 64 = 12,352 elements a token; 8192 tokens a rank (seq 16384 / cp 2)
    in bf16: S = 8192 x 12352 x 2 = 202,375,168 bytes. Back: the gated norm's 4096 channels: 67,108,864 bytes."""
    m = load_model("qwen3-next-80b-a3b")
    p = ParallelConfig(pp=1, ep=8, cp=2, seq_len=16384, expert_load=1.0)
    lt = layer_tasks(m, _layer(m, "gated_deltanet"), p)
    a_in, a_out = _task(lt, "F", "cp_a2a_in"), _task(lt, "F", "cp_a2a_out")
    assert (a_in.collective.kind, a_in.collective.group, a_in.collective.group_size) == ("all_to_all", "cp", 2)
    assert a_in.collective.bytes == 202_375_168
    assert a_out.collective.bytes == 67_108_864
    assert _task(lt, "B", "cp_a2a_in").collective.bytes == 202_375_168  # the reverse all-to-all, same bytes
    # the all-to-all sits between the in-projection and the convolution, and before the out-projection
    assert _task(lt, "F", "conv1d").deps == ("cp_a2a_in",)
    assert _task(lt, "F", "out_proj").deps == ("cp_a2a_out",)
    assert "cp_kv" not in {t.name for t in lt.F}


@pytest.mark.parametrize("tp, width", [
    # tp 1: z, x 16384 each; B, C 8 groups x 256; dt 256 heads: 32768 + 4096 + 256
    (1, 37_120),
    # tp 4: 4096 + 4096 + 2 groups a rank repeated to cp 4 -> 2 x 4 x 256 + 64 heads
    (4, 10_304),
])
def test_mamba2_all_to_all_by_hand(tp, width):
    """Nemotron-H 56B Mamba-2 (256 heads of 64, 8 groups, state 256) at cp 4, seq 8192 -> 2048 tokens a rank, bf16;
    Megatron repeats B and C when a rank has fewer groups than cp (``group_repeat_count``)."""
    m = load_model("nemotron-h-56b")
    p = ParallelConfig(pp=1, ep=1, tp=tp, cp=4, seq_len=8192)
    lt = layer_tasks(m, _layer(m, "mamba2"), p)
    assert _task(lt, "F", "cp_a2a_in").collective.bytes == 2048 * width * 2
    assert _task(lt, "F", "cp_a2a_out").collective.bytes == 2048 * (16384 // tp) * 2


def test_activations_divide_by_cp():
    """Every saved activation is per token, so cp 2 halves a layer's saved bytes (expert load fixed at 1)."""
    m = load_model("qwen3-next-80b-a3b")
    for attention in ("gated_gqa", "gated_deltanet"):
        layer = _layer(m, attention)
        one = sum(t.saved_bytes for t in layer_tasks(m, layer, ParallelConfig(pp=1, seq_len=16384, expert_load=1.0)).F)
        two = sum(t.saved_bytes for t in layer_tasks(
            m, layer, ParallelConfig(pp=1, seq_len=16384, cp=2, expert_load=1.0)).F)
        assert two == pytest.approx(one / 2)


def test_cp_layout_and_counting():
    p = ParallelConfig(pp=2, ep=4, tp=2, cp=2, dp=1)
    assert p.world_size == 2 * 4 * 2 * 2
    assert p.tokens_per_iteration == ParallelConfig(pp=2, ep=4, tp=2).tokens_per_iteration  # same global batch
    assert p.group_ranks("tp") == [0, 1]
    assert p.group_ranks("cp") == [0, 2]  # CP next to TP (Megatron's tp-cp-ep-dp-pp)
    # EP spans CP as in Megatron-Core's expert grid: the 8 ranks of TP index 0 in a stage (0, 2, ..., 14), in
    # rank order, cut into cp = 2 groups of ep = 4
    assert p.group_ranks("ep") == [0, 2, 4, 6]
    assert p.group_ranks("ep", ep_i=2) == [8, 10, 12, 14]
    assert ParallelConfig(pp=1, ep=8, cp=2).ep_link_ranks() == list(range(8))  # inside one DGX node
    assert p.dense_shard_dp == 8 and p.expert_dp == 4
    assert sorted(r for k in ("tp", "cp", "ep") for r in p.group_ranks(k)) != list(range(16))  # groups differ


def test_cp_refusals():
    with pytest.raises(ConfigError, match="field 'cp' = 3"):
        ParallelConfig(cp=3, seq_len=4096)
    m = load_model("qwen3-next-80b-a3b")
    with pytest.raises(ConfigError, match="does not divide the 16 gated_deltanet heads"):
        layer_tasks(m, _layer(m, "gated_deltanet"), ParallelConfig(pp=1, cp=32, seq_len=65536))


@pytest.mark.parametrize("argv, needle", [
    (["--cp", "3"], "field 'cp' = 3"),
    (["--cp", "2", "--nodes", "8"], "exceeds the cluster's 64 GPUs"),
    (["--cp", "0"], "cp = 0"),
])
def test_cli_bad_cp(argv, needle, capsys):
    try:
        rc = main(["plan", *argv])
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


# --------------------------------------------------------------------------------------------- rack-scale hardware
def test_ep64_inside_nvl72_across_nodes_on_h200():
    """An EP group of 64 sits in one GB200 NVL72 NVLink domain but spans 8 DGX H200 nodes. Hand-worked all-to-all
    of S bytes: GB200, all over NVLink 5 (1.8 TB/s bidirectional = 900 GB/s a direction): S x 63/64 / 900e9.
    H200, 8 ranks a node: 56/64 of S leaves the node over the 400 Gb/s NIC (50 GB/s) and 7/64 stays on NVLink
    (450 GB/s); the NIC part is the slower: S x 56/64 / 50e9. Bandwidth terms' ratio: (56/50) / (63/900) = 16."""
    p = ParallelConfig(pp=1, ep=64, tp=1, dp=1)
    gb, h = cluster_for(p, "GB200"), cluster_for(p, "H200")
    assert (gb.num_nodes, gb.gpus_per_node) == (1, 72)
    assert (h.num_nodes, h.gpus_per_node) == (8, 8)
    ranks = p.ep_link_ranks()
    assert len({gb.node_of(r) for r in ranks}) == 1 and len({h.node_of(r) for r in ranks}) == 8
    assert gb.link_for(ranks).name == "NVLink" and h.link_for(ranks).name == "InfiniBand"
    S = 1e9
    a = cost_assumptions()
    coll = Collective("all_to_all", S, "ep", 64)
    t_gb = CostModel(gb, p).collective_time(coll) - a["alpha_intra_node_s"]
    t_h = CostModel(h, p).collective_time(coll) - a["alpha_inter_node_s"]
    eff, eff_ib = a["nccl_bus_efficiency"], a["nccl_bus_efficiency_inter_node"]  # NVLink 0.8, a NIC 0.94
    assert t_gb == pytest.approx(S * 63 / 64 / (900e9 * eff))
    assert t_h == pytest.approx(S * 56 / 64 / (50e9 * eff_ib))
    # (56/64 / 50 GB/s) / (63/64 / 900 GB/s) = 16 at line rate; at the links' efficiencies 16 x 0.8 / 0.94
    assert t_h / t_gb == pytest.approx(16.0 * eff / eff_ib)


def test_gpu_figures_from_datasheets():
    """GB200 NVL72 page: 360 PFLOPS sparse BF16, 13.4 TB HBM3e, 576 TB/s, 130 TB/s NVLink for 72 GPUs; HGX B300:
    36 PFLOPS sparse BF16 and 2.3 TB for 8 GPUs, 800 Gb/s ConnectX-8 per GPU."""
    from tessera_lab.model.hardware import GPUSpec

    gb, b3 = GPUSpec.named("GB200"), GPUSpec.named("b300")
    assert gb.peak_flops == pytest.approx(360e15 / 2 / 72)
    assert gb.hbm_bytes_per_s == pytest.approx(576e12 / 72)
    assert gb.nvlink_bytes_per_s == pytest.approx(130e12 / 72 / 2, rel=0.01)
    assert gb.memory_bytes == pytest.approx(13.4e12 / 72, rel=0.001)
    assert (gb.nvlink_domain, b3.nvlink_domain, GPUSpec.named("H200").nvlink_domain) == (72, 8, 8)
    assert b3.peak_flops == pytest.approx(36e15 / 2 / 8)
    assert b3.memory_bytes == pytest.approx(2.3e12 / 8, rel=0.002)
    assert b3.nic_bytes_per_s == pytest.approx(800e9 / 8)


def test_plan_gb200_default_inside_one_nvlink_domain(capsys):
    assert main(["plan", "--gpu", "GB200", "--method", "uniform", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["gpu"], out["gpus"], out["nodes"]) == ("GB200", 64, 1)  # 64 GPUs in one 72-GPU NVLink domain
    p = ParallelConfig()
    c = cluster_for(p, "GB200")
    assert c.num_nodes == 1 and all(c.node_of(r) == 0 for r in range(p.world_size))


def test_cp4_faster_than_cp2_at_64k(capsys):
    """The acceptance layout: qwen3-next at 65,536 tokens, pp 8 ep 8, full recompute; cp 4 doubles the GPUs a
    sequence gets (256 against 128) for the same micro-batches, so its iteration is shorter."""
    times = {}
    for cp in (2, 4):
        assert main(["plan", "--model", "qwen3-next-80b-a3b", "--seq-len", "65536", "--pp", "8", "--ep", "8",
                     "--recompute", "full", "--cp", str(cp), "--json", "-"]) == 0
        times[cp] = json.loads(capsys.readouterr().out)
    it = {cp: d["iteration_time_s"] for cp, d in times.items()}
    assert it[4] < it[2]


def test_plan_json_keeps_cp():
    """A CP plan's JSON records cp and re-evaluates to the same iteration (plan.load)."""
    from tessera_lab.plan.load import load_plan
    from tessera_lab.plan.make import make_plan

    m = load_model("qwen3-next-80b-a3b")
    par = ParallelConfig(pp=4, ep=8, cp=2, seq_len=16384, microbatches=8, recompute="full")
    plan = make_plan(m, par, None, method="uniform", gpu="H200")
    d = plan.as_dict()
    assert d["parallel"]["cp"] == 2 and d["gpus"] == 4 * 8 * 2
    again = load_plan(d)
    assert again.parallel == par
    assert again.chosen.iteration_time_s == pytest.approx(plan.chosen.iteration_time_s)


def test_cp_ring_on_the_right_link():
    """TP 8 x CP 2: the CP pair (ranks 0 and 8) spans two DGX H200 nodes (the ring runs at the 50 GB/s NIC) but one
    GB200 NVL72 rack (900 GB/s NVLink a direction): S x 1/2 over each. 64 GPUs (EP 4), so every CP pair is in the
    one rack (at 128 GPUs the pairs of ranks 64-79 would straddle the rack boundary at 72)."""
    m = load_model("qwen3-next-80b-a3b")
    p = ParallelConfig(pp=1, ep=4, tp=8, cp=2, seq_len=16384, expert_load=1.0)
    assert p.group_ranks("cp") == [0, 8]
    ring = _task(layer_tasks(m, _layer(m, "gated_gqa"), p), "F", "cp_kv").collective
    a = cost_assumptions()
    eff = a["nccl_bus_efficiency"]
    t_h = CostModel(cluster_for(p, "H200"), p).collective_time(ring)
    t_gb = CostModel(cluster_for(p, "GB200"), p).collective_time(ring)
    assert t_h == pytest.approx(a["alpha_inter_node_s"] + ring.bytes / 2 / (50e9 * a["nccl_bus_efficiency_inter_node"]))
    assert t_gb == pytest.approx(a["alpha_intra_node_s"] + ring.bytes / 2 / (900e9 * eff))


def test_a_cp_group_leaving_its_nvlink_domain_is_named():
    # TP 4 x CP 4: the CP ranks are 4 apart (0, 4, 8, 12), two nodes of 8 on H200, one NVL72 rack on GB200;
    # TP 1 x CP 4 stays inside a node. Qwen3-235B-A22B is full attention only: only the KV ring is named.
    from tessera_lab.model.hardware import ParallelConfig, cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.notes import cp_span_note

    m = load_model("qwen3-235b-a22b")
    p = ParallelConfig(pp=8, ep=8, tp=4, cp=4, seq_len=65536)
    note = cp_span_note(m, p, cluster_for(p, "H200"))
    assert "(ranks 0, 4, 8, 12: 2 domains of 8 GPUs)" in note, note
    assert "their KV ring (full attention) run on InfiniBand" in note and "all-to-all" not in note
    # 256 GPUs of GB200 in 4 racks of 72 (tp x cp = 16 does not divide 72): some CP groups straddle a rack
    assert "span NVLink domains" in cp_span_note(m, ParallelConfig(pp=2, ep=8, tp=4, cp=4, seq_len=65536),
                                                  cluster_for(ParallelConfig(pp=2, ep=8, tp=4, cp=4), "GB200"))
    single = ParallelConfig(pp=1, ep=4, tp=4, cp=4, seq_len=65536)  # 64 GPUs, one rack
    assert cp_span_note(m, single, cluster_for(single, "GB200")) is None
    assert cp_span_note(m, ParallelConfig(pp=8, ep=8, tp=1, cp=4, seq_len=65536), cluster_for(p, "H200")) is None
    # a hybrid names both: the ring of its attention layers and the all-to-alls of its Gated DeltaNet layers
    hybrid = cp_span_note(load_model("qwen3-next-80b-a3b"), ParallelConfig(pp=8, ep=8, tp=2, cp=8, seq_len=65536),
                          cluster_for(p, "H200"))
    assert "KV ring" in hybrid and "all-to-alls" in hybrid


def _cp_groups_by_brute_force(p: ParallelConfig) -> list[list[int]]:
    """Every CP group, from the rank layout alone: the grid's tp axis holds tp x cp (position cp_i x tp + tp_i);
    a rank's CP group is the cp ranks with its pp, dp, ep and tp_i."""
    g = p.grid
    groups = set()
    for r in range(p.world_size):
        pp_i, dp_i, ep_i, t = g.coords(r)
        groups.add(tuple(g.rank(pp_i, dp_i, ep_i, c * p.tp + t % p.tp) for c in range(p.cp)))
    return sorted(map(list, groups))


def test_cp_groups_beyond_the_first_cross_a_gb200_rack():
    # a fact of the layout: 1,024 GB200 ranks of TP 4 x CP 4 fill racks of 72 unevenly, so some CP groups straddle
    # a rack (ranks 64, 68, 72, 76: racks 0 and 1) while rank 0's group (0, 4, 8, 12) does not
    p = ParallelConfig(pp=8, ep=8, tp=4, cp=4, seq_len=65536)
    gb = cluster_for(p, "GB200")
    groups = _cp_groups_by_brute_force(p)
    assert len(groups) == p.world_size // p.cp and [0, 4, 8, 12] in groups and [64, 68, 72, 76] in groups
    crossing = [grp for grp in groups if len({gb.node_of(r) for r in grp}) > 1]
    assert len(crossing) == 28, len(crossing)


def test_a_cp_collective_is_priced_on_its_slowest_groups_link():
    # every CP group runs the collective in lockstep: the one straddling a rack sets the time (the NIC), although
    # rank 0's group sits in one rack; the plan's note names a straddling group
    from tessera_lab.model.layout import slowest_group
    from tessera_lab.plan.notes import cp_span_note

    p = ParallelConfig(pp=8, ep=8, tp=4, cp=4, seq_len=65536)
    gb = cluster_for(p, "GB200")
    a = cost_assumptions()
    S = 1e9
    t = CostModel(gb, p).collective_time(Collective("all_gather", S, "cp", 4))
    slowest = min(gb.link_for(grp).bytes_per_s for grp in _cp_groups_by_brute_force(p))
    assert slowest == gb.inter_link().bytes_per_s
    # the straddling group has 2 ranks in each rack: the spanning rule of the cost model (two NICs per rack carry
    # the crossing traffic), against NVLink alone for rank 0's group
    from tessera_lab.cost.analytic import spanning_bus_bytes_per_s

    eff = a["nccl_bus_efficiency"]
    spanning = spanning_bus_bytes_per_s(2, gb.inter_link().bytes_per_s * a["nccl_bus_efficiency_inter_node"],
                                        gb.intra_link().bytes_per_s * eff)  # each link at its own efficiency
    assert t == pytest.approx(a["alpha_inter_node_s"] + S * 3 / 4 / spanning)
    assert t > 5 * (a["alpha_intra_node_s"] + S * 3 / 4 / (gb.intra_link().bytes_per_s * eff))
    worst = list(slowest_group(p, gb.gpus_per_node, "cp"))
    assert worst in _cp_groups_by_brute_force(p) and len({gb.node_of(r) for r in worst}) == 2
    assert "span NVLink domains" in cp_span_note(load_model("qwen3-235b-a22b"), p, gb)
    # on nodes of 8 (powers of two throughout) rank 0's group stands for all: the same placement, no enumeration
    h = cluster_for(p, "H200")
    assert list(slowest_group(p, 8, "cp")) == p.group_ranks("cp")
    assert all(len({h.node_of(r) for r in grp}) == 2 for grp in _cp_groups_by_brute_force(p))


def test_worst_tp_cp_ep_placement_does_not_depend_on_the_stage_replica_split():
    # the per-layer cost caches share costs across pipeline sizes and replicas (plan.stages.cost_key_parallel);
    # that is exact only if the worst-placed TP, CP and EP group on a world is the same whatever pp x dp; checked
    # by brute force over every group (from the rank formula, not slowest_group's translates) on racks of 72
    import itertools

    from tessera_lab.model.layout import ranks_per_node, slowest_group

    def key(ranks) -> tuple:
        per = ranks_per_node(ranks, 72)
        return len(per) > 1, -min(per.values()), len(per)

    def worst(p: ParallelConfig, kind: str) -> tuple:
        axes = {"pp": p.pp, "dp": p.dp, "ep": p.ep, "tp": p.tp, "cp": p.cp}
        groups: dict[tuple, list[int]] = {}
        for c in itertools.product(*(range(n) for n in axes.values())):
            coord = dict(zip(axes, c))
            rest = tuple(v for k, v in coord.items() if k != kind)
            groups.setdefault(rest, []).append(p.rank(coord["pp"], coord["dp"], coord["ep"], coord["tp"],
                                                      coord["cp"]))
        return max(key(g) for g in groups.values())

    cases = ((144, 2, 1, 16, ("tp", "ep")), (144, 4, 4, 1, ("tp", "cp")), (216, 2, 2, 1, ("tp", "cp")),
             (144, 1, 1, 48, ("ep",)))
    for world, tp, cp, ep, kinds in cases:
        rest = world // (tp * cp * ep)
        splits = [(pp, rest // pp) for pp in range(1, rest + 1) if rest % pp == 0]
        for kind in kinds:
            found = {worst(ParallelConfig(pp=pp, dp=dp, ep=ep, tp=tp, cp=cp, microbatches=2 * pp), kind)
                     for pp, dp in splits}
            assert len(found) == 1, (world, tp, cp, ep, kind, found)
            for pp, dp in splits:  # slowest_group finds that placement at every split
                p = ParallelConfig(pp=pp, dp=dp, ep=ep, tp=tp, cp=cp, microbatches=2 * pp)
                assert {key(slowest_group(p, 72, kind))} == found
