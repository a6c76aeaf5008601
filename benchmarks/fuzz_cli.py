"""Fuzz the command-line contract: every subcommand, generated flags and files.

The contract: exit status 0 or 2; no traceback; on exit 2 at most two lines on stderr (on exit 0 at most two lines
besides the "result: / figure: / trace: / plan written to" notices of written files); every run within a time
bound. The CLI runs in-process (``tessera_lab.cli.main.main``), under a per-example alarm.

Generated: each subcommand's options (introspected from the parser) with values drawn from corpora of numbers
(0, negatives, nan, inf, 1e308, 10**7, "abc", "1e12", ...), strings, model names, schedule names, routing specs and
files (valid and broken configs, profiles and plans: binary, non-UTF-8, deeply nested, NaN fields, strings where
numbers belong, empty, folders, missing paths, symlinks, a private character device, a 250-character name).
Routing logs (``simulate --routing replay:FILE``), ``report --dynamic`` sources (simulation and run results) and
overlap profiles come as real files and tampered copies: wrong types, values out of range, huge values (1e300,
10**30, sizes over the work limits), missing fields, broken cross-field rules and non-UTF-8 bytes; each is bad by
construction where its command reads it (a tampered profile once the profile loader applies
:func:`tessera_lab.overlap.profile_schema.check_profile`).
The runner's commands (``run``, ``calibrate``, ``validate``) are driven with their
files (runner plans, observation stores, run results, device files, validation results: good ones and tampered
copies) and ``TESSERA_LAB_*`` variables; the step that would start workers or measure is replaced by a stub that
runs every check a launch makes first (:func:`tessera_lab.runner.launch.spawn.check_launch`) and then stops: an input
that gets there was accepted (``accepted``). An input known to be bad by construction (a tampered file where the
command reads it, a malformed variable) that is accepted or exits 0 is a contract break (``silent``).
Plan JSONs that claim what they are not (a ``partition_from`` that is none of their baselines, nodes that cannot
hold their GPUs) are bad where ``report --plan`` reads them; option combinations are bad by construction too: a
``run --pair-order`` without the scheduled pair handler (it would be ignored), ``report --plan P --costs PROFILE``
with a profile of another model or backend without ``--allow-stale-profile``, ``simulate --dynamic --steps
1000000`` (over the online work limit), ``measure --backend cpu|cuda`` with a ``--budget-s`` over its ``--timeout``.
``search`` (with few ``--max-plans``), ``plan --cp``, ``--gpu GB200|B300``, real HF configs of several families
(tests/data/aiconfigurator_configs) and tampered ones (a boolean as a string: refused always; an unknown field:
refused without ``--allow-unknown-fields``; an unknown field named like a shape: refused without both allow
flags) where plan and search read them, ``measure --dry-run`` and ``--pair``, and the torchrun entry
``python -m tessera_lab.runner`` (pseudo-command ``runner``): without torchrun's variables it is the local spawner
(stubbed as for ``run``); with all five it runs up to the process group (stubbed: ``accepted``); with one of them
missing or malformed it is bad by construction.
Not driven: ``measure --backend cpu|cuda`` (real measurements) and ``reproduce`` without ``--quick`` (minutes).

Usage::

    python benchmarks/fuzz_cli.py --examples 200 [--seed 0] [--bound 60] [--bad-rate 2] [--verbose]

prints how many inputs it tried and the outcome counts (ok, error, and any contract breaks with their argv).
``tests/test_fuzz_cli.py`` runs the same generator with a bounded number of examples in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import stat
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hypothesis import strategies as st  # noqa: E402

#: commands the fuzzer drives, and how often (cheap ones more often)
COMMANDS = ("models", "params", "plan", "search", "partition", "simulate", "measure", "report", "reproduce", "run",
            "calibrate", "validate")
#: the torchrun entry ``python -m tessera_lab.runner`` (its own parser), driven as the pseudo-command "runner"
RUNNER_ENTRY = "runner"
#: options whose file is read by the command whenever given (a bad file there must be refused)
READ_ALWAYS = {("run", "--plan"), ("run", "--profile-store"), ("report", "--observed"), ("report", "--lifecycle"),
               ("validate", "--repredict"), ("plan", "--device"), ("report", "--dynamic"), ("report", "--plan")}
#: files bad only where a given option reads them (option -> key prefix): a plan JSON tampered in what it claims
#: (partition_from, nodes, gpus) is bad for report --plan, not for run --plan (which reads only its boundaries)
ONLY_FOR = {"bad_pjson": ("report", "--plan")}
#: options read by every command that takes them once the profile loader applies the profile schema
PROFILE_READ = {("plan", "--profile")}
#: options given several times, each file read (append)
APPENDED = {"--dynamic"}
#: set by :func:`build_corpus`: whether the profile loader applies the profile schema
_PROFILES_CHECKED = [False]
#: TESSERA_LAB_* values: good ones, and malformed ones (always refused)
ENV_GOOD = {"TESSERA_LAB_MAX_LAYERS": "4096", "TESSERA_LAB_FAULT": "1:kill:5", "TESSERA_LAB_HEARTBEAT_TIMEOUT": "8",
            "TESSERA_LAB_MAX_JSON_BYTES": "100000000", "TESSERA_LAB_STARTUP_FLOOR": "20",
            "TESSERA_LAB_MAX_ONLINE_ACTIONS": "500000"}
ENV_BAD = {"TESSERA_LAB_MAX_JSON_BYTES": ("-5", "abc", "0"),
           "TESSERA_LAB_FAULT": ("x:kill", "1:boom", "1:kill:-1", "1", "1:start-boom", "1:start-hang:nan"),
           "TESSERA_LAB_HEARTBEAT_TIMEOUT": ("0", "nan", "x"), "TESSERA_LAB_MAX_LAYERS": ("0", "-3", "many"),
           "TESSERA_LAB_MAX_LAYRES": ("5",), "TESSERA_LAB_STARTUP_FLOOR": ("0", "nan", "x", "-2"),
           "TESSERA_LAB_MAX_ONLINE_ACTIONS": ("0", "lots")}
NOTICE_PREFIXES = ("result:", "figure:", "figures:", "trace:", "plan written to", "profile:")
NUMBERS = ("0", "1", "2", "3", "4", "8", "16", "64", "-1", "-5", "2.5", "1e12", "10000000", "1e308", "-1e308", "nan",
           "inf", "-inf", "abc", "", "0x10", "1_000", "  3")
SMALL_INTS = ("1", "2", "3", "4", "8")
FLOATS = ("0", "0.5", "1", "2", "3.5", "1e-9", "-1", "nan", "inf", "-inf", "1e308", "1e9", "fast", "")
MODELS = ("qwen3-8b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "deepseek-v3", "nope", "")
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "zb-h2", "dualpipev", "overlapped", "zb-v", "zb-auto", "bogus",
             "")
GPUS = ("H100", "H200", "B200", "B300", "GB200", "A100", "gb200", "")
#: real HF configs of the families the readers cover (tests/data/aiconfigurator_configs), a few per run
AICONF = ROOT / "tests" / "data" / "aiconfigurator_configs"
#: torchrun's variables for the runner entry: a whole good set, and sets with one variable broken or missing
#: (each refused in one line before any process group: ``bad`` ones are bad by construction)
TORCHRUN_GOOD = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29999"}
TORCHRUN_BAD = ({"MASTER_ADDR": None}, {"MASTER_PORT": None}, {"MASTER_PORT": "x"}, {"MASTER_PORT": "0"},
                {"MASTER_PORT": "70000"}, {"RANK": "4"}, {"RANK": "-1"}, {"RANK": "x"}, {"WORLD_SIZE": "3"},
                {"WORLD_SIZE": "0"}, {"LOCAL_RANK": "x"}, {"LOCAL_RANK": "-2"}, {"MASTER_ADDR": ""})


class FuzzTimeout(BaseException):
    """Raised by the alarm when one example runs past its time bound."""


@dataclass
class Outcome:
    kind: str  # ok | error | traceback | exit_code | stderr_lines | slow
    argv: list[str]
    rc: int | None = None
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Corpus:
    """Files the generated arguments point at (all inside ``root``)."""

    root: Path
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)


def _write(path: Path, data: bytes | str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def build_corpus(root: Path) -> Corpus:
    """Write the input files (good and broken configs, profiles, plans) and prepare output paths under ``root``."""
    from tessera_lab.cli.main import main

    root = Path(root)
    (root / "cwd").mkdir(parents=True, exist_ok=True)
    c = Corpus(root)
    cfg = json.loads((ROOT / "data" / "models" / "qwen3-next-80b-a3b.json").read_text())
    inp = root / "in"
    c.inputs["config"] = _write(inp / "config.json", json.dumps(cfg))
    for name, change in {"nan": float("nan"), "huge": 1e300, "string": "abc", "negative": -4, "float": 2.5,
                         "hugeint": 10**40}.items():
        c.inputs[f"config_{name}"] = _write(inp / f"config_{name}.json", json.dumps({**cfg, "hidden_size": change}))
    c.inputs["config_layers"] = _write(inp / "config_layers.json", json.dumps({**cfg, "num_hidden_layers": 10**6}))
    c.inputs["config_type"] = _write(inp / "config_type.json", json.dumps({**cfg, "model_type": "gpt2"}))
    c.inputs["binary"] = _write(inp / "binary.json", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    c.inputs["latin1"] = _write(inp / "latin1.json", '{"model_type": "qwen3_next", "x": "caf\xe9"}'.encode("latin-1"))
    c.inputs["deep"] = _write(inp / "deep.json", "[" * 50_000 + "]" * 50_000)
    c.inputs["list"] = _write(inp / "list.json", "[1, 2, 3]")
    c.inputs["empty"] = _write(inp / "empty.json", "")
    c.inputs["truncated"] = _write(inp / "truncated.json", json.dumps(cfg)[:100])
    c.inputs["folder"] = str(inp)
    c.inputs["missing"] = str(inp / "missing.json")
    c.inputs["devnull"] = "/dev/null"
    link = inp / "link.json"
    link.symlink_to("config.json")
    c.inputs["link"] = str(link)
    # a real plan and a real (analytic) profile, then broken copies of each
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        main(["plan", "--pp", "4", "-m", "8", "--json", str(inp / "plan.json")])
        main(["measure", "--backend", "analytic", "--model", "qwen3-8b", "--no-progress", "--out",
              str(inp / "profile.json")])
    c.inputs["plan"] = str(inp / "plan.json")
    c.inputs["profile"] = str(inp / "profile.json")
    plan = json.loads((inp / "plan.json").read_text())
    for name, par in {"pp_string": {"pp": "abc"}, "pp_huge": {"pp": 10**9}, "m_nan": {"microbatches": 1.5}}.items():
        bad = {**plan, "parallel": {**plan["parallel"], **par}}
        c.inputs[f"plan_{name}"] = _write(inp / f"plan_{name}.json", json.dumps(bad))
    c.inputs["plan_boundaries"] = _write(inp / "plan_boundaries.json", json.dumps({**plan, "boundaries": [0, 99]}))
    # plan JSONs that claim what they are not (bad where report --plan reads them): a partition_from that is none
    # of the plan's baselines, a baseline whose boundaries are not the plan's, nodes that cannot hold its GPUs
    other = next((n for n, b in plan.get("baselines", {}).items() if b.get("boundaries") != plan["boundaries"]), None)
    for name, change in {"origin_fake": {"partition_from": "baseline made-up", "solver_result": {}},
                         "origin_text": {"partition_from": "the ILP optimum", "solver_result": {}},
                         "origin_other": {"partition_from": f"baseline {other}", "solver_result": {}} if other else {},
                         "nodes_one": {"nodes": 1}, "gpus": {"gpus": plan["gpus"] + 1}}.items():
        if change:
            c.inputs[f"bad_pjson_{name}"] = _write(inp / f"bad_pjson_{name}.json", json.dumps({**plan, **change}))
    prof = json.loads((inp / "profile.json").read_text())
    entries = prof.get("entries", {})
    if entries:
        key = next(iter(entries))
        for name, value in {"negative": -1.0, "string": "fast"}.items():
            e = json.loads(json.dumps(entries[key]))
            e["t_ab"]["median"] = value
            c.inputs[f"profile_{name}"] = _write(inp / f"profile_{name}.json",
                                                 json.dumps({**prof, "entries": {**entries, key: e}}))
    c.inputs["profile_nan"] = _write(inp / "profile_nan.json",
                                     (inp / "profile.json").read_text().replace('"median": 0', '"median": NaN', 1))
    c.inputs["routing_log"] = _write(inp / "routing.json", json.dumps({"format": "nope"}))
    _runner_corpus(c, inp)
    _schema_corpus(c, inp)
    _config_corpus(c, inp)
    _PROFILES_CHECKED[0] = _profiles_checked()
    # outputs
    out = root / "out"
    out.mkdir(parents=True, exist_ok=True)
    blocker = out / "a_file"
    blocker.write_text("x")
    c.outputs.update({
        "json": str(out / "r.json"), "png": str(out / "fig.png"), "svg": str(out / "fig.svg"),
        "badsuffix": str(out / "fig.xyz"), "folder": str(out), "under_file": str(blocker / "x.json"),
        "long": str(out / ("n" * 245 + ".json")), "stdout": "-", "devnull": "/dev/null",
        "nested": str(out / "new" / "deeper" / "r.json"),
    })
    target = out / "target.json"
    target.write_text("{}")
    (out / "link.json").symlink_to("target.json")
    c.outputs["link"] = str(out / "link.json")
    if os.geteuid() == 0:
        node = out / "null"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        c.outputs["device"] = str(node)
    return c


#: real configs of several families (each a different reader), and the one tampered below
HF_CONFIGS = ("Qwen--Qwen3-30B-A3B", "deepseek-ai--DeepSeek-V3", "mistralai--Mixtral-8x7B-v0.1",
              "meta-llama--Llama-4-Scout-17B-16E-Instruct", "MiniMaxAI--MiniMax-M2.5", "moonshotai--Kimi-K2-Instruct",
              "XiaomiMiMo--MiMo-V2-Flash", "google--gemma-4-26B-A4B", "nvidia--GLM-5-NVFP4")


def _config_corpus(c: Corpus, inp: Path) -> None:
    """Real HF configs (keys ``hf_*``) and a Qwen3-MoE config tampered in how its fields are read: a boolean as a
    string (``bad_cfg_*``: refused always), an unknown field (``cfg_unknown``: refused without
    --allow-unknown-fields) and an unknown field named like a shape (``cfg_structural``: refused without
    --allow-unknown-fields --allow-structural-fields)."""
    for name in HF_CONFIGS:
        path = AICONF / f"{name}_config.json"
        if path.exists():
            c.inputs[f"hf_{name}"] = _write(inp / f"hf_{name}.json", path.read_bytes())
    cfg = json.loads((AICONF / "Qwen--Qwen3-30B-A3B_config.json").read_text())
    for name, change in {"bool_false": {"tie_word_embeddings": "false"}, "bool_true": {"norm_topk_prob": "true"},
                         "bool_int": {"attention_bias": 0}}.items():
        c.inputs[f"bad_cfg_{name}"] = _write(inp / f"bad_cfg_{name}.json", json.dumps({**cfg, **change}))
    c.inputs["cfg_unknown"] = _write(inp / "cfg_unknown.json", json.dumps({**cfg, "my_custom_flag": 1}))
    c.inputs["cfg_structural"] = _write(inp / "cfg_structural.json", json.dumps({**cfg, "num_extra_layers": 2}))


def _runner_corpus(c: Corpus, inp: Path) -> None:
    """Runner files: a device file, a runner plan, a store, a run result and a validation result, each good and in
    tampered copies (keys ``bad_*``: refused by construction wherever the command reads them)."""
    import copy

    dev = json.loads((ROOT / "data" / "devices" / "cpu-2core.json").read_text())
    c.inputs["device"] = _write(inp / "device.json", json.dumps(dev))
    for name, change in {"gemm_string": lambda d: d["throughput"].update(gemm_flop_per_s="fast"),
                         "p2p_negative": lambda d: d["p2p"].update(alpha_s=-1),
                         "layers_list": lambda d: d.update(layers=[1]),
                         "kind": lambda d: d.update(kind="device")}.items():
        d = copy.deepcopy(dev)
        change(d)
        c.inputs[f"bad_device_{name}"] = _write(inp / f"bad_device_{name}.json", json.dumps(d))
    c.inputs["bad_device_latin1"] = _write(inp / "bad_device_latin1.json", b'{"kind": "calibrated_device", "x": "\xe9"}')
    plan = {"kind": "runner_plan", "schema_version": 1, "model": "tiny-runner",
            "model_config": {"num_layers": 4, "num_experts": 4, "top_k": 2, "seed": 0},
            "parallel": {"pp": 2, "ep": 2, "dp": 1, "microbatches": 4, "micro_batch_size": 1, "schedule": "1f1b",
                         "vpp": None},
            "boundaries": [0, 2, 4], "pair_exec": None, "pair_order": None, "costs": {"source": "fuzz"},
            "prediction": {"iteration_s": 0.3, "stage_f_s": [0.01, 0.01], "stage_b_s": [0.02, 0.02]}}
    c.inputs["runner_plan"] = _write(inp / "runner_plan.json", json.dumps(plan))
    tampers = {"mb_huge": lambda d: d["parallel"].update(microbatches=1e9),
               "hidden_huge": lambda d: d["model_config"].update(hidden_size=10**7),
               "pred_string": lambda d: d["prediction"].update(iteration_s="1"),
               "pred_zero": lambda d: d["prediction"].update(iteration_s=0),
               "pred_negative": lambda d: d["prediction"]["stage_f_s"].__setitem__(0, -1),
               "bound_frac": lambda d: d.update(boundaries=[0, 1.5, 4]),
               "bound_list": lambda d: d.update(boundaries=[0, [2], 4]),
               "parallel_string": lambda d: d.update(parallel="pp2"),
               "model_list": lambda d: d.update(model_config=[4]),
               "kind": lambda d: d.update(kind="partition"),
               "no_kind": lambda d: d.pop("kind"),
               "experts_string": lambda d: d["model_config"].update(num_experts="4")}
    for name, change in tampers.items():
        d = copy.deepcopy(plan)
        change(d)
        c.inputs[f"bad_plan_{name}"] = _write(inp / f"bad_plan_{name}.json", json.dumps(d))
    step = {"step": 0, "predicted": {"iteration": 0.1}, "observed": {"iteration": 0.1}, "step_time_s": 0.1}
    store = {"schema_version": 1, "kind": "runner_observations",
             "runs": [{"date": "d", "microbatches": 4, "predictions": "plan (before the run)",
                       "lifecycle": {"steps": [step, {**step, "step": 1}]}}]}
    c.inputs["store"] = _write(inp / "store.json", json.dumps(store))
    for name, d in {"runs_string": {**store, "runs": "x"}, "runs_missing": {k: v for k, v in store.items() if k != "runs"},
                    "garbage": {**store, "runs": [1, "x", None]},
                    "observed_string": {**store, "runs": [{**store["runs"][0], "lifecycle": {"steps": [
                        {**step, "observed": {"iteration": "slow"}}]}}]},
                    "version": {**store, "schema_version": 7}}.items():
        c.inputs[f"bad_store_{name}"] = _write(inp / f"bad_store_{name}.json", json.dumps(d))
    ev = [{"step": 0, "rank": r, "lane": "compute", "type": "F", "stage": r, "start": 0.0, "end": 0.01} for r in range(2)]
    job = {"name": "run", "schedule": "1f1b", "tokens_per_step": 64, "spec": {"model": {"num_layers": 4}},
           "timing": {"durations": {"f": [0.01, 0.01], "b": [0.02, 0.02]}}, "events": ev}
    c.inputs["run_result"] = _write(inp / "run_result.json", json.dumps({"backend": "gloo", "jobs": [job]}))
    for name, d in {"jobs_string": {"jobs": "x"}, "job_int": {"jobs": [1]},
                    "events_bad": {"jobs": [{**job, "events": [{"step": "a"}]}]},
                    "durations_negative": {"jobs": [{**job, "timing": {"durations": {"f": [-1], "b": [1]}}}]}}.items():
        c.inputs[f"bad_run_{name}"] = _write(inp / f"bad_run_{name}.json", json.dumps(d))
    case = {"name": "c", "schedule": "1f1b", "pp": 2, "ep": 1, "width": 1, "boundaries": [0, 2, 4], "observed_s": 0.1}
    val = {"cases": [case], "calibration": {"device_file": dev}}
    c.inputs["validation"] = _write(inp / "validation.json", json.dumps(val))
    for name, d in {"calibration_string": {**val, "calibration": "x"},
                    "calibration_bad": {**val, "calibration": {"device_file": {**dev, "p2p": "fast"}}},
                    "case_string": {**val, "cases": [{**case, "pp": "2"}]},
                    "observed_zero": {**val, "cases": [{**case, "observed_s": 0}]}}.items():
        c.inputs[f"bad_validation_{name}"] = _write(inp / f"bad_validation_{name}.json", json.dumps(d))


DROP = object()


def _tampered(doc, path: tuple, value):
    """A deep copy of ``doc`` with the field at ``path`` set to ``value`` (``DROP``: removed)."""
    import copy

    d = copy.deepcopy(doc)
    cur = d
    for p in path[:-1]:
        cur = cur[p]
    if value is DROP:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return d


def _not_utf8(doc) -> bytes:
    """``doc`` as JSON with a Latin-1 byte in an added string field (not UTF-8)."""
    return b'{"note": "caf\xe9", ' + json.dumps(doc).encode()[1:]


#: every tamper below breaks its file by construction: wrong types, values out of range or over a work limit,
#: missing fields, broken cross-field rules
_HUGE = (1e300, 10**30)


def _schema_corpus(c: Corpus, inp: Path) -> None:
    """Routing logs (``simulate --routing replay:``), ``report --dynamic`` sources and overlap profiles: a good
    one of each (real shipped files where there are some) and tampered copies (keys ``bad_routing_*``,
    ``bad_dynamic_*``, ``bad_profile_*``)."""
    log = {"format": "tessera-lab/routing-log", "version": 1, "top_k": 2, "num_experts": 8,
           "records": [{"layer": l, "microbatch": mb, "tokens": 8, "routed": [3, 1, 2, 2, 0, 4, 1, 3]}
                       for l in range(4) for mb in range(4)]}
    r0 = ("records", 0)
    tampers = {
        "routed_string": (r0 + ("routed", 1), "abc"), "routed_negative": (r0 + ("routed", 1), -1),
        "routed_float": (r0 + ("routed", 1), 2.5), "routed_null": (r0 + ("routed", 1), None),
        "routed_length": (r0 + ("routed",), [1, 2]), "routed_missing": (r0 + ("routed",), DROP),
        "routed_empty": (r0 + ("routed",), []), "layer_string": (r0 + ("layer",), "0"),
        "layer_negative": (r0 + ("layer",), -1), "layer_huge": (r0 + ("layer",), 10**9),
        "layer_missing": (r0 + ("layer",), DROP), "step_huge": (r0 + ("step",), 10**9),
        "mb_float": (r0 + ("microbatch",), 1.5), "tokens_negative": (r0 + ("tokens",), -1),
        "group_huge": (r0 + ("group",), 10**9), "top_k_over": (("top_k",), 9), "top_k_zero": (("top_k",), 0),
        "top_k_string": (("top_k",), "2"), "experts_zero": (("num_experts",), 0),
        "experts_mismatch": (("num_experts",), 4), "format": (("format",), "other"), "version": (("version",), 2),
        "records_missing": (("records",), DROP), "records_empty": (("records",), []),
        "records_string": (("records",), "x"), "records_int": (("records",), [1]),
        "cells": (r0, {"layer": 0, "step": 999_999, "microbatch": 99_999, "routed": [1] * 8}),
    }
    tampers.update({f"routed_huge{i}": (r0 + ("routed", 1), v) for i, v in enumerate(_HUGE)})
    # totals that contradict the log: tokens x top_k = 16 per record, at most 8 per expert, one record per cell
    tampers.update({"sum_short": (r0 + ("routed",), [3, 1, 2, 2, 0, 4, 1, 2]),
                    "over_tokens": (r0 + ("routed",), [9, 1, 2, 2, 0, 0, 1, 1]),
                    "repeated": (("records", 1), dict(log["records"][0]))})
    c.inputs["routing_good"] = _write(inp / "routing_good.json", json.dumps(log))
    for name, (path, value) in tampers.items():
        c.inputs[f"bad_routing_{name}"] = _write(inp / f"bad_routing_{name}.json", json.dumps(_tampered(log, path, value)))
    c.inputs["bad_routing_latin1"] = _write(inp / "bad_routing_latin1.json", _not_utf8(log))

    run = json.loads((ROOT / "data" / "runs" / "runner_dynamic_overlapped_zipf1.5.json").read_text())
    c.inputs["dynamic_run"] = _write(inp / "dynamic_run.json", json.dumps(run))
    sim = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "routing": "zipf:1.2", "dynamic": True, "steps": 4,
           "costs": "analytic (synthetic --f/--b/--w per stage)", "predictor": "last-step", "prediction_lag_steps": 1,
           "iteration_static_s": 47.1, "iteration_dynamic_s": 45.9, "routing_variance_s": 15.6,
           "bubble_after_dynamic_s": 10.0, "idle_removed_s": 1.2}
    c.inputs["dynamic_sim"] = _write(inp / "dynamic_sim.json", json.dumps(sim))
    st_ = ("static", "step_time")
    run_t = {"median_string": (st_ + ("median_s",), "abc"), "median_negative": (st_ + ("median_s",), -1),
             "median_null": (st_ + ("median_s",), None), "median_missing": (st_ + ("median_s",), DROP),
             "q3_below": (st_ + ("q3_s",), 0.0), "q1_huge": (("dynamic", "host_idle_per_step", "q1_s"), 1e12),
             "ranks_zero": (("world", "ranks"), 0), "ranks_string": (("world", "ranks"), "4"),
             "ranks_huge": (("world", "ranks"), 10**9), "routing_missing": (("routing",), DROP),
             "routing_int": (("routing",), 5), "gain_string": (("gain",), "x"),
             "verdict": (("gain_verdict",), "maybe"), "static_missing": (("static",), DROP),
             "dynamic_string": (("dynamic",), "x"), "trials_zero": (("trials",), 0), "kind_missing": (("kind",), DROP)}
    run_t.update({f"median_huge{i}": (st_ + ("median_s",), v) for i, v in enumerate(_HUGE)})
    sim_t = {"static_zero": (("iteration_static_s",), 0), "static_negative": (("iteration_static_s",), -1),
             "static_string": (("iteration_static_s",), "x"), "static_missing": (("iteration_static_s",), DROP),
             "dynamic_missing": (("iteration_dynamic_s",), DROP), "variance_over": (("routing_variance_s",), 47.1),
             "variance_string": (("routing_variance_s",), "x"), "bubble_negative": (("bubble_after_dynamic_s",), -1),
             "idle_null": (("idle_removed_s",), None), "stages_huge": (("stages",), 10**9),
             "microbatches_float": (("microbatches",), 2.5)}
    sim_t.update({f"static_huge{i}": (("iteration_static_s",), v) for i, v in enumerate(_HUGE)})
    for prefix, doc, ts in (("run", run, run_t), ("sim", sim, sim_t)):
        for name, (path, value) in ts.items():
            c.inputs[f"bad_dynamic_{prefix}_{name}"] = _write(inp / f"bad_dynamic_{prefix}_{name}.json",
                                                              json.dumps(_tampered(doc, path, value)))
        c.inputs[f"bad_dynamic_{prefix}_latin1"] = _write(inp / f"bad_dynamic_{prefix}_latin1.json", _not_utf8(doc))
    c.inputs["bad_dynamic_list"] = _write(inp / "bad_dynamic_list.json", "[1, 2]")

    prof = json.loads((ROOT / "data" / "profiles" / "cpu-qwen3-next-small.json").read_text())
    c.inputs["profile_shipped"] = _write(inp / "profile_shipped.json", json.dumps(prof))
    k0 = next(iter(prof["entries"]))
    e0 = ("entries", k0)
    prof_t = {"median_negative": (e0 + ("t_ab", "median"), -1.0), "median_string": (e0 + ("t_ab", "median"), "fast"),
              "median_null": (e0 + ("t_ab", "median"), None), "median_missing": (e0 + ("t_ab", "median"), DROP),
              "median_outside": (e0 + ("t_ab", "median"), 100.0), "samples_empty": (e0 + ("t_a", "samples"), []),
              "samples_negative": (e0 + ("t_a", "samples"), [-1.0]), "samples_string": (e0 + ("t_a", "samples"), "x"),
              "kind_int": (e0 + ("kind_f",), 5), "kind_missing": (e0 + ("kind_b",), DROP),
              "metadata_missing": (e0 + ("metadata",), DROP), "hidden_over": (e0 + ("comm_hidden_fraction",), 1.5),
              "layer_huge": (e0 + ("layer_f",), 10**9), "version": (("schema_version",), 2),
              "version_missing": (("schema_version",), DROP), "backend": (("backend",), "gpu"),
              "size_zero": (("size_factor",), 0), "size_over": (("size_factor",), 2),
              "ep_string": (("parallel", "ep"), "8"), "entries_string": (("entries",), "x"),
              "entries_missing": (("entries",), DROP),
              "key_renamed": (("entries",), {"F:mamba|BW:mamba": prof["entries"][k0]}),
              "entries_empty": (("entries",), {})}
    prof_t.update({f"median_huge{i}": (e0 + ("t_ab", "median"), v) for i, v in enumerate(_HUGE)})
    for name, (path, value) in prof_t.items():
        c.inputs[f"bad_profile_{name}"] = _write(inp / f"bad_profile_{name}.json", json.dumps(_tampered(prof, path, value)))
    c.inputs["bad_profile_latin1"] = _write(inp / "bad_profile_latin1.json", _not_utf8(prof))


def _profiles_checked() -> bool:
    """Whether the profile loader applies :func:`tessera_lab.overlap.profile_schema.check_profile` (then a tampered
    profile wherever it is read is bad by construction)."""
    import inspect

    from tessera_lab.overlap import profiles

    return "check_profile" in inspect.getsource(profiles)


# ---------------------------------------------------------------------------------------------- strategies
#: how often (in ten) a flag value is drawn from the bad corpus instead of the good one (``--bad-rate``)
BAD_IN_10 = 2


def _mix(good, bad, bad_in_10: int | None = None) -> st.SearchStrategy[str]:
    """Mostly ``good`` values, ``bad_in_10`` times in ten a ``bad`` one (so generated runs get past the first flag)."""
    bad_in_10 = BAD_IN_10 if bad_in_10 is None else min(bad_in_10, 2 * BAD_IN_10)
    good = st.sampled_from(good) if isinstance(good, tuple) else good
    bad = st.sampled_from(bad) if isinstance(bad, tuple) else bad
    return st.integers(0, 9).flatmap(lambda i: bad if i < bad_in_10 else good)


GOOD_FLOATS = ("0.5", "1", "2", "3.5", "0")


def _values_for(dest: str, corpus: Corpus) -> st.SearchStrategy[str]:
    files = st.sampled_from(sorted(corpus.inputs.values()))
    outs = st.sampled_from(sorted(corpus.outputs.values()))
    times = _mix(GOOD_FLOATS, FLOATS)
    table = {
        "model": _mix(MODELS[:3] + (corpus.inputs["config"],) + _hf(corpus),
                      st.one_of(st.sampled_from(MODELS), files, _cfg_files(corpus)), 4),
        "gpus": _mix(("8", "16", "64", "72", "128", "512"), NUMBERS + ("100000", "12", "1e3")),
        "global_batch_tokens": _mix(("4096", "65536", "1048576"), NUMBERS),
        "max_plans": _mix(("1", "5", "20"), NUMBERS),
        "jobs": _mix(("1", "1", "1", "2"), ("0", "-1", "abc", "1000", "nan", "")),
        "top": _mix(("1", "3", "10"), NUMBERS),
        "cp": _mix(("1", "2", "4"), NUMBERS + ("3", "4096")),
        "csv": st.one_of(outs, st.just("-")),
        "pair": _mix(("linear_attention+moe,full_attention+moe", "full_attention+moe,full_attention+moe"),
                     ("bogus", "a,b,c", "", ",", "moe,moe", "full_attention+moe")),
        "profile": _mix((corpus.inputs["profile"],), st.one_of(_bad(corpus, "bad_profile", files), files), 6), "plan": _mix((corpus.inputs["plan"],), st.one_of(_bad(corpus, "bad_pjson", files), files), 6),
        "pair_order": _mix(("searched", "megatron", "comm-first", "program"), ("bogus", "", "measured:/no/such"), 3),
        "device": _mix((corpus.inputs["device"],), _bad(corpus, "bad_device", files), 6),
        "profile_store": _mix((corpus.inputs["store"], str(corpus.root / "out" / "new_store.json")),
                              _bad(corpus, "bad_store", files), 6),
        "lifecycle": _mix((corpus.inputs["store"],), _bad(corpus, "bad_store", files), 6),
        "observed": _mix((corpus.inputs["run_result"],), _bad(corpus, "bad_run", files), 6),
        "repredict": _mix((corpus.inputs["validation"],), _bad(corpus, "bad_validation", files), 6),
        "group_sizes": st.sampled_from(("2,4", "2", "3,x", "", "9", "2,,4", "1e3")),
        "out": outs,
        "json": outs, "plot": outs, "trace": outs, "export": outs,
        "schedule": _mix(SCHEDULES[:7], SCHEDULES), "gpu": _mix(GPUS[:3], GPUS),
        "costs": _costs(),
        "routing": _mix(("uniform", "zipf:1.2", "drift:0.5", "drift:0.5:2", f"replay:{corpus.inputs['routing_good']}"),
                        st.sampled_from(("zipf:nan", "zipf:-1", "bogus", "zipf:", "replay:/no/such")
                                        + tuple(f"replay:{v}" for k, v in sorted(corpus.inputs.items())
                                                if k.startswith(("routing", "bad_routing"))
                                                or k in ("binary", "deep", "folder"))), 6),
        "dynamic": _mix((corpus.inputs["dynamic_run"], corpus.inputs["dynamic_sim"]),
                        _bad(corpus, "bad_dynamic", files), 6),
        "memory_cap": st.sampled_from(("max", "rank", "4", "0", "-1", "nan", "lots")),
        "diff": st.one_of(st.sampled_from(("expert_width=256", "top_k=4,seq_len=8192", "top_k=nan", "dtype=fp8",
                                           "bogus=1", "expert_width=", "qwen3-8b", "nope")), files),
        "f": times, "b": times, "w": times, "fb": times, "p2p_latency": times, "expert_fraction": times,
        "capacity_factor": times, "grad_sync": times,
        "time_limit": _mix(("0.5", "2"), ("0", "nan", "-1", "inf", "1e12")),
        "ilp_max_binaries": _mix(("0", "400", "3000"), NUMBERS), "ilp_max_nodes": _mix(("0", "10", "50"), NUMBERS),
        "timeout": _mix(("30",), ("0", "nan", "-1", "inf")),
        "size_factor": _mix(("0.125", "1"), ("0", "2", "nan", "x")),
        "seq_len": _mix(("1", "64", "4096"), NUMBERS), "micro_batch_size": _mix(SMALL_INTS, NUMBERS),
        "tokens": _mix(("1", "64", "4096"), NUMBERS),
        "steps": _mix(("2", "4", "10"), NUMBERS + ("1000000",)),
    }
    if dest in table:
        return table[dest]
    return _mix(SMALL_INTS, NUMBERS)


def _hf(corpus: Corpus) -> tuple[str, ...]:
    return tuple(sorted(v for k, v in corpus.inputs.items() if k.startswith("hf_")))


def _cfg_files(corpus: Corpus) -> st.SearchStrategy[str]:
    """The tampered configs (string booleans, unknown and structural-named unknown fields)."""
    return st.sampled_from(sorted(v for k, v in corpus.inputs.items() if k.startswith(("bad_cfg", "cfg_"))))


def _bad(corpus: Corpus, prefix: str, files) -> st.SearchStrategy[str]:
    """The tampered files of one kind (most of the time) or any corpus file."""
    mine = sorted(v for k, v in corpus.inputs.items() if k.startswith(prefix))
    return st.one_of(st.sampled_from(mine), st.sampled_from(mine), files)


def _costs() -> st.SearchStrategy[str]:
    good = st.lists(st.integers(0, 50).map(str), min_size=1, max_size=70).map(",".join)
    return _mix(good, st.one_of(_wild_costs(), st.sampled_from(("", ",", "1,,2", " 1, 2"))), 3)


def _wild_costs() -> st.SearchStrategy[str]:
    wild = st.lists(st.sampled_from(("1", "2", "0", "-1", "nan", "inf", "1e308", "x", "", "3.5")), min_size=0,
                    max_size=12).map(",".join)
    return wild


def _option_strategy(action: argparse.Action, corpus: Corpus) -> st.SearchStrategy[list[str]]:
    opt = action.option_strings[0] if action.option_strings else None
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return st.just([opt])
    if action.choices is not None:
        values = _mix(tuple(action.choices), ("bogus", ""), 1)
    else:
        values = _values_for(action.dest, corpus)
    if opt is None:
        return values.map(lambda v: [v])
    return values.map(lambda v: [opt, v])


def _command_parsers():
    from tessera_lab.cli.main import build_parser

    from tessera_lab.runner.launch.launch import add_run_arguments

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {name: sub.choices[name] for name in COMMANDS}
    entry = argparse.ArgumentParser(prog="python -m tessera_lab.runner")
    add_run_arguments(entry)
    parsers[RUNNER_ENTRY] = entry
    return parsers


@st.composite
def argv_for(draw, command: str, corpus: Corpus) -> list[str]:
    """A generated argv for ``command``: required options usually present (with generated values), a few
    optional ones, sometimes a missing required one or an unknown flag."""
    parser = _command_parsers()[command]
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    argv = [command]
    for a in actions:
        required = a.required or not a.option_strings
        if command == "measure" and a.dest == "backend":
            argv += ["--backend", draw(st.sampled_from(("analytic", "analytic", "cpu", "runner", "bogus")))]
            continue
        if command == "measure" and a.dest == "out":
            argv += ["--out", draw(st.sampled_from((str(corpus.root / "out" / "prof.json"), corpus.outputs["folder"],
                                                    corpus.outputs["under_file"])))]
            continue
        if command == "measure" and a.dest == "model":  # one of the cheap configs
            argv += ["--model", draw(st.sampled_from(("qwen3-8b", "nope", corpus.inputs["binary"],
                                                      corpus.inputs["config_nan"], "tiny-runner")))]
            continue
        if command == "reproduce" and a.dest == "out":  # cheap cases only: outputs that are refused up front
            argv += ["--out", draw(st.sampled_from((corpus.outputs["under_file"], str(corpus.root / "out" / "a_file"))))]
            continue
        if command == "reproduce" and a.dest == "quick":
            argv.append("--quick")
            continue
        if command == "run" and a.dest == "plan" and draw(st.integers(0, 2)) == 0:  # runner plans, good or tampered
            argv += ["--plan", draw(_mix((corpus.inputs["runner_plan"],), _bad(corpus, "bad_plan", st.nothing()), 6))]
            continue
        if command == "plan" and a.dest == "device" and draw(st.integers(0, 3)) == 0:
            argv += ["--model", "tiny-runner", "--pp", "2", "--ep", "2", "--device",
                     draw(_mix((corpus.inputs["device"],), _bad(corpus, "bad_device", st.nothing()), 5))]
            continue
        if (command, a.dest) in (("simulate", "routing"), ("report", "dynamic"), ("plan", "profile")) \
                and draw(st.integers(0, 1)) == 0:
            argv += draw(_option_strategy(a, corpus))  # the files these read (routing logs, dynamic sources), often
            continue
        if command == "report" and a.dest == "costs" and draw(st.integers(0, 2)) == 0:  # profiles of other setups
            argv += ["--costs", draw(st.sampled_from(("analytic", corpus.inputs["profile"], corpus.inputs["profile_shipped"],
                                                      corpus.inputs["bad_profile_entries_empty"])))]
            continue
        if command == "run" and a.dest == "pair_exec" and draw(st.integers(0, 3)) == 0:
            argv += ["--pair-exec", draw(st.sampled_from(("scheduled", "threads", "serial")))]
            continue
        if command == "search" and a.dest == "max_plans" and draw(st.integers(0, 4)) > 0:  # cheap: few plans
            argv += ["--max-plans", draw(st.sampled_from(("1", "3", "8")))]
            continue
        if command == "search" and a.dest in ("allow_unknown_fields", "allow_structural_fields") \
                or command in ("plan", "params") and a.dest == "allow_unknown_fields" \
                or command == "measure" and a.dest in ("dry_run", "pair"):
            if draw(st.integers(0, 2)) == 0:
                argv += draw(_option_strategy(a, corpus))
            continue
        if command == "calibrate" and a.dest == "out":
            argv += ["--out", str(corpus.root / "out" / "device.json")]
            continue
        if required:
            if draw(st.integers(0, 29)) == 0:  # sometimes leave a required one out
                continue
            argv += draw(_option_strategy(a, corpus))
        elif draw(st.integers(0, 19)) < 3:
            argv += draw(_option_strategy(a, corpus))
    if draw(st.integers(0, 49)) == 0:
        argv.append(draw(st.sampled_from(("--bogus", "-x", "extra", "--json"))))
    return argv


def env_strategy() -> st.SearchStrategy[dict[str, str]]:
    """Mostly no TESSERA_LAB_* variable; sometimes a good one, sometimes a malformed one."""
    good = st.sampled_from(sorted(ENV_GOOD.items())).map(lambda kv: {kv[0]: kv[1]})
    bad = st.sampled_from(sorted((k, v) for k, vs in ENV_BAD.items() for v in vs)).map(lambda kv: {kv[0]: kv[1]})
    return st.integers(0, 9).flatmap(lambda i: bad if i == 0 else (good if i == 1 else st.just({})))


def torchrun_env_strategy() -> st.SearchStrategy[dict[str, str | None]]:
    """The runner entry's environment: none (the local spawner), torchrun's whole set, or the set with one variable
    broken or removed (None: unset)."""
    bad = st.sampled_from(TORCHRUN_BAD).map(lambda change: {**TORCHRUN_GOOD, **change})
    return st.integers(0, 3).flatmap(lambda i: st.just({}) if i == 0 else (st.just(dict(TORCHRUN_GOOD)) if i == 1
                                                                           else bad))


def case_strategy(corpus: Corpus) -> st.SearchStrategy[tuple[list[str], dict[str, str]]]:
    """(argv, environment) pairs."""
    return argv_strategy(corpus).flatmap(lambda argv: st.tuples(
        st.just(argv), torchrun_env_strategy() if argv[0] == RUNNER_ENTRY else env_strategy()))


def known_bad(argv: list[str], env: dict[str, str], corpus: Corpus) -> str:
    """Why this input must be refused by construction ("" when it need not be)."""
    for k in env:
        if env[k] in ENV_BAD.get(k, ()):
            return f"{k}={env[k]}"
    if argv[0] == RUNNER_ENTRY and env and env != TORCHRUN_GOOD:
        return "torchrun variables " + ", ".join(f"{k}={v}" for k, v in env.items() if TORCHRUN_GOOD.get(k) != v)
    bad_files = {v for k, v in corpus.inputs.items() if k.startswith("bad_")
                 and (not k.startswith("bad_profile") or _PROFILES_CHECKED[0])}
    read_always = READ_ALWAYS | (PROFILE_READ if _PROFILES_CHECKED[0] else set())
    for i in range(1, len(argv) - 1):
        name = Path(argv[i + 1]).name
        only = next((use for prefix, use in ONLY_FOR.items() if name.startswith(prefix)), None)
        if (argv[0], argv[i]) in read_always and argv[i + 1] in bad_files and (
                argv.count(argv[i]) == 1 or argv[i] in APPENDED) and only in (None, (argv[0], argv[i])):
            return f"{argv[i]} {name}"
        if argv[0] == "simulate" and argv[i] == "--routing" and argv.count("--routing") == 1 \
                and argv[i + 1].startswith("replay:") and argv[i + 1][len("replay:"):] in bad_files:
            return f"--routing {Path(argv[i + 1]).name}"
    return _bad_combination(argv, corpus)


def _last(argv: list[str], opt: str) -> str | None:
    """The value of the last ``opt`` in ``argv`` (argparse keeps the last), None when absent."""
    idx = [i for i in range(1, len(argv) - 1) if argv[i] == opt]
    return argv[idx[-1] + 1] if idx else None


def _bad_combination(argv: list[str], corpus: Corpus) -> str:
    """Inputs bad by how options combine: a --pair-order the run would ignore (no scheduled pair handler), a
    profile of another model or backend for report --plan without --allow-stale-profile, simulate --dynamic at
    the --steps maximum."""
    order = _last(argv, "--pair-order")
    if argv[0] == "run" and order is not None and order != "searched" and _last(argv, "--pair-exec") != "scheduled":
        return f"--pair-order {order} without --pair-exec scheduled"
    costs = _last(argv, "--costs")
    if (argv[0] == "report" and _last(argv, "--plan") is not None and "--allow-stale-profile" not in argv
            and costs in (corpus.inputs["profile"], corpus.inputs["profile_shipped"])):
        return f"--costs {Path(costs).name} (another model or a cpu profile)"
    if argv[0] == "simulate" and "--dynamic" in argv and _last(argv, "--steps") == "1000000":
        return "simulate --dynamic --steps 1000000"
    budget, timeout = _last(argv, "--budget-s"), _last(argv, "--timeout") or "600"
    if argv[0] == "measure" and _last(argv, "--backend") in ("cpu", "cuda") and budget is not None:
        try:
            if float(budget) > float(timeout):
                return f"--budget-s {budget} over --timeout {timeout}"
        except ValueError:
            pass
    return _bad_config(argv, corpus)


def _bad_config(argv: list[str], corpus: Corpus) -> str:
    """A tampered config where plan or search reads it: a string boolean always; an unknown field without
    --allow-unknown-fields; an unknown field named like a shape without both allow flags."""
    model = _last(argv, "--model")
    if argv[0] not in ("plan", "search") or model is None or argv.count("--model") > 1 + ("--device" in argv):
        return ""
    name = Path(model).name
    if name.startswith("bad_cfg_"):
        return f"--model {name}"
    if name == "cfg_unknown.json" and "--allow-unknown-fields" not in argv:
        return f"without --allow-unknown-fields: --model {name}"
    if name == "cfg_structural.json" and not {"--allow-unknown-fields", "--allow-structural-fields"} <= set(argv):
        return f"without --allow-unknown-fields --allow-structural-fields: --model {name}"
    return ""


def argv_strategy(corpus: Corpus) -> st.SearchStrategy[list[str]]:
    """Any command: cheap ones weighted up (plan, report and measure cost about a second each)."""
    weights = {"models": 1, "params": 2, "partition": 4, "simulate": 5, "plan": 3, "report": 3, "measure": 2,
               "reproduce": 1, "run": 4, "calibrate": 1, "validate": 2, "search": 3, RUNNER_ENTRY: 3}
    pool = [c for c, w in weights.items() for _ in range(w)]
    return st.sampled_from(pool).flatmap(lambda c: argv_for(c, corpus))


# ---------------------------------------------------------------------------------------------- running
def _alarm(signum, frame):  # pragma: no cover - only on a hang
    raise FuzzTimeout()


class WouldStart(BaseException):
    """Raised by the stubs in place of starting workers or a measurement: the input was accepted."""


class Exited(BaseException):
    """Raised in place of ``os._exit(code)`` while an example runs."""


#: set when the runner entry's torchrun path reached the (stubbed) process group: the input was accepted
_ACCEPTED = [False]


@contextlib.contextmanager
def _stubs(env: dict[str, str]):
    """Replace the steps that start workers or measurements by stubs (after the launch's own checks), set ``env``."""
    import importlib

    launch = importlib.import_module("tessera_lab.runner.launch.launch")
    spawn_mod = importlib.import_module("tessera_lab.runner.launch.spawn")
    cal = importlib.import_module("tessera_lab.runner.testbed.calibrate")
    val = importlib.import_module("tessera_lab.runner.testbed.validate")
    meas = importlib.import_module("tessera_lab.runner.measure.harness")

    def fake_spawn(world, jobs, **kw):
        spawn_mod.check_launch(world, list(jobs), timeout_s=kw.get("timeout_s", 600.0), env=kw.get("env"))
        raise WouldStart()

    def stop(*a, **k):
        raise WouldStart()

    real_exit, me = os._exit, os.getpid()

    def exit_now(code=0):  # the runner entry ends a failing torchrun rank with os._exit: here a status instead
        if os.getpid() != me:  # a process forked meanwhile (search --jobs, a fork pool) ends as it would
            real_exit(code)
        raise Exited(code)

    dist = importlib.import_module("torch.distributed")
    worker = importlib.import_module("tessera_lab.runner.launch.worker")
    real_worker = launch.torchrun_worker

    def torchrun_worker(args):  # torchelastic's record() passes BaseException through; main would os._exit on it
        try:
            return real_worker(args)
        except WouldStart:
            _ACCEPTED[0] = True
            return 0

    saved = [(launch, "spawn", launch.spawn), (cal, "calibrate", cal.calibrate),
             (val, "validate_from_args", val.validate_from_args), (meas, "measure_layer_pairs", meas.measure_layer_pairs),
             (dist, "init_process_group", dist.init_process_group), (os, "_exit", os._exit),
             (launch, "torchrun_worker", launch.torchrun_worker), (launch, "_watch_parent", launch._watch_parent),
             (worker, "_watch_parent", worker._watch_parent)]
    old_env = {k: os.environ.get(k) for k in env}
    launch.spawn, cal.calibrate, val.validate_from_args, meas.measure_layer_pairs = fake_spawn, stop, stop, stop
    dist.init_process_group, os._exit, launch.torchrun_worker = stop, exit_now, torchrun_worker
    launch._watch_parent = worker._watch_parent = lambda: None
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_one(argv: list[str], bound_s: float = 60.0, env: dict[str, str] | None = None,
            must_refuse: str = "") -> Outcome:
    """Run the CLI in-process on ``argv`` (with ``env`` set and the worker-starting steps stubbed) and classify the
    result against the contract; ``must_refuse``: why the input is bad by construction (then exit 2 is required)."""
    import traceback

    from tessera_lab.cli.main import main as cli_main
    from tessera_lab.runner.launch.launch import main as entry_main

    main = (lambda a: entry_main(a[1:])) if argv and argv[0] == RUNNER_ENTRY else cli_main
    _ACCEPTED[0] = False
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, bound_s)
    t0 = time.perf_counter()
    rc: int | None = None
    crash = ""
    accepted = False
    try:
        with _stubs(env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.simplefilter("default")
            # torchelastic's record() enables faulthandler on sys.stderr, a StringIO here (no fileno): in-process only
            warnings.filterwarnings("ignore", message="Unable to enable fault handler")
            rc = main(argv)
    except WouldStart:
        accepted, rc = True, 0
    except Exited as exc:
        rc = exc.args[0] if exc.args else 0
    except FuzzTimeout:
        return Outcome("slow", argv, None, time.perf_counter() - t0, f"over {bound_s} s")
    except SystemExit as exc:  # main should return, not exit; still a status
        rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - any escape is a traceback for the user
        crash = traceback.format_exc(limit=-3)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        try:
            import matplotlib.pyplot as plt

            plt.close("all")
        except Exception:  # noqa: BLE001
            pass
    seconds = time.perf_counter() - t0
    accepted = accepted or _ACCEPTED[0]
    text = err.getvalue()
    if crash or "Traceback" in text:
        return Outcome("traceback", argv, rc, seconds, (crash or text).strip().splitlines()[-1][:300])
    if must_refuse and rc != 2:
        return Outcome("silent", argv, rc, seconds, f"accepted a bad input ({must_refuse})")
    if rc not in (0, 2):
        return Outcome("exit_code", argv, rc, seconds, text[-300:])
    lines = [l for l in text.splitlines() if l.strip()]
    if rc == 0:
        lines = [l for l in lines if not l.startswith(NOTICE_PREFIXES)]
    if len(lines) > 2:
        return Outcome("stderr_lines", argv, rc, seconds, " | ".join(lines[:4])[:400])
    if seconds > bound_s:
        return Outcome("slow", argv, rc, seconds, f"{seconds:.1f} s")
    if accepted:
        return Outcome("accepted", argv, rc, seconds, "")
    return Outcome("ok" if rc == 0 else "error", argv, rc, seconds, lines[0][:200] if lines else "")


def fuzz(examples: int, seed: int = 0, bound_s: float = 60.0, root: Path | None = None,
         verbose: bool = False) -> tuple[Counter, list[Outcome]]:
    """Run ``examples`` generated inputs; returns the outcome counts and the contract breaks."""
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

    tmp = tempfile.TemporaryDirectory(prefix="fuzz_cli_") if root is None else None
    corpus = build_corpus(Path(tmp.name) if tmp else Path(root))
    cwd = os.getcwd()
    os.chdir(corpus.root / "cwd")  # a stray relative output lands in the corpus, not in the checkout
    counts: Counter = Counter()
    breaks: list[Outcome] = []

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case_strategy(corpus))
    def one(case):
        argv, env = case
        bad = known_bad(argv, env, corpus)
        o = run_one(argv, bound_s, env, bad)
        counts[o.kind] += 1
        counts["tried"] += 1
        counts["known bad"] += bool(bad)
        if bad:  # per file type: bad_routing_*, bad_dynamic_*, bad_profile_*, bad_plan_*, ... or a variable
            name = bad.split()[-1]
            counts["bad:" + ("_".join(name.split("_")[:2]) if name.startswith(("bad_", "cfg_")) else "variable")] += 1
        counts["env set"] += bool(env)
        counts[f"cmd:{argv[0]}"] += 1
        if o.kind not in ("ok", "error", "accepted"):
            o.detail = (f"[{' '.join(f'{k}={v}' for k, v in env.items())}] " if env else "") + o.detail
            breaks.append(o)
        if verbose:
            print(f"{o.kind:12s} {o.seconds:6.2f}s {' '.join(argv)[:160]}  {o.detail[:120]}", file=sys.__stderr__)

    try:
        one()
    finally:
        os.chdir(cwd)
        if tmp is not None:
            tmp.cleanup()
    return counts, breaks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--examples", type=int, default=200, help="generated inputs to try")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    ap.add_argument("--bound", type=float, default=60.0, help="time bound per input, seconds")
    ap.add_argument("--verbose", action="store_true", help="one line per input")
    ap.add_argument("--bad-rate", type=int, default=BAD_IN_10, choices=range(0, 11), metavar="0-10",
                    help="flag values drawn from the bad corpus, in ten (0: valid values only, deep paths)")
    a = ap.parse_args(argv)
    globals()["BAD_IN_10"] = a.bad_rate
    t0 = time.perf_counter()
    counts, breaks = fuzz(a.examples, a.seed, a.bound, verbose=a.verbose)
    elapsed = time.perf_counter() - t0
    kinds = ("ok", "accepted", "error", "traceback", "exit_code", "stderr_lines", "slow", "silent")
    print(f"seed {a.seed}: tried {counts['tried']} inputs ({counts['known bad']} bad by construction, "
          f"{counts['env set']} with a TESSERA_LAB_* variable) in {elapsed:.1f} s (load {os.getloadavg()[0]:.2f}): "
          + ", ".join(f"{k} {counts[k]}" for k in kinds))
    print("per command: " + ", ".join(f"{k[4:]} {v}" for k, v in sorted(counts.items()) if k.startswith("cmd:")))
    print("bad by construction, per file type: " + ", ".join(f"{k[4:]} {v}" for k, v in sorted(counts.items())
                                                              if k.startswith("bad:")))
    for o in breaks[:30]:
        print(f"  {o.kind}: tessera-lab {' '.join(o.argv)}\n      {o.detail}")
    return 0 if not breaks else 1


if __name__ == "__main__":
    sys.exit(main())
