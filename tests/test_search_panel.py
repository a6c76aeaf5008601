"""Notebook 11's layout-search panel and the "suggest a layout that fits" button of the planning panels, driven
in process (no browser): controls set, buttons clicked, results compared with the search and the planner run
directly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tessera_lab.plan import search as S

pytest.importorskip("ipywidgets")


def _action(box):
    """(button, line) of a panel's action row."""
    import ipywidgets as w

    rows = [c for c in box.children if isinstance(c, w.HBox) and c.children and isinstance(c.children[0], w.Button)]
    assert len(rows) == 1, "one action row"
    return rows[0].children


@pytest.fixture(scope="module")
def searched():
    from tessera_lab.ui.search_panel import search_panel

    return search_panel("qwen3-next-80b-a3b", gpu="H200", gpus=64, max_plans=16)


def test_search_panel_shows_the_search_its_grid_and_the_chosen_layouts_timeline(searched):
    from tessera_lab.ui.search_panel import layout_search

    box, controls, state = searched
    assert "error" not in state, state.get("error")
    res = state["result"]
    direct = layout_search("qwen3-next-80b-a3b", 64, gpu="H200", max_plans=16)  # the search run directly
    assert [c.layout for c in direct.ranked] == [c.layout for c in res.ranked]
    assert list(state["table"]["tokens/s"]) == [c.result["tokens_per_s"] for c in direct.ranked[:10]]
    # the grid: per (pp, ep) the best planned layout that fits, worked out from every planned row
    grid = state["grid"]
    for pp in grid.index:
        for ep in grid.columns:
            fit = [c.result["tokens_per_s"] for c in res.planned
                   if c.layout.pp == pp and c.layout.ep == ep and c.result.get("fits")]
            cell = grid.loc[pp, ep]
            assert (cell == max(fit)) if fit else cell != cell, (pp, ep, cell, fit)
    # the timeline is the planner's simulation of layout #1's own partition: the same iteration as its row
    assert state["plan"].chosen.iteration_time_s == pytest.approx(res.ranked[0].result["iteration_time_s"], rel=1e-9)
    assert state["plan"].parallel.pp == res.ranked[0].layout.pp
    cap = state["caption"]
    for part in ("search of qwen3-next-80b-a3b on 64 H200", "panel budget 16 plans (tessera-lab search: 210; planned in batches of up to 8, up to 7 more)",
                 "s wall", "s CPU (measured)"):
        assert part in cap, (part, cap)
    # the chosen layout's MFU against the published band first (as the CLI's "MFU of #1"), then the budget
    assert state["info"][0].startswith("MFU of #1 (simulated): ") and "published band" in state["info"][0]
    assert not any(n.startswith("MFU of #") for n in state["notes"])  # information, not a warning
    assert any("left unplanned" in n for n in state["notes"])  # 16 plans leave layouts unplanned
    assert state["png"][:4] == b"\x89PNG" and "<table" in state["table_html"]
    # "m x mbs" never wraps after the x: non-breaking spaces, the numbers the layout's own
    assert list(state["table"]["m x mbs"]) == [f"{c.layout.microbatches}\u00a0x\u00a0{c.layout.micro_batch_size}"
                                               for c in res.ranked[:10]]


def test_search_panel_draws_another_layout_without_searching_again(searched):
    box, controls, state = searched
    res = state["result"]
    controls["show"].value = 3
    assert state["result"] is res, "the search is reused"
    assert "search reused" in state["caption"]
    assert state["plan"].chosen.iteration_time_s == pytest.approx(res.ranked[2].result["iteration_time_s"], rel=1e-9)
    controls["show"].value = 1


def test_search_panel_gpu_choice_keeps_a_count_the_search_accepts():
    from tessera_lab.ui.search_panel import gpu_counts, search_panel

    assert 72 in gpu_counts("GB200") and all(n % 72 == 0 for n in gpu_counts("GB200") if n > 72)
    # on 8-GPU nodes half a node (a 4-GPU workstation) and whole nodes, each a count the search accepts
    assert gpu_counts("B300")[0] == 4 and all(n % 8 == 0 for n in gpu_counts("B300")[1:])
    assert all(S.gpu_count_ok(n, d) for g, d in (("B300", 8), ("GB200", 72)) for n in gpu_counts(g))
    box, controls, state = search_panel("qwen3-30b-a3b", gpus=64, max_plans=4)
    assert {"GB200", "B300"} <= set(controls["gpu"].options)
    assert controls["attention_ratio"].layout.display == "none"  # full attention only: no ratio knob
    # 64 GPUs are part of one NVL72 rack, which the search takes: the count stays
    controls["gpu"].value = "GB200"
    assert controls["gpus"].value == 64 and "GPUs 64 ->" not in state["caption"], state.get("error")
    assert state["result"].gpus == 64 and state["result"].gpu == "GB200"
    # a count not in the lists (as the refusal button adds one) stays when the GPU changes: 24 H100 -> 24 H200
    controls["gpu"].value = "H100"
    controls["gpus"].options = (*controls["gpus"].options, 24)
    controls["gpus"].value = 24
    controls["gpu"].value = "H200"
    assert controls["gpus"].value == 24 and 24 in controls["gpus"].options and state["result"].gpus == 24


def test_quickstart_suggest_applies_the_fastest_layout_that_fits():
    """H100 at sequence 16,384 on 8 x 8: no partition fits. The button applies the fastest layout among those the
    panel can set on the same 64 GPUs and global batch (256 sequences), found here by planning each directly."""
    from tessera_lab.errors import TesseraError
    from tessera_lab.ui.widgets import quickstart_panel, replan

    box, controls, state = quickstart_panel(gpu="H100", pp=8, ep=8, microbatches=32, seq_len=16384)
    button, line = _action(box)
    assert "error" in state and button.layout.display != "none"
    best = None
    for pp, ep in ((2, 32), (4, 16), (8, 8), (16, 4)):  # pp x ep = 64, dp 1, global batch 32 x 8 sequences
        for rc in ("none", "selective", "full"):
            try:
                ev = replan(gpu="H100", pp=pp, ep=ep, microbatches=256 // ep, seq_len=16384, recompute=rc).chosen
            except TesseraError:
                continue
            if ev.fits_memory and (best is None or ev.tokens_per_s > best[0]):
                best = (ev.tokens_per_s, pp, ep, 256 // ep, rc)
    assert best is not None
    button.click()
    assert "error" not in state, state.get("error")
    got = (controls["pp"].value, controls["ep"].value, controls["microbatches"].value, controls["recompute"].value)
    assert state["plan"].chosen.fits_memory
    assert state["plan"].chosen.tokens_per_s == pytest.approx(best[0], rel=1e-3), (got, best)
    assert "suggested" in line.value and f"{state['plan'].chosen.tokens_per_s:,.0f} tokens/s" in line.value
    assert state["action"].startswith("suggested") and button.layout.display == "none"
    controls["seq_len"].value = 4096  # a user's change clears the line
    assert "action" not in state and line.value == ""


def test_quickstart_suggest_says_why_when_the_search_refuses():
    """DeepSeek-V3 on pp 2 x ep 4 = 8 H200: too few GPUs for its parameter state. The search refuses, the line says
    why in the panel's terms (its controls, no CLI flag), no control moves; the CLI's own line keeps its flag."""
    from tessera_lab.ui.widgets import quickstart_panel

    box, controls, state = quickstart_panel(model="deepseek-v3", gpu="H200", pp=2, ep=4, microbatches=8)
    button, line = _action(box)
    assert "error" in state
    # the panel's own refusal says only more GPUs help (no recompute, schedule or sequence advice, no CLI command)
    assert "no layout of 8 GPUs holds deepseek-v3's parameter state" in state["error"], state["error"]
    assert "--recompute" not in state["error"] and "tessera-lab search" not in state["error"]
    before = {k: c.value for k, c in controls.items()}
    button.click()
    assert "8 GPUs (pp 2 x ep 4) are too few for deepseek-v3" in line.value, line.value
    assert "--" not in line.value and "in this panel: a larger pp or ep" in line.value
    assert {k: c.value for k, c in controls.items()} == before and "error" in state
    # the same controls would be refused again: the button hides until a control changes, and is back on a change
    # that still cannot plan (pp 4 x ep 4 = 16 GPUs)
    assert button.layout.display == "none"
    controls["pp"].value = 4
    assert "error" in state and button.layout.display != "none" and line.value == ""
    r = subprocess.run([sys.executable, "-m", "tessera_lab", "search", "--model", "deepseek-v3", "--gpus", "8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--gpus = 8 is too small for deepseek-v3" in r.stderr


def test_partition_suggest_refusal_in_panel_terms():
    """Notebook 06 at minimax-m1 on 2 stages: its layout's ep 32 makes 64 GPUs, too few; the line names the stages
    control and what a stage adds (ep 32 x tp 1 = 32 GPUs), not ``--gpus``."""
    from tessera_lab.ui.widgets import partition_panel

    box, controls, state = partition_panel(model="minimax-m1", pp=2)
    button, line = _action(box)
    assert "error" in state and button.layout.display != "none"
    button.click()
    assert "64 GPUs (stages 2 x ep 32 of the model" in line.value, line.value
    assert "--" not in line.value and "more stages (each adds 32 GPUs)" in line.value


def test_panel_message_rewords_flags_only():
    from tessera_lab.ui.suggest import panel_message

    got = panel_message("--gpus = 12 is out of range; allowed: a multiple of 8 (--seq-len 4,096, "
                        "--global-batch-tokens = 1,000, --max-plans)", "pp 3 x ep 4", "a larger pp")
    assert got == ("12 GPUs (pp 3 x ep 4) are out of range; allowed: a multiple of 8 (sequence 4,096, the global "
                   "batch (micro-batches x sequence) = 1,000, max plans); in this panel: a larger pp")


def test_quickstart_suggest_on_a_partial_gb200_rack():
    """pp 2 x ep 8 = 16 GB200 GPUs at sequence 32,768: no partition fits without recompute; the search accepts the
    partial NVL72 rack as `plan` does and the button applies a layout that fits."""
    from tessera_lab.ui.widgets import quickstart_panel

    box, controls, state = quickstart_panel(gpu="GB200", pp=2, ep=8, microbatches=32, seq_len=32768)
    button, line = _action(box)
    assert "error" in state
    button.click()
    assert "error" not in state and "suggested" in line.value, line.value
    assert state["plan"].chosen.fits_memory and controls["pp"].value * controls["ep"].value == 16


def test_partition_suggest_sets_recompute_and_the_panel_plans():
    from tessera_lab.errors import TesseraError
    from tessera_lab.ui.widgets import compare_partitions, partition_panel

    box, controls, state = partition_panel(microbatches=32)
    button, line = _action(box)
    assert button.layout.display == "none"  # it plans: no suggestion offered
    controls["pp"].value = 4  # 16K tokens on 4 stages: no partition fits without recompute
    controls["seq_len"].value = 16384
    assert "error" in state and button.layout.display != "none"
    button.click()
    assert "error" not in state and controls["recompute"].value in ("selective", "full")
    plan, table = compare_partitions(pp=4, seq_len=16384, microbatches=32, recompute=controls["recompute"].value)
    assert state["table"].equals(table) and plan.chosen.fits_memory
    if controls["recompute"].value == "full":  # selective is faster where it fits: here it must not
        try:
            fits = compare_partitions(pp=4, seq_len=16384, microbatches=32,
                                      recompute="selective")[0].chosen.fits_memory
        except TesseraError:
            fits = False
        assert not fits


def test_gpu_dropdowns_offer_gb200_and_b300():
    from tessera_lab.teach.panels import collective_cost_panel, tp_pp_panel
    from tessera_lab.ui.widgets import quickstart_panel

    for build in (lambda: collective_cost_panel(show_figure=False), lambda: tp_pp_panel(show_figure=False)):
        _, controls, state = build()
        assert {"H100", "H200", "B200", "B300", "GB200"} <= set(controls["gpu"].options)
        controls["gpu"].value = "GB200"
        assert "error" not in state
    _, controls, state = quickstart_panel(pp=8, microbatches=8)
    controls["gpu"].value = "B300"
    assert "64 B300" in state["caption"]


def test_search_panel_offers_the_long_sequences_context_parallelism_is_for():
    # the CP range the search covers (docs/search.md): 32k-128k tokens are choices of the sequence control
    from tessera_lab.ui.search_panel import _search_controls

    options = _search_controls("qwen3-next-80b-a3b", "H200", 64, 4096, 16)["seq_len"].options
    assert {32768, 65536, 131072} <= set(options) and min(options) == 1024


def test_search_panel_searches_again_on_the_gpus_a_refusal_names():
    """deepseek-v3.2 on 64 H200 is refused as too few GPUs for its parameter state; the refusal names 88 (the same
    count tessera-lab search names), which the GPUs list does not offer. The button adds 88 to the list, selects
    it and searches again. There every planned layout is refused by the planner (a bound is a floor), and the line
    names the next count at which some layout passes both memory bounds (96), which the button searches next; there
    a layout fits and the button is hidden."""
    from tessera_lab.errors import TooFewGPUsError
    from tessera_lab.model.spec import load_model
    from tessera_lab.ui.search_panel import search_panel

    with pytest.raises(TooFewGPUsError) as info:
        S.search(load_model("deepseek-v3.2"), 64, gpu="H200", top=1, max_plans=4)
    needed = info.value.needed
    assert needed is not None and f"at least {needed} GPUs" in str(info.value)
    box, controls, state = search_panel("deepseek-v3.2", gpu="H200", gpus=64, max_plans=8)
    button, line = _action(box)
    assert "too small" in state["error"] and button.layout.display != "none"
    assert needed not in controls["gpus"].options
    button.click()
    assert controls["gpus"].value == needed and needed in controls["gpus"].options
    assert state["action"].startswith(f"GPUs 64 -> {needed}:")
    assert "no planned layout of deepseek-v3.2 on 88 H200 fits memory" in state["error"]
    assert "more GPUs (96: the next count" in state["error"] and button.layout.display != "none"
    button.click()
    assert controls["gpus"].value == 96 and "error" not in state, state.get("error")
    assert state["action"].startswith(f"GPUs {needed} -> 96:") and button.layout.display == "none"
