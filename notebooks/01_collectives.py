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
# # 01 · The five collectives
#
# Every parallel training job is computation plus a handful of communication patterns, the **collectives**:
#
# | collective | what every rank ends up with | where it appears |
# |---|---|---|
# | **all-reduce** | the sum of every rank's buffer | data-parallel gradients, tensor-parallel partial sums |
# | **all-gather** | every rank's piece, concatenated | sharded weights (ZeRO/FSDP), sequence parallelism |
# | **reduce-scatter** | its own slice of the sum | sharded gradients; all-reduce = reduce-scatter + all-gather |
# | **all-to-all** | chunk *r* of every rank (a transpose: *n(n-1)* pairs talk) | MoE dispatch and combine |
# | **point-to-point** | what one partner sent it | pipeline stages passing activations and gradients |
#
# First we run all five for real, on 4 local processes talking through PyTorch's `gloo` backend, and look at the
# data before and after. Then we price them: the alpha-beta formula with nccl-tests' bus-bandwidth factors, on
# NVLink (inside an 8-GPU node) and on InfiniBand (between nodes).

# %% tags=["parameters"]
# parameters: the tests run these small values; they are also the sensible teaching values.
WORLD_SIZE = 4          # local gloo processes
CHUNK = 1               # elements per rank per chunk
GPU = "H100"            # H100 | H200 | B200 (sets the NVLink bandwidth)
GROUP = 8               # ranks n in the cost formulas (8 = one node)
MESSAGE_MIB = 64        # message size S for the cost table (the slider starts here)
SIZES = [2**i for i in range(10, 33, 2)]   # 1 KiB .. 4 GiB for the size sweep

# %%
import matplotlib.pyplot as plt
import pandas as pd
from tessera_lab.teach.core import (collective_cost_sweep, collective_cost_table, collectives_frame, link_bandwidths,
                                  plot_collectives, plot_cost_bars, plot_cost_vs_size, run_collectives)
pd.set_option("display.precision", 3)
pd.set_option("display.max_colwidth", 60)

# %% [markdown]
# ## Run them on 4 processes
#
# `run_collectives` starts `WORLD_SIZE` processes (a fork server imports torch once, so this takes a few seconds),
# joins them in a gloo process group and runs each collective on small buffers. Element *j* of rank *r* holds
# `10·r + j`, so the tens digit of every value tells you which rank it came from. Each process returns what it held
# before and after; all of them are stopped before the call returns (and on any error, within a timeout).

# %%
runs = run_collectives(WORLD_SIZE, chunk=CHUNK)
table = collectives_frame(runs)
assert table["as expected"].all(), "gloo disagrees with the plain-Python reference"
table

# %% [markdown]
# The column *as expected* compares each output with the same data movement written in plain Python
# (`tessera_lab.teach.core.expected_collective`). The picture below colours each value by the rank it came from;
# hatched grey cells are sums over all ranks.

# %%
fig = plot_collectives(runs)
plt.show()

# %% [markdown]
# Read it row by row:
#
# * **all-reduce**: every rank holds the column sums (0+10+20+30 = 60, ...): the same answer everywhere.
# * **all-gather**: each rank contributed one value and holds all four.
# * **reduce-scatter**: rank *r* keeps only element *r* of the sum: a quarter of the all-reduce's result, for half its
#   traffic. An all-gather of those slices would complete the all-reduce (that is how a ring all-reduce works).
# * **all-to-all**: rank *r* receives chunk *r* of everyone: the matrix of ranks x chunks is transposed. Every pair
#   of ranks exchanges data, which is why it is the heaviest pattern and the one MoE layers run twice per layer.
# * **point-to-point**: here a ring, each rank sends to *r+1*: a pipeline stage handing its activations on.

# %% [markdown]
# ## What they cost: the alpha-beta model
#
# The time of a collective on a group of *n* ranks is modelled as
#
# $$ t = \alpha + \frac{S \cdot f(n)}{B \cdot \eta} $$
#
# * *S*: the message size as nccl-tests defines it (the buffer for all-reduce, the gathered output for
#   all-gather, ...);
# * *f(n)*: nccl-tests' **bus-bandwidth factor**, the share of *S* each rank must push over its busiest link:
#   2(n-1)/n for all-reduce (reduce-scatter then all-gather), (n-1)/n for all-gather, reduce-scatter and
#   all-to-all, 1 for point-to-point;
# * *B*: the per-GPU, per-direction link bandwidth, *η* the fraction of it NCCL reaches, *α* the base latency
#   (`data/hardware/cost_model.json` states each value and its source).

# %%
links = link_bandwidths(GPU)
print(f"{links['gpu']}: NVLink / InfiniBand per direction {links['ratio_per_direction']:.0f}x, bidirectional NVLink vs "
      f"one direction of IB {links['ratio_bidirectional_nvlink_vs_ib']:.0f}x (often quoted: "
      f"{links['quoted_ratio_range'][0]}-{links['quoted_ratio_range'][1]}x); NCCL reaches "
      f"eta = {links['nccl_bus_efficiency']:.0%} of NVLink's and {links['nccl_bus_efficiency_inter_node']:.0%} of "
      "InfiniBand's line rate")
pd.DataFrame({
    "bandwidth B per direction (GB/s)": {"NVLink": links["nvlink_bytes_per_s"] / 1e9,
                                         "InfiniBand": links["infiniband_bytes_per_s"] / 1e9},
    "latency alpha (us)": {"NVLink": links["nvlink_latency_s"] * 1e6, "InfiniBand": links["infiniband_latency_s"] * 1e6},
}).rename_axis(f"{links['gpu']} link")

# %% [markdown]
# NVLink datasheets quote **bidirectional** totals (900 GB/s on H100 and H200, 1,800 GB/s on B200); one direction
# carries half. InfiniBand NDR gives each GPU 50 GB/s per direction. So per direction NVLink is 9x (H100) or 18x
# (B200) faster; the often quoted "18-36x" compares the bidirectional NVLink figure with one direction of
# InfiniBand. Either way, chatty parallelism belongs inside a node.

# %%
cost = collective_cost_table(MESSAGE_MIB * 2**20, GROUP, GPU)
cost

# %%
fig = plot_cost_bars(cost, title=f"S = {MESSAGE_MIB} MiB on a group of {GROUP} ({GPU})")
plt.show()

# %% [markdown]
# For large messages the latency *α* no longer matters and the InfiniBand / NVLink ratio tends to the bandwidth
# ratio; for small ones both links are latency-bound and the ratio falls to about *α_IB / α_NVLink*. The sweep
# shows both regimes:

# %%
sweep = collective_cost_sweep(SIZES, GROUP, GPU)
fig = plot_cost_vs_size(sweep, title=f"alpha-beta time vs message size, n = {GROUP} ({GPU})")
plt.show()
sweep.pivot_table(index="bytes", columns=["collective", "link"], values="time (us)").iloc[[0, len(SIZES) // 2, -1]]

# %% [markdown]
# ## Try it
#
# Move the message size (a log slider from 1 KiB to 4 GiB), the group size and the GPU. The callback only calls
# `collective_cost_table` and draws it.

# %% tags=["panel"]
from tessera_lab.teach.core import collective_cost_panel
panel, controls, state = collective_cost_panel(n=GROUP, gpu=GPU, message_mib=MESSAGE_MIB)
panel

# %% [markdown]
# Questions to try:
#
# 1. At what message size does an all-reduce on NVLink stop being latency-bound?
# 2. Why does the all-reduce cost about twice the all-gather for the same *S*?
# 3. With *n* = 64 ranks, how much of *S* does each rank move in an all-to-all? Does more ranks make it cheaper
#    per rank?
