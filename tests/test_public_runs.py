"""The published runs of benchmarks/bench_public_runs.py: every run has its source, and the layout mapping
gives the hand-worked parallel sizes (planning them is the benchmark's job, not a test's)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_public_runs", ROOT / "benchmarks" / "bench_public_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs(files=("megatron_bridge.json",)) -> dict:
    from tessera_lab.report.fidelity_set import load_runs

    runs, _ = load_runs([ROOT / "data" / "published" / f for f in files])
    return {r["id"]: r for r in runs}


ALL_FILES = ("megatron_bridge.json", "megatron_moe_modelzoo.json", "tech_reports.json")
#: the current containers' recipes (each read line by line from the recipe source); the older containers' rows and
#: the other sources' layouts are priced whether or not our memory model fits them (their "fits" column says)
CURRENT_RECIPES = ("qwen3-30b-a3b/16xH100/fp8/ep16", "qwen3-235b-a22b/256xH100/fp8/tp2-pp8-vp4-ep32",
                   "deepseek-v3/1024xH100/fp8/tp2-pp8-vp4-ep64", "qwen3-30b-a3b/8xB200/fp8/ep8",
                   "qwen3-235b-a22b/256xB200/fp8/pp8-ep8", "deepseek-v3/256xB200/fp8/pp8-vp2-ep32")


def test_every_run_has_a_source_and_four_count():
    runs = _runs()
    counted = [r for r in runs.values() if not r.get("reference_only")]
    assert len(counted) >= 4
    for r in runs.values():
        assert r["source"] and r["recipe"] and r["container"] and r["model_tflops_per_gpu"] > 0


def test_layout_mapping_by_hand():
    bench, runs = _bench(), _runs()
    # Qwen3-235B-A22B on 256 H100, TP 2 PP 8 VP 4 EP 32: Megatron DP = 256/16 = 16 < EP, so the EP group spans
    # TP x DP (expert TP 1): tp 2, ep 32, expert dp = 2 * 16 / 32 = 1, dense DP 32 / 2 * 1 = 16, world 8 * 1 * 32
    # = 256, m = 8192 / (1 * 16) = 512; VP 4 with the EP overlap: interleaved-overlapped
    par, notes = bench.parallel_for(runs["qwen3-235b-a22b/256xH100/fp8/tp2-pp8-vp4-ep32"])
    assert (par.tp, par.ep, par.dp, par.pp, par.vpp, par.microbatches) == (2, 32, 1, 8, 4, 512)
    assert par.ep_spans_tp and par.dense_dp == 16 and par.expert_dp == 1 and par.world_size == 256
    assert par.schedule == "interleaved-overlapped" and par.sequence_parallel and any("ep_spans_tp" in n for n in notes)
    assert par.ep_link_ranks() == list(range(32)) == par.group_ranks("ep")
    # DeepSeek-V3 on 1024 H100, TP 2 PP 8 EP 64: DP = 1024/16 = 64 = EP: tp 2, ep 64, dp 1, m = 8192/64 = 128
    par, _ = bench.parallel_for(runs["deepseek-v3/1024xH100/fp8/tp2-pp8-vp4-ep64"])
    assert (par.tp, par.ep, par.dp, par.pp, par.microbatches) == (2, 64, 1, 8, 128) and par.world_size == 1024
    assert (par.precision, par.dispatcher, par.recompute, par.grad_reduce_dtype) == ("fp8", "deepep", "selective", "bf16")
    # the recipe's modules and DeepSeek-V3's precision-aware optimizer (bf16 moments); VP 4 with the EP overlap
    # (Megatron-Bridge v0.1.0rc3, the 25.09 container's, run_script.py: A2A_1F1B on H100)
    assert par.recompute_modules == ("mla_up_proj", "mlp") and par.adam_moment_dtype == "bf16"
    assert (par.vpp, par.schedule, par.ep_spans_tp, par.expert_dp) == (4, "interleaved-overlapped", False, 2)
    # Megatron's expert grid (ETP 1): EP 64 on ranks 0..63, i.e. 8 nodes of 8 (a TP-strided group: 16 nodes of 4)
    assert par.ep_placement == "contiguous" and par.ep_link_ranks() == list(range(64))
    # Qwen3-30B-A3B on 16 H100, EP 16, one stage: m = 1024 / 16 = 64, balanced tokens as the pages state
    par, _ = bench.parallel_for(runs["qwen3-30b-a3b/16xH100/fp8/ep16"])
    assert (par.pp, par.ep, par.microbatches, par.expert_load) == (1, 16, 64, 1.0)


def test_fsdp_run_maps_onto_fsdp_by_hand():
    # ModelZoo's FSDP row: 256 H100, TP 2 EP 8 PP 1, EDP 32, DP 128, FSDP on, MBS 4, GBS 2048: Megatron DP = 256/2 =
    # 128 >= EP, so ep 8, dp 128/8 = 16; dense sharded over ep x dp = 128, experts over tp x dp = 32 (the row's EDP);
    # m = 2048 / (4 x 128) = 4; planned with Megatron FSDP as `plan --fsdp`
    bench, runs = _bench(), _runs(ALL_FILES)
    run = runs["mz/qwen3-235b-a22b/256xH100/bf16/deepep-tp2-ep8-fsdp"]
    par, _ = bench.parallel_for(run)
    assert par.fsdp and (par.tp, par.ep, par.dp, par.pp, par.microbatches, par.micro_batch_size) == (2, 8, 16, 1, 4, 4)
    assert (par.dense_shard_dp, par.expert_dp, par.world_size) == (128, 32, 256)
    assert not bench.parallel_for({**run, "fsdp": False})[0].fsdp
    # it ran on 80 GB H100s: planned with FSDP's sharding it fits (without it the unsharded bf16 weights and fp32
    # gradients of 94 layers' 16 local experts alone are 6 x 94 x 301,989,888 bytes = 159 GiB)
    row = bench.predict(run)
    assert row["fits_memory"] and row["parallel"]["fsdp"], row["peak_memory_gib"]


def test_context_parallel_runs_map_by_hand():
    # ModelZoo long context, 256 H100, TP 4 PP 8 VP 4 EP 8, GBS 256, MBS 1. CP 2 at 32k: Megatron DP = 256 / (4 x 2
    # x 8) = 4 < EP 8, so the EP group spans whole TP groups: expert replicas dp = 4 x 4 / 8 = 2, dense DP 8 x 2 / 4
    # = 4, world 8 x 2 x 8 x 2 = 256, m = 256 / 4 = 64, each rank 32768 / 2 tokens; CP 4 at 64k: DP 2, dp = 4 x 2 /
    # 8 = 1, m = 128, 16384 tokens a rank
    import pytest

    bench, runs = _bench(), _runs(ALL_FILES)
    for seq, cp, dp, dense, m in ((32, 2, 2, 4, 64), (64, 4, 1, 2, 128)):
        run = runs[f"mz/qwen3-235b-a22b/256xH100/bf16/seq{seq}k-tp4-cp{cp}-pp8-vp4-ep8-dropless"]
        par, notes = bench.parallel_for(run)
        assert (par.tp, par.cp, par.ep, par.dp, par.pp, par.vpp, par.microbatches) == (4, cp, 8, dp, 8, 4, m)
        assert par.ep_spans_tp and par.dense_dp == dense and par.world_size == 256
        assert par.tokens_per_rank == 16384 and par.tokens_per_iteration == 256 * seq * 1024
        assert any(f"CP {cp}" in n for n in notes)
        # Megatron's expert grid (order tp-ep-dp, ETP 1) puts an EP 8 group on 8 consecutive ranks: TP 4 x CP 2
        assert sorted(par.group_ranks("ep")) == list(range(8)) and par.ep_span_text() == "TP 4 x CP 2"
        assert any(n.startswith("EP 8 spans TP 4 x CP 2") for n in notes)
    # CP 8 at 128k (left out): DP = 1, and EP 8 does not divide TP 4 x DP 1 = 4: refused, not silently re-shaped
    tmpl = runs["mz/qwen3-235b-a22b/256xH100/bf16/seq64k-tp4-cp4-pp8-vp4-ep8-dropless"]
    from tessera_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="field 'ep' = 8 .* not expressible"):
        bench.parallel_for({**tmpl, "cp": 8, "seq_len": 131072})
    left = json.loads((ROOT / "data" / "published" / "megatron_moe_modelzoo.json").read_text())["left_out"]
    assert {r["id"] for r in left} & set(runs) == set()


def test_fsdp_field_is_checked(tmp_path):
    import pytest

    from tessera_lab.errors import ConfigError
    from tessera_lab.report.fidelity_set import load_runs

    data = json.loads((ROOT / "data" / "published" / "megatron_moe_modelzoo.json").read_text())
    data["runs"] = [dict(r, fsdp="yes") for r in data["runs"] if r.get("fsdp")]
    bad = tmp_path / "runs.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="field 'fsdp' = 'yes'"):
        load_runs([bad])


def test_published_recipes_fit_memory():
    # the acceptance point: every published recipe is feasible in the memory model at its own layout (even split,
    # VP, the recomputation it uses); the bench prices the time of a row that does not fit and says "fits: NO"
    bench, runs = _bench(), _runs()
    for run in (runs[i] for i in CURRENT_RECIPES):
        row = bench.predict(run)
        assert row["fits_memory"], (run["id"], row["peak_memory_gib"], row["capacity_gib"])
        assert not any("does not fit" in n for n in row["mapping_notes"])  # DeepSeek-V3's planned MTP layer too


def test_recipe_pipeline_splits_by_hand():
    bench, runs = _bench(), _runs()
    # Qwen3-235B-A22B, PP 8 VP 4, account_for_embedding/loss: (94 + 2) / 32 = 3 slots a virtual stage; the first
    # gives one to the embedding, the last one to the loss: [2, 3 x 30, 2]
    b = bench.split_for(runs["qwen3-235b-a22b/256xH100/fp8/tp2-pp8-vp4-ep32"], 94)
    assert [y - x for x, y in zip(b, b[1:])] == [2] + [3] * 30 + [2] and b[-1] == 94
    # PP 8, no VP: (94 + 2) / 8 = 12: [11, 12 x 6, 11]
    b = bench.split_for(runs["qwen3-235b-a22b/256xB200/fp8/pp8-ep8"], 94)
    assert [y - x for x, y in zip(b, b[1:])] == [11] + [12] * 6 + [11]
    # DeepSeek-V3 'Et|(tt|)*30mL': 1 + 2 x 30 + 0 = 61 decoder layers over 32 virtual stages
    b = bench.split_for(runs["deepseek-v3/1024xH100/fp8/tp2-pp8-vp4-ep64"], 61)
    assert b[:3] == [0, 1, 3] and b[-2:] == [61, 61] and len(b) == 33
    assert bench.split_for(runs["qwen3-30b-a3b/16xH100/fp8/ep16"], 48) is None  # Megatron's even split
    # ModelZoo A2A row, PP 32 VP 3: (94 + 2) / 96 = 1 slot a virtual stage: the embedding alone on the first, the
    # loss alone on the last, one decoder layer on each of the 94 between
    b = bench.split_for(_runs(ALL_FILES)["mz/qwen3-235b-a22b/256xH100/bf16/a2a-tp2-pp32-vp3-ep8"], 94)
    assert [y - x for x, y in zip(b, b[1:])] == [0] + [1] * 94 + [0]


def test_mtp_layers_planned_where_megatron_places_them():
    """A recipe's MTP layers (``mtp_num_layers``) are planned after the decoder layers on the last virtual stage, with
    the output head: DeepSeek-V3's layout 'Et|(tt|)*30mL' puts 'm' on the last virtual stage, which holds no decoder
    layer; Qwen3-Next's ModelZoo run has no custom layout, so Megatron-Core's even split (48 / 12 = 4) and the MTP
    layer on the last virtual stage (``mtp_on_this_rank``)."""
    bench, runs = _bench(), _runs(ALL_FILES)
    b = bench.split_for(runs["deepseek-v3/1024xH100/fp8/tp2-pp8-vp4-ep64"], 61, 1)
    assert b[:3] == [0, 1, 3] and b[-2:] == [61, 62] and len(b) == 33
    assert bench.split_for(runs["qwen3-30b-a3b/16xH100/fp8/ep16"], 48, 1) == [0, 49]  # PP 1: one stage
    run = runs["mz/qwen3-next-80b-a3b/128xH100/bf16/deepep-pp4-vp3-ep32"]
    model = bench.model_for(run)
    assert model.num_layers == 49 and model.stack.layers[-1].mtp and not model.stack.layers[47].mtp
    assert bench.run_split(run, model) == [4 * i for i in range(12)] + [49]
    row = bench.predict(run)
    assert any("1 MTP layer after them on the last virtual stage" in n for n in row["mapping_notes"])
    without = bench.predict(dict(run, mtp_num_layers=0))
    # the last virtual stage runs 4 + 1 layers and a second head: the iteration is longer, and not by more than the
    # whole work of that stage again
    assert without["iteration_time_s"] < row["iteration_time_s"] < 2 * without["iteration_time_s"]


def test_nemotron_pages_count_mamba_with_twice_the_hidden_size():
    """The Nemotron 3 Nano rows' Model TFLOP/s come from Megatron-Bridge's hybrid formula (``hybrid_flops`` in
    src/megatron/bridge/training/utils/flop_utils.py at c8101293), which sizes a Mamba mixer's inner width as
    d_in = 2 x hidden (5,376) where the Nano's mixer has 64 heads x 64 = 4,096 channels; worked out here by hand from
    that formula (forward x 3; attention 4 s h p (h + h g / n + s / 2) with p = 128 x 32 / h; Mamba
    2 s h (2 d_in + 2 G N + heads) + 7 s d_in N + 2 s d_in h; MoE 4 s h (f k + shared); logits 2 s h V), it gives the
    pages' figures, and this project's count (the mixer's real width) is lower by the difference."""
    import pytest

    from tessera_lab.model.tasks import model_flops_per_iteration

    bench, runs = _bench(), _runs()
    s, h, V = 8192, 2688, 131072
    attn = 4 * s * h * (128 * 32 / h) * (h + h * 2 / 32 + s / 2)
    d_in = 2 * h
    mamba = 2 * s * h * (2 * d_in + 2 * 8 * 128 + 64) + 7 * s * d_in * 128 + 2 * s * d_in * h
    moe = 4 * s * h * (1856 * 6 + 3712)
    per_token = 3 * (6 * attn + 23 * mamba + 23 * moe + 2 * s * h * V) / s
    nano = [r for r in runs.values() if r["model"] == "nemotron-3-nano-30b-a3b"]
    assert len(nano) == 2
    for run in nano:
        assert per_token * run["tokens_per_s_per_gpu"] / 1e12 == pytest.approx(run["model_tflops_per_gpu"], rel=0.01)
        par, _ = bench.parallel_for(run)
        ours = model_flops_per_iteration(bench.model_for(run), par) / (run["gbs"] * run["seq_len"])
        assert 0.90 < ours / per_token < 0.97  # the Mamba mixers' in/out projections at 4,096 channels, not 5,376


def test_model_flops_reproduce_the_pages_tflops_with_mtp_counted():
    """Megatron-Bridge's pages give tokens/s and Model TFLOP/s per GPU for the same run; the model FLOPs of an
    iteration (Megatron's convention: 3 x forward GEMMs + attention, MTP layers and their logits included, as
    ``num_floating_point_operations`` in megatron/training/training.py counts ``mtp_num_layers``) turn the one into
    the other. Every Qwen3 and DeepSeek-V3 row agrees within 1% once the recipe's MTP layer is planned (DeepSeek-V3
    was 3.7-4.1% low without it), an independent check that those runs train it. The dense Llama rows agree within
    2.5%: Megatron-Bridge's own formula (``transformer_flops`` in src/megatron/bridge/training/utils/flop_utils.py at
    c8101293: 18 h f L + 12 h^2 (1 + g/n + s/2h) L + 6 h V per token, worked out by hand for Llama 3 70B: 449.2
    GFLOP per token) is ours, and the 70B page row's figure is 2.3% below it (731 against 747.5), the 405B rows'
    1.1%."""
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.model.tasks import model_flops_per_iteration

    bench, runs = _bench(), _runs()
    checked = 0
    for run in runs.values():
        if (not (run.get("tokens_per_s_per_gpu") and run.get("model_tflops_per_gpu"))
                or run["model"] in ("gpt-oss-120b", "nemotron-3-nano-30b-a3b")):  # they count otherwise (below)
            continue
        par, _ = bench.parallel_for(run)
        cluster_for(par, run["gpu"])  # the layout exists on that GPU
        flops = model_flops_per_iteration(bench.model_for(run), par)
        seconds = run["gbs"] * run["seq_len"] / (run["tokens_per_s_per_gpu"] * run["gpus"])
        tflops = flops / (seconds * run["gpus"]) / 1e12
        tolerance = 0.01 if bench.model_for(run).has_moe else 0.025
        assert abs(tflops / run["model_tflops_per_gpu"] - 1) < tolerance, (run["id"], tflops, run["model_tflops_per_gpu"])
        checked += 1
    assert checked >= 10


def test_precision_as_the_source_says():
    bench, runs = _bench(), _runs()
    for run in runs.values():
        # the source's row label names MXFP8 exactly where the data says so; the plan prices FP8 either way
        assert ("(MXFP8)" in run["source"]) == (run.get("source_precision") == "mxfp8")
        label = bench.precision_label(run)
        want = "mxfp8 (planned as fp8)" if run.get("source_precision") == "mxfp8" else run["precision"]
        assert label == want, (run["id"], label)


def test_breakdown_labels_and_per_layer_budget_by_hand():
    bench, runs = _bench(), _runs()
    run = runs["qwen3-30b-a3b/16xH100/fp8/ep16"]
    # published budget per layer and micro-batch: MBS 1 x 4096 tokens / (8826 tokens/s per GPU x TP 1 x 48 layers)
    # = 9.668 ms; the plan's per-layer time: the same formula on the predicted tokens/s
    b = bench.breakdown(run, predicted_tokens_per_s_per_gpu=10000.0)
    assert abs(b["published_layer_budget_s"] - 4096 / (8826 * 1 * 48)) < 1e-12
    assert abs(b["plan_layer_time_s"] - 4096 / (10000 * 48)) < 1e-12
    assert abs(b["standalone_layer_s"] - sum(b["phase_s"].values())) < 1e-15
    assert abs(b["gap_vs_standalone_s"] - (b["published_layer_budget_s"] - b["standalone_layer_s"])) < 1e-15
    assert abs(b["gap_vs_plan_s"] - (b["published_layer_budget_s"] - b["plan_layer_time_s"])) < 1e-15
    # communication tasks issue no kernels the host model counts: n/a, not 0
    assert b["tasks"]["dispatch"]["kernels"] is None and b["tasks"]["combine"]["kernels"] is None
    assert b["tasks"]["experts"]["kernels"] > 0


def test_plan_per_layer_is_iteration_time_times_pp_over_m_layers():
    # the formula's identity (tokens/s per GPU = m * tokens per micro-batch / (T * tp * pp)): per-layer time
    # = T * pp / (m * layers), on a run with TP 2 spanning EP and PP 8 VP 4
    bench, runs = _bench(), _runs()
    run = runs["qwen3-235b-a22b/256xH100/fp8/tp2-pp8-vp4-ep32"]
    row = bench.predict(run)
    b = bench.breakdown(run, row["predicted_tokens_per_s_per_gpu"])
    expect = row["iteration_time_s"] * 8 / (512 * 94)
    assert abs(b["plan_layer_time_s"] / expect - 1) < 1e-9


def test_printed_table_and_breakdown(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_public_runs.py"), "--breakdown",
                           "--json", str(out)], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    lines = text.splitlines()
    runs = _runs(ALL_FILES)
    head = next(i for i, ln in enumerate(lines) if ln.startswith("run "))
    rule = next(i for i in range(head, len(lines)) if lines[i].startswith("----"))
    end = next(i for i in range(rule, len(lines)) if not lines[i].strip())
    block = lines[head:end]
    # every table line, the reference-only row included, has the rule's column starts
    starts = [i for i, ch in enumerate(lines[rule]) if ch == "-" and (i == 0 or lines[rule][i - 1] == " ")]
    for ln in lines[rule + 1:end]:
        assert all(ln[s - 1] == " " for s in starts[1:]), ln
        assert len(ln) <= len(lines[rule])
    header = "\n".join(block[: rule - head])
    for unit in ("TFLOP/s/GPU", "published", "predicted", "iteration s", "GiB/GPU", "fits", "split"):
        assert unit in header
    assert sum("mxfp8 (planned as fp8)" in ln for ln in block) == sum(
        r.get("source_precision") == "mxfp8" for r in runs.values())
    assert any(" reference " in ln for ln in block)
    assert "estimate of mtp_estimate" not in text and "kernels     0" not in text
    assert "n/a (communication)" in text and "standalone sum (before overlap)" in text
    assert "plan per layer (after overlap)" in text and "published budget per layer" in text
    summary = next(ln for ln in lines if ln.startswith("gap per layer and micro-batch"))
    data = json.loads(out.read_text())
    # the summary's rows: the counted ones whose expert task is host-bound (the README's small-expert rows)
    small = [b for b in data["breakdown"] if b["experts_host_bound"] and not b["reference_only"]]
    assert small and all(b["id"] in text for b in small)
    gaps = [b["gap_vs_standalone_s"] * 1e3 for b in small]
    assert f"{min(gaps):.1f}" in summary and f"{max(gaps):.1f}" in summary
    # the JSON keeps its keys
    assert {"rows", "summary", "source_pages"} <= set(data)
    assert {"id", "source", "source_family", "split", "published", "predicted", "error", "fits_memory",
            "peak_memory_gib", "capacity_gib", "mapping_notes"} <= set(data["rows"][0])
    summ = data["summary"]
    assert {"test_median_abs_error", "test_max_abs_error", "n_test", "fit_ids"} <= set(summ)
    test_ids = {r["id"] for r in data["rows"] if r["split"] == "test"}
    # the acceptance's shape: >= 20 runs from >= 3 families, >= 10 test runs, no id in both sets
    assert len(data["rows"]) >= 20 and len({r["source_family"] for r in data["rows"]}) >= 3
    assert summ["n_test"] == len(test_ids) >= 10 and not test_ids & set(summ["fit_ids"])
    # the headline is the test set's, worked out here from the rows
    import statistics

    errs = [abs(r["error"]) for r in data["rows"] if r["split"] == "test"]
    assert summ["test_median_abs_error"] == statistics.median(errs) and summ["test_max_abs_error"] == max(errs)
    assert "HEADLINE (test set" in text and ("MISSED" in text) == (not summ["target_met"])


def test_sync_term_fit_is_the_shipped_constant():
    # the fitted host/sync seconds per MoE layer the planner ships, per dispatcher, is what the bench fits on the fit
    # set now, and it names that fit set; no fit run is a test run
    import statistics

    from tessera_lab.cost.sync import FIT_SET, FITTED_PER_WAIT_S

    import pytest

    bench = _bench()
    runs = _runs(ALL_FILES)
    rows = [bench.predict(r, 0.0) for r in runs.values() if r["split"] == "fit"]  # the fit sees the term off
    assert all(r["host_sync_per_layer_s"] == 0.0 for r in rows)
    fit = bench.apply_sync_term(rows, runs)
    by = {r["id"]: r for r in rows}
    for d, ids in FIT_SET.items():
        c = fit["per_layer_s"][d]
        assert abs(c - FITTED_PER_WAIT_S[d]) < 0.01e-3, (d, c)
        assert tuple(fit["fit_runs_used"][d]) == ids and all(runs[i]["split"] == "fit" for i in ids)
        assert all(runs[i]["dispatcher"] == d for i in ids)
        # the fit is the median of what each used run needs per host wait (per_layer_needed_s over the run's
        # host_waits_per_layer), worked out here from the rows
        assert c == pytest.approx(statistics.median(by[i]["sync_needed_per_layer_s"] / by[i]["host_waits_per_layer"]
                                                    for i in ids), rel=1e-12)
    # the predictions come from the planner with the dispatcher's c per host wait, whatever the schedule (an
    # EP-overlap schedule hides it only in the forwards it pairs)
    for r in rows:
        c = fit["per_layer_s"][r["parallel"]["dispatcher"]] if any(r["moe_layers_per_rank"]) else 0.0  # dense: none
        assert r["host_sync_per_layer_s"] == pytest.approx(c * r["host_waits_per_layer"], rel=1e-12), r["id"]
    assert any(not any(r["moe_layers_per_rank"]) for r in rows)  # the dense Llama runs carry none
    # one-stage Qwen3-30B-A3B on 16 H100 (48 MoE layers, m 64, DeepEP): the planner adds 64 x 48 x c to the iteration
    q = by["qwen3-30b-a3b/16xH100/fp8/ep16"]
    c = fit["per_layer_s"]["deepep"]
    assert q["sync_s_per_iteration"] == pytest.approx(64 * 48 * c, rel=1e-9)
    # a fit on rows planned with the term on would be circular: refused
    with pytest.raises(ValueError, match="term off"):
        bench.apply_sync_term([bench.predict(runs[q["id"]], c)], runs)


def test_split_fit_prints_the_fit_set_only(tmp_path, capsys):
    # model development looks at the fit set alone: --split fit plans and prints fit runs only, no test error and
    # no headline; the sync term is still fitted on them
    bench = _bench()
    out = tmp_path / "fit.json"
    bench.main(["--split", "fit", "--json", str(out)])
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    fit_ids = {i for i, r in _runs(ALL_FILES).items() if r["split"] == "fit"}
    assert {r["id"] for r in data["rows"]} == fit_ids and data["summary"]["n_test"] == 0
    assert "HEADLINE" not in text and "no test runs in this selection" in text
    assert "[test]" not in text and "  test  " not in text and data["sync_term"]["fitted_here"]


def test_component_classes_by_op_and_collective_group():
    from tessera_lab.model.graph import Collective, Task

    bench = _bench()
    want = {"grouped_gemm": "expert GEMMs", "gemm": "dense GEMMs", "router": "dense GEMMs",
            "attention": "attention core", "linear_attention": "attention core", "elementwise": "memory-bound kernels",
            "loss": "memory-bound kernels"}
    for op, cls in want.items():
        assert bench.component_of(Task("t", 0, "F", op, 1.0, 1.0)) == cls, op
    for group, cls in (("ep", "EP all-to-all"), ("tp", "TP collectives"), ("dp", "other communication")):
        t = Task("c", 0, "F", "all_to_all", 0.0, 0.0, Collective("all_to_all", 1e6, group, 8))
        assert bench.component_of(t) == cls, group


def test_layer_components_sum_to_the_per_task_breakdown():
    # one decoder layer: the classes (FP8 casts and host-bound issue split out) add up to the breakdown's per-task
    # GPU/link + host-bound seconds, and the FP8 run has casts where the bf16 run has none
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.model.tasks import layer_tasks

    bench = _bench()
    for rid in ("qwen3-30b-a3b/16xH100/fp8/ep16", "gpt-oss-120b/64xB200/bf16/ep8-mbs4"):
        run = _runs()[rid]
        b = bench.breakdown(run)
        par, _ = bench.parallel_for(run)
        model = load_model(run["model"])
        cm = CostModel(cluster_for(par, run["gpu"]), par)
        comps = bench.layer_components(cm, [t for ph in "FBW" for t in layer_tasks(model, b["layer"], par).phase(ph)])
        per_task = sum(r["gpu_s"] + r["host_excess_s"] for r in b["tasks"].values())
        assert abs(sum(comps.values()) / per_task - 1) < 1e-12, rid
        assert abs(comps["EP all-to-all"] - b["tasks"]["dispatch"]["gpu_s"] - b["tasks"]["combine"]["gpu_s"]) < 1e-15
        assert (comps["FP8 casts"] > 0) == (par.precision == "fp8"), rid
        # the mean over the decoder layers is what the JSON keeps
        assert set(b["components_s"]) == set(bench.COMPONENTS)


def test_components_table_needed_by_hand():
    # needed per layer = budget x (1 - predicted iteration without the term / published iteration), worked out by
    # hand for a made-up row: budget 10 ms, 6 s predicted without the term, 8 s published -> 2.5 ms; compute (all
    # classes but communication) 5 ms -> 0.5
    bench = _bench()
    comps = dict.fromkeys(bench.COMPONENTS, 0.0)
    comps.update({"expert GEMMs": 3e-3, "memory-bound kernels": 2e-3, "EP all-to-all": 7e-3})
    row = {"id": "x", "split": "fit", "parallel": {"dispatcher": "alltoall", "schedule": "1f1b"},
           "iteration_time_s": 7.0, "iteration_without_sync_s": 6.0, "published": {"iteration_s": 8.0}}
    text = bench.components_table([row], [{"components_s": comps, "published_layer_budget_s": 10e-3}])
    last = text.splitlines()[-1].split()
    assert last[-2:] == ["+2.50", "+0.50"]


def _row(rid, split, dispatcher, published, predicted, without, term, schedule="interleaved"):
    """A hand-made row of the shape ``apply_sync_term`` leaves (error = published / predicted - 1)."""
    return {"id": rid, "source_family": "fam", "split": split,
            "published": {"iteration_s": published, "basis": "tokens/s per GPU"},
            "predicted": {"iteration_s": predicted}, "iteration_time_s": predicted,
            "error": published / predicted - 1.0, "error_without_sync": without, "host_sync_per_layer_s": term,
            "parallel": {"dispatcher": dispatcher, "schedule": schedule}}


def test_markdown_table_and_reading_figures_by_hand():
    import pytest

    bench = _bench()
    pair, load = bench.PAIR_IDS, bench.LOAD_IDS
    rows = [_row("qwen3-x/a", "test", "alltoall", 6.0, 10.0, 0.50, 0.01),       # error -0.40
            _row("mz/qwen3-y/b", "test", "alltoall", 8.0, 10.0, 0.30, 0.01),    # -0.20
            _row("gpt-oss/c", "test", "alltoall", 11.0, 10.0, 0.60, 0.01),      # +0.10, not a Qwen3 run
            _row(pair[0], "test", "deepep", 9.0, 10.0, 0.20, 0.004),           # -0.10
            _row(pair[1], "test", "deepep", 14.5, 10.0, 0.45, 0.004,           # +0.45, EP overlap: the term only
                 "interleaved-overlapped"),                                    # in forwards run apart
            _row(load[0], "test", "deepep", 11.0, 10.0, 0.30, 0.004),          # +0.10
            _row(load[1], "test", "deepep", 13.2, 10.5, 0.50, 0.004),          # 13.2 / 10.5 - 1 = +0.2571
            _row("fit/d", "fit", "deepep", 10.2, 10.0, -0.05, 0.004),          # +0.02, too slow without the term
            _row("ref/e", "reference", "alltoall", 19.0, 10.0, 0.90, 0.01)]    # in no count
    # the CP pairs (split reference here, so the counts above stay): 32k 12 / 10 published, 20.4 / 20 predicted;
    # 64k 30 / 24, 41 / 40
    for (forced, dropless), pub, pred in zip(bench.LOAD_IDS_CP.values(), ((10.0, 12.0), (24.0, 30.0)),
                                             ((20.0, 20.4), (40.0, 41.0))):
        rows += [_row(forced, "reference", "deepep", pub[0], pred[0], 0.0, 0.004),
                 _row(dropless, "reference", "deepep", pub[1], pred[1], 0.0, 0.004)]
    f = bench.reading_figures(rows)
    assert (f["load.32k.published.slowdown"], f["load.32k.predicted.slowdown"]) == pytest.approx((0.20, 0.02))
    assert (f["load.64k.published.slowdown"], f["load.64k.predicted.slowdown"]) == pytest.approx((0.25, 0.025))
    assert (f["load.32k.forced.error"], f["load.64k.dropless.error"]) == pytest.approx((10 / 20 - 1, 30 / 41 - 1))
    # every forward carries the term in 7 fit/test rows (a, b, c, pair[0], both load rows, d; not pair[1], EP overlap);
    # 6 of them are too fast without it
    assert (f["term.runs"], f["term.too-fast-without"]) == (7, 6)
    # deepep test rows with the term: -0.10, +0.10, +0.2571 -> median |error| 0.10
    assert f["deepep.test.n"] == 3 and f["deepep.test.min"] == pytest.approx(-0.10)
    assert f["deepep.test.max"] == pytest.approx(13.2 / 10.5 - 1) and f["deepep.test.median-abs"] == pytest.approx(0.10)
    # Qwen3 alltoall test rows with the term: a and b (c is GPT-OSS, e a reference row)
    assert f["qwen3-alltoall.test.n"] == 2
    assert (f["qwen3-alltoall.test.min"], f["qwen3-alltoall.test.max"]) == pytest.approx((-0.40, -0.20))
    assert (f["qwen3-alltoall.test.without-min"], f["qwen3-alltoall.test.without-max"]) == (0.30, 0.50)
    assert (f["pair.plain"], f["pair.overlap"]) == pytest.approx((-0.10, 0.45))
    assert (f["load.published.forced"], f["load.published.dropless"]) == (11.0, 13.2)
    assert (f["load.predicted.forced"], f["load.predicted.dropless"]) == (10.0, 10.5)
    assert f["load.published.slowdown"] == pytest.approx(0.2) and f["load.predicted.slowdown"] == pytest.approx(0.05)
    # test rows beyond 35%: a (-0.40) and pair[1] (+0.45, EP overlap); e is a reference row
    assert (f["test.beyond-target"], f["test.beyond-target.ep-overlap"]) == (2, 1)
    table = bench.markdown_table(rows[:1]).splitlines()
    assert table == ["| run | source family | split | published s | published s from | predicted s | error | "
                     "error without the term | dispatcher |", "|---|---|---|---|---|---|---|---|---|",
                     "| qwen3-x/a | fam | test | 6.000 | tokens/s per GPU (computed) | 10.000 | -40.0% | +50.0% | "
                     "alltoall |"]


def test_markdown_flag_prints_only_the_table(capsys):
    # --markdown: stdout holds the Markdown table and nothing else; the report goes to stderr (one reference run)
    bench = _bench()
    bench.main(["--markdown", "--split", "reference"])
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    ref = [i for i, r in _runs(ALL_FILES).items() if r["split"] == "reference"]
    assert lines[0].startswith("| run | source family | split |") and lines[1] == "|" + "---|" * 9
    assert len(lines) == 2 + len(ref) and all(ln.startswith("| ") and ln.endswith(" |") for ln in lines[2:])
    assert [ln.split(" | ")[0][2:] for ln in lines[2:]] == ref and all(" | reference | " in ln for ln in lines[2:])
    assert "no test runs in this selection" in cap.err and "per run: source" in cap.err
    import pytest

    with pytest.raises(SystemExit) as exc:  # both on stdout: refused before any work
        bench.main(["--markdown", "--json", "-"])
    assert exc.value.code == 2 and "--markdown and --json -" in capsys.readouterr().err


def test_runs_file_layout_errors_are_one_line_before_planning(tmp_path, capsys):
    """A runs file whose run maps onto no planner layout is refused with one line naming the field, exit 2, before
    any run is planned (the mapping is checked for every run first): CP 8 at TP 4 and DP 1 (EP 8 larger than TP x DP),
    CP 0, a sequence that 2 x CP does not split, a global batch of partial micro-batches, a malformed split."""
    import pytest

    data = json.loads((ROOT / "data" / "published" / "megatron_moe_modelzoo.json").read_text())
    base = next(r for r in data["runs"] if "seq64k" in r["id"])
    cases = {"cp8": ({"cp": 8, "seq_len": 131072}, "field 'ep' = 8"), "cp0": ({"cp": 0}, "field 'cp' = 0"),
             "seq": ({"seq_len": 65540}, "field 'seq_len' = 65540"), "gbs": ({"gbs": 255}, "field 'gbs' = 255"),
             "split": ({"pipeline_split": [1, 2]}, "field 'pipeline_split'"),
             "mtp": ({"mtp_num_layers": 1}, "field 'mtp_num_layers' = 1; allowed: 0 (qwen3-235b-a22b's config"),
             "mtp-str": ({"mtp_num_layers": "1"}, "field 'mtp_num_layers' = '1'; allowed: an integer >= 0")}
    for name, (change, field) in cases.items():
        path = tmp_path / f"{name}.json"
        good = dict(base, id="ok/first")  # planned only if the bad run were skipped instead of refused
        path.write_text(json.dumps({"runs": [good, dict(base, **change, id=f"x/{name}")]}))
        with pytest.raises(SystemExit) as exc:
            _bench().main(["--runs", str(path)])
        err = capsys.readouterr()
        assert exc.value.code == 2 and field in err.err and "Traceback" not in err.err, name
        assert "ok/first" not in err.out and "ok/first" not in err.err, name  # nothing planned first


def test_summary_of_an_empty_selection_is_strict_json():
    """No test and no fit run (a runs file whose only run was not planned): the medians are null, not NaN, so
    ``--json`` output parses as strict JSON (json.loads refusing NaN)."""
    bench = _bench()
    summ = bench.summary([], {"fit_ids": [], "per_layer_s": {}, "fit_runs_used": {}})
    text = json.dumps(summ)
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert summ["test_median_abs_error"] is None and summ["fit_max_abs_error"] is None and not summ["target_met"]


def test_tflops_line_names_sources_that_count_flops_otherwise():
    """The Model TFLOP/s columns are this model's FLOPs over a time (computed); a source whose own figure differs by
    more than 2% from the published-time column is named with both (GPT-OSS's page: 158 where ours give 190)."""
    bench = _bench()
    rows = [{"id": "a", "source_tflops_per_gpu": 158, "tflops_per_gpu_at_published_time": 190.0},
            {"id": "b", "source_tflops_per_gpu": 338, "tflops_per_gpu_at_published_time": 337.2},
            {"id": "c", "source_tflops_per_gpu": None, "tflops_per_gpu_at_published_time": 50.0}]
    line = bench.tflops_line(rows)
    assert line.endswith("differs by more than 2% (they count FLOPs otherwise): a 158 (ours 190, +20%)"), line
    assert "within 2%" in bench.tflops_line(rows[1:])


def test_alternate_reading_applies_its_fields_and_refuses_others():
    # a run whose source reads two ways carries the other reading; the bench plans the row as it stands and, apart,
    # every run with its alternate_reading applied (one dict merge per run; the split and the id never move)
    import pytest

    from tessera_lab.errors import ConfigError

    bench = _bench()
    a = {"id": "a", "split": "test", "dispatcher": "alltoall", "ep_overlap": False,
         "alternate_reading": {"fields": {"dispatcher": "deepep", "ep_overlap": True}, "why": "two presets"}}
    b = {"id": "b", "split": "fit", "dispatcher": "deepep"}
    out, ids = bench.alternate_runs([a, b])
    assert ids == ["a"] and out[1] is b
    assert (out[0]["dispatcher"], out[0]["ep_overlap"], out[0]["split"], out[0]["id"]) == ("deepep", True, "test", "a")
    assert (a["dispatcher"], a["ep_overlap"]) == ("alltoall", False)  # the row itself is not changed
    with pytest.raises(ConfigError, match=r"alternate_reading\.fields\.gpus"):
        bench.alternate_runs([{**a, "alternate_reading": {"fields": {"gpus": 8}, "why": "x"}}])
    with pytest.raises(ConfigError, match="'alternate_reading'"):
        bench.alternate_runs([{**a, "alternate_reading": {"fields": {}, "why": "x"}}])
    # the shipped data: the runs whose container's release reads two ways (docs/fidelity.md), each with a reason
    runs = _runs(ALL_FILES)
    _, ids = bench.alternate_runs(list(runs.values()))
    assert sorted(ids) == sorted(["qwen3-30b-a3b/16xH100/fp8/pp2-vp12-ep8", "qwen3-30b-a3b/16xH100/fp8/pp2-vp12-ep8-2602.01",
                                  "gpt-oss-120b/64xH100/bf16/pp4-ep8-mbs4-gbs512",
                                  "gpt-oss-120b/64xB200/bf16/ep8-mbs4-gbs512"])


def test_runs_file_field_types_are_refused_with_one_line(tmp_path):
    # each broken field of a real row gives one line naming the run and the field, exit 2, before any planning
    import copy
    import subprocess
    import sys

    data = json.loads((ROOT / "data" / "published" / "megatron_bridge.json").read_text())
    cases = {"expert_load": ("x", "'expert_load' = 'x'"), "ep_overlap": ("no", "'ep_overlap' = 'no'"),
             "tokens_per_s_per_gpu": (-5, "'tokens_per_s_per_gpu' = -5"),
             "recompute_modules": ("moe_act", "'recompute_modules' = 'moe_act'"),
             "dispatcher": ("nccl", "'dispatcher' = 'nccl'"),
             "alternate_reading": ({"fields": {"dispatcher": "nccl"}, "why": "w"}, "(alternate_reading)")}
    for field, (value, expected) in cases.items():
        d = copy.deepcopy(data)
        run = d["runs"][2]
        run[field] = value
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps(d))
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_public_runs.py"), "--runs", str(path)],
                           capture_output=True, text=True, cwd=ROOT)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, (field, p.stderr)
        assert expected in lines[0] and run["id"] in lines[0], (field, lines[0])
