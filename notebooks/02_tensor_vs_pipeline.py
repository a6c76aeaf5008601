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
# # 02 · Tensor parallelism vs pipeline parallelism
#
# Two ways to split a model that does not fit on one GPU:
#
# * **Tensor parallelism (TP)** splits every weight matrix across *tp* GPUs (Megatron-LM: the first GEMM of a block by
#   columns, the second by rows). Each GPU then holds a partial sum of the block's output, and an **all-reduce**
#   adds them up: one after the attention block and one after the MLP, so **two all-reduces per layer** in the
#   forward pass and two more in the backward. They sit on the critical path: the next GEMM needs the sum.
# * **Pipeline parallelism (PP)** splits the *layers* into stages on different GPUs. Only neighbouring stages
#   talk, by **point-to-point** send/recv of one activation tensor per micro-batch (and its gradient on the way
#   back). The price is the pipeline bubble (notebook 03), which many micro-batches shrink.
#
# This notebook counts the bytes each one moves, puts each on the link it would use (NVLink inside a node of 8
# GPUs, InfiniBand between nodes) and prices it with the same alpha-beta model as notebook 01.

# %% tags=["parameters"]
# parameters: planning-only arithmetic, so the full-size values run in a second.
MODEL = "qwen3-8b"      # a dense model shows the textbook pair of all-reduces; MoE models work too
TP, PP = 8, 4           # 32 GPUs = 4 nodes of 8
SEQ_LEN = 4096
MICRO_BATCH_SIZE = 1
GPU = "H100"
GPUS = 32               # for the table of all tp x pp splits
TP_SWEEP = [1, 2, 4, 8, 16, 32]

# %%
import matplotlib.pyplot as plt
import pandas as pd
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import layer_tasks
from tessera_lab.teach.core import plot_tp_sweep, tp_link_sweep, tp_pp_layouts, tp_vs_pp_volumes
pd.set_option("display.precision", 3)
model = load_model(MODEL)
pd.Series({"layers": model.num_layers, "hidden size": model.hidden_size, "attention heads": model.attention.num_attention_heads,
           "MLP width": model.mlp.intermediate_size, "experts": model.moe.num_experts}, name=MODEL).to_frame()

# %% [markdown]
# ## Where the all-reduces are
#
# The forward tasks of one layer with tensor parallelism, as `tessera_lab.model.tasks.layer_tasks` builds them. The two
# `*_tp_allreduce` tasks are the all-reduces; every GEMM before them works on 1/tp of the weights.

# %%
lt = layer_tasks(model, 0, ParallelConfig(tp=TP, pp=1, ep=1, seq_len=SEQ_LEN, micro_batch_size=MICRO_BATCH_SIZE))
pd.DataFrame([{"task": t.name, "op": t.op, "GFLOP": t.flops / 1e9,
               "collective": f"{t.collective.kind} over {t.collective.group} ({t.collective.group_size} ranks)" if t.collective else "",
               "message (MiB)": t.collective.bytes / 2**20 if t.collective else None} for t in lt.F])

# %% [markdown]
# ## Volumes and links for one micro-batch
#
# Each all-reduce carries the whole activation of the micro-batch: tokens x hidden x 2 bytes (bf16), whatever *tp*
# is. A stage boundary carries the same tensor once (split over the *tp* ranks, each sending its share) forward,
# and its gradient once backward. Ranks are placed TP innermost, so a TP group of up to 8 sits in one node; the
# stages then spread over the nodes and their boundaries cross InfiniBand.

# %%
v = tp_vs_pp_volumes(model, TP, PP, seq_len=SEQ_LEN, micro_batch_size=MICRO_BATCH_SIZE, gpu=GPU)
hand = SEQ_LEN * MICRO_BATCH_SIZE * model.hidden_size * 2
assert v.allreduce_bytes == hand or TP == 1
print(f"one all-reduce: {SEQ_LEN} tokens x {model.hidden_size} x 2 bytes = {hand / 2**20:.1f} MiB; "
      f"one stage boundary per direction: {v.p2p_bytes / 2**20:.1f} MiB per rank")
pd.Series(v.summary(), name=f"tp={TP}, pp={PP}, {v.nodes} node(s)").to_frame()

# %%
v.frame()

# %% [markdown]
# Per micro-batch a stage of *L/pp* layers runs *4·L/pp* all-reduces of the full activation on its critical path,
# while the pipeline sends one activation and one gradient across each boundary. That is why TP must stay on
# NVLink and PP is the parallelism that crosses nodes.
#
# ## What if TP left the node?
#
# Compute per layer shrinks as 1/tp; the all-reduce bytes do not. Up to *tp* = 8 the group is inside a node; at 16 it
# spans two nodes and every all-reduce runs at InfiniBand speed:

# %%
sweep = tp_link_sweep(model, TP_SWEEP, seq_len=SEQ_LEN, micro_batch_size=MICRO_BATCH_SIZE, gpu=GPU)
fig = plot_tp_sweep(sweep, title=f"{MODEL}: compute vs TP all-reduce per layer ({SEQ_LEN} tokens, {GPU})")
plt.show()
sweep

# %% [markdown]
# ## The same GPUs, split differently
#
# All power-of-two ways to place the model on `GPUS` GPUs, from pure pipeline to pure tensor parallelism. The
# communication time is per micro-batch on the busiest stage, next to that stage's compute:

# %%
tp_pp_layouts(model, GPUS, seq_len=SEQ_LEN, micro_batch_size=MICRO_BATCH_SIZE, gpu=GPU)

# %% [markdown]
# Pure pipeline parallelism moves the least, but it pays with the bubble, (pp - 1)/m of the work for 1F1B with m
# micro-batches, and every stage must hold its activations for the micro-batches in flight. Large jobs therefore
# combine them: TP (and EP for MoE layers) inside a node, PP and data parallelism across nodes.
#
# ## Try it
#
# Change *tp*, *pp*, the sequence length and the GPU. The callback only calls `tp_vs_pp_volumes`.

# %% tags=["panel"]
from tessera_lab.teach.core import tp_pp_panel
panel, controls, state = tp_pp_panel(MODEL, tp=TP, pp=PP, seq_len=SEQ_LEN, gpu=GPU)
panel

# %% [markdown]
# Questions to try:
#
# 1. Double the sequence length: which volumes double, and does the TP share of the step change?
# 2. Set *tp* = 16: how much slower is each all-reduce, and is it still worth it?
# 3. With *tp* = 2 and *pp* = 16, how many stage boundaries cross nodes?
