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
# # 03 · Bubbles and micro-batches
#
# Pipeline parallelism splits a model's layers into **stages**, one group per GPU (a *rank*). A batch is cut
# into **micro-batches** that flow through the stages: forward (F) from the first stage to the last, backward
# (B) back again. At the start and the end of every iteration some ranks wait for work: that idle rank-time is
# the **bubble**.
#
# In this notebook you will
#
# * simulate one iteration of a schedule and see it as a Gantt chart (one row per rank, the number on each bar
#   is the micro-batch);
# * compare the simulated bubble with the closed form from the literature;
# * see how more micro-batches, interleaving (several model chunks per rank), splitting the backward into
#   input-gradient (I) and weight-gradient (W) passes, and overlapping F with B shrink the bubble.
#
# Two bubble measures (both used by `tessera_lab`):
#
# * `bubble_fraction` = idle rank-time / (iteration time × ranks): the share of the GPUs' time lost;
# * `bubble_overhead` = idle rank-time / useful work: Megatron-LM's measure, `(p - 1) / m` for 1F1B.
#
# | schedule | iteration time with uniform stage times `F`, `B` (per chunk) | source |
# |---|---|---|
# | GPipe, 1F1B | `(m + p - 1)(F + B)` | GPipe; Narayanan et al., SC21 |
# | interleaved 1F1B, `v` chunks | `v·m(F + B) + (p - 1)(F + B)`: overhead `(p - 1)/(v·m)` | Narayanan et al., SC21 |
# | ZB-H1 | `m(F + B) + (p - 1)(F + I - W)`, `I = B - W` | Qi et al., ICLR 2024 |
# | ZB-H2 | `m(F + B) + (p - 1)·max(F, F + I - 2W)` | Qi et al., ICLR 2024 |
# | DualPipeV | bubble `(PP/2 - 1)(F&B + B - 3W)`, `PP = 2p` (PP counts DualPipe's ranks; DualPipeV is DualPipe on 2p ranks cut in half onto p) | DeepSeek DualPipe README |
# | overlapped 1F1B | `p(F + B) + (m - 1)·F&B` | this library |
#
# `F&B` is the time of a forward and a backward of different micro-batches run *together* (overlapped).
# Perfect overlap would make it `max(F, B)`; no overlap makes it `F + B`.

# %% tags=["parameters"]
# Parameters (small defaults so the notebook runs in seconds; change them freely)
SCHEDULE = "1f1b"        # gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | dualpipev | overlapped
PP = 4                   # pipeline ranks p
MICROBATCHES = 8         # micro-batches m per iteration
VPP = 2                  # chunks per rank for "interleaved"
F, B, W, FB = 1.0, 2.0, 1.0, 2.5   # seconds per stage (chunk): forward, full backward, weight grad, overlapped F&B
P2P_LATENCY = 0.0        # seconds per stage-to-stage hop (closed forms assume 0)
SWEEP_MAX_MICROBATCHES = 16

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from IPython.display import display

from tessera_lab.errors import ScheduleError
from tessera_lab.ui.plots import gantt
from tessera_lab.pipeline.schedules import SCHEDULE_NAMES
from tessera_lab.pipeline.simulate import compare_with_closed_form
from tessera_lab.teach.panels import bubble_table

sns.set_theme(context="notebook", style="whitegrid")


# %% [markdown]
# ## One schedule: simulated beside the closed form
#
# `compare_with_closed_form` builds the schedule, simulates it with the same `F`, `B`, `W`, `F&B` on every
# stage, and puts the textbook value beside the simulated one. Each closed form rests on assumptions: every
# stage takes the same time, no p2p transfer time between stages, and per schedule more (interleaved: `m` a
# multiple of `p`; ZB-H1: `W ≤ min(F, I)`; ZB-H2: also `m ≥ 2p - 1`; DualPipeV: `I = F`, `W ≤ F`; overlapped:
# `F&B ≥ max(F, B)`). `assumptions` lists them with whether these inputs satisfy them; `exact` is all of them.
# Outside them (interleaved with `m < p`, any schedule with `P2P_LATENCY > 0`) the closed form is only a guide and
# may be far off: read the simulated column.

# %%
def vpp_for(name, vpp=VPP):
    return vpp if name == "interleaved" else 1


res = compare_with_closed_form(SCHEDULE, PP, MICROBATCHES, F, B, W, FB, vpp=vpp_for(SCHEDULE), p2p_latency=P2P_LATENCY)
display(bubble_table(res).round(4))  # labelled rows with units; float round-off shown as 0
print("closed form:", res["formula"])
print("source:     ", res["source"])
print("exact here: ", res["exact"], "-", res["note"] or "simulator and formula agree")
for a in res["assumptions"]:
    print(("  holds:   " if a["holds"] else "  OUTSIDE: ") + a["assumption"])
gantt(res["timeline"])
plt.show()

# %% [markdown]
# ## All schedules on the same model
#
# To compare schedules fairly, give each **rank** the same work per micro-batch: with `per_rank_times=True`,
# `F`, `B`, `W` and `F&B` are per rank and are divided among the rank's chunks (2 for interleaved with `v = 2`,
# 2 for DualPipeV). Peak activations count micro-batches whose forward has run but whose backward (or W) has
# not: the memory price of a smaller bubble.

# %%
rows = []
for name in SCHEDULE_NAMES:
    try:
        r = compare_with_closed_form(name, PP, MICROBATCHES, F, B, W, FB, vpp=vpp_for(name), per_rank_times=True)
    except ScheduleError as exc:  # e.g. DualPipeV needs m >= 2p
        rows.append({"schedule": name, "note": str(exc)})
        continue
    rows.append({
        "schedule": name,
        "iteration (sim)": r["simulated"]["makespan"],
        "iteration (closed form)": r["closed_form"]["makespan"],
        "bubble_fraction": r["simulated"]["bubble_fraction"],
        "bubble_overhead": r["simulated"]["bubble_overhead"],
        "peak activations": r["simulated"]["peak_activations"],
        "exact": r["exact"],
        "outside the assumptions": "; ".join(a["assumption"].split(" (")[0] for a in r["assumptions"]
                                             if not a["holds"]) or "-",
    })
table = pd.DataFrame(rows).set_index("schedule")
display(table.round(3))

# %% [markdown]
# ## More micro-batches shrink the bubble
#
# For 1F1B the bubble per rank stays `(p - 1)(F + B)` while the useful work grows as `m(F + B)`, so
# `bubble_fraction = (p - 1)/(m + p - 1)` falls with `m`. Interleaving divides the bubble by `v`; ZB-H1 shrinks
# it by moving weight-gradient work into it. Dots: simulated; lines (or x where a schedule runs at some
# micro-batch counts only): closed form.

# %%
sweep = []
for m in range(PP, SWEEP_MAX_MICROBATCHES + 1):
    for name in ("1f1b", "interleaved", "zb-h1"):
        try:
            r = compare_with_closed_form(name, PP, m, F, B, W, FB, vpp=vpp_for(name), per_rank_times=True)
        except ScheduleError:
            continue
        sweep.append({"micro-batches": m, "schedule": name,
                      "simulated": r["simulated"]["bubble_fraction"],
                      "closed form": r["closed_form"]["bubble_fraction"]})
sweep = pd.DataFrame(sweep)
from tessera_lab.teach.figures import plot_bubble_sweep
plot_bubble_sweep(sweep, PP)  # a schedule defined at some counts only: closed form as markers, no line across gaps
plt.show()

# %% [markdown]
# ## Try it
#
# Change the schedule, the number of ranks and micro-batches, and the stage times. The panel only calls
# `compare_with_closed_form` and `gantt`; settings a schedule cannot run (1F1B with fewer micro-batches than
# stages, for instance) show the library's error instead of a plot.

# %% tags=["panel"]
from tessera_lab.teach.panels import bubble_panel

panel, controls, state = bubble_panel(SCHEDULE, PP, MICROBATCHES, VPP, F, B, W, FB, P2P_LATENCY)
panel

# %% [markdown]
# ## What to notice
#
# * With `F&B = F + B` the overlapped 1F1B takes exactly as long as 1F1B; every second of overlap gain is
#   saved once per micro-batch.
# * ZB-H2 and DualPipeV buy their small bubbles with memory (more micro-batches in flight).
# * Set `P2P_LATENCY` above zero: the closed forms ignore it, the simulator does not. Each hop on the critical
#   path adds its latency once.
# * Export any timeline with `res["timeline"].to_chrome_trace("trace.json")` and open it in
#   [Perfetto](https://ui.perfetto.dev).
