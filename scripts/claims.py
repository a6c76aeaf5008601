"""The registry of figures quoted in README.md and docs/ (``docs/claims.json``): check them, re-run them, rewrite them.

A quoted figure carries a marker right after it, ``1.794 s<!-- claim:default-plan.iteration -->``; its registry
entry holds the value, the format that turns the value into the quoted text, the command that produced it, the
environment, date and machine load, its kind (``measured``, ``simulated``, ``derived``, ``by construction``,
``cited``) and its tolerance. Entries with a ``probe`` are re-computed by this script: simulated and derived
figures of the analytic planner, the cost model's data-file inputs and zb-auto's simulated makespans, cheap and
deterministic (a few seconds of CPU in all). Measured figures (benchmarks' CPU and wall seconds) carry the date
and the machine load of their run and are not re-run.

A generated block (a table) sits between ``<!-- claim-block:ID -->`` and ``<!-- /claim-block:ID -->`` lines (a
blank line on either side of it); its text is what the block's function (:data:`BLOCKS`) returns, the same text a
command prints (``benchmarks/bench_public_runs.py --markdown``).
``check`` compares the block with a fresh run, ``regen`` rewrites it, ``check --no-rerun`` checks only that every
block is known and closed.

Usage::

    python scripts/claims.py check            # quoted text == registry text; probes re-run within tolerance
    python scripts/claims.py check --no-rerun # only the quoted text against the registry
    python scripts/claims.py regen            # re-run the probes, update their entries, rewrite the quoted text
    python scripts/claims.py list             # every entry: id, kind, quoted text, date

Exit status: 0 when everything agrees, 1 with one line per disagreement, 2 when the registry itself cannot be used
(unreadable, empty, not UTF-8, not JSON, a null or malformed entry, a missing field, a duplicate id, a format
that does not format its value): one line per problem on stderr, nothing checked or written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "claims.json"
KINDS = ("measured", "simulated", "derived", "by construction", "cited")
REQUIRED = ("id", "value", "format", "kind", "command", "environment", "date", "load", "tolerance")

#: a marker after a quoted figure; the figure is the text right before it (number, optional sign and unit)
MARKER = re.compile(r"<!-- claim:(?P<id>[A-Za-z0-9_.\-]+) -->")
#: a generated block: its opening line, its text (every line up to the closing marker) and its closing line; a
#: block marker is a line of its own (a marker quoted inside a sentence is not one)
BLOCK = re.compile(r"^<!-- claim-block:(?P<id>[A-Za-z0-9_.\-]+) -->\n(?P<body>(?:(?!<!-- /?claim-block:).*\n)*?)"
                   r"<!-- /claim-block:(?P=id) -->$", re.M)
BLOCK_OPEN = re.compile(r"^<!-- claim-block:(?P<id>[A-Za-z0-9_.\-]+) -->$", re.M)
FIGURE = re.compile(r"[+\-]?\d[\d,]*(?:\.\d+)?(?: ?(?:%|s|ms|minutes|min|GiB|x|tokens/s))?$")


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, CHANGELOG excluded (history quotes old figures on purpose), and every Markdown file of docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


class RegistryError(ValueError):
    """A registry that cannot be used: ``problems`` holds one line per problem (file, entry, field, value)."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _read_json_doc(path: Path) -> tuple[Any, list[str]]:
    """``(parsed document, problems)`` of a JSON file: unreadable, empty, not UTF-8 or not JSON is one problem."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, [f"{path}: cannot read it ({exc.strerror or exc})"]
    if not raw.strip():
        return None, [f"{path}: the file is empty; allowed: a JSON object {{\"claims\": [...]}}"]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [f"{path}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); allowed: UTF-8 JSON"]
    try:
        return json.loads(text), []
    except json.JSONDecodeError as exc:
        return None, [f"{path}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"]
    except RecursionError:
        return None, [f"{path}: not valid JSON: nested too deeply"]


def _entry_problems(n: int, e: Any, seen: dict[str, int]) -> list[str]:
    """Problems of the registry's ``claims[n]``: not an object, missing fields, a bad id (or one seen before), a
    value that is not a finite number, a format that does not format it, an unknown kind or probe, a bad
    tolerance."""
    import math

    where = f"claims[{n}]"
    if not isinstance(e, dict):
        return [f"{where} is {json.dumps(e)[:40]}; allowed: an object with fields {', '.join(REQUIRED)}"]
    cid = e.get("id")
    bad = []
    if not isinstance(cid, str) or not MARKER.fullmatch(f"<!-- claim:{cid} -->"):
        bad.append(f"{where}: field 'id' = {cid!r}; allowed: a string of letters, digits, '_', '.', '-'")
    elif cid in seen:
        bad.append(f"{where}: field 'id' = {cid!r} appears twice (also claims[{seen[cid]}]); allowed: unique ids")
    else:
        seen[cid] = n
    where = f"{where} ({cid!r})" if isinstance(cid, str) else where
    missing = [k for k in REQUIRED if k not in e]
    if missing:
        bad.append(f"{where}: missing field(s) {', '.join(missing)}")
    v = e.get("value")
    if "value" in e and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
        bad.append(f"{where}: field 'value' = {v!r}; allowed: a finite number")
    elif "format" in e:
        try:
            if not isinstance(e["format"], str):
                raise TypeError
            e["format"].format(v)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            bad.append(f"{where}: field 'format' = {e['format']!r} cannot format value {v!r}; allowed: a format "
                       "string with one field, e.g. '{:.3f} s'")
    if "kind" in e and e["kind"] not in KINDS:
        bad.append(f"{where}: field 'kind' = {e['kind']!r}; allowed: {', '.join(KINDS)}")
    tol = e.get("tolerance", {})
    if (not isinstance(tol, dict) or not set(tol) <= {"abs", "rel", "note"}
            or any(isinstance(tol.get(k), bool) or not isinstance(tol.get(k, 0.0), (int, float)) for k in ("abs", "rel"))):
        bad.append(f"{where}: field 'tolerance' = {tol!r}; allowed: {{'abs': x}} and/or {{'rel': x}} (numbers; "
                   "and a 'note')")
    if e.get("probe") is not None and (e["probe"] not in PROBES or not isinstance(e.get("key"), str)):
        bad.append(f"{where}: field 'probe' = {e['probe']!r} with key {e.get('key')!r}; allowed: a probe of "
                   f"{', '.join(PROBES)} and a string 'key'")
    return bad


def read_registry(path: Path = REGISTRY) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``({id: entry}, problems)``: the registry checked entry by entry (:func:`_entry_problems`), one line per
    problem; entries with problems are left out of the dict."""
    doc, bad = _read_json_doc(path)
    if bad:
        return {}, bad
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        return {}, [f"{path}: top level is {type(doc).__name__}{' without a list claims' if isinstance(doc, dict) else ''}"
                    "; allowed: a JSON object {\"claims\": [entry, ...]}"]
    out: dict[str, dict[str, Any]] = {}
    seen: dict[str, int] = {}
    for n, e in enumerate(doc["claims"]):
        problems = _entry_problems(n, e, seen)
        bad += [f"{path}: {line}" for line in problems]
        if not problems:
            out[e["id"]] = e
    return out, bad


def load_registry(path: Path = REGISTRY) -> dict[str, dict[str, Any]]:
    """The registry as ``{id: entry}``.

    Raises:
        RegistryError: one line per problem (:func:`read_registry`): unreadable, empty, not UTF-8, not JSON, a
            null or malformed entry, a missing field, a duplicate id, a format that does not format its value.
    """
    reg, bad = read_registry(path)
    if bad:
        raise RegistryError(bad)
    return reg


def text_of(entry: dict[str, Any]) -> str:
    """The quoted text of an entry: its ``format`` applied to its ``value``."""
    return entry["format"].format(entry["value"])


def quoted(text: str) -> list[tuple[str, str, int, int]]:
    """``(id, figure, start, end)`` for every marker of ``text``; ``figure`` is the number (with sign and unit)
    right before the marker, ``""`` when there is none; ``start:end`` its span."""
    out = []
    for m in MARKER.finditer(text):
        head = text[:m.start()]
        fig = FIGURE.search(head[-40:])
        if fig is None:
            out.append((m.group("id"), "", m.start(), m.start()))
        else:
            start = m.start() - (len(head[-40:]) - fig.start())
            out.append((m.group("id"), fig.group(0), start, m.start()))
    return out


def check_entries(reg: dict[str, dict[str, Any]]) -> list[str]:
    """Problems with the entries themselves (:func:`_entry_problems`): missing fields, unknown kinds, ..."""
    seen: dict[str, int] = {}
    return [f"{cid}: {line}" for n, (cid, e) in enumerate(reg.items()) for line in _entry_problems(n, e, seen)]


def check_text(name: str, text: str, reg: dict[str, dict[str, Any]]) -> list[str]:
    """Problems in one document: a marker without a figure, an unknown id, a figure that is not the entry's text."""
    bad = []
    for cid, fig, _, _ in quoted(text):
        if cid not in reg:
            bad.append(f"{name}: claim:{cid} is not in {REGISTRY.name}")
        elif not fig:
            bad.append(f"{name}: claim:{cid} has no figure right before its marker")
        elif fig != text_of(reg[cid]):
            bad.append(f"{name}: claim:{cid} quotes {fig!r}, the registry says {text_of(reg[cid])!r} "
                       f"(python scripts/claims.py regen rewrites it)")
    return bad


def check_blocks(name: str, text: str) -> list[str]:
    """Problems with the generated blocks of one document: an unknown block id, an opening marker without its
    closing marker (``<!-- /claim-block:ID -->`` on a line of its own after the block's text)."""
    closed = {m.start() for m in BLOCK.finditer(text)}
    bad = []
    for m in BLOCK_OPEN.finditer(text):
        if m.group("id") not in BLOCKS:
            bad.append(f"{name}: claim-block:{m.group('id')} is not a block of scripts/claims.py; known: "
                       f"{', '.join(BLOCKS)}")
        elif m.start() not in closed:
            bad.append(f"{name}: claim-block:{m.group('id')} is not closed by a line "
                       f"<!-- /claim-block:{m.group('id')} -->")
    return bad


def check_docs(reg: dict[str, dict[str, Any]], root: Path = ROOT) -> list[str]:
    bad = check_entries(reg)
    for path in doc_files(root):
        if path.exists():
            name, text = str(path.relative_to(root)), path.read_text()
            bad += check_text(name, text, reg) + check_blocks(name, text)
    return bad


# ------------------------------------------------------------------------------------------------- probes
def _default_plan() -> dict[str, float]:
    """The embedded default plan (``tessera-lab plan``) and the same with one grouped expert kernel."""
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import DEFAULT_MODEL, make_plan

    model = load_model(DEFAULT_MODEL)
    plan = make_plan(model)
    grouped = make_plan(model, ParallelConfig(grouped_gemm="grouped"))
    gain = plan.refinement.get("gain_s", 0.0)
    return {"iteration": plan.chosen.iteration_time_s, "tokens-per-s": plan.chosen.tokens_per_s,
            "mfu": plan.chosen.mfu, "mfu-grouped": grouped.chosen.mfu, "gpus": plan.parallel.world_size,
            "refinement-start": plan.chosen.iteration_time_s + gain, "refinement-end": plan.chosen.iteration_time_s}


def _knobs() -> dict[str, float]:
    """Relative change of the default plan's iteration time under two model knobs."""
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import DEFAULT_MODEL, make_plan

    model = load_model(DEFAULT_MODEL)
    base = make_plan(model).chosen.iteration_time_s
    half = make_plan(model.with_changes(moe_intermediate_size=model.moe.moe_intermediate_size // 2)).chosen
    ratio1 = make_plan(model.with_changes(attention_ratio=1)).chosen
    return {"expert-width-half": half.iteration_time_s / base - 1.0,
            "attention-ratio-1": ratio1.iteration_time_s / base - 1.0}


_PUBLIC_KEYS = {
    "qwen3-30b-a3b/16xH100/fp8/ep16": "qwen3-30b-16xh100",
    "qwen3-235b-a22b/256xH100/fp8/tp2-pp8-vp4-ep32": "qwen3-235b-256xh100",
    "deepseek-v3/1024xH100/fp8/tp2-pp8-vp4-ep64": "deepseek-v3-1024xh100",
    "qwen3-30b-a3b/8xB200/fp8/ep8": "qwen3-30b-8xb200",
    "qwen3-235b-a22b/256xB200/fp8/pp8-ep8": "qwen3-235b-256xb200",
    "deepseek-v3/256xB200/fp8/pp8-vp2-ep32": "deepseek-v3-256xb200",
}


def _public_runs() -> dict[str, float]:
    """Predicted TFLOP/s per GPU and error of each published run (``benchmarks/bench_public_runs.py``)."""
    import statistics

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_public_runs as bench
    finally:
        sys.path.pop(0)
    from tessera_lab.report.fidelity_set import DEFAULT_FILES, load_runs

    runs, _ = load_runs([ROOT / "data" / "published" / f for f in DEFAULT_FILES])
    out: dict[str, float] = {}
    errors = []  # the test set's median |error| with the term off
    with_term = []  # the headline: the test set's |error| with the shipped fitted term (never refitted here)
    for run in runs:
        if run["split"] == "reference" or (run["split"] == "fit" and run["id"] not in _PUBLIC_KEYS):
            continue
        row = bench.predict(run)
        if run["split"] == "test":
            errors.append(abs(row["error"]))
            with_term.append(abs(bench.predict(run, None)["error"]))  # None: the planner's fitted term
        key = _PUBLIC_KEYS.get(row["id"])
        if key:
            out[f"{key}.predicted"] = row["predicted_tflops_per_gpu"]
            out[f"{key}.error"] = row["error"]
    out["median-abs-error"] = statistics.median(errors)
    out["test-median-abs-error"] = statistics.median(with_term)
    out["test-max-abs-error"] = max(with_term)
    return out


_EVALUATION: dict[str, tuple] = {}


def _public_evaluation() -> tuple:
    """``bench_public_runs.evaluate()`` on the shipped runs files (term fitted on their fit set, as the bench prints
    it), computed once per process: the per-run table block and the ``public-runs-table`` probe read the same rows."""
    if "rows" not in _EVALUATION:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        try:
            import bench_public_runs as bench
        finally:
            sys.path.pop(0)
        runs, rows, _, summ, _ = bench.evaluate()
        _EVALUATION.update(bench=bench, rows=rows, summary=summ, runs=runs)
    return _EVALUATION["bench"], _EVALUATION["rows"], _EVALUATION["summary"]


def _public_runs_markdown() -> str:
    """The per-run table of docs/reproduce.md: ``python benchmarks/bench_public_runs.py --markdown``."""
    bench, rows, _ = _public_evaluation()
    return bench.markdown_table(rows)


def _public_runs_table() -> dict[str, float]:
    """The figures the reading of the per-run table quotes (``bench_public_runs.reading_figures``) and the headline
    counts beside them (test runs, source families, the fit set's median |error|), from the rows of that table."""
    bench, rows, summ = _public_evaluation()
    alt = bench.alternate_summary(_EVALUATION["runs"], None)  # every ambiguous run read the other way, refitted
    return {**bench.reading_figures(rows), "n-test": float(summ["n_test"]),
            "source-families": float(len(summ["source_families"])),
            "fit-median-abs-error": summ["fit_median_abs_error"],
            "alternate.n": float(len(alt["ids"])), "alternate.test-median-abs-error": alt["test_median_abs_error"],
            "alternate.test-max-abs-error": alt["test_max_abs_error"],
            "alternate.test-beyond-target": float(alt["test_beyond_target"])}


def _public_fit_components() -> dict[str, float]:
    """On the fit set only (no test run is planned): the per-layer time the plan without the host/sync term leaves
    unexplained, in ms and over the modelled compute (``bench_public_runs.needed_and_compute``), for the GPT-OSS runs
    and for the Qwen3-30B-A3B runs with the ``deepep`` dispatcher (``bench_public_runs.py --split fit --breakdown``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_public_runs as bench
    finally:
        sys.path.pop(0)
    from tessera_lab.report.fidelity_set import DEFAULT_FILES, load_runs

    runs, _ = load_runs([ROOT / "data" / "published" / f for f in DEFAULT_FILES])
    groups: dict[str, list[tuple[float, float]]] = {"gpt-oss": [], "qwen3-deepep": []}
    for run in runs:
        if run["split"] != "fit":
            continue
        group = ("gpt-oss" if run["model"].startswith("gpt-oss") else
                 "qwen3-deepep" if run["model"].startswith("qwen3-30b") and run["dispatcher"] == "deepep" else None)
        if group is None:
            continue
        row = bench.predict(run, 0.0)
        b = bench.breakdown({**run, "tokens_per_s_per_gpu": row["tokens_per_s_per_gpu_at_published_time"]})
        groups[group].append(bench.needed_and_compute(row, b))
    out: dict[str, float] = {}
    for g, vals in groups.items():
        ms = [n * 1e3 for n, _ in vals]
        ratio = [n / c for n, c in vals]
        out.update({f"{g}.needed-ms.min": min(ms), f"{g}.needed-ms.max": max(ms),
                    f"{g}.needed-over-compute.min": min(ratio), f"{g}.needed-over-compute.max": max(ratio),
                    f"{g}.runs": float(len(vals))})
    return out


#: validated runs quoted in docs/fidelity.md: claim key -> result file under data/devices/validation/
_VALIDATION_FILES = {
    "quick-1": "cpu-2core-quick-2026-12-01-cpu-1.json", "quick-2": "cpu-2core-quick-2026-12-01-cpu-2.json",
    "quick-3": "cpu-2core-quick-2026-12-01-cpu-3.json",
    "own-1": "cpu-2core-quick-2026-12-01-cpu-own-calibration-1.json",
    "own-2": "cpu-2core-quick-2026-12-01-cpu-own-calibration-2.json",
    "full": "cpu-2core-full-2026-12-01-cpu.json",
}


def _validation_results() -> dict[str, float]:
    """Median |error|, rank agreement and agreement on pairs apart beyond the noise of the stored ``validate``
    results (measured once; re-read here, so the quoted figures stay those of the files)."""
    out = {}
    for key, name in _VALIDATION_FILES.items():
        d = json.loads((ROOT / "data" / "devices" / "validation" / name).read_text())
        out[f"{key}.error"] = d["median_abs_error"]
        out[f"{key}.rank"] = d["rank_agreement"]
        out[f"{key}.apart"] = d["rank_agreement_apart"]
    return out


def _cost_model() -> dict[str, float]:
    """The analytic cost model's inputs quoted in docs/cost-model.md (``data/hardware/cost_model.json``, the fitted
    host-sync term of ``cost.sync``), its worked host-issue example (Qwen3-30B-A3B FP8 expert forward on EP 16:
    8 local experts x 2 GEMM shapes x (1 + 3 + 3/m) kernels, computed here by that formula from the data file's
    kernel counts) and the published MFU bands of the default model (``report.headline.published_mfu_band``)."""
    from tessera_lab.cost.sync import FITTED_PER_WAIT_S
    from tessera_lab.report.headline import published_mfu_band

    data = json.loads((ROOT / "data" / "hardware" / "cost_model.json").read_text())
    v = {k: e["value"] for k, e in data.items() if isinstance(e, dict) and "value" in e}
    q = v["fp8_quantize_kernels"]
    experts, shapes = 8, 2  # Qwen3-30B-A3B: 128 experts / EP 16; gate-up and down GEMM shapes

    def kernels(m: int) -> float:
        return experts * shapes * (1 + q + q / m)

    bands = {b["name"]: b for b in published_mfu_band()["bands"]}
    return {
        "attention-efficiency": v["attention_efficiency"], "linear-attention-efficiency":
        v["linear_attention_efficiency"], "hbm-efficiency": v["hbm_efficiency"],
        "fp8-cast-bytes": v["fp8_cast_bytes_per_element"], "kernel-launch-us": v["kernel_launch_s"] * 1e6,
        "host-us-per-kernel": v["host_s_per_kernel"] * 1e6, "fp8-quantize-kernels": q,
        "memory-reserve-gib": v["memory_reserve_gib"],
        "host-sync-ms.alltoall": FITTED_PER_WAIT_S["alltoall"] * 1e3,
        "host-sync-ms.deepep": FITTED_PER_WAIT_S["deepep"] * 1e3,
        "example.kernels-m32": kernels(32), "example.kernels-m1": kernels(1),
        "example.host-ms-m32": kernels(32) * v["host_s_per_kernel"] * 1e3,
        "band.tessera-lo": bands["tessera"]["lo"], "band.tessera-hi": bands["tessera"]["hi"],
        "band.megatron-bridge-lo": bands["megatron_bridge"]["lo"],
        "band.megatron-bridge-hi": bands["megatron_bridge"]["hi"],
    }


def _zb_auto() -> dict[str, float]:
    """zb-auto's simulated makespans on the nine cases of ``benchmarks/bench_schedules.py`` compared with sail-sg's
    heuristic (p2p 0.05, budget 2p - 1): the pruned search (the default) and the exhaustive one (under a second of
    CPU in all). Keys ``p{p}-m{m}-{profile}.pruned`` / ``.exhaustive``."""
    from tessera_lab.pipeline.schedules import zb_auto

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_schedules as bench
    finally:
        sys.path.pop(0)
    out = {}
    for p, rounds, prof in bench.SAIL_CASES:
        m = rounds * p
        f, i, w = bench.profiles(p, 0)[prof]
        for search in ("pruned", "exhaustive"):
            sched = zb_auto(p, m, f, i, w, p2p=0.05, memory_budget=2 * p - 1, search=search)
            out[f"p{p}-m{m}-{prof}.{search}"] = sched.meta["makespan"]
    return out


def _context_parallel() -> dict[str, float]:
    """docs/context-parallel.md: the GPU figures of ``data/hardware/hardware.json`` it tabulates (per GPU, dense), the
    worked CP volumes (the task graph's ``cp_kv`` / ``cp_a2a_*`` bytes, which the tests check against the hand
    formulas) and the EP 64 all-to-all bandwidth-term ratio of DGX H200 over GB200 NVL72 (the cost model's)."""
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.graph import Collective
    from tessera_lab.model.hardware import GPUSpec, ParallelConfig, cluster_for, cost_assumptions
    from tessera_lab.model.spec import load_model
    from tessera_lab.model.tasks import layer_tasks

    out: dict[str, float] = {}
    for name in ("H100", "H200", "B200", "B300", "GB200"):
        g = GPUSpec.named(name)
        hbm_gb = json.loads((ROOT / "data" / "hardware" / "hardware.json").read_text())["gpus"][g.name]["hbm_gb"]
        out.update({f"{name}.bf16-tflops": g.peak_flops / 1e12, f"{name}.hbm-gb": hbm_gb,
                    f"{name}.hbm-tb-s": g.hbm_bytes_per_s / 1e12, f"{name}.nvlink-gb-s": g.nvlink_bytes_per_s * 2e-9,
                    f"{name}.domain": g.nvlink_domain, f"{name}.nic-gbit": g.nic_bytes_per_s * 8e-9})

    def coll(model, attention, name, **par):
        m = load_model(model)
        layer = next(l for l in m.stack.layers if l.attention == attention)
        lt = layer_tasks(m, layer, ParallelConfig(pp=1, expert_load=1.0, **par))
        return {ph: next(t for t in getattr(lt, ph) if t.name == name).collective.bytes for ph in ("F", "B")}

    ring = coll("qwen3-next-80b-a3b", "gated_gqa", "cp_kv", ep=8, cp=4, seq_len=65536)
    out.update({"ring.S": ring["F"], "ring.backward": ring["B"]})
    out["gdn.in"] = coll("qwen3-next-80b-a3b", "gated_deltanet", "cp_a2a_in", ep=8, cp=2, seq_len=16384)["F"]
    out["gdn.out"] = coll("qwen3-next-80b-a3b", "gated_deltanet", "cp_a2a_out", ep=8, cp=2, seq_len=16384)["F"]
    out["mamba2.in-width"] = coll("nemotron-h-56b", "mamba2", "cp_a2a_in", ep=1, tp=4, cp=4,
                                  seq_len=8192)["F"] / (2048 * 2)
    p, a = ParallelConfig(pp=1, ep=64), cost_assumptions()
    c = Collective("all_to_all", 1e9, "ep", 64)
    t_gb = CostModel(cluster_for(p, "GB200"), p).collective_time(c) - a["alpha_intra_node_s"]
    t_h = CostModel(cluster_for(p, "H200"), p).collective_time(c) - a["alpha_inter_node_s"]
    out["ep64.h200-over-gb200"] = t_h / t_gb
    return out


#: probe name -> function returning {key: value}; an entry names ``probe`` and ``key``
_REPRODUCE: list = []


def _reproduce_markdown() -> str:
    """The verdicts, reasons and per-scenario gains of docs/reproduce.md:
    ``tessera-lab reproduce --out DIR --quick --markdown`` (about 40 CPU s; run once per process)."""
    from tessera_lab.cli.reproduce import claims_markdown
    from tessera_lab.report.reproduce import reproduce

    if not _REPRODUCE:
        _REPRODUCE.append(reproduce(quick=True))
    return claims_markdown(_REPRODUCE[0])


def _modelzoo_markdown() -> str:
    """The Megatron-MoE-ModelZoo Qwen3 table of docs/search.md: ``python benchmarks/bench_modelzoo_ranking.py
    --markdown`` (twelve plans, about 12 CPU s)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_modelzoo_ranking as bench
    finally:
        sys.path.pop(0)
    return bench.markdown(bench.evaluate())


PROBES: dict[str, Callable[[], dict[str, float]]] = {
    "default-plan": _default_plan,
    "knobs": _knobs,
    "public-runs": _public_runs,
    "public-fit-components": _public_fit_components,
    "public-runs-table": _public_runs_table,
    "validation-files": _validation_results,
    "cost-model": _cost_model,
    "zb-auto": _zb_auto,
    "context-parallel": _context_parallel,
    "reproduce": dict,  # no figure of its own: its block (``reproduce.verdicts``) is the whole output
    "modelzoo": dict,  # likewise: its block (``modelzoo.table``)
}
#: probes whose runs take tens of CPU seconds (the fast test suite leaves them to the slow one)
SLOW_PROBES = ("reproduce", "modelzoo")


#: generated block id -> (the probe whose run it shares, the command that prints the same text, the function
#: returning its text)
BLOCKS: dict[str, tuple[str, str, Callable[[], str]]] = {
    "public-runs.table": ("public-runs-table", "python benchmarks/bench_public_runs.py --markdown",
                          _public_runs_markdown),
    "reproduce.verdicts": ("reproduce", "tessera-lab reproduce --out DIR --quick --markdown", _reproduce_markdown),
    "modelzoo.table": ("modelzoo", "python benchmarks/bench_modelzoo_ranking.py --markdown", _modelzoo_markdown),
}


def within(entry: dict[str, Any], value: float) -> bool:
    """Whether a re-computed ``value`` agrees with the entry's within its tolerance (abs or rel, either passes)."""
    tol = entry.get("tolerance", {})
    diff = abs(value - entry["value"])
    return diff <= tol.get("abs", 0.0) or diff <= tol.get("rel", 0.0) * abs(entry["value"]) or diff == 0.0


def rerun(reg: dict[str, dict[str, Any]], probes: list[str] | None = None) -> tuple[dict[str, float], list[str]]:
    """Re-run the probes (all, or those named) of the registry's entries: ``(new values by id, problems)``."""
    wanted = sorted({e["probe"] for e in reg.values() if e.get("probe")} & set(probes or PROBES))
    values: dict[str, float] = {}
    bad = []
    for name in wanted:
        if name not in PROBES:
            bad.append(f"probe {name!r} is unknown; known: {', '.join(PROBES)}")
            continue
        got = PROBES[name]()
        for cid, e in reg.items():
            if e.get("probe") != name:
                continue
            if e["key"] not in got:
                bad.append(f"{cid}: probe {name} gives no {e['key']!r}")
                continue
            values[cid] = got[e["key"]]
            if not within(e, got[e["key"]]):
                bad.append(f"{cid}: re-run gives {e['format'].format(got[e['key']])} ({got[e['key']]!r}), the registry "
                           f"says {text_of(e)} ({e['value']!r}); tolerance {e['tolerance']}")
    return values, bad


def framed(text: str) -> str:
    """A block's text as a document holds it between its markers: a blank line, the text (ending in a newline),
    a blank line (so that Markdown renders the table apart from the markers)."""
    return "\n" + text + ("" if text.endswith("\n") else "\n") + "\n"


def rerun_blocks(probes: list[str] | None = None, root: Path = ROOT) -> tuple[dict[str, str], list[str]]:
    """Re-make the generated blocks the documents hold (all, or those of the probes named): ``(text by block id,
    problems)``, a problem per block whose text in a document differs from the fresh one."""
    texts: dict[str, str] = {}
    bad = []
    for path in doc_files(root):
        if not path.exists():
            continue
        for m in BLOCK.finditer(path.read_text()):
            bid = m.group("id")
            if bid not in BLOCKS or BLOCKS[bid][0] not in (probes or PROBES):
                continue
            if bid not in texts:
                texts[bid] = BLOCKS[bid][2]()
            if m.group("body") != framed(texts[bid]):
                bad.append(f"{path.relative_to(root)}: claim-block:{bid} differs from a fresh run of "
                           f"`{BLOCKS[bid][1]}` (python scripts/claims.py regen rewrites it)")
    return texts, bad


def rewrite_blocks(text: str, texts: dict[str, str]) -> str:
    """``text`` with every generated block named in ``texts`` replaced by that text."""
    def body(m: re.Match) -> str:
        bid = m.group("id")
        if bid not in texts:
            return m.group(0)
        return f"<!-- claim-block:{bid} -->\n{framed(texts[bid])}<!-- /claim-block:{bid} -->"

    return BLOCK.sub(body, text)


def rewrite(text: str, reg: dict[str, dict[str, Any]]) -> str:
    """``text`` with every marked figure replaced by its entry's quoted text."""
    out, last = [], 0
    for cid, fig, start, end in quoted(text):
        if cid in reg and fig:
            out.append(text[last:start])
            out.append(text_of(reg[cid]))
            last = end
    out.append(text[last:])
    return "".join(out)


def _load_now() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:  # pragma: no cover
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["check", "regen", "list"])
    ap.add_argument("--no-rerun", action="store_true", help="check: only compare the quoted text with the registry")
    ap.add_argument("--probe", action="append", choices=sorted(PROBES), help="re-run only this probe (repeatable)")
    ap.add_argument("--registry", type=Path, default=REGISTRY, help=f"the registry (default {REGISTRY})")
    args = ap.parse_args(argv)
    reg, bad = read_registry(args.registry)
    if bad:  # a broken registry: one line per problem, exit 2 (bad input), nothing checked or written
        for line in bad:
            print(f"claims.py: error: {line}", file=sys.stderr)
        return 2
    if args.action == "list":
        for cid, e in reg.items():
            print(f"{cid:44} {e['kind']:15} {text_of(e):>14}  {e['date']}  load {e['load']}")
        for bid, (_, command, _) in BLOCKS.items():
            print(f"{bid:44} {'block':15} {'(table)':>14}  {command}")
        return 0
    if args.action == "check":
        bad = check_docs(reg)
        if not args.no_rerun:
            bad += rerun(reg, args.probe)[1] + rerun_blocks(args.probe)[1]
        for line in bad:
            print(line)
        print(f"{len(reg)} claims, {len(bad)} problem(s)", file=sys.stderr)
        return 1 if bad else 0
    # regen: re-run the probes, update their entries (value, date, load), rewrite every document
    values, _ = rerun(reg, args.probe)
    blocks, _ = rerun_blocks(args.probe)
    today = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    for cid, v in values.items():
        if reg[cid]["value"] != v:
            reg[cid].update(value=v, date=today, load=_load_now())
    args.registry.write_text(json.dumps({"claims": list(reg.values())}, indent=1) + "\n")
    changed = []
    for path in doc_files():
        if path.exists():
            old = path.read_text()
            new = rewrite_blocks(rewrite(old, reg), blocks)
            if new != old:
                path.write_text(new)
                changed.append(str(path.relative_to(ROOT)))
    print(f"{len(values)} claims and {len(blocks)} block(s) re-run; rewritten: {', '.join(changed) or 'nothing'}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
