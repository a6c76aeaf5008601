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
# # 00 · Quick start: from a Hugging Face config to a pipeline plan
#
# This notebook walks the main job of **tessera-lab**: load Qwen3-Next-80B-A3B from its `config.json`, look at its
# hybrid layer pattern and parameter counts, partition its 48 layers into pipeline stages by their cost after
# overlap (ILP, against uniform, standalone-balanced and parameter-balanced baselines), simulate an overlapped 1F1B
# iteration (the forward of one micro-batch runs together with the backward of another) and read off iteration time,
# tokens/s, MFU and the bubble.
# Every number comes from the analytic cost model (`data/hardware/cost_model.json` states each assumption) or from
# the shipped config and hardware data.

# %% tags=["parameters"]
# parameters: small values run in the tests in seconds; the defaults below are already full size,
# because planning is cheap (about a second; the plan cell below prints its own wall time).
MODEL = "qwen3-next-80b-a3b"
GPU = "H200"
PP = 8                  # pipeline stages
EP = 8                  # expert-parallel ranks per stage (GPUs = PP x EP)
MICROBATCHES = 32
SEQ_LEN = 4096
RECOMPUTE = "none"      # activation recomputation: "none", "selective" or "full" (the CLI's --recompute)

# %%
import time

import pandas as pd
import matplotlib.pyplot as plt
from tessera_lab.model.spec import load_model
from tessera_lab.errors import TesseraError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.plan.make import make_plan
from tessera_lab.report.formatting import display_frame  # one format per column, by the unit its label states
from tessera_lab.report.headline import mfu_line, mfu_note
from tessera_lab.ui.plots import gantt, stage_cost_bars
from tessera_lab.ui.widgets import bottleneck_bounds, plan_caption
pd.set_option("display.precision", 3)

# %% [markdown]
# ## The model: layer pattern and parameter counts

# %%
model = load_model(MODEL)
print(model.layer_pattern(), " (L linear mixer: Gated DeltaNet, KDA, lightning or Mamba; A full attention, S sliding "
      "window, C chunked, T MTP; lower case: dense FFN, upper case: MoE)")
pd.DataFrame([{"layer": l.index, "mixer": l.mixer, "attention": l.attention, "ffn": l.ffn} for l in model.stack.layers[:8]])

# %%
counts = model.param_counts().as_dict()
pd.DataFrame({"parameters (B)": {k: v / 1e9 for k, v in counts.items()}})

# %% [markdown]
# ## Plan: layer pairs after overlap, ILP partition, overlapped 1F1B simulation

# %%
parallel = ParallelConfig(pp=PP, ep=EP, microbatches=MICROBATCHES, seq_len=SEQ_LEN, recompute=RECOMPUTE)
t0 = time.perf_counter()
try:
    plan = make_plan(model, parallel, gpu=GPU)
except TesseraError as exc:  # e.g. GPU = "H100" with SEQ_LEN = 8192 at pp 8 x ep 8: no partition fits in memory
    plan = None
    print(f"cannot plan these parameters: {exc}\nThe cells below skip; the panel at the end starts from them, so "
          "change pp, ep, the sequence or recompute there (or PP, EP, SEQ_LEN, RECOMPUTE above), or press its "
          "'suggest a layout that fits' button.")
by_stage = None
if plan is not None:
    print(f"planned in {time.perf_counter() - t0:.2f} s (wall clock, measured on this machine; ILP and baselines)")
    print(plan_caption(plan))
    print(bottleneck_bounds(plan))
    rows = []
    for ev in [plan.chosen, *plan.baselines.values()]:
        for st in ev.stages:
            rows.append({"partition": ev.method, "stage": st.index, "layers": f"{st.layers[0]}-{st.layers[-1]}",
                         "n": len(st.layers), "time/mb (ms)": st.time_s * 1e3,
                         "memory (GiB)": st.memory_bytes / 2**30})
    by_stage = pd.DataFrame(rows).pivot(index="stage", columns="partition",
                                        values=["n", "time/mb (ms)", "memory (GiB)"])
    by_stage["n"] = by_stage["n"].astype(int)  # layer counts are whole numbers (pivot stores them as floats)
display_frame(by_stage) if by_stage is not None else None

# %%
summary = None
if plan is not None:  # simulated iteration, tokens/s, MFU and bubble of each partition
    summary = pd.DataFrame([{"partition": ev.method, "iteration (s)": ev.iteration_time_s,
                             "tokens/s": ev.tokens_per_s, "MFU (%)": 100 * ev.mfu,
                             "bubble fraction": ev.bubble_fraction}
                            for ev in [plan.chosen, *plan.baselines.values()]]).set_index("partition")
    # MFU against the published band of this model class, and the validity note when it is above it
    # (report.headline.mfu_line / mfu_note: one source with the CLI)
    print(mfu_line(plan))
    if note := mfu_note(plan.chosen.mfu, moe=model.moe.num_experts > 0, grouped_gemm=plan.parallel.grouped_gemm,
                        model=model):
        print(note)
display_frame(summary) if summary is not None else None

# %%
if plan is not None:
    ax = stage_cost_bars(plan)
    plt.show()

# %%
if plan is not None:
    ax = gantt(plan.chosen.timeline)
    plt.show()

# %% [markdown]
# ## Re-plan interactively
#
# The panel starts from this notebook's parameters (every one of them: `MODEL`, `GPU`, `PP`, `EP`, `MICROBATCHES`,
# `SEQ_LEN`, `RECOMPUTE`; `quickstart_panel` refuses a parameter it does not know). Pick another model (every
# shipped model, the list `tessera-lab models` prints), GPU, pipeline stages, EP size, micro-batches, sequence
# length or activation recomputation (`none`, `selective`: attention core and routed experts' SwiGLU, `full`: each
# layer keeps only its input and re-runs its forward in the backward; the CLI's `--recompute`), and the
# model knobs that apply to the chosen model: the attention ratio (linear-attention layers per full-attention
# layer) only for hybrid models, expert width and top-k only for MoE models. Each change re-runs the same
# `make_plan` and redraws. The dropdowns offer only what the chosen model can be planned with (pp up to its layer
# count, ep a divisor of its routed experts, ep 1 for a dense model, micro-batches at least pp); a value the new
# model cannot take is moved to the nearest one it can, and the caption says so. The caption says what was planned
# (model, GPU, GPU count, pp/ep/dp, sequence, schedule, recompute), how long the re-plan took (wall and CPU seconds,
# measured), and what bounds the bottleneck stage's main tasks: where the expert GEMMs
# are *host issue* bound, a narrower expert barely moves the iteration; at long sequences (`sequence` 32768) the
# attention ratio starts to matter. A model that does not fit in memory (Nemotron-H 56B on 8 stages, say) may fit
# with `recompute` set to `full`, at the cost of a longer iteration. Where the panel cannot plan, a "suggest a layout
# that fits" button appears: it runs the layout search (notebook 11) over the layouts this panel can set on the same
# GPUs (pp x ep), global batch and sequence (every pp and ep of the dropdowns, every recompute, the micro-batches
# that keep the global batch), applies the fastest that fits to the controls and says what it applied, its tokens/s
# and peak memory, and how long the search took.

# %% tags=["panel"]
from tessera_lab.ui.widgets import quickstart_panel
panel, controls, state = quickstart_panel(MODEL, gpu=GPU, pp=PP, ep=EP, microbatches=MICROBATCHES, seq_len=SEQ_LEN,
                                          recompute=RECOMPUTE)
panel
