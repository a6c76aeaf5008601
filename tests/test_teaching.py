"""Teaching helpers (tessera_lab.teach.core): collectives on real gloo processes, cost formulas, TP vs PP volumes,
MoE all-to-all volumes and per-rank load, and the notebook panels. Expected values are worked out by hand."""

from __future__ import annotations

import multiprocessing
import sys

import pytest

from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.teach.core import (
    COLLECTIVES,
    a2a_volume_vs_topk,
    all_to_all_volumes,
    collective_cost_sweep,
    collective_cost_table,
    collective_inputs,
    collectives_frame,
    expected_collective,
    link_bandwidths,
    moe_all_to_all,
    reference_collectives,
    sample_routing,
    tp_link_sweep,
    tp_pp_layouts,
    tp_vs_pp_volumes,
)

ALPHA_NV, ALPHA_IB, ETA, ETA_IB = 1e-5, 2e-5, 0.8, 0.94  # data/hardware/cost_model.json (NVLink, InfiniBand)
NV_H100, IB = 450e9, 50e9  # bytes/s per direction: 900 GB/s bidirectional / 2, NDR 400 Gb/s


# --------------------------------------------------------------------------- collectives: data movement
def test_inputs_encode_rank_and_position():
    assert collective_inputs("all_reduce", 4) == [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    assert collective_inputs("all_gather", 4) == [[0], [10], [20], [30]]
    assert collective_inputs("all_gather", 2, chunk=2) == [[0, 1], [10, 11]]


def test_expected_collectives_by_hand():
    x = collective_inputs("all_reduce", 4)
    # all-reduce: the column sums everywhere
    assert expected_collective("all_reduce", x) == [[60, 64, 68, 72]] * 4
    # reduce-scatter: rank r keeps slice r of the sum
    assert expected_collective("reduce_scatter", x) == [[60], [64], [68], [72]]
    # all-to-all: a transpose of the rank x chunk matrix
    assert expected_collective("all_to_all", x) == [[0, 10, 20, 30], [1, 11, 21, 31], [2, 12, 22, 32], [3, 13, 23, 33]]
    # all-gather: concatenation everywhere
    assert expected_collective("all_gather", [[0], [10], [20], [30]]) == [[0, 10, 20, 30]] * 4
    # p2p ring: rank r receives rank r-1's buffer
    assert expected_collective("p2p", x) == [x[3], x[0], x[1], x[2]]
    # chunks of 2 on 2 ranks
    y = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert expected_collective("reduce_scatter", y) == [[6, 8], [10, 12]]
    assert expected_collective("all_to_all", y) == [[1, 2, 5, 6], [3, 4, 7, 8]]


def test_expected_collective_rejects_bad_input():
    with pytest.raises(ConfigError, match="kinds"):
        expected_collective("broadcast", [[1], [2]])
    with pytest.raises(ConfigError, match="multiple of 4"):
        expected_collective("all_to_all", [[1, 2, 3]] * 4)
    with pytest.raises(ConfigError, match="world_size"):
        collective_inputs("all_reduce", 1)


@pytest.fixture(scope="module")
def gloo_runs():
    from tessera_lab.teach.core import run_collectives

    return run_collectives(4, timeout_s=120)


@pytest.mark.slow
def test_run_collectives_on_gloo_matches_hand_values(gloo_runs):
    runs = gloo_runs
    assert list(runs) == list(COLLECTIVES)
    assert runs["all_reduce"].outputs == [[60.0, 64.0, 68.0, 72.0]] * 4
    assert runs["reduce_scatter"].outputs == [[60.0], [64.0], [68.0], [72.0]]
    assert runs["all_to_all"].outputs == [[0.0, 10.0, 20.0, 30.0], [1.0, 11.0, 21.0, 31.0],
                                          [2.0, 12.0, 22.0, 32.0], [3.0, 13.0, 23.0, 33.0]]
    assert runs["all_gather"].outputs == [[0.0, 10.0, 20.0, 30.0]] * 4
    assert runs["p2p"].outputs[1] == [0.0, 1.0, 2.0, 3.0] and runs["p2p"].outputs[0] == [30.0, 31.0, 32.0, 33.0]
    ref = reference_collectives(4)
    for kind in COLLECTIVES:
        assert runs[kind].inputs == ref[kind].inputs
        assert runs[kind].outputs == ref[kind].outputs
    table = collectives_frame(runs)
    assert table["as expected"].all() and len(table) == 5 * 4
    # every worker process has been reaped
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("collectives-rank")]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fork server timing is Linux-specific here")
def test_run_collectives_timeout_stops_every_process():
    from tessera_lab.teach.core import run_collectives

    with pytest.raises(TesseraError, match="timeout_s"):
        run_collectives(4, kinds=["all_reduce"], timeout_s=0.01)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("collectives-rank")]


def test_run_collectives_validates_before_spawning():
    from tessera_lab.teach.core import run_collectives

    with pytest.raises(ConfigError, match="world_size"):
        run_collectives(1)
    with pytest.raises(ConfigError, match="kinds"):
        run_collectives(2, kinds=["gather"])


# --------------------------------------------------------------------------- cost formulas
def test_cost_table_alpha_beta_by_hand():
    s = 2.0**30
    table = collective_cost_table(s, 8, "H100")
    assert list(table.index) == list(COLLECTIVES)
    assert table.loc["all_reduce", "factor"] == pytest.approx(2 * 7 / 8)
    assert table.loc["all_to_all", "factor"] == pytest.approx(7 / 8)
    assert table.loc["p2p", "factor"] == 1.0
    assert table.loc["all_reduce", "NVLink (us)"] == pytest.approx((ALPHA_NV + s * 1.75 / (NV_H100 * ETA)) * 1e6)
    assert table.loc["all_gather", "InfiniBand (us)"] == pytest.approx((ALPHA_IB + s * 0.875 / (IB * ETA_IB)) * 1e6)
    assert table.loc["p2p", "NVLink (us)"] == pytest.approx((ALPHA_NV + s / (NV_H100 * ETA)) * 1e6)
    # an all-reduce moves twice what an all-gather of the same S moves
    assert table.loc["all_reduce", "bytes per rank on the wire"] == 2 * table.loc["all_gather", "bytes per rank on the wire"]


@pytest.mark.parametrize("gpu, ratio", [("H100", 9.0), ("H200", 9.0), ("B200", 18.0)])
def test_ib_over_nvlink_tends_to_the_effective_bandwidth_ratio(gpu, ratio):
    assert link_bandwidths(gpu)["ratio_per_direction"] == pytest.approx(ratio)
    big = collective_cost_table(2.0**40, 8, gpu)
    # large messages: the bandwidth ratio at each link's NCCL efficiency (NVLink 0.8, a NIC 0.94)
    assert big["IB / NVLink"].to_numpy() == pytest.approx([ratio * ETA / ETA_IB] * 5, rel=1e-4)
    # tiny messages are latency-bound: the ratio falls to alpha_IB / alpha_NVLink
    tiny = collective_cost_table(8, 8, gpu)
    assert tiny["IB / NVLink"].to_numpy() == pytest.approx([ALPHA_IB / ALPHA_NV] * 5, rel=1e-3)


def test_cost_sweep_and_bad_sizes():
    sweep = collective_cost_sweep([2**10, 2**20, 2**30], 8, "H100")
    assert len(sweep) == 3 * 2 * 3
    times = sweep[(sweep.collective == "all_reduce") & (sweep.link == "NVLink")]["time (us)"].to_list()
    assert times == sorted(times)
    with pytest.raises(ConfigError, match="message_bytes"):
        collective_cost_table(0, 8)
    with pytest.raises(ConfigError, match="'n'"):
        collective_cost_table(1024, 1)


# --------------------------------------------------------------------------- TP vs PP
def test_tp_allreduces_two_per_layer_each_way():
    v = tp_vs_pp_volumes("qwen3-8b", tp=8, pp=4, seq_len=4096)
    assert v.allreduces_per_layer_forward == 2 and v.allreduces_per_layer_backward == 2
    assert v.allreduce_bytes == 4096 * 4096 * 2  # tokens x hidden x bf16
    assert v.layers == 36 and v.layers_per_stage == 9 and v.nodes == 4
    assert v.tp_link == "NVLink"
    # each stage boundary sits between two nodes: stage s fills node s
    assert v.boundary_links == ("InfiniBand",) * 3
    assert v.p2p_bytes == 4096 * 4096 * 2 / 8  # each of the tp ranks sends its share
    frame = v.frame()
    assert frame.loc["TP all-reduce (forward)", "per stage per micro-batch"] == 18
    assert frame.loc["TP all-reduce (backward)", "bytes per stage per micro-batch (MiB)"] == 18 * 32
    t_each = ALPHA_NV + 2**25 * 1.75 / (NV_H100 * ETA)
    assert v.tp_time_each_s == pytest.approx(t_each)
    assert v.tp_time_per_stage_s == pytest.approx(36 * t_each)
    assert v.tp_time_each_other_link_s == pytest.approx(ALPHA_IB + 2**25 * 1.75 / (IB * ETA_IB))
    assert v.p2p_time_each_s[0] == pytest.approx(ALPHA_IB + 2**22 / (IB * ETA_IB))


def test_tp_on_moe_layers_and_small_layouts():
    moe = tp_vs_pp_volumes("qwen3-next-80b-a3b", tp=4, pp=2)  # after attention and after the shared expert
    assert moe.allreduces_per_layer_forward == 2 and moe.allreduces_per_layer_backward == 2
    one_node = tp_vs_pp_volumes("qwen3-8b", tp=2, pp=4)
    assert one_node.nodes == 1 and one_node.boundary_links == ("NVLink",) * 3
    no_tp = tp_vs_pp_volumes("qwen3-8b", tp=1, pp=2)
    assert no_tp.allreduces_per_layer_forward == 0 and no_tp.tp_time_per_stage_s == 0
    cross = tp_vs_pp_volumes("qwen3-8b", tp=16, pp=1)
    assert cross.tp_link == "InfiniBand" and cross.boundary_links == ()
    with pytest.raises(ConfigError, match="'pp'"):
        tp_vs_pp_volumes("qwen3-8b", tp=1, pp=37)


def test_tp_sweep_cliff_past_one_node():
    sweep = tp_link_sweep("qwen3-8b", (2, 8, 16)).set_index("tp")
    assert list(sweep["link"]) == ["NVLink", "NVLink", "InfiniBand"]
    assert sweep.loc[16, "TP all-reduce per layer (ms)"] > 5 * sweep.loc[8, "TP all-reduce per layer (ms)"]
    assert sweep.loc[16, "compute per layer (ms)"] < sweep.loc[8, "compute per layer (ms)"]
    layouts = tp_pp_layouts("qwen3-8b", 32)
    assert list(layouts.index) == [(1, 32), (2, 16), (4, 8), (8, 4), (16, 2), (32, 1)]


# --------------------------------------------------------------------------- MoE all-to-all
def test_all_to_all_volumes_by_hand():
    # 2 EP ranks, 4 experts (rank 0 owns experts 0-1, rank 1 owns 2-3), hidden 4 in bf16: 8 bytes per copy
    counts = [[3, 1, 2, 2], [1, 1, 4, 0]]
    v = all_to_all_volumes(counts, 2, 4, dtype="bf16", gpu="H100")
    assert v.send == ((4, 4), (2, 4))
    assert v.dispatch_sent == (32.0, 16.0) and v.dispatch_received == (16.0, 32.0)
    assert v.expert_tokens == (6, 8)
    assert v.load_imbalance == pytest.approx(8 / 7)
    assert v.link == "NVLink"
    assert v.time_s == pytest.approx(ALPHA_NV + 32 / (NV_H100 * ETA))
    frame = v.frame()
    assert frame.loc[0, "combine sent (MiB)"] * 2**20 == 16.0  # the combine sends back what was received
    assert frame.loc[1, "kept local (tokens)"] == 4


def test_uniform_all_to_all_matches_the_cost_model():
    # 4 ranks x 8 experts, 10 copies each: every rank sends 20 copies to each rank, 60 of them remote
    v = all_to_all_volumes([[10] * 8] * 4, 4, 2048, dtype="bf16", expert_width=768)
    assert v.dispatch_sent == (60 * 4096.0,) * 4 and v.load_imbalance == 1.0
    assert v.time_s == pytest.approx(v.uniform_time_s)
    assert v.uniform_time_s == pytest.approx(ALPHA_NV + 80 * 4096 * 3 / 4 / (NV_H100 * ETA))
    assert len(set(v.expert_time_s)) == 1
    across = all_to_all_volumes([[10] * 16] * 16, 16, 2048)
    assert across.link == "InfiniBand"


def test_all_to_all_volumes_rejects_bad_shapes():
    with pytest.raises(ConfigError, match="shape"):
        all_to_all_volumes([[1, 2]], 2, 8)
    with pytest.raises(ConfigError, match="divide"):
        all_to_all_volumes([[1, 2, 3]] * 2, 2, 8)


def test_sample_routing_rows_caps_and_skew():
    flat = sample_routing(500, 4, 16, 3, 0.0, seed=1)
    assert flat.shape == (4, 16) and (flat == 500 * 3 // 16).sum() + (flat == 500 * 3 // 16 + 1).sum() == 64
    assert (flat.sum(axis=1) == 500 * 3).all()  # skew 0: the exact uniform split
    c = sample_routing(500, 4, 16, 3, 1.0, seed=1)
    assert (c.sum(axis=1) == 500 * 3).all() and (c <= 500).all()  # top-k distinct: at most one copy per token
    assert (sample_routing(500, 4, 16, 3, 1.0, seed=1) == c).all()  # deterministic
    hot = sample_routing(500, 4, 16, 3, 3.0, seed=1)
    assert (hot <= 500).all() and hot.max() == 500  # the hottest expert saturates: every token picks it
    assert hot.std() > c.std() > flat.std()
    assert (sample_routing(10, 2, 4, 4) == 10).all()  # top-k = E: every token visits every expert
    with pytest.raises(ConfigError, match="skew"):
        sample_routing(10, 2, 4, 1, -1.0)


def test_moe_skew_raises_imbalance_and_time():
    flat = moe_all_to_all("qwen3-30b-a3b", ep=8, skew=0.0, tokens_per_rank=2048)
    skewed = moe_all_to_all("qwen3-30b-a3b", ep=8, skew=1.5, tokens_per_rank=2048)
    assert flat.load_imbalance == 1.0 and 1.5 < skewed.load_imbalance
    assert skewed.time_s > 1.3 * flat.time_s
    assert flat.time_s == pytest.approx(flat.uniform_time_s)
    assert sum(flat.dispatch_sent) == pytest.approx(sum(skewed.dispatch_sent), rel=0.05)
    with pytest.raises(ConfigError, match="no MoE"):
        moe_all_to_all("qwen3-8b")


def test_a2a_volume_formula():
    df = a2a_volume_vs_topk("qwen3-30b-a3b", top_ks=(2, 8), eps=(4, 16), tokens_per_rank=4096)
    row = df[(df["top-k"] == 8) & (df["ep"] == 4)].iloc[0]
    assert row["dispatch per rank (MiB)"] == 4096 * 8 * 2048 * 2 * 3 / 4 / 2**20  # = 96 MiB
    assert row["link"] == "NVLink"
    assert set(df[df["ep"] == 16]["link"]) == {"InfiniBand"}


# --------------------------------------------------------------------------- panels: widgets call the pure functions
def test_collective_cost_panel_recomputes():
    pytest.importorskip("ipywidgets")
    from tessera_lab.teach.core import collective_cost_panel

    panel, controls, state = collective_cost_panel(n=8, gpu="H100", message_mib=64)
    assert state["table"].equals(collective_cost_table(64 * 2**20, 8, "H100"))
    controls["message_mib"].value = 1024.0
    controls["gpu"].value = "B200"
    assert state["table"].equals(collective_cost_table(1024 * 2**20, 8, "B200"))


def test_tp_pp_panel_recomputes():
    pytest.importorskip("ipywidgets")
    from tessera_lab.teach.core import tp_pp_panel

    panel, controls, state = tp_pp_panel("qwen3-8b", tp=8, pp=4)
    assert state["result"] == tp_vs_pp_volumes("qwen3-8b", 8, 4)
    controls["tp"].value = 16
    assert state["result"] == tp_vs_pp_volumes("qwen3-8b", 16, 4)
    assert state["result"].tp_link == "InfiniBand"


def test_moe_panel_recomputes():
    pytest.importorskip("ipywidgets")
    from tessera_lab.teach.core import moe_panel

    panel, controls, state = moe_panel("qwen3-30b-a3b", ep=8, skew=0.5, tokens_per_rank=1024)
    assert state["result"] == moe_all_to_all("qwen3-30b-a3b", ep=8, skew=0.5, tokens_per_rank=1024)
    controls["skew"].value = 1.5
    controls["top_k"].value = 4
    assert state["result"] == moe_all_to_all("qwen3-30b-a3b", ep=8, top_k=4, skew=1.5, tokens_per_rank=1024)
    controls["ep"].value = 16
    assert state["result"].link == "InfiniBand"


def test_panel_labels_are_not_cut_off():
    pytest.importorskip("ipywidgets")
    from tessera_lab.teach.core import collective_cost_panel, moe_panel, tp_pp_panel

    for make in (lambda: collective_cost_panel(show_figure=False), lambda: tp_pp_panel("qwen3-8b", show_figure=False),
                 lambda: moe_panel("qwen3-30b-a3b", tokens_per_rank=1024, show_figure=False)):
        _, controls, _ = make()
        assert all(c.style.description_width == "initial" for c in controls.values())


# --------------------------------------------------------------------------- what moves the needle
def test_attention_core_grows_with_the_square_of_the_sequence():
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.teach.sensitivity import layer_time_split

    short = layer_time_split(parallel=ParallelConfig(seq_len=4096))
    long = layer_time_split(parallel=ParallelConfig(seq_len=32768))
    # 8x the tokens: the causal full-attention core ~ s^2 (64x), the linear-attention core ~ s (8x)
    assert 48 <= long.loc["full_attention+moe", "attention core (ms)"] / short.loc["full_attention+moe",
                                                                                  "attention core (ms)"] <= 66
    assert 6 <= long.loc["linear_attention+moe", "attention core (ms)"] / short.loc["linear_attention+moe",
                                                                                    "attention core (ms)"] <= 8.5
    # at 4K tokens the core is a small part of a full-attention layer; at 32K it is the larger part
    assert short.loc["full_attention+moe", "attention core share"] < 0.25
    assert long.loc["full_attention+moe", "attention core share"] > 0.5
    parts = short[["attention core (ms)", "other compute (ms)", "communication (ms)"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(short["layer (ms)"].to_numpy())


def test_attention_ratio_matters_at_long_sequences_only():
    from tessera_lab.teach.sensitivity import attention_ratio_sweep

    settings = {"4K": {"pp": 8, "ep": 8, "seq_len": 4096}, "32K": {"pp": 8, "ep": 8, "seq_len": 32768}}
    table, spread = attention_ratio_sweep(ratios=(1, 7), settings=settings)
    assert spread.loc["4K", "spread of layers time"] < 0.05
    assert spread.loc["32K", "spread of layers time"] > 5 * spread.loc["4K", "spread of layers time"]
    # more full-attention layers (ratio 1) cost more than fewer (ratio 7)
    t = table.set_index(["setting", "attention ratio"])["layers (ms)"]
    assert t["32K", 1] > t["32K", 7]
    assert (table[table["setting"] == "4K"]["iteration (s)"].notna()).all()


# --------------------------------------------------------------------------- the model-diff headline (notebook 10)
def test_diff_headline_share_only_when_it_reads_as_one():
    from tessera_lab.report.diff import diff_headline

    labels = ("base", "variant")
    # notebook 10's case: +121.70 ms runtime overhead, -75.04 ms model work, the rest -57.85 ms: net -11.19 ms
    c = {"runtime overhead": 0.12170, "model work at peak": -0.07504, "kernel efficiency": -0.05785}
    h = diff_headline(labels, 1.7944, 1.7944 + sum(c.values()), 0.21, 0.169, c)
    assert "%)" not in h.split(";")[-1] and "-1087" not in h
    assert "largest term is runtime overhead (+121.70 ms per GPU), offset by model work at peak (-75.04 ms)" in h
    assert "net -11.19 ms per GPU" in h
    # same sign, term <= net: a share, 30 of 40 ms = 75%
    h = diff_headline(labels, 1.0, 1.04, 0.2, 0.19, {"a": 0.03, "b": 0.01})
    assert "dominated by a (+30.00 ms of +40.00 ms per GPU, 75%)" in h and "+4.0%, longer" in h
    # a net change inside 0.1% of the base: about unchanged, no share
    h = diff_headline(labels, 1.0, 1.0 + 1e-5, 0.2, 0.2, {"a": 0.02, "b": -0.01999})
    assert "about unchanged" in h and "%)" not in h.split(";")[-1]


def test_diff_headline_never_prints_a_share_outside_0_100():
    import re

    from hypothesis import given
    from hypothesis import strategies as st

    from tessera_lab.report.diff import diff_headline

    @given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=1, max_size=6))
    def check(values):
        c = {f"k{i}": v for i, v in enumerate(values)}
        h = diff_headline(("a", "b"), 2.0, max(1e-3, 2.0 + sum(values)), 0.2, 0.2, c)
        for share in re.findall(r"per GPU, (-?\d+)%\)", h):
            assert 0 < int(share) <= 100

    check()
