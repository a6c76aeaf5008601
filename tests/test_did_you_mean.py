"""A mistyped name in a user's input (a config.json field, a model name, a knob, a plan file's parallel key) is
refused in one line, exit 2, that names the closest known name (difflib) beside the allowed ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera_lab.checks import did_you_mean
from tessera_lab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tessera_lab", *args], capture_output=True, text=True, timeout=120)


def test_did_you_mean_by_hand():
    assert did_you_mean("num_hiden_layers", ["hidden_size", "num_hidden_layers"]) == \
        " (did you mean 'num_hidden_layers'?)"
    assert did_you_mean("microbatch", ["pp", "microbatches", "micro_batch_size"]) == " (did you mean 'microbatches'?)"
    assert did_you_mean("colour", ["pp", "ep"]) == ""  # nothing close: no guess


def test_config_field_typo_one_line_exit_2(tmp_path):
    cfg = json.loads((ROOT / "data" / "models" / "qwen3-30b-a3b.json").read_text())
    cfg["num_hiden_layers"] = cfg.pop("num_hidden_layers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = _cli("plan", "--model", str(path))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
    assert "'num_hiden_layers'" in lines[0] and "(did you mean 'num_hidden_layers'?)" in lines[0]


def test_model_name_typo_one_line_exit_2():
    r = _cli("plan", "--model", "qwen3-30b-a3")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1
    assert "(did you mean 'qwen3-30b-a3b'?)" in lines[0] and "qwen3-next-80b-a3b" in lines[0]


def test_plan_file_parallel_key_typo(tmp_path):
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.load import load_plan
    from tessera_lab.plan.make import make_plan

    data = make_plan(load_model("qwen3-30b-a3b"), ParallelConfig(pp=4, ep=8, microbatches=8), method="dp",
                     baselines=()).as_dict()
    data["parallel"]["microbatch"] = data["parallel"].pop("microbatches")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_plan(str(path))
    line = str(info.value)
    assert "\n" not in line and "['microbatch']" in line and "(did you mean 'microbatches'?)" in line


def test_knob_typo():
    from tessera_lab.model.spec import load_model

    want = r"knob 'num_expert_per_tok' is unknown \(did you mean 'num_experts_per_tok'\?\)"
    with pytest.raises(ConfigError, match=want):
        load_model("qwen3-30b-a3b").with_changes(num_expert_per_tok=4)


def test_a_family_named_without_its_size_is_suggested():
    """A name that begins shipped names (a family without its size) lists them (both gpt-oss sizes, not the one
    difflib finds closest); a path to a missing config.json says so instead of calling it an unknown model."""
    import pytest

    from tessera_lab.checks import did_you_mean
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.spec import load_model

    known = ["gpt-oss-120b", "gpt-oss-20b", "kimi-linear-48b-a3b", "deepseek-v3"]
    assert did_you_mean("gpt-oss", known) == " (did you mean 'gpt-oss-120b' or 'gpt-oss-20b'?)"
    assert did_you_mean("kimi-linear", known) == " (did you mean 'kimi-linear-48b-a3b'?)"
    assert did_you_mean("deepseek-v33", known) == " (did you mean 'deepseek-v3'?)"
    assert did_you_mean("zz", known) == ""
    with pytest.raises(ConfigError, match="no such file"):
        load_model("/nonexistent-dir/config.json")


def test_a_model_folder_is_read_through_its_config_json(tmp_path):
    # a Hugging Face model folder holds config.json: the folder plans as the file does; a folder without one is one
    # clear error naming it
    import shutil

    import pytest

    from tessera_lab.errors import ConfigError
    from tessera_lab.model.spec import load_model, shipped_models

    shutil.copy(shipped_models()["qwen3-30b-a3b"], tmp_path / "config.json")
    m = load_model(tmp_path)
    assert (m.num_layers, m.hidden_size) == (load_model("qwen3-30b-a3b").num_layers, 2048)
    with pytest.raises(ConfigError, match="is a folder without a config.json"):
        load_model(tmp_path.parent)
