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
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Overlap-aware partitioning
#
# A stage's real cost is its cost **after overlap**: in the steady state of overlapped 1F1B a stage runs the forward
# of its layers for one micro-batch together with the backward of its layers for an earlier one. The forward walks
# the layers up while the backward walks them down, so layer `a+k`'s forward meets layer `b-k`'s backward, and the
# stage costs the sum of those pair makespans. Which kinds of layer meet (Gated DeltaNet with gated attention, MoE
# all-to-all with expert GEMMs) changes how much communication hides, so two stages with equal sums of standalone
# times run at different speeds. Here the ILP partitions on costs after overlap; the uniform, standalone-balanced
# and parameter-balanced partitions are simulated with the same schedule for a fair comparison.

# %% tags=["parameters"]
# parameters (planning is fast: full size runs in seconds)
MODEL = "qwen3-next-80b-a3b"
PP = 8
MICROBATCHES = 32

# %%
import matplotlib.pyplot as plt
import pandas as pd
from tessera_lab.ui.widgets import compare_partitions, partition_panel
from tessera_lab.ui.plots import standalone_vs_overlap_bars, gantt
pd.set_option("display.precision", 4)

# %% [markdown]
# ## Layer-pair costs after overlap (analytic, best issue order)

# %%
plan, table = compare_partitions(MODEL, pp=PP, microbatches=MICROBATCHES)
from tessera_lab.cost.analytic import CostModel
from tessera_lab.plan.make import layer_pair_costs
pc = layer_pair_costs(plan.model, plan.parallel, CostModel(plan.cluster, plan.parallel))
pd.DataFrame([{"forward of": kf, "backward of": kb, "pair after overlap (ms)": t * 1e3} for (kf, kb), t in pc.items()])

# %% [markdown]
# ## The partitions side by side

# %%
table

# %%
ax = standalone_vs_overlap_bars(plan)
plt.show()

# %%
ax = gantt(plan.chosen.timeline, title="overlap-aware plan: overlapped 1F1B")
plt.show()

# %% [markdown]
# ## Change the model and the pipeline
#
# Attention ratio (linear-attention layers per full-attention layer), routed expert width, top-k, stages and
# micro-batches. Each change re-plans with the same functions; a variant that cannot fit in GPU memory says so.

# %%
panel, controls, state = partition_panel(MODEL, pp=PP, microbatches=MICROBATCHES)
panel
