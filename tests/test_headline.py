"""One source per headline number (tessera_lab.report.headline): hand-worked values, invariants, and the same
number in the CLI, the report, reproduce and the notebooks."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera_lab.report import headline as H

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- formulas
def test_width_at_hidden_share_hand_example():
    # 0.2 at 128, 0.4 at 512: 0.3 is half way in log2(width): 2**8 = 256
    assert H.width_at_hidden_share([128, 512], [0.2, 0.4], 0.3) == pytest.approx(256.0)
    # a quarter of the way: 2**(7 + 0.5) = 181.02
    assert H.width_at_hidden_share([128, 512], [0.2, 0.4], 0.25) == pytest.approx(2 ** 7.5)
    assert H.width_at_hidden_share([128, 512], [0.2, 0.4], 0.5) is None
    # NaN points (widths that could not be planned) are skipped
    assert H.width_at_hidden_share([64, 128, 512], [math.nan, 0.2, 0.4], 0.3) == pytest.approx(256.0)
    assert H.width_at_hidden_share([128, 512], [0.2, 0.4], 0.4) == 512.0


@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=8, unique=True), st.floats(0.0, 1.0))
def test_width_at_hidden_share_lands_on_the_target(shares, target):
    shares = sorted(shares)
    widths = [64 * 2**i for i in range(len(shares))]
    w = H.width_at_hidden_share(widths, shares, target)
    if not shares[0] <= target <= shares[-1]:
        assert w is None
        return
    assert widths[0] <= w <= widths[-1]
    # interpolating the curve at the returned width gives back the target
    x = math.log2(w)
    i = max(k for k in range(len(widths) - 1) if math.log2(widths[k]) <= x + 1e-12) if x < math.log2(widths[-1]) else len(widths) - 2
    x0, x1 = math.log2(widths[i]), math.log2(widths[i + 1])
    assert shares[i] + (x - x0) / (x1 - x0) * (shares[i + 1] - shares[i]) == pytest.approx(target, abs=1e-9)


def test_validity_notes():
    assert H.efficiency_note(0.8) is None
    assert "not physical" in H.efficiency_note(2.074)
    assert H.spread_note(0.05) is None and "n/a" in H.spread_note(math.inf)
    assert "not significant" in H.gain_note(0.01, 0.03)
    assert H.gain_note(0.10, 0.03) is None
    assert "above the published band" in H.mfu_note(0.657)
    assert "above the published band" in H.mfu_note(0.312)  # --grouped-gemm grouped
    assert "grouped expert GEMM" in H.mfu_note(0.312, grouped_gemm="grouped")
    for mode in ("multistream", None):  # the grouped-kernel cause only where the plan runs one
        assert "grouped" not in H.mfu_note(0.216, grouped_gemm=mode) and "host or GPU time" in H.mfu_note(0.216, grouped_gemm=mode)
    assert H.mfu_note(0.2099) is None  # the default plan: inside the band
    assert "above the best BF16 MFU of a published large-scale dense run" in H.mfu_note(0.50, moe=False)  # 43%
    assert H.mfu_note(0.40, moe=False) is None


def test_published_mfu_band_by_hand():
    band = H.published_mfu_band()
    tessera, mb = band["bands"]
    # Tessera paper, Qwen3-Next jobs: M 16.7% -> 20.0%, XL 15.9% -> 21.1% (4,096 and 12,288 GPUs)
    assert (tessera["lo"], tessera["hi"]) == (0.159, 0.211) and "4,096-12,288 GPUs" in tessera["source"]
    # Megatron-Bridge Qwen3-30B-A3B on H100: 118 (26.02) to 208 (26.02.01) model TFLOP/s per GPU on the pages over
    # the 989 TFLOP/s bf16 peak (its runs of containers 25.11-26.06: 118, 121, 203, 208); the band counts this
    # project's model FLOPs at the pages' tokens/s (run_tflop_rate), within 1% of the pages' own figures for Qwen3
    assert mb["lo"] == pytest.approx(118 / 989, rel=0.01) and mb["hi"] == pytest.approx(208 / 989, rel=0.01)
    assert band["lo"] == mb["lo"] and band["hi"] == 0.211
    # 21.08%: inside the paper's band, above Megatron-Bridge's 21.07%
    assert mb["hi"] < 0.2108
    assert H.mfu_text(0.2108).startswith("21.1%: inside 15.9%-21.1% Tessera paper")
    assert f"; above 11.9%-{mb['hi']:.1%} Megatron-Bridge" in H.mfu_text(0.2108)
    assert H.mfu_text(0.18).startswith("18.0%, inside the published band (15.9%-21.1% Tessera paper")
    assert H.mfu_text(0.312).startswith("31.2%, ABOVE the published band")
    assert H.mfu_text(0.10).startswith("10.0%, below")
    # 13.1%: below the paper's 15.9-21.1%, inside Megatron-Bridge's 11.9-21.0%: each band named with its position
    t = H.mfu_text(0.131)
    assert t.startswith("13.1%: below 15.9%-21.1% Tessera paper") and "; inside 11.9%-21.1% Megatron-Bridge" in t
    assert "published band" not in t
    assert H.mfu_text(0.3, moe=False) == "30.0%"


def test_band_per_family_and_model():
    # Qwen3-235B-A22B (qwen3_moe): the paper's Qwen3 jobs, L 29.7% -> 36.3% and XL 32.0% -> 39.0%, and its own
    # Megatron-Bridge runs on H100, 233 / 989 = 23.6% (25.11) to 253 / 989 = 25.6% (26.04.01); 35.4% (its plan) is
    # inside the first, above the second
    band = H.published_mfu_band("qwen3-235b-a22b")
    tessera, mb = band["bands"]
    assert (tessera["lo"], tessera["hi"]) == (0.297, 0.390) and "Qwen3 MoE" in tessera["source"]
    assert mb["lo"] == pytest.approx(233 / 989, rel=0.01) and mb["hi"] == pytest.approx(253 / 989, rel=0.01)
    assert "qwen3-235b-a22b on H100" in mb["source"]
    t = H.mfu_text(0.354, model="qwen3-235b-a22b")
    assert t.startswith("35.4%: inside 29.7%-39.0% Tessera paper, Qwen3 MoE") and "; above 23.6%-25.6% Megatron" in t
    assert H.mfu_note(0.354, model="qwen3-235b-a22b") is None
    assert "ABOVE" not in t and "1.05x" in H.mfu_note(0.41, model="qwen3-235b-a22b")  # 0.41 / 0.39
    # Qwen3-Next: the default band (its stand-in named); DeepSeek-V3: its own run only, 338 / 989
    assert H.published_mfu_band("qwen3-next-80b-a3b") == H.published_mfu_band()
    assert "stand-in for qwen3-next-80b-a3b" in H.published_mfu_band()["bands"][1]["source"]
    # gpt-oss-20b has no run of its own: gpt-oss-120b (same model_type, the only one on H100) stands in, named
    oss20, oss120 = H.published_mfu_band("gpt-oss-20b"), H.published_mfu_band("gpt-oss-120b")
    assert (oss20["lo"], oss20["hi"]) == (oss120["lo"], oss120["hi"]) and oss20["lo"] is not None
    assert "gpt-oss-120b (stand-in for gpt-oss-20b) on H100 (BF16 runs" in oss20["bands"][0]["source"]  # as the file
    ds = H.published_mfu_band("deepseek-v3")
    assert [b["name"] for b in ds["bands"]] == ["megatron_bridge"] and ds["hi"] == pytest.approx(338 / 989, rel=0.01)
    # GPT-OSS's pages count 20% fewer FLOPs than this project (docs/fidelity.md): the band is in the plan's count,
    # the pages' tokens/s x this project's FLOPs per token, not the pages' TFLOP/s (158-184 on H100)
    runs = json.loads((Path(__file__).parents[1] / "data" / "published" / "megatron_bridge.json").read_text())["runs"]
    oss = [r for r in runs if r["model"] == "gpt-oss-120b" and r["gpu"] == "H100"]
    assert oss120["hi"] == pytest.approx(max(H.run_tflop_rate(r) for r in oss) / 989)
    assert oss120["hi"] > 1.15 * max(r["model_tflops_per_gpu"] for r in oss) / 989
    assert H.position(0.2, 0.1, 0.3) == "inside" and H.position(0.4, 0.1, 0.3) == "above"
    # Qwen3-VL's MoE text model is the Qwen3 MoE decoder: the paper's Qwen3 band (no Megatron-Bridge run of its own)
    from tessera_lab.model.spec import load_model

    vl = load_model(str(Path(__file__).parent / "data" / "aiconfigurator_configs" /
                        "Qwen--Qwen3-VL-30B-A3B-Instruct_config.json"))
    assert vl.model_type == "qwen3_vl_moe_text"
    band = H.published_mfu_band(vl)
    assert [b["name"] for b in band["bands"]] == ["tessera", "megatron_bridge"]
    assert (band["bands"][0]["lo"], band["bands"][0]["hi"]) == (0.297, 0.390)
    # and, loaded from its config.json as from the shipped copy below, qwen3-30b-a3b's runs stand in for it
    assert f"qwen3-30b-a3b (stand-in for {vl.name}) on H100" in band["bands"][1]["source"]
    # shipped models of one family (one config reader) and kind stand in for each other: deepseek-v3 for
    # deepseek-v3.2 (same reader, MoE), qwen3-30b-a3b for the shipped Qwen3-VL MoE (the Qwen3 reader, nearest in
    # parameters: 30.5 B both); the dense qwen3-8b gets none (no dense Qwen3 run)
    ds32 = H.published_mfu_band("deepseek-v3.2")
    assert (ds32["lo"], ds32["hi"]) == (ds["lo"], ds["hi"]) and "deepseek-v3 (stand-in for deepseek-v3.2)" in \
        ds32["bands"][0]["source"]
    vl30 = H.published_mfu_band("qwen3-vl-30b-a3b")
    assert "qwen3-30b-a3b (stand-in for qwen3-vl-30b-a3b)" in vl30["bands"][1]["source"]
    assert H.published_mfu_band("qwen3-8b")["bands"] == []
    # Qwen3.5's MoE text model is read by the Qwen3-Next reader: the paper's Qwen3-Next band and its stand-in
    q35, nxt = H.published_mfu_band("qwen3.5-35b-a3b"), H.published_mfu_band("qwen3-next-80b-a3b")
    assert q35["family"] == "qwen3_5_moe_text" and (q35["lo"], q35["hi"]) == (nxt["lo"], nxt["hi"])
    assert [b["name"] for b in q35["bands"]] == ["tessera", "megatron_bridge"]
    assert H.band_type("qwen3_5_moe_text") == "qwen3_next" and H.band_type("qwen3_vl_moe_text") == "qwen3_moe"
    assert H.band_type("deepseek_v3") == "deepseek_v3" and H.band_type("no_such_type") == "no_such_type"


def test_a_moe_model_without_a_band_is_cautioned_above_every_published_moe_run():
    """OLMoE has no band: above the highest MoE MFU in data/published (DeepSeek-V3 on H100, 338 / 989 = 34.2%, read
    from the file here) the text says so; below it, and for a dense model, no caution."""
    from tessera_lab.model.spec import load_model

    runs = json.loads((Path(__file__).parents[1] / "data" / "published" / "megatron_bridge.json").read_text())["runs"]
    best = max((r for r in runs if r["gpu"] == "H100" and load_model(r["model"]).has_moe),
               key=lambda r: r["model_tflops_per_gpu"])
    assert (best["model"], best["model_tflops_per_gpu"]) == ("deepseek-v3", 338)
    assert H.run_tflop_rate(best) == pytest.approx(338, rel=0.01)  # this project's count at the page's tokens/s
    t = H.mfu_text(0.40, model="olmoe-1b-7b")
    assert t.startswith("40.0% (no published run of this model or its family") and \
        (f"ABOVE every published MoE run's MFU here (highest {H.run_tflop_rate(best) / 989:.1%}, Megatron-Bridge "
         "deepseek-v3 on H100") in t
    assert "ABOVE" not in H.mfu_text(0.30, model="olmoe-1b-7b")
    assert H.mfu_text(0.55, moe=False) == "55.0%"


NONE = " (no published dense run of this model's family on this GPU type in this precision)"


def test_a_dense_model_is_set_against_its_own_published_dense_runs():
    """Llama 3 70B's Megatron-Bridge H100 rows (FP8, 719 and 731 model TFLOP/s per GPU, read from the file here) over
    the H100's 989 TFLOP/s dense bf16: the band 72.7%-73.9% for an FP8 plan on H100; Llama 3.1 405B's B200 row (1667
    over B200's 2250) for a plan on B200; a Llama 3.1 8B config.json takes the 70B's as the closest dense Llama. No
    band across GPU types (an H200 counts as an H100) or precisions: a BF16 plan keeps the bare figure and the
    large-scale BF16 ceiling (43%), an FP8 plan without a band the bare figure alone."""
    runs = json.loads((Path(__file__).parents[1] / "data" / "published" / "megatron_bridge.json").read_text())["runs"]
    mine = sorted(r["model_tflops_per_gpu"] for r in runs if r["model"] == "llama-3.1-70b" and r["gpu"] == "H100")
    assert mine == [719, 731]
    # the band counts this project's model FLOPs at the pages' tokens/s: the 70B page's 731 is 2.3% below that count
    # (747.5; tests/test_public_runs.py works it out by hand), the other row agrees
    ours = sorted(H.run_tflop_rate(r) for r in runs if r["model"] == "llama-3.1-70b" and r["gpu"] == "H100")
    assert ours[0] == pytest.approx(719, rel=0.01) and ours[1] == pytest.approx(747.5, rel=0.001)
    lo, hi = ours[0] / 989, ours[1] / 989
    h100 = {"gpu": "H100-SXM", "precision": "fp8"}
    t = H.mfu_text(0.80, moe=False, model="llama-3.1-70b", **h100)
    assert t == (f"80.0%, ABOVE the published band ({lo:.1%}-{hi:.1%} Megatron-Bridge llama-3.1-70b on H100 "
                 "(FP8 runs, published tokens/s x model FLOPs per token / 989 bf16 TFLOP/s))")
    assert H.mfu_note(0.80, moe=False, model="llama-3.1-70b", **h100).startswith(
        f"MFU 80.0% is above the published band (max {hi:.1%}")
    assert H.mfu_note(0.70, moe=False, model="llama-3.1-70b", **h100) is None  # below the band: no caution
    b200 = [r["model_tflops_per_gpu"] for r in runs if r["model"] == "llama-3.1-405b" and r["gpu"] == "B200"]
    assert b200 == [1667]
    assert H.mfu_text(0.80, moe=False, model="llama-3.1-405b", gpu="B200", precision="fp8").startswith(
        f"80.0%, ABOVE the published band ({1668.3 / 2250:.1%} Megatron-Bridge llama-3.1-405b on B200")
    from tessera_lab.model.spec import load_model

    small = load_model("tests/data/aiconfigurator_configs/meta-llama--Meta-Llama-3.1-8B_config.json")
    assert "llama-3.1-70b (stand-in for" in H.mfu_text(0.5, moe=False, model=small, **h100)
    # another GPU or precision than the runs': no band
    assert H.mfu_text(0.5, moe=False, model="llama-3.1-70b", gpu="GB200", precision="fp8") == "50.0%" + NONE
    # the H200 takes the H100's runs (same SMs and bf16 peak), as the MoE bands do
    assert "Megatron-Bridge llama-3.1-70b on H100" in H.mfu_text(0.5, moe=False, model="llama-3.1-70b", gpu="H200",
                                                                precision="fp8")
    assert H.mfu_text(0.5, moe=False, model="llama-3.1-70b", gpu="H100-SXM", precision="bf16") == "50.0%" + NONE
    assert "best BF16 MFU of a published large-scale dense run (43%" in H.mfu_note(
        0.5, moe=False, model="llama-3.1-70b", gpu="H100-SXM", precision="bf16")
    assert H.mfu_note(0.5, moe=False, model="qwen3-8b", gpu="H200", precision="fp8") is None
    assert H.mfu_text(0.5, moe=False, model="qwen3-8b", gpu="H200", precision="bf16") == "50.0%" + NONE


# ----------------------------------------------------------------------------------------------- one number, everywhere
@pytest.fixture(scope="module")
def default_plan():
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import make_plan

    return make_plan(load_model("qwen3-next-80b-a3b"), ParallelConfig(), gpu="H200")


def test_ep_hidden_share_same_in_cli_report_and_library(default_plan):
    out = subprocess.run([sys.executable, "-m", "tessera_lab", "report", "--json", "-"], capture_output=True,
                         text=True, check=True, cwd=ROOT, timeout=120)
    cli = json.loads(out.stdout)["capacity"]["ep_hidden_fraction"]
    assert cli == pytest.approx(H.ep_hidden_share_iteration(default_plan), rel=1e-12)
    from tessera_lab.report.capacity import capacity_report

    assert H.ep_hidden_share_iteration(capacity_report(default_plan)) == H.ep_hidden_share_iteration(default_plan)


def test_dynamic_gain_same_in_reproduce_library_and_notebook():
    from tessera_lab.report.reproduce import ablation_table

    res = H.dynamic_headline()
    gain = H.dynamic_gain(res)
    assert gain == pytest.approx(res.throughput_gain, rel=1e-12)
    table = ablation_table()
    row = table[(table["step"] == "dynamic filling") & (table["source"] != "reported")]
    assert float(row["gain"].iloc[0]) == pytest.approx(gain, rel=1e-12)
    # notebook 07 prints the same headline (its stored output, from python notebooks/regenerate.py)
    nb = json.loads((ROOT / "notebooks" / "07_dynamic_bubbles.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []))
    found = re.search(r"dynamic gain \(headline\): ([+-][0-9.]+)%", text)
    assert found, "notebook 07 does not print the dynamic-gain headline (regenerate it)"
    assert float(found.group(1)) == pytest.approx(100 * gain, abs=0.006)


def test_width_headline_is_the_reproduce_crossing():
    from tessera_lab.report.study import expert_width_study, paper_point_widths

    df = expert_width_study(widths=(128, 512, 2048))
    points = paper_point_widths(df)
    ok = df[df["feasible"]].sort_values("width")
    for p in points:
        want = H.width_at_hidden_share(list(ok["width"]), list(ok["hidden_fraction"]), p["paper_hidden"])
        assert p["width_reaching_hidden"] == want


def test_band_of_a_config_json_model(tmp_path):
    # a model loaded from a config.json has no shipped name: the published run of the same family reader and kind
    # closest in size stands in for it, named, as for a shipped model without runs (DeepSeek-V3's own config:
    # deepseek-v3's runs, 338 / 989 at most)
    import shutil

    from tessera_lab.model.spec import load_model
    from tessera_lab.paths import data_dir

    cfg = tmp_path / "my-model.json"
    shutil.copy(data_dir() / "models" / "deepseek-v3.json", cfg)
    spec = load_model(str(cfg))
    band = H.published_mfu_band(spec)
    assert band["hi"] == pytest.approx(338 / 989, rel=0.01)
    assert f"deepseek-v3 (stand-in for {spec.name}) on H100" in band["bands"][0]["source"]
