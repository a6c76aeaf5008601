"""The one builder behind every interactive panel: controls -> a pure function -> a table and a figure drawn
deterministically.

A panel never prints into an ``ipywidgets.Output`` and never calls ``plt.show()`` (that Output-capture pattern
loses figures: 3 of 4 redraws came out blank in JupyterLab). Instead, on every change of a control:

* ``compute`` (a pure, tested function) runs with the controls' values;
* ``render`` turns its result into a :class:`View`: a table (DataFrame, Series or text), one figure or several
  (matplotlib Figure or Axes) and validity notes;
* the table goes into an ``ipywidgets.HTML`` and the figure is drawn with matplotlib's Agg renderer into PNG bytes
  shown by an ``ipywidgets.Image``; both are set in place, so the front end only ever swaps a finished picture.

Each figure carries a one-line caption with the settings that produced it, so a screenshot is self-describing.
A :class:`~tessera_lab.errors.TesseraError` from ``compute`` is shown, not raised: the status line and a figure
state it. ipywidgets and matplotlib are imported inside the functions.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass, field
from typing import Any, Callable

#: ``style`` of every control: labels take the width they need, so JupyterLab does not cut "expert width" short.
LABEL_STYLE = {"description_width": "initial"}
#: GPU types the panels offer (``data/hardware/hardware.json``): DGX/HGX nodes of 8 and the GB200 NVL72 rack (an
#: NVLink domain of 72 GPUs)
GPU_CHOICES = ("H100", "H200", "B200", "B300", "GB200")
#: resolution of panel figures (dots per inch of the PNG)
PANEL_DPI = 96


@dataclass
class View:
    """What a panel shows for one result.

    Attributes:
        table: a pandas DataFrame or Series, a plain string, or ``None``.
        figures: matplotlib Figures or Axes (stacked top to bottom), or ``None``/empty for none.
        notes: validity flags and caveats, one line each, shown with a warning sign (e.g. "ilp: does not fit in
            memory (stage 0 needs 161.2 GiB)").
        info: plain information lines (what a figure shows, the MFU against its published band), shown above the
            notes without a warning sign.
    """

    table: Any = None
    figures: Any = None
    notes: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)


@dataclass
class Action:
    """A button of a panel that sets several controls at once (one recompute).

    Attributes:
        label: the button's text.
        run: the controls' values -> ``(new values by control name, one line saying what was done)``; a
            :class:`~tessera_lab.errors.TesseraError` it raises is shown on the action's line, nothing is changed.
        when: the panel's state after a recompute -> whether the button is shown (default: always).
        busy: the status line while ``run`` works.
    """

    label: str
    run: Callable[[dict[str, Any]], tuple[dict[str, Any], str]]
    when: Callable[[dict[str, Any]], bool] | None = None
    busy: str = "working"


def _figure_of(obj: Any):
    return obj.figure if hasattr(obj, "figure") and not hasattr(obj, "savefig") else obj


def figure_png(fig: Any, *, caption: str | None = None, dpi: int = PANEL_DPI) -> bytes:
    """Draw a matplotlib Figure (or an Axes' figure) with the Agg renderer into PNG bytes and close it.

    Independent of the notebook's matplotlib backend (inline, ipympl or none): the figure gets its own Agg
    canvas. ``caption`` is written as a small grey line under the figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _figure_of(fig)
    FigureCanvasAgg(fig)  # attaches a fresh Agg canvas: no GUI or inline backend involved
    managed = fig.get_layout_engine() is not None  # constrained/tight layout already fits every label
    if caption:  # balanced lines that fit the figure's width, broken between settings only
        chars = min(FIGURE_CAPTION_CHARS, int(fig.get_figwidth() * CAPTION_CHARS_PER_INCH))
        caption = "\n".join(CAPTION_SEP.join(line) for line in caption_lines(caption.split(CAPTION_SEP), chars))
        if managed and getattr(fig, "_supxlabel", None) is None:  # the layout engine makes room for it
            fig.supxlabel(caption, x=0.005, ha="left", fontsize=7, color="dimgray")
        else:
            fig.text(0.005, -0.01, caption, fontsize=7, color="dimgray", ha="left", va="top")  # below the axes
            managed = False
    buf = io.BytesIO()
    # a tight bounding box costs a second draw; only figures without a layout engine need it
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white", bbox_inches=None if managed else "tight",
                pad_inches=0.08)
    plt.close(fig)
    return buf.getvalue()


def stack_png(images: list[bytes]) -> bytes:
    """Stack PNG images top to bottom on white (left-aligned); one image is returned unchanged."""
    if len(images) == 1:
        return images[0]
    from PIL import Image

    pics = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    out = Image.new("RGB", (max(p.width for p in pics), sum(p.height for p in pics)), "white")
    y = 0
    for p in pics:
        out.paste(p, (0, y))
        y += p.height
    buf = io.BytesIO()
    out.save(buf, format="PNG")
    return buf.getvalue()


def message_figure(text: str, *, width: float = 7.0):
    """A figure that states ``text`` (why there is no plot), so a panel never shows an empty picture."""
    import textwrap

    from matplotlib.figure import Figure

    lines = textwrap.wrap(text, int(width * 13))  # about 13 characters of 8-point text per inch
    fig = Figure(figsize=(width, 0.45 + 0.17 * len(lines)), facecolor="white", layout="constrained")
    fig.text(0.01, 0.6, "\n".join(lines), fontsize=8, va="center", ha="left", color="firebrick")
    return fig


def panel_wording(text: str) -> str:
    """An error worded for the command line in a panel's terms: ``--gpus = 64 is too small`` as "64 GPUs are too
    few", the pointer to ``tessera-lab search`` as the panels' suggest button and notebook 11, and any other
    ``--option value`` as "option value" (the control of that name)."""
    text = re.sub(r"--gpus = ([\d,]+) is too small", r"\1 GPUs are too few", text)
    text = re.sub(r"--gpus = ([\d,]+) is", r"\1 GPUs are", text)
    from tessera_lab.plan.problem import SEARCH_POINTER

    text = text.replace(SEARCH_POINTER,
                        "(the suggest button, or notebook 11's search, finds layouts that fit)")
    text = text.replace("tessera-lab search", "the layout search (notebook 11)")
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", " "), text)


def _number(x: float) -> str:
    """4 significant digits below 1,000; whole numbers with thousands separators from 1,000 up (so one table
    never mixes "26,892" with "3323", and never shows an exponent)."""
    return f"{x:,.0f}" if abs(x) >= 1e3 and x == x and abs(x) != float("inf") else f"{x:.4g}"


def table_html(table: Any, *, caption: str | None = None) -> str:
    """HTML for a DataFrame / Series or escaped plain text; ``caption`` (the settings that produced it) goes under
    the table, so a stale table can be told apart. A table sits in a horizontally scrolling block, so one wider
    than the notebook's output area is never cut off.

    Numbers take one format per column, set by the unit its label states, or per row in a table of metrics
    (:func:`tessera_lab.report.formatting.display_frame`: ms with 2 digits, s with 3, shares as % with 1, tokens/s
    whole, thousands separators); missing values read "n/a"."""
    from tessera_lab.report.formatting import display_frame

    if table is None:
        return ""
    if hasattr(table, "to_frame") and not hasattr(table, "columns"):
        table = table.to_frame()
    if hasattr(table, "to_html"):
        out = display_frame(table).to_html(na_rep="n/a", border=0)
        if caption:
            head, sep, rest = out.partition(">")
            out = (f"{head}{sep}<caption style='caption-side: bottom; font-size: 0.8em; color: dimgray'>"
                   f"{caption_html(caption)}</caption>{rest}")
        # wider than the output area (notebook 11's 20 columns at 1,220 px): it scrolls, nothing is cut off
        return f"<div style='overflow-x: auto; max-width: 100%'>{out}</div>"
    text = f"<pre>{html.escape(str(table))}</pre>"
    return text + (f"<div style='font-size: 0.8em; color: dimgray'>{caption_html(caption)}</div>" if caption else "")


#: characters per caption line (at 0.8em this is about 620 px, inside a notebook's output width)
CAPTION_LINE_CHARS = 90


def caption_html(caption: str, *, line_chars: int = CAPTION_LINE_CHARS) -> str:
    """Escaped ``caption`` laid out in balanced lines of at most about ``line_chars`` characters, broken only
    between `` · ``-separated items (each line a ``white-space: nowrap`` span, lines joined by ``<br>``): the
    browser never wraps it, so no item ("p2p (s) 0") ends alone on a line and none breaks inside."""
    items = caption.split(CAPTION_SEP)
    return "<br>".join(f"<span style='white-space: nowrap'>{html.escape(CAPTION_SEP.join(line))}</span>"
                       for line in caption_lines(items, line_chars))


def caption_lines(items: list[str], line_chars: int = 0) -> list[list[str]]:
    """``items`` split, in order, into the fewest lines of about equal length that keep each line within
    ``line_chars`` characters where a single item allows it (``len(text) / n`` per line for ``n`` lines)."""
    total = len(CAPTION_SEP.join(items))
    n = max(1, min(len(items), -(-total // max(1, line_chars or CAPTION_LINE_CHARS))))
    target = total / n
    lines: list[list[str]] = [[]]
    used = 0
    for i, item in enumerate(items):
        rest = len(items) - i
        if lines[-1] and len(lines) < n and (used + len(item) / 2 > target * len(lines) or rest < n - len(lines) + 1):
            lines.append([])
        lines[-1].append(item)
        used += len(item) + len(CAPTION_SEP)
    return lines


#: separator of the settings in a caption
CAPTION_SEP = " · "


#: characters per line of a figure's caption (7 pt text across a panel figure)
FIGURE_CAPTION_CHARS = 150
#: characters of 7 pt caption text per inch of figure width (DejaVu Sans averages about 4 pt a character, kept
#: below 72 / 4 = 18 so a line of wide characters still fits)
CAPTION_CHARS_PER_INCH = 15


def settings_caption(controls: dict[str, Any]) -> str:
    """``settings: label value · label value ...`` of the visible controls (floats to 4 significant digits): the
    default caption of a panel's table and figure."""
    parts = []
    for name, c in controls.items():
        if getattr(getattr(c, "layout", None), "display", None) == "none":
            continue  # a hidden control does not apply to this setting
        label = getattr(c, "description", "") or name
        value = c.value
        parts.append(f"{label} {value:.4g}" if isinstance(value, float) else f"{label} {value}")
    return "settings: " + CAPTION_SEP.join(parts)


# long: the widgets and their update callback share the panel's state (syncing, last result) as closures
def panel(
    controls: dict[str, Any],
    compute: Callable[[dict[str, Any]], Any],
    render: Callable[[Any], View],
    rows: list[list[str]] | None = None,
    *,
    state_key: str | None = "result",
    error_prefix: str = "cannot compute",
    caption: Callable[[Any], str] | None = None,
    on_change: Callable[[str], None] | None = None,
    actions: list[Action] | None = None,
):
    """Wire ipywidgets controls to a pure function; draw its table and figure deterministically.

    Every change of a control's ``value`` (and the call itself, once) clears ``state``, calls ``compute`` with
    the current values and ``render`` with its result, then replaces the HTML table and the PNG image in place.
    While ``compute`` runs, the status line says "computing" (with the new settings).

    Args:
        controls: the widgets by name; ``compute`` receives ``{name: widget.value}`` in this order.
        compute: the pure function; a :class:`~tessera_lab.errors.TesseraError` it raises is reported, not raised:
            ``state["error"]`` holds its text, the status line and the figure say ``"{error_prefix}: {exc}"``.
        render: result -> :class:`View` (table, figures, validity notes).
        rows: control names per row of the layout (default: one row of all controls).
        state_key: ``state[state_key]`` holds the latest result; ``None``: ``compute`` returns a dict of state
            entries that are all kept.
        error_prefix: the first words of the error line (e.g. ``"cannot plan"``).
        caption: result -> the caption of its table and figure (default: the controls' settings).
        on_change: called with the name of the control that changed, before ``compute``; changes it makes to
            other controls (options, values, visibility) do not recompute on their own.
        actions: buttons under the controls (:class:`Action`), each shown while its ``when`` holds; a click sets
            the controls ``run`` returns (``on_change`` called for each, as for a user's change) and recomputes
            once; ``state["action"]`` then holds its line (cleared by the next change of a control).

    Returns:
        ``(panel, controls, state)``: the ``ipywidgets.VBox`` (rows of controls, status line, table, image),
        the controls (set ``.value`` to recompute) and the live ``state`` dict, which also holds ``"png"`` (the
        figure's PNG bytes), ``"table_html"``, ``"notes"`` and ``"info"``.
    """
    import ipywidgets as w

    from tessera_lab.errors import TesseraError

    caption_of = caption
    status = w.HTML(layout=w.Layout(min_height="1.2em"))
    # the widget, not only the block inside it, scrolls a table wider than the panel: the HTML widget's content box
    # is a flex item that grows to the table's width (min-width auto), so the panel would scroll as a whole
    table = w.HTML(layout=w.Layout(overflow="auto", max_width="100%"))
    table.add_class("jp-RenderedHTMLCommon")
    image = w.Image(format="png", layout=w.Layout(max_width="100%"))
    image.add_class("tessera-panel-figure")
    state: dict[str, Any] = {}
    syncing = [False]
    names = {id(c): name for name, c in controls.items()}

    def update(change=None) -> None:
        if syncing[0]:
            return
        if change is not None:
            done.pop("line", None)
        if on_change is not None and change is not None:
            syncing[0] = True
            try:
                on_change(names.get(id(change.get("owner") if isinstance(change, dict) else change.owner), ""))
            finally:
                syncing[0] = False
        state.clear()
        caption = settings = settings_caption(controls)
        # a busy marker while ``compute`` runs (a re-plan can take seconds): the old table and figure stay, but
        # the status line says they are being replaced (the front end gets this message before the result)
        status.value = f"<span style='color:dimgray'>computing ({html.escape(settings)})&hellip;</span>"
        try:
            result = compute({name: c.value for name, c in controls.items()})
        except TesseraError as exc:
            state["error"] = str(exc)
            state["notes"], state["info"] = [], []
            state["table_html"] = ""
            # the reason in the status line (in the panel's words), the figure only saying there is no plot
            state["png"] = figure_png(message_figure(f"{error_prefix}: no plot (the reason is in the line above)"),
                                      caption=caption)
            status.value = (f"<b style='color:firebrick'>{html.escape(error_prefix)}</b>: "
                            f"{html.escape(panel_wording(str(exc)))}")
            table.value = ""
            image.value = state["png"]
            show(state)
            return
        if state_key is None:
            state.update(result)
        else:
            state[state_key] = result
        view = render(result)
        if caption_of is not None:
            caption = caption_of(result)
        figs = view.figures if isinstance(view.figures, (list, tuple)) else [view.figures]
        figs = [f for f in figs if f is not None] or [message_figure("no figure for these settings")]
        state["notes"], state["info"] = list(view.notes), list(view.info)
        state["table_html"] = table_html(view.table, caption=caption)
        state["png"] = stack_png([figure_png(f, caption=caption if i == len(figs) - 1 else None)
                                  for i, f in enumerate(figs)])
        status.value = "<br>".join([*(f"<span style='color:dimgray'>{html.escape(n)}</span>" for n in view.info),
                                    *(f"<span style='color:#b35900'>&#9888; {html.escape(n)}</span>"
                                      for n in view.notes)])
        table.value = state["table_html"]
        image.value = state["png"]
        show(state)

    done: dict[str, Any] = {}
    rows_of_actions, show = _action_buttons(actions or [], controls, status, done, (syncing, on_change, update))
    for c in controls.values():
        style = getattr(c, "style", None)
        if style is not None and hasattr(style, "description_width") and not style.description_width:
            style.description_width = LABEL_STYLE["description_width"]  # labels never cut off
        c.observe(update, names="value")
    update()
    layout = [w.HBox([controls[name] for name in row]) for row in (rows if rows is not None else [list(controls)])]
    box = w.VBox([*layout, *rows_of_actions, status, table, image])
    box.add_class("tessera-panel")
    return box, controls, state


def _action_buttons(actions: list[Action], controls: dict[str, Any], status, done: dict[str, Any], wiring: tuple):
    """A row per action of :func:`panel` (its button and a line beside it) and ``show(state)``, which shows each
    button while its ``when`` holds and the line of the action last done; ``wiring`` is the panel's
    ``(syncing flag, on_change, update)``. A click runs the action, sets the controls it returns with
    recomputation held off (``on_change`` called for each), then recomputes once; an action that fails shows why
    on its line and hides its button until the next recompute (the same controls would fail the same way)."""
    import ipywidgets as w

    from tessera_lab.errors import TesseraError

    syncing, on_change, update = wiring
    buttons, lines = [], []

    def click(act: Action, line, button) -> None:
        before = status.value  # the panel's reason (e.g. why it cannot plan), back in place if the action fails
        status.value = f"<span style='color:dimgray'>{html.escape(act.busy)}&hellip;</span>"
        try:
            values, text = act.run({name: c.value for name, c in controls.items()})
        except TesseraError as exc:
            status.value = before
            line.value = f"<span style='color:firebrick'>{html.escape(panel_wording(str(exc)))}</span>"
            # the same controls would give the same answer: the button is back once a control changes (show)
            button.layout.display = "none"
            return
        syncing[0] = True
        try:
            for name in [n for n in controls if n in values]:
                controls[name].value = values[name]
                if on_change is not None:
                    on_change(name)
            for name in [n for n in controls if n in values]:  # on_change may have moved a later one back
                controls[name].value = values[name]
        finally:
            syncing[0] = False
        done.update(by=act, line=text)
        update()

    for act in actions:
        # the button keeps its whole label beside a long line (flex: no shrink), the line wraps
        button = w.Button(description=act.label, layout=w.Layout(width="auto", flex="0 0 auto"))
        button.add_class("tessera-panel-action")
        line = w.HTML(layout=w.Layout(flex="1 1 auto"))
        button.on_click(lambda _b, act=act, line=line: click(act, line, _b))
        buttons.append((act, button))
        lines.append(line)

    def show(state: dict[str, Any]) -> None:
        if "line" in done:
            state["action"] = done["line"]
        for (act, button), line in zip(buttons, lines):
            button.layout.display = None if act.when is None or act.when(state) else "none"
            line.value = (f"<span style='color:#1a5e20'>{html.escape(done['line'])}</span>"
                          if done.get("by") is act and "line" in done else "")

    return [w.HBox([button, line]) for (_, button), line in zip(buttons, lines)], show
