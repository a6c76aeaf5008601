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
# MODEL: any shipped model; the panel below offers qwen3-next-80b-a3b, kimi-linear-48b-a3b, minimax-m1,
# nemotron-h-56b, jamba-1.5-mini and qwen3.5-35b-a3b, each at a layout it fits at (MODEL_LAYOUTS)
MODEL = "qwen3-next-80b-a3b"
PP = None               # None: the model's layout (pp, ep, tp) from MODEL_LAYOUTS; or a number of stages
MICROBATCHES = 32
RATIOS = (1, 3, 7)      # attention ratios of the "what moves the needle" sweep

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display
from tessera_lab.ui.widgets import compare_partitions, partition_panel
from tessera_lab.ui.plots import standalone_vs_overlap_bars, gantt
pd.set_option("display.precision", 4)

# %% [markdown]
# ## The model choice
#
# The hybrids the panel offers, read from their `config.json` by their family's reader (docs/models.md): the mixer
# kinds of their layers, parameter counts (computed from the module shapes) and the layout each is planned at.

# %%
from tessera_lab.model.spec import load_model
from tessera_lab.ui.widgets import MODEL_LAYOUTS
pd.DataFrame([{"model": n, "family": (m := load_model(n)).family, "mixers": m.mixer_kinds(),
               "total (B)": m.param_counts().total / 1e9, "active (B)": m.param_counts().active / 1e9,
               "layout pp/ep/tp": "/".join(map(str, lay))} for n, lay in MODEL_LAYOUTS.items()]).set_index("model")

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
# ## What moves the needle: why the attention ratio barely matters here
#
# Change the attention ratio in the panel below at the default setting (EP = 8 inside a node, 4,096 tokens) and
# the iteration time moves by a few percent at most between ratios 1, 3 and 7 (the sweep below prints by how
# much). The ratio swaps a Gated
# DeltaNet layer for a full-attention layer, so it matters only as much as those two layers differ in cost, and at
# 4,096 tokens most of a layer's time is the MoE part (expert GEMMs, router, all-to-all), which both kinds share.
# The full-attention core grows with the square of the sequence while everything else grows linearly: at 32K tokens
# it is more than half of a full-attention layer.

# %%
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.teach.figures import plot_ratio_spread
from tessera_lab.teach.sensitivity import attention_ratio_sweep, layer_time_split

split = pd.concat({f"{s // 1024}K tokens": layer_time_split(MODEL, plan.parallel.replace(seq_len=s))
                   for s in (4096, 32768)})
split.round(3)

# %% [markdown]
# The same sweep in several settings. `layers (ms)` is the standalone time of all 48 decoder layers for one
# micro-batch (defined for every setting); `iteration (s)` is the planned, overlapped iteration where a plan fits
# in GPU memory (at 32K tokens none does without activation recompute: the row says so instead of a number).
# Where the attention core is a larger share of a layer (long sequences) the ratio matters; where communication
# is (EP over InfiniBand, TP all-reduces) the layers' time moves even less than at the default. The planned
# iteration can move a little more than the layers' time: the ratio also changes which layers share a stage.

# %%
sweep, spread = attention_ratio_sweep(MODEL, ratios=RATIOS)
display(sweep.set_index(["setting", "attention ratio"]).round(4))
display(spread.map(lambda x: "n/a (no plan fits)" if x != x else f"{x:.1%}"))
plot_ratio_spread(spread, RATIOS)  # "n/a (does not fit)" where no plan fits at some ratio
plt.show()

# %% [markdown]
# ## Change the model and the pipeline
#
# The model (Qwen3-Next, Kimi-Linear, MiniMax-M1, Nemotron-H, Jamba, Qwen3.5, each at its layout), attention ratio
# (linear-mixer layers per full-attention layer, placed by the family's rule), routed expert width, top-k ("config":
# the model's own), stages and micro-batches. Each change re-plans with the same functions; a knob a model does not
# have (expert width on the dense Nemotron-H) is hidden, a value the new model cannot take goes back to "config"
# (the caption says so), and a variant that cannot fit in GPU memory says so. The caption ends with how long the
# change took (wall and CPU seconds, measured). `recompute` (`none`, `selective`, `full`, the CLI's `--recompute`)
# trades time for activation memory; where the panel cannot plan (a 16K sequence on 4 stages, say), a "suggest a layout that
# fits" button runs the layout search (notebook 11) over what this panel can set on the same GPUs (the recompute
# levels, the micro-batches of the same global batch) and applies the fastest that fits.

# %% tags=["panel"]
from tessera_lab.ui.widgets import partition_panel
panel, controls, state = partition_panel(MODEL, pp=PP, microbatches=MICROBATCHES)
panel
