# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Layer tasks and overlap
#
# A MoE layer is not one kernel but a small graph of tasks: the mixer (projections and the attention core), the
# router, the **dispatch all-to-all**, the grouped expert GEMMs, the **combine all-to-all** and the shared expert.
# On a GPU, compute runs on one stream and communication on another, so the all-to-all of one micro-batch can
# hide under the GEMMs of another. How much hides depends on *which* tasks meet, and compute and communication
# slow each other down while they overlap. This notebook shows
#
# 1. the tasks of one Qwen3-Next layer and their timeline on the two lanes (compute, comm),
# 2. the overlap of a forward (micro-batch i+1) with a backward (micro-batch i): alone, together, the gain and the
#    overlap efficiency `e = (t_a + t_b - t_ab) / min(t_a, t_b)` (which can be negative),
# 3. the overlap table for every layer-kind combination as a heatmap, and why a stage's cost after overlap is not
#    the sum of its standalone times,
# 4. a real measurement on this machine's CPU (the runtime's node executor on two gloo processes), and the shipped
#    CPU profile,
# 5. sliders for expert width and top-k: the hidden fraction of communication falls as expert GEMMs get short.
#
# Times from the analytic model are for an H200 cluster (`data/hardware/cost_model.json` states every assumption);
# CPU times are real but at shapes scaled down by a size factor, so only their *shape* carries over.

# %% tags=["parameters"]
# parameters: small values so the tests run this notebook in well under a minute
MODEL = "qwen3-next-80b-a3b"
EP = 8                       # expert-parallel size (8 = inside one NVLink node)
EP_CROSS_NODE = 16           # EP over two nodes for the expert-width sweep (communication-heavy)
SCHED_BUDGET = 400           # orders the overlap scheduler evaluates per pair
RUN_CPU = True               # run a real cpu-backend measurement
CPU_SIZE_FACTOR = 1 / 32     # widths and sequence length x this factor for the cpu backend
CPU_REPEATS = 3
CPU_BUDGET_S = 60            # wall seconds the cpu measurement may take (repeats and orders are sized to it)
SWEEP_WIDTHS = (64, 256, 1024, 2048)
SWEEP_TOPK = (4, 10)
# the model choice of section 6: other hybrids, the pair of their first linear-mixer layer's forward with their first
# full-attention layer's backward (any shipped model: `tessera-lab models`)
OTHER_MODELS = ("kimi-linear-48b-a3b", "minimax-m1", "nemotron-h-56b", "jamba-1.5-mini")

# %%
import warnings

import matplotlib.pyplot as plt
import pandas as pd

from tessera_lab.overlap import core as ov
from tessera_lab.overlap import profiles as pr
from tessera_lab.cost.analytic import Contention, CostModel
from tessera_lab.model.hardware import ParallelConfig, cluster_for
from tessera_lab.model.spec import load_model
from tessera_lab.ui.plots import lane_gantt, overlap_heatmap

pd.set_option("display.precision", 4)
model = load_model(MODEL)
parallel = ParallelConfig(ep=EP, pp=1)
cost_model = CostModel(cluster_for(parallel), parallel)
print(model.layer_pattern(), " (L = Gated DeltaNet linear attention, A = gated full attention; all MoE)")

# %% [markdown]
# ## 1 · The tasks of one layer
#
# The forward of layer 0 (linear attention + MoE) for one micro-batch of 4,096 tokens on one of 8 EP ranks:
# FLOPs, bytes, what each task waits for, and its analytic time on an H200.

# %%
f0 = ov.bundle(model, 0, "F", parallel)
pd.DataFrame([{"task": t.name, "op": t.op, "GFLOP": t.flops / 1e9, "MB moved": (t.collective.bytes if t.is_comm else t.bytes) / 1e6,
               "waits for": ", ".join(t.deps), "time (us)": cost_model.task_time(t) * 1e6} for t in f0.tasks])

# %% [markdown]
# Alone, the layer's only overlap is the shared expert beside the dispatch all-to-all; everything else
# waits. The comm lane sits idle most of the time, and compute waits for the all-to-alls.

# %%
ax = lane_gantt(ov.lane_timeline(f0, cost_model=cost_model), title="forward of layer 0 alone (program order)")
plt.show()

# %% [markdown]
# ## 2 · Forward of micro-batch i+1 with the backward of micro-batch i
#
# Bundle a: the forward of layer 0; bundle b: the full backward (B then W) of layer 3 (full attention + MoE). The
# overlap scheduler searches dependency-respecting issue orders (program order is always a candidate; the search
# is exhaustive for small bundles and a seeded local search otherwise) and evaluates each with the two-lane
# executor. While both lanes are busy, each compute task and collective run at the rates their demands on the
# shared SMs, HBM and host thread give (the contention term, `tessera_lab.cost.contention.shared_rates`).

# %%
b3 = ov.bundle(model, 3, "BW", parallel)
res = ov.measure_pair(f0, b3, "analytic", cost_model=cost_model, budget=SCHED_BUDGET)
s = res.schedule
pd.DataFrame({"time (ms)": {
    "t_a (F0 alone)": res.t_a * 1e3, "t_b (BW3 alone)": res.t_b * 1e3, "t_a + t_b": (res.t_a + res.t_b) * 1e3,
    "program order (a then b per lane)": s.program_makespan * 1e3, "best order t_ab": res.t_ab * 1e3,
    "all tasks on one lane": s.one_lane_makespan * 1e3}}).assign(
    note=["", "", "serial", "", f"{s.method} search, {s.evaluated} orders", ""])

# %%
print(f"gain {res.gain * 1e3:.3f} ms, overlap efficiency {res.overlap_efficiency:.3f}, "
      f"hidden fraction of communication {res.comm_hidden_fraction:.2f}")
ax = lane_gantt(ov.lane_timeline(f0, b3, order=res.order, cost_model=cost_model),
                title="F0 (micro-batch i+1) with BW3 (micro-batch i), best issue order")
plt.show()

# %% [markdown]
# Per-task inflation is the time a task takes together divided by its time alone: the GEMMs that overlap an
# all-to-all stretch by the contention factor.

# %%
infl = pd.Series(res.inflation, name="inflation").sort_values(ascending=False)
infl.head(8).to_frame()

# %% [markdown]
# **Efficiency can be negative.** Overlap only pays if the time two kernels save by running together exceeds
# what they lose by slowing each other down. A hand example (the one `tests/test_overlap.py` works through): a
# 2 s GEMM beside an independent 1 s all-to-all, with contention compute 1.0 / comm 1.5 (while both run, the GEMM
# progresses at 1/2 of its speed and the all-to-all at 1/2.5). The all-to-all ends at 2.5 s, when the GEMM has
# done 1.25 s of its 2 s; the last 0.75 s run alone, so t_ab = 3.25 s against t_a + t_b = 3 s and
# e = (3 − 3.25) / min(2, 1) = −0.25: running them together is slower than one after the other.

# %%
from tessera_lab.model.tasks import Collective, Task

gemm = ov.Bundle.from_tasks("GEMM", [Task("gemm", 0, "F", "gemm")], durations={"F.gemm": 2.0})
a2a = ov.Bundle.from_tasks("A2A", [Task("a2a", 0, "F", "all_to_all", collective=Collective("all_to_all", 1.0, "ep", 8))],
                           durations={"F.a2a": 1.0})
hand = ov.measure_pair(gemm, a2a, "analytic", contention=Contention(1.0, 1.5))
print(f"t_a {hand.t_a:.2f} s, t_b {hand.t_b:.2f} s, t_a + t_b {hand.t_a + hand.t_b:.2f} s, t_ab {hand.t_ab:.2f} s, "
      f"efficiency {hand.overlap_efficiency:+.2f}")

# %% [markdown]
# The same happens on the real layer pair F0 / BW3 when contention is heavy (both lanes 4x slower while they
# overlap, `Contention(3.0, 3.0)`), depending on the issue order:
#
# * **program order** (all of F0, then all of BW3, on each lane) overlaps *nothing* here: BW3's compute queues
#   behind F0's on the compute lane and BW3's all-to-alls wait for BW3's compute, so the pair runs serially and
#   e = 0 exactly, whatever the contention;
# * **the order the scheduler chose above** (for the default contention) hides every all-to-all under a GEMM;
#   under heavy contention those overlaps cost more than they save and e is **negative**;
# * **the scheduler, re-run with the heavy contention**, finds that any overlap now loses time and picks an order
#   that avoids overlapping (hidden fraction 0): e ≈ 0, the serial time. It never does worse than program order.

# %%
heavy = Contention(3.0, 3.0)
cases = {
    "program order": ov.measure_pair(f0, b3, "analytic", cost_model=cost_model, contention=heavy,
                                     order=ov.pair_graph(f0, b3).program_order),
    "order chosen for the default contention": ov.measure_pair(f0, b3, "analytic", cost_model=cost_model,
                                                               contention=heavy, order=res.order),
    "scheduler, re-run for heavy contention": ov.measure_pair(f0, b3, "analytic", cost_model=cost_model,
                                                              contention=heavy, budget=SCHED_BUDGET),
}
pd.DataFrame([{"issue order (heavy contention 3.0 / 3.0)": name, "t_a + t_b (ms)": (r.t_a + r.t_b) * 1e3,
               "t_ab (ms)": r.t_ab * 1e3, "efficiency": round(r.overlap_efficiency, 3) + 0.0,
               "comm hidden": round(r.comm_hidden_fraction, 3) + 0.0}
              for name, r in cases.items()]).set_index("issue order (heavy contention 3.0 / 3.0)")

# %% [markdown]
# ## 3 · The overlap table and the stage cost after overlap
#
# Every combination of layer kinds that can meet in a stage: the forward of one kind against the backward of the
# other, both ways round.

# %%
table = ov.overlap_table(model, parallel, "analytic", cost_model=cost_model, budget=SCHED_BUDGET)
table[["kind_f", "kind_b", "t_f", "t_b", "t_sum", "t_pair", "gain", "efficiency", "comm_hidden_fraction"]]

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.4), layout="constrained")
overlap_heatmap(table, ax=axes[0], value="gain")
overlap_heatmap(table, ax=axes[1], value="efficiency")
plt.show()
from tessera_lab.report import headline
spread = ov.overlap_spread(table)
print(f"overlap spread (best gain / worst gain): {headline.ratio_note(spread) or format(spread, '.3g')}")

# %% [markdown]
# With EP inside one NVLink node the all-to-alls are short enough to hide completely in every combination, so
# the analytic gains barely differ. The paper measured up to 3x between combinations on real kernels; the CPU
# profile below is a real measurement.
#
# In the steady state of overlapped 1F1B a stage with layers i..j-1 pairs layer i+k's forward with layer
# j-1-k's backward. Its cost is the sum of those pair times, not the sum of standalone times:

# %%
kinds = [l.kind for l in model.stack.layers[:6]]   # a stage of layers 0-5: L L L A L L
after = ov.stage_pair_cost(kinds, ov.pair_costs_from_table(table))
standalone = ov.stage_pair_cost(kinds, ov.pair_costs_from_table(table, "t_sum"))
print(f"stage of layers 0-5: standalone sum {standalone * 1e3:.3f} ms, after overlap {after * 1e3:.3f} ms "
      f"({(1 - after / standalone):.1%} less)")

# %% [markdown]
# ## 4 · A real measurement on this machine (cpu backend)
#
# Measuring is running: the pair is run with the runtime's own node executor (the runner's layers at the model's
# shapes times `CPU_SIZE_FACTOR`, the five nodes of each layer issued in a candidate order) on an EP group of two
# gloo processes, timed with the host clock (CUDA events on a GPU). Each side alone, then program order, Megatron's
# order and the best searched orders together, narrowed by successive halving; a challenger wins only when its
# quartiles clear program order's. We report medians and quartiles, and the sizing: what a probe planned for
# `CPU_BUDGET_S` seconds.

# %%
if RUN_CPU:
    from tessera_lab.runner.measure.harness import measure_layer_pairs

    (cpu,) = measure_layer_pairs(model, ParallelConfig(ep=2, pp=1), "cpu", size_factor=CPU_SIZE_FACTOR,
                                 repeats=CPU_REPEATS, warmup=1, budget_s=CPU_BUDGET_S, fixed=("size_factor",),
                                 pairs=[(f0.kind, b3.kind)], timeout_s=240)
    display(pd.DataFrame({q: {k: v * 1e3 for k, v in cpu.spread[q].items() if k in ("median", "q1", "q3", "min", "max")}
                          for q in ("t_a", "t_b", "t_ab", "t_program")}).T.rename(columns=lambda c: c + " (ms)"))
    sz = cpu.metadata["sizing"]
    print(headline.efficiency_note(cpu.overlap_efficiency) or f"efficiency {cpu.overlap_efficiency:.3f}",
          f"hidden fraction {cpu.comm_hidden_fraction:.2f}, decision: {cpu.metadata['search']['decision']['verdict']}",
          f"device {cpu.metadata['device']}, torch {cpu.metadata['torch']}, size factor {cpu.metadata['size_factor']}",
          f"sizing: budget {sz['budget_s']:g} s, took {sz['wall_s']} s wall, {sz['cpu_s']} s CPU, load average "
          f"{sz['load_average_1m']['before']}; reduced: {'; '.join(sz['reductions']) or 'nothing'}", sep="\n")

# %% [markdown]
# The shipped profile `data/profiles/cpu-qwen3-next-small.json` holds the full table measured the same way with
# `tessera-lab measure --backend cpu` (size factor 1/8, two gloo processes) on a busy 2-core machine; its `sizing`
# records the budget, what was reduced, the wall and CPU seconds and the load average. Loading it elsewhere warns that
# it is stale (another device), which is the point: a profile belongs to its machine.

# %%
from tessera_lab.paths import data_dir

path = data_dir() / "profiles" / "cpu-qwen3-next-small.json"
if path.exists():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = pr.load_profile(path)
    print("stale here:" if prof.stale_reasons else "current on this machine", *prof.stale_reasons[:2], sep="\n  ")
    psz = prof.data.get("sizing") or {}
    if psz:
        print(f"measured with repeats {psz['plan']['repeats']}, {psz['plan']['keep']} orders per pair, size factor "
              f"{psz['size_factor']:g}, in {psz['wall_s']} s wall ({psz['cpu_s']} s CPU) at load average "
              f"{psz['load_average_1m']['before']}-{psz['load_average_1m']['after']}")
    ptable = prof.table()
    shown = ptable[["kind_f", "kind_b", "t_f", "t_b", "t_sum", "t_pair", "t_pair_q1", "t_pair_q3", "gain", "efficiency"]].copy()
    shown["validity"] = headline.overlap_validity(ptable)  # efficiency > 1 and gains within the noise are flagged
    cols = ["t_f", "t_b", "t_sum", "t_pair", "t_pair_q1", "t_pair_q3", "gain"]
    shown[cols] *= 1e3
    display(shown.rename(columns={c: f"{c} (ms)" for c in cols}))
    overlap_heatmap(ptable, value="gain", title="measured gain on this CPU (ms)")
    plt.show()
    measured_after = ov.stage_pair_cost(kinds, ov.pair_costs_from_table(ptable))
    measured_sum = ov.stage_pair_cost(kinds, ov.pair_costs_from_table(ptable, "t_sum"))
    print(f"CPU profile, stage of layers 0-5: standalone sum {measured_sum * 1e3:.1f} ms, "
          f"after overlap {measured_after * 1e3:.1f} ms; spread of gains (best / worst): "
          f"{headline.ratio_note(ov.overlap_spread(ptable), 'spread') or format(ov.overlap_spread(ptable), '.3g')}")
    planner = pr.profile_stage_pair_costs(prof, model, parallel, cost_model)
    display(pd.DataFrame([{"forward of": kf, "backward of": kb, "planner pair cost (ms)": t * 1e3}
                          for (kf, kb), t in planner.items()]))
else:
    print("no shipped CPU profile")

# %% [markdown]
# ## 5 · Expert width and top-k: when expert GEMMs get short, less communication hides
#
# With EP across two nodes (`EP_CROSS_NODE`), the all-to-alls go over InfiniBand and outweigh the compute of a
# layer. The expert GEMMs are the compute that can hide them; make them short and the hidden fraction falls
# (the paper: large expert GEMMs hid 73% of EP communication, short ones 26%). More experts per token (top-k)
# add communication faster than compute.
#
# Which share is this? The share of **one F/BW layer pair's** communication hidden under that pair's compute
# (`tessera_lab.report.headline.ep_hidden_share_pair`). The paper's 73% / 26% and what `tessera-lab report`
# prints are shares of **a whole iteration's** EP all-to-all time (`ep_hidden_share_iteration`), which also
# counts the warm-up and cool-down, where no pair overlaps: the iteration share is the lower of the two.

# %%
cross = ParallelConfig(ep=EP_CROSS_NODE, pp=1)
sweep = ov.hidden_fraction_sweep(model, cross, expert_widths=SWEEP_WIDTHS, top_ks=SWEEP_TOPK, budget=SCHED_BUDGET)
import seaborn as sns
ax = sns.lineplot(data=sweep, x="expert_width", y="comm_hidden_fraction", hue="top_k", marker="o", palette="colorblind")
ax.set(xscale="log", xlabel="routed expert width (intermediate size)", ylabel="hidden fraction of EP communication",
       title=f"F/BW pair of layer 0, EP={EP_CROSS_NODE} over two nodes (analytic)")
plt.show()
sweep[["expert_width", "top_k", "expert_gemm_s", "comm_s", "comm_hidden_fraction", "efficiency"]]

# %% [markdown]
# The panel: expert width and top-k of the first MoE layer's F/BW pair, and the model (Qwen3-Next or one of
# `OTHER_MODELS`; the width and top-k you set apply to the chosen model; Nemotron-H is dense and says so).

# %% tags=["panel"]
from tessera_lab.teach.panels import overlap_panel

panel, controls, state = overlap_panel(MODEL, ep=EP_CROSS_NODE, budget=SCHED_BUDGET, models=OTHER_MODELS)
panel

# %% [markdown]
# ## 6 · Other hybrids: the model choice
#
# The same F/BW pair on the other hybrids (`OTHER_MODELS` in the parameters cell): the forward of the first
# linear-mixer layer (KDA, lightning attention, Mamba-2, Mamba) against the backward of the first full-attention
# layer (MLA, GQA), analytic, EP = 8. Nemotron-H has no MoE: its blocks hold a mixer or an MLP, so there is no
# all-to-all to hide and the gain comes from compute meeting compute only. The tasks of each mixer kind are in
# `tessera_lab/model/mixers.py`.

# %%
from tessera_lab.model.spec import load_model as _load

def pair_row(name: str) -> dict:
    m = _load(name)
    pick = lambda mixer: next((l for l in m.stack.layers if l.mixer == mixer and l.ffn == "moe"),  # noqa: E731
                              next(l for l in m.stack.layers if l.mixer == mixer))  # a MoE layer where there is one
    lin, full = pick("linear_attention"), pick("full_attention")
    cm = CostModel(cluster_for(parallel), parallel)
    fa, bb = ov.bundle(m, lin.index, "F", parallel), ov.bundle(m, full.index, "BW", parallel)
    r = ov.measure_pair(fa, bb, "analytic", cost_model=cm, budget=SCHED_BUDGET)
    comm = sum(cm.task_time(t) for t in fa.tasks + bb.tasks if t.is_comm)
    return {"model": name, "mixers": m.mixer_kinds(), "forward of": f"{lin.label} layer {lin.index}",
            "backward of": f"{full.label} layer {full.index}", "F alone (ms)": r.t_a * 1e3,
            "BW alone (ms)": r.t_b * 1e3, "together (ms)": r.t_ab * 1e3, "efficiency e": r.overlap_efficiency,
            "EP communication (ms)": comm * 1e3}

pd.DataFrame([pair_row(n) for n in (MODEL, *OTHER_MODELS)]).set_index("model")

# %% [markdown]
# ## What to take away
#
# * A stage's time is set by pairs of bundles running together, not by the sum of standalone task times.
# * Overlap has a price: while compute and communication share the device both slow down, and the efficiency
#   can fall below zero. A scheduler that chooses *which* tasks overlap avoids that: under heavy contention its
#   best order overlaps nothing (e ≈ 0) instead of losing time.
# * Measure on the device you will train on: `scripts/gpu_check.sh` measures one pair at real shapes on CUDA GPUs
#   (`tessera-lab measure --backend cuda`), and the planner can take its pair costs from the profile
#   (`tessera_lab.overlap.profiles.profile_stage_pair_costs`).
