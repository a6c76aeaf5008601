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
# # 04 · MoE all-to-all and routing skew
#
# A mixture-of-experts layer replaces the MLP with many small MLPs, the **experts**, of which each token uses only
# *top-k*. **Expert parallelism (EP)** spreads the experts over *ep* GPUs, so every MoE layer moves tokens twice:
#
# 1. the router picks *k* experts per token; the tokens are permuted by destination;
# 2. **dispatch all-to-all**: each rank sends every token copy to the rank that owns its expert;
# 3. the experts run their GEMMs on the tokens they received;
# 4. **combine all-to-all**: the results travel back (the same volumes, transposed);
# 5. unpermute and weight by the router's scores.
#
# Both all-to-alls sit on the layer's critical path, every layer, forward and backward. The expert GEMMs are
# small (narrow experts), so the all-to-all is often the bottleneck: that is what DeepEP optimises and what
# Tessera overlaps with other work. And the router does not spread tokens evenly: popular experts make their
# rank the slowest, and the slowest rank sets the pace.

# %% tags=["parameters"]
# parameters: sampling a few thousand tokens per rank takes well under a second.
MODEL = "qwen3-30b-a3b"     # 128 experts, top-8; try "qwen3-next-80b-a3b" (512 experts, top-10)
EP = 8                      # EP ranks (8 = one node on NVLink; 16+ crosses InfiniBand)
TOP_K = None                # None = the model's top-k
SKEW = 1.0                  # Zipf exponent of expert popularity (0 = uniform)
TOKENS_PER_RANK = 4096      # micro-batch size x sequence length on each rank
SEED = 0
JITTER = 0.5                # per-rank noise on the expert shares (tessera_lab.dynamic.routing.DEFAULT_JITTER)
GPU = "H100"
SKEWS = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
TOP_KS = [1, 2, 4, 8]
EPS = [2, 4, 8, 16, 32]

# %%
import matplotlib.pyplot as plt
import pandas as pd
from tessera_lab.model.spec import load_model
from tessera_lab.teach.core import (a2a_volume_vs_topk, moe_all_to_all, plot_a2a_vs_topk, plot_moe, plot_skew_sweep,
                                  skew_sweep)
pd.set_option("display.precision", 3)
model = load_model(MODEL)
k = TOP_K or model.moe.num_experts_per_tok
pd.Series({"experts": model.moe.num_experts, "top-k": model.moe.num_experts_per_tok, "hidden size": model.hidden_size,
           "expert width": model.moe.moe_intermediate_size, "experts per EP rank": model.moe.num_experts // EP},
          name=MODEL).to_frame()

# %% [markdown]
# ## How much moves
#
# With even routing each rank sends `tokens x top-k` copies of a `hidden x 2`-byte (bf16) vector; the share
# `(ep-1)/ep` leaves the rank (the rest goes to its own experts). That is per layer, per micro-batch, and the
# combine moves it again:

# %%
copy_bytes = model.hidden_size * 2
per_rank = TOKENS_PER_RANK * k * copy_bytes * (EP - 1) / EP
print(f"{TOKENS_PER_RANK} tokens x top-{k} x {copy_bytes} bytes x ({EP}-1)/{EP} = {per_rank / 2**20:.1f} MiB "
      f"leave each rank in the dispatch, and as much again in the combine")

# %%
volumes = a2a_volume_vs_topk(model, top_ks=TOP_KS, eps=EPS, tokens_per_rank=TOKENS_PER_RANK, gpu=GPU)
fig = plot_a2a_vs_topk(volumes, title=f"{MODEL}: dispatch + combine per layer, even routing ({GPU})")
plt.show()
volumes.pivot_table(index="top-k", columns="ep", values="dispatch per rank (MiB)")

# %% [markdown]
# The volume grows linearly with top-k and hardly with the EP size (the share leaving a rank tends to 1). What
# changes with EP is the link: past 8 ranks the group spans nodes and the all-to-all runs at InfiniBand speed, an
# order of magnitude slower. That is why EP groups are kept inside a node where possible.
#
# ## Routing skew and per-rank load
#
# Real routers prefer some experts. The routing model of `tessera_lab.dynamic.routing` (the same one the dynamic bubble
# optimizer of notebook 07 uses) gives expert *e* a share following Zipf's law, `p_e ∝ 1 / rank_e ** skew`, the
# popular experts scattered over the EP ranks by a seeded permutation; each rank's tokens perturb those shares a
# little (`JITTER`: different sequences prefer different experts) and pick *k* distinct experts each. Skew 0 is the
# exact even split. Experts sit on the EP ranks contiguously; a rank's load is the number of token copies its
# experts receive.

# %%
uniform = moe_all_to_all(model, ep=EP, top_k=k, skew=0.0, tokens_per_rank=TOKENS_PER_RANK, seed=SEED, gpu=GPU)
skewed = moe_all_to_all(model, ep=EP, top_k=TOP_K, skew=SKEW, tokens_per_rank=TOKENS_PER_RANK, seed=SEED,
                        jitter=JITTER, gpu=GPU)
pd.DataFrame({"uniform routing": uniform.summary(), f"skew {SKEW}": skewed.summary()})

# %%
fig = plot_moe(skewed, title=f"{MODEL}, ep {EP}, top-{k}, skew {SKEW}")
plt.show()
skewed.frame()

# %% [markdown]
# The heatmap is the dispatch: row *src*, column *dst*, token copies sent. The rows look alike because every rank
# routes with the same router (up to the per-rank noise); the hot columns are the ranks that own popular experts. The combine is the
# transpose. The busiest rank receives more than its share in the dispatch, sends more back in the combine and
# runs the largest expert GEMMs, and all the others wait for it at the next collective.

# %%
sweep = skew_sweep(model, skews=SKEWS, ep=EP, tokens_per_rank=TOKENS_PER_RANK, seed=SEED, jitter=JITTER, gpu=GPU)
fig = plot_skew_sweep(sweep, title=f"{MODEL}, ep {EP}: cost of routing skew")
plt.show()
sweep

# %% [markdown]
# Skew makes both the all-to-all and the expert GEMMs of the slowest rank grow, while the mean stays put: the
# difference is idle time on every other rank. It changes from micro-batch to micro-batch, so a static pipeline
# plan cannot remove it; notebook 07 predicts these bubbles from the routing and fills them with deferrable work
# (weight gradients).
#
# ## Try it
#
# Change top-k, the EP size and the skew. The callback only calls `moe_all_to_all` and draws the result.

# %% tags=["panel"]
from tessera_lab.teach.core import moe_panel
panel, controls, state = moe_panel(MODEL, ep=EP, top_k=TOP_K, skew=SKEW, tokens_per_rank=TOKENS_PER_RANK, seed=SEED,
                                   jitter=JITTER)
panel

# %% [markdown]
# Questions to try:
#
# 1. Halve top-k: what happens to the all-to-all time and to the expert GEMM time?
# 2. Go from ep 8 to ep 16: the volume per rank barely changes; why does the time jump?
# 3. At which skew does the slowest rank's dispatch take twice the uniform time?
