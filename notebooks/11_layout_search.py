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
# # 11 · Which layout should I train on? The layout search
#
# Notebooks 00 and 06 plan a layout you choose. This one chooses it: `tessera_lab.plan.search.search` (the
# library behind `tessera-lab search`, docs/search.md) enumerates the layouts Megatron-Core can run for a model on N
# GPUs (TP, EP, PP with VPP, data-parallel replicas, micro-batching, schedule, recompute, dispatcher), rules most out
# by a memory bound and a lower bound on the iteration, and plans the rest with the planner of `tessera-lab plan`.
# Every tokens/s below is simulated by that planner from the analytic cost model; memory is computed.

# %% tags=["parameters"]
# parameters: the panel runs the search with a planning budget of MAX_PLANS full planner runs (tessera-lab search's
# default is 210, planned in batches of up to 8, so up to 216); a search at this size takes a few CPU seconds (the caption
# measures each change)
MODEL = "qwen3-next-80b-a3b"
GPU = "H200"            # H100, H200, B200, B300 (8-GPU nodes) or GB200 (NVL72 racks of 72 GPUs)
GPUS = 64
SEQ_LEN = 4096
MAX_PLANS = 48

# %%
import time

import matplotlib.pyplot as plt
from tessera_lab.report.formatting import display_frame
from tessera_lab.ui.search_panel import layout_plan, layout_search, pp_ep_grid, search_heatmap, top_table
from tessera_lab.ui.plots import gantt

# %% [markdown]
# ## One search
#
# The top layouts that fit memory, fastest first (`ep N*`: the EP group spans the TP ranks). The counts say how
# many layouts were enumerated, how many each rule pruned, and how many the budget left unplanned (their lower
# bounds say how fast they could be at best).

# %%
t0, c0 = time.perf_counter(), time.process_time()
res = layout_search(MODEL, GPUS, gpu=GPU, seq_len=SEQ_LEN, max_plans=MAX_PLANS)
print(f"searched in {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU (measured)")
pruned = ", ".join(f"{n:,} by {rule}" for rule, n in res.pruned.items() if n)
print(f"{res.enumerated:,} layouts enumerated; pruned {pruned or 'none'}; {len(res.planned)} planned, "
      f"{len(res.ranked)} fit memory")
display_frame(top_table(res))  # one number format per column, by the unit its label states

# %% [markdown]
# ## Tokens/s over (pp, ep)
#
# Each cell is the best planned layout with that pipeline depth and EP size, whatever its TP, data-parallel
# replicas, micro-batching, schedule, recompute and dispatcher; grey cells had no planned layout that fits (pruned by
# memory or by the time bound, or left at the budget). The outlined cell holds layout #1, drawn below.

# %%
grid = pp_ep_grid(res)
search_heatmap(grid, (res.ranked[0].layout.pp, res.ranked[0].layout.ep))
plt.show()

# %%
best = layout_plan(res, res.ranked[0])
gantt(best.chosen.timeline, title=f"#1: {res.ranked[0].layout.text()}")
plt.show()

# %% [markdown]
# ## Search interactively
#
# Pick the model (every shipped model), the GPU type, the GPU count (4, half a node as on a workstation, or multiples
# of 8: whole 8-GPU nodes, or on GB200 part of an NVL72 rack or whole racks of 72), the
# sequence length (1,024 to 131,072 tokens; from 8,192 on, the search tries context parallelism with at least 4,096
# tokens per CP rank) and the model knobs that apply (attention ratio for hybrids, expert width and top-k for MoE
# models; "config" is the model's own value). The planning budget bounds the full planner runs per search; the caption
# says how many layouts it left unplanned (raise it to 210, the CLI's default, for the search `tessera-lab search`
# runs) and the wall and CPU seconds the last change took. "timeline of" draws another of the top layouts without
# searching again. Where the search refuses the GPU count as too few for the model's memory, or no planned layout
# fits, the refusal names a count at which some layout passes both memory bounds, and a button searches on it.
# Planning panels 00 and 06 offer a "suggest a layout that fits" button where they cannot plan; it runs the same
# search over the layouts their controls can set.

# %% tags=["panel"]
from tessera_lab.ui.search_panel import search_panel
panel, controls, state = search_panel(MODEL, gpu=GPU, gpus=GPUS, seq_len=SEQ_LEN, max_plans=MAX_PLANS)
panel
