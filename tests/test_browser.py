"""A real-browser check of the notebook panels: every control touched, every redraw judged.

Starts JupyterLab on 127.0.0.1 (a free port, a random token, headless, isolated config/runtime/settings folders)
in a temporary folder holding ``panels.ipynb``, built from the notebooks' own cells (each notebook's
``parameters`` cell, the cells tagged ``panel-setup`` and the cell tagged ``panel``), opens it in headless
Chromium driven by selenium and runs it through JupyterLab's ``notebook:run-all-cells``. Then, for each panel
(notebooks 00 to 07 and 11), it changes every control once and then ``RANDOM_CHANGES`` (10) random ones the way a user
does (another option of a dropdown; arrow keys on a focused slider handle), and after each change requires

* the panel's figure (its largest ``<img>``) to be a non-blank image (at least 1% of its pixels drawn),
* that differs from the previous figure (pixel hash),
* and the table to have changed (or, for settings the library refuses, a status line that says why).

It saves ``artifacts/browser/NN_name_panel.png`` per panel and ``artifacts/browser/panels.json`` (timings).
``test_check_catches_blank_figures_of_an_output_capture_panel`` runs the same check on
``tests/data/browser/output_capture_panel.ipynb`` (the Output + ``plt.show()`` pattern no panel uses) and requires it to find blank redraws. Needs the Debian packages ``chromium`` and ``chromium-driver``
(``/usr/bin/chromium``, ``/usr/bin/chromedriver``); the tests skip when they are missing. JupyterLab, its
kernels, chromedriver and Chromium are stopped in every case; each step has its own timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser  # slow by kind (tests/conftest.py)

from tessera_lab.runner.launch.spawn import _alive, _free_port  # noqa: E402  (one copy of each)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "artifacts" / "browser"

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--disable-breakpad", "--disable-crash-reporter",
                "--window-size=1400,1600", "--hide-scrollbars"]

SERVER_START_S = 90
PAGE_READY_S = 120
RUN_ALL_S = 300


def _find(env: str, *candidates: str) -> str | None:
    for c in (os.environ.get(env), *candidates):
        if not c:
            continue
        path = c if os.path.isabs(c) else shutil.which(c)
        if path and os.path.exists(path) and os.access(path, os.X_OK):
            return path
    return None


CHROMIUM = _find("TESSERA_CHROMIUM", "/usr/bin/chromium", "chromium", "chromium-browser")
CHROMEDRIVER = _find("TESSERA_CHROMEDRIVER", "/usr/bin/chromedriver", "chromedriver")


def _descendants(pid: int) -> list[int]:
    """PIDs below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_pids(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM the given processes (ours), wait, SIGKILL what is left; return those still alive."""
    pids = [p for p in pids if _alive(p)]
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for p in pids:
        if _alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
    time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return json.loads(r.read().decode())


class JupyterLab:
    """JupyterLab on 127.0.0.1 in its own session, with isolated Jupyter folders under ``tmp``."""

    def __init__(self, tmp: Path, root_dir: Path):
        self.tmp, self.root_dir = tmp, root_dir
        self.token = os.urandom(16).hex()
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = tmp / "jupyterlab.log"
        self.tracked: set[int] = set()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        settings = self.tmp / "lab-settings"
        # no virtual scrolling (every cell in the DOM), no news or update checks (no network)
        for rel, value in {
            "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                                "checkForUpdates": False},
        }.items():
            path = settings / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        env = dict(os.environ)
        env.update({
            "JUPYTER_CONFIG_DIR": str(self.tmp / "jupyter-config"),
            "JUPYTER_RUNTIME_DIR": str(self.tmp / "jupyter-runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.tmp / "lab-workspaces"),
            "IPYTHONDIR": str(self.tmp / "ipython"),
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("MPLBACKEND", None)  # let the kernel use its inline backend
        return env

    def start(self) -> None:
        last_error = ""
        for _attempt in range(3):  # another process may take the free port between probe and bind
            self.port = _free_port()
            cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                   f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
                   "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
                   "--ServerApp.shutdown_no_activity_timeout=900", "--MappingKernelManager.cull_idle_timeout=0"]
            if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
                cmd.append("--allow-root")
            log = open(self.log_path, "ab")  # noqa: SIM115 - closed when the process is stopped
            self.proc = subprocess.Popen(cmd, cwd=self.root_dir, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            self.tracked.add(self.proc.pid)
            deadline = time.monotonic() + SERVER_START_S * _oversubscription()
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    _get_json(f"{self.base}/api/status?token={self.token}", timeout=2)
                    return
                except (urllib.error.URLError, OSError, ValueError):
                    time.sleep(0.3)
            last_error = self.log_tail()
            self.stop()
        raise RuntimeError(f"JupyterLab did not start within {SERVER_START_S} s:\n{last_error}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def remember_children(self) -> None:
        if self.proc is not None:
            self.tracked.update(_descendants(self.proc.pid))

    def stop(self) -> list[int]:
        """Shut the kernels down through the REST API, SIGTERM the server (it cleans up its kernels), then
        SIGKILL anything of ours still running. Returns PIDs that survived (should be none)."""
        if self.proc is None:
            return []
        self.remember_children()
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                for k in _get_json(f"{self.base}/api/kernels?token={self.token}"):
                    req = urllib.request.Request(f"{self.base}/api/kernels/{k['id']}?token={self.token}",
                                                 method="DELETE")
                    urllib.request.urlopen(req, timeout=10).close()  # noqa: S310 - loopback only
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        survivors = _kill_pids(sorted(self.tracked - {self.proc.pid}))
        self.proc = None
        return survivors


def _notebook_state_js() -> str:
    return """
const app = window.jupyterapp;
if (!app) { return {ready: false, why: 'no window.jupyterapp'}; }
const w = app.shell.currentWidget;
if (!w || !w.content || !w.sessionContext) { return {ready: false, why: 'no notebook panel'}; }
const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
const cells = w.content.widgets;
let code = 0, notRun = 0, errors = [];
for (const c of cells) {
  if (c.model.type !== 'code') { continue; }
  code += 1;
  if (c.model.executionCount === null || c.model.executionCount === undefined) { notRun += 1; }
  const outs = c.model.outputs.toJSON();
  for (const o of outs) { if (o.output_type === 'error') { errors.push(o.ename + ': ' + o.evalue); } }
}
const busyPrompts = Array.from(document.querySelectorAll('.jp-InputPrompt')).filter(e => e.textContent.includes('*')).length;
return {ready: true, path: w.context.path, kernel: kernel ? kernel.status : null, kernelName: kernel ? kernel.name : null,
        code: code, notRun: notRun, busyPrompts: busyPrompts, errors: errors};
"""


def _oversubscription() -> float:
    """The machine's 1-minute load average over its usable cores, at least 1: on a shared machine at load 9 on 2
    cores, Chromium, JupyterLab and a kernel get about 2/9 of a core each, so every wait below is stretched by it."""
    try:
        return max(1.0, os.getloadavg()[0] / max(1, len(os.sched_getaffinity(0))))
    except (OSError, AttributeError):  # pragma: no cover
        return 1.0


def _wait(driver, what: str, timeout: float, predicate, poll: float = 0.5):
    """Poll the notebook state until ``predicate`` holds; the limit is ``timeout`` seconds times the largest
    oversubscription seen while waiting (a busy machine slows every step, not a broken panel)."""
    start, scale = time.monotonic(), _oversubscription()
    last = None
    while time.monotonic() < start + timeout * scale:
        last = driver.execute_script(_notebook_state_js())
        if predicate(last):
            return last
        time.sleep(poll)
        scale = max(scale, _oversubscription())
    raise AssertionError(f"timed out after {time.monotonic() - start:.0f} s (limit {timeout} s x load factor "
                         f"{scale:.1f}) waiting for {what}; last notebook state: {last}")


# ----------------------------------------------------------------------------------------------- panel checks
#: the notebooks whose panels are checked (each panel is a ``.tessera-panel`` VBox in a cell tagged ``panel``)
PANEL_NOTEBOOKS = ["00_quickstart.ipynb", "01_collectives.ipynb", "02_tensor_vs_pipeline.ipynb",
                   "03_bubbles_and_microbatches.ipynb", "04_moe_all_to_all.ipynb",
                   "05_layer_tasks_and_overlap.ipynb", "06_overlap_aware_partitioning.ipynb",
                   "07_dynamic_bubbles.ipynb", "11_layout_search.ipynb"]
#: ``TESSERA_BROWSER_NOTEBOOKS=00,07`` checks only those notebooks' panels (by number; default: every one above)
_ONLY = {n.strip() for n in os.environ.get("TESSERA_BROWSER_NOTEBOOKS", "").split(",") if n.strip()}
PANEL_NOTEBOOKS = [n for n in PANEL_NOTEBOOKS if not _ONLY or n[:2] in _ONLY]
PANELS_NOTEBOOK = "panels.ipynb"  # built by panels_notebook() from the notebooks' tagged cells
#: random changes per panel after every control once (about 2.3 s each at load 2 on 2 cores: 9 panels x 4 is 80 s of
#: the suite; TESSERA_BROWSER_RANDOM_CHANGES=10 for a longer sweep)
RANDOM_CHANGES = int(os.environ.get("TESSERA_BROWSER_RANDOM_CHANGES", "4"))
CHANGE_S = 90          # one recompute (a re-plan is about a second; notebook 07's panel simulates two timelines;
                       # notebook 11's searches layouts with a budget of 48 plans, a few CPU seconds)
SETTLE_S = 2.0         # after the kernel is idle again, how long a redraw may still take to arrive
MIN_INK = 0.01         # a figure is blank when fewer than 1% of its pixels differ from white

# JS: the panel's figure (largest visible <img>) as pixel statistics, and its table / status text.
_PANEL_JS = """
const panel = document.querySelectorAll('.tessera-panel')[arguments[0]];
if (!panel) { return {found: false}; }
const imgs = Array.from(panel.querySelectorAll('img')).filter(i => i.offsetParent !== null);
let fig = null;
for (const i of imgs) { if (!fig || i.naturalWidth * i.naturalHeight > fig.naturalWidth * fig.naturalHeight) { fig = i; } }
let stats = {w: 0, h: 0, ink: 0, hash: '', src: ''};
if (fig && fig.complete && fig.naturalWidth > 0) {
  const c = document.createElement('canvas');
  c.width = fig.naturalWidth; c.height = fig.naturalHeight;
  const ctx = c.getContext('2d');
  ctx.drawImage(fig, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  let ink = 0, h = 2166136261;
  for (let k = 0; k < d.length; k += 4) {  // every pixel: a changed caption digit changes the hash
    if (d[k] < 235 || d[k + 1] < 235 || d[k + 2] < 235) { ink += 1; }
    h = Math.imul(h ^ (d[k] + 3 * d[k + 1] + 7 * d[k + 2] + 11 * (k & 255)), 16777619) >>> 0;
  }
  stats = {w: c.width, h: c.height, ink: ink / (c.width * c.height), hash: String(h) + ':' + c.width + 'x' + c.height,
           src: fig.src.slice(0, 80)};
}
const tables = Array.from(panel.querySelectorAll('table')).map(t => t.innerText).join('\\n');
const status = Array.from(panel.querySelectorAll('.widget-html')).map(e => e.innerText).join('\\n');
const out = Array.from(panel.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText).join('\\n');
return {found: true, figure: stats, table: tables, status: status, output: out};
"""


def _controls(driver, index: int):
    """The panel's controls in layout order: (kind, element) with kind 'dropdown' or 'slider'."""
    from selenium.webdriver.common.by import By

    panel = driver.find_elements(By.CSS_SELECTOR, ".tessera-panel")[index]
    out = []
    for el in panel.find_elements(By.CSS_SELECTOR, ".widget-dropdown, .widget-hslider"):
        if not el.is_displayed():
            continue  # a knob that does not apply to the chosen model is hidden
        out.append(("dropdown" if "widget-dropdown" in el.get_attribute("class") else "slider", el))
    return out


def _value(kind: str, el) -> str:
    from selenium.webdriver.common.by import By

    if kind == "dropdown":
        return el.find_element(By.CSS_SELECTOR, "select").get_attribute("value")
    return el.find_element(By.CSS_SELECTOR, ".widget-readout").text


def _change(driver, kind: str, el, rng) -> tuple[str, str]:
    """Change one control the way a user does (pick another option; focus the slider handle and press arrow
    keys). Returns (before, after) of its shown value."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    before = _value(kind, el)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    if kind == "dropdown":
        sel = Select(el.find_element(By.CSS_SELECTOR, "select"))
        options = [o.get_attribute("value") for o in sel.options]
        choices = [i for i, o in enumerate(options) if o != before]
        if not choices:  # a one-option dropdown (a dense model's MoE knobs read "config" only): it cannot move
            return before, before
        sel.select_by_index(rng.choice(choices))
        return before, _value(kind, el)
    handle = el.find_element(By.CSS_SELECTOR, ".noUi-handle")
    presses = rng.randint(1, 3)
    for key in ([Keys.ARROW_RIGHT, Keys.ARROW_LEFT] if rng.random() < 0.5 else [Keys.ARROW_LEFT, Keys.ARROW_RIGHT]):
        handle.click()
        handle.send_keys(*([key] * presses))
        time.sleep(0.1)
        after = _value(kind, el)
        if after != before:  # at the end of its range: the other direction
            return before, after
    return before, _value(kind, el)


_KERNEL_JS = """
const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
return k ? k.status : null;
"""


_SRC_JS = """
const panel = document.querySelectorAll('.tessera-panel')[arguments[0]];
const imgs = panel ? Array.from(panel.querySelectorAll('img')).filter(i => i.offsetParent !== null) : [];
return imgs.map(i => i.src.length + ':' + i.src.slice(-48)).join('|');
"""


def _redraw(driver, index: int, before: dict, timeout: float) -> dict:
    """Wait until the panel's figure is replaced and the kernel is idle (or, for a figure that never comes, the
    kernel has been idle for SETTLE_S); return the panel's new state. The limit is stretched by the load factor."""
    deadline = time.monotonic() + timeout * _oversubscription()
    idle_since = None
    src = driver.execute_script(_SRC_JS, index)
    while time.monotonic() < deadline:
        kernel = driver.execute_script(_KERNEL_JS)
        if kernel == "idle":
            idle_since = idle_since or time.monotonic()
            if driver.execute_script(_SRC_JS, index) != src:  # a new picture arrived: wait until all settles
                return _settled(driver, index, deadline)
            if time.monotonic() - idle_since > SETTLE_S:
                return driver.execute_script(_PANEL_JS, index)
        else:
            idle_since = None
        time.sleep(0.2)
    return driver.execute_script(_PANEL_JS, index)


def _settled(driver, index: int, deadline: float) -> dict:
    """The panel's state once the kernel is idle and two reads 0.4 s apart agree (a slider moved by several
    key presses sends several changes; the table, status and figure of the last one arrive in turn)."""
    last = driver.execute_script(_PANEL_JS, index)
    while time.monotonic() < deadline:
        time.sleep(0.4)
        now = driver.execute_script(_PANEL_JS, index)
        if now == last and driver.execute_script(_KERNEL_JS) == "idle":
            return now
        last = now
    return last


def _judge(before: dict, after: dict) -> str | None:
    """Why this redraw fails the check, or None: the figure is a non-blank image that differs from the last one
    and the table changed (or, for settings the library refuses, the status line says why)."""
    fig = after["figure"]
    if not fig["w"]:
        return "no figure"
    if fig["ink"] < MIN_INK:
        return f"blank figure ({fig['ink']:.2%} of pixels drawn)"
    if fig["hash"] == before["figure"]["hash"]:
        return "figure did not change"
    text = after["table"] or after["output"]
    if not text.strip():
        if not after["status"].strip():
            return "no table and no reason given"
    elif text == (before["table"] or before["output"]):
        return "table did not change"
    return None


def exercise_panels(driver, owners: list[str], rng, *, random_changes: int = RANDOM_CHANGES) -> dict:
    """Change every control of every panel once, then ``random_changes`` random controls; judge each redraw and
    save a screenshot per panel (``owners[i]`` names the notebook of panel ``i``). Returns ``{"panels",
    "changes", "failures": [...], "seconds", "per_panel": {notebook: seconds}}``."""
    from selenium.webdriver.common.by import By

    t0 = time.monotonic()
    panels = driver.find_elements(By.CSS_SELECTOR, ".tessera-panel")
    failures, changes, per_panel = [], 0, {}
    for index in range(len(panels)):
        t_panel = time.monotonic()
        notebook = owners[index] if index < len(owners) else f"panel{index}"
        # every control once (by label: a model change may hide knobs that do not apply), then random visible ones
        plan = [el.text.split("\n")[0] for _, el in _controls(driver, index)] + [None] * random_changes
        state = driver.execute_script(_PANEL_JS, index)
        if (why := _judge({"figure": {"hash": None}, "table": "", "output": ""}, state)) is not None:
            failures.append(f"{notebook} panel {index}, as first shown: {why}")
        for want in plan:
            visible = _controls(driver, index)
            picked = ([c for c in visible if c[1].text.split("\n")[0] == want] if want is not None
                      else [visible[rng.randrange(len(visible))]])
            if not picked:
                continue  # hidden now: it does not apply to the model chosen meanwhile
            kind, el = picked[0]
            label = el.text.split("\n")[0]
            old, new = _change(driver, kind, el, rng)
            if old == new:
                continue  # the control could not move (e.g. a one-option dropdown): nothing to judge
            changes += 1
            after = _redraw(driver, index, state, CHANGE_S)
            if (why := _judge(state, after)) is not None:
                failures.append(f"{notebook} panel {index}, {label} {old} -> {new}: {why}")
            state = after
        panel = driver.find_elements(By.CSS_SELECTOR, ".tessera-panel")[index]
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", panel)
        time.sleep(0.3)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        panel.screenshot(str(ARTIFACTS / f"{Path(notebook).stem}_panel.png"))
        per_panel[notebook] = round(time.monotonic() - t_panel, 1)
    failures += _overflowing_panels(driver, owners)
    return {"panels": len(panels), "changes": changes, "failures": failures,
            "seconds": round(time.monotonic() - t0, 1), "per_panel": per_panel}


_OVERFLOW_JS = """
return Array.from(document.querySelectorAll('.tessera-panel')).map(p => [p.clientWidth, p.scrollWidth]);
"""


def _overflowing_panels(driver, owners: list[str]) -> list[str]:
    """Panels wider than the notebook with JupyterLab's file browser open (a 1,400 px window leaves about 970
    px): a wide table must scroll inside its own widget, never push the whole panel sideways."""
    driver.execute_script("window.jupyterapp.shell.expandLeft();")
    time.sleep(1.0)
    try:
        widths = driver.execute_script(_OVERFLOW_JS)
    finally:
        driver.execute_script("window.jupyterapp.shell.collapseLeft();")
    return [f"{owners[i] if i < len(owners) else f'panel{i}'} panel {i}: {scroll} px wide in a {client} px output "
            "area with the file browser open (the panel scrolls sideways as a whole)"
            for i, (client, scroll) in enumerate(widths) if scroll > client + 1]


def panels_notebook(src: Path, out: Path, notebooks: list[str]) -> list[str]:
    """Write one notebook holding every panel: for each notebook (in order) its ``parameters`` cell, the cells
    tagged ``panel-setup`` and the ``panel`` cell, exactly as they are in the notebook. Returns the notebook of
    each panel, in order."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    owners = []
    for name in notebooks:
        cells = nbformat.read(src / name, as_version=4).cells
        picked = [c for c in cells if c.cell_type == "code"
                  and {"parameters", "panel-setup", "panel"} & set(c.get("metadata", {}).get("tags", []))]
        panels = [c for c in picked if "panel" in c.metadata.get("tags", [])]
        assert panels, f"{name}: no code cell tagged 'panel'"
        nb.cells.append(nbformat.v4.new_markdown_cell(f"## {name}"))
        for c in picked:
            nb.cells.append(nbformat.v4.new_code_cell(c.source, metadata={"tags": c.metadata.get("tags", [])}))
        owners += [name] * len(panels)
    nbformat.write(nb, out)
    return owners


# ----------------------------------------------------------------------------------------------- the session
class Browser:
    """JupyterLab plus headless Chromium, opened once for a test module; every process is ours and is stopped."""

    def __init__(self, tmp: Path, root_dir: Path):
        self.tmp, self.root_dir = tmp, root_dir
        self.lab = JupyterLab(tmp, root_dir)
        self.driver = None
        self.service = None
        self.pids: set[int] = set()

    def start(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        os.environ.setdefault("SE_AVOID_STATS", "true")  # selenium: never phone home
        self.lab.start()
        opts = Options()
        opts.binary_location = CHROMIUM
        for flag in CHROME_FLAGS:
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={self.tmp / 'chromium-profile'}")
        self.service = Service(executable_path=CHROMEDRIVER, log_output=str(self.tmp / "chromedriver.log"))
        self.driver = webdriver.Chrome(service=self.service, options=opts)
        self.pids.add(self.service.process.pid)
        self.driver.set_page_load_timeout(PAGE_READY_S * _oversubscription())
        self.driver.set_script_timeout(60)

    def run_notebook(self, notebook: str) -> dict:
        """Open ``notebook``, clear its stored outputs, run every cell, wait for an idle kernel; the final state."""
        d = self.driver
        d.get(f"{self.lab.base}/lab/tree/{notebook}?token={self.lab.token}")
        self.pids.update(_descendants(self.service.process.pid))
        _wait(d, f"{notebook} to open with an idle kernel", PAGE_READY_S,
              lambda s: s and s.get("ready") and s.get("path", "").endswith(notebook) and s.get("kernel") == "idle")
        self.lab.remember_children()
        d.execute_script("window.jupyterapp.shell.collapseLeft();")
        # fire and forget: the command's promise settles only when every cell has run
        d.execute_script("window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')"
                         ".then(() => window.jupyterapp.commands.execute('notebook:run-all-cells')); return true;")
        state = _wait(d, f"every cell of {notebook} to run", RUN_ALL_S,
                      lambda s: s.get("ready") and (s["errors"] or (s["notRun"] == 0 and s["kernel"] == "idle"
                                                                   and s["busyPrompts"] == 0)))
        assert not state["errors"], f"{notebook}: cells raised: {state['errors']}"
        return state

    def close_notebook(self) -> None:
        """Shut the notebook's kernel down (so kernels do not pile up) and close its tab without saving."""
        with contextlib.suppress(Exception):
            for k in _get_json(f"{self.lab.base}/api/kernels?token={self.lab.token}"):
                req = urllib.request.Request(f"{self.lab.base}/api/kernels/{k['id']}?token={self.lab.token}",
                                             method="DELETE")
                urllib.request.urlopen(req, timeout=10).close()  # noqa: S310 - loopback only
        with contextlib.suppress(Exception):
            self.driver.execute_script("window.onbeforeunload = null; return true;")

    def stop(self) -> tuple[list[int], list[int]]:
        if self.service is not None and self.service.process is not None:
            self.pids.update(_descendants(self.service.process.pid))
        if self.driver is not None:
            with contextlib.suppress(Exception):
                self.driver.quit()
        return _kill_pids(sorted(self.pids)), self.lab.stop()


def _skip_without_chromium() -> None:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium is not installed (need /usr/bin/chromium and /usr/bin/chromedriver: "
                    "apt-get install -y chromium chromium-driver)")
    pytest.importorskip("selenium")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _skip_without_chromium()
    tmp = tmp_path_factory.mktemp("browser")
    work = tmp / "notebooks"
    work.mkdir()
    b_owners = panels_notebook(NOTEBOOKS, work / PANELS_NOTEBOOK, PANEL_NOTEBOOKS)
    shutil.copy(FIXTURE, work / FIXTURE.name)
    b = Browser(tmp, work)
    b.owners = b_owners
    try:
        b.start()
        yield b
    finally:
        browser_left, server_left = b.stop()
        assert not browser_left, f"browser processes survived: {browser_left}"
        assert not server_left, f"JupyterLab/kernel processes survived: {server_left}"


#: a panel built the old way (ipywidgets.Output + display + plt.show()), kept to prove the check catches it
FIXTURE = ROOT / "tests" / "data" / "browser" / "output_capture_panel.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_panel_redraws_on_every_change_in_chromium(browser):
    """For each panel of the notebooks: every control once, then RANDOM_CHANGES (4) random changes; after each the figure is a
    non-blank image that differs from the last and the table changed. Screenshots: artifacts/browser/."""
    import random

    t0 = time.monotonic()
    try:
        state = browser.run_notebook(PANELS_NOTEBOOK)
        t_run = time.monotonic() - t0
        res = exercise_panels(browser.driver, browser.owners, random.Random(17))
    except Exception:
        with contextlib.suppress(Exception):
            browser.driver.save_screenshot(str(ARTIFACTS / "panels_failure.png"))
        print("---- JupyterLab log ----\n" + browser.lab.log_tail())
        raise
    finally:
        browser.close_notebook()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "panels.json").write_text(json.dumps(
        {"total_s": round(time.monotonic() - t0, 1), "run_all_s": round(t_run, 1), "code_cells": state["code"],
         "random_changes": RANDOM_CHANGES, **res}, indent=1))
    assert res["panels"] == len(browser.owners), (f"{res['panels']} panels rendered, {len(browser.owners)} expected "
                                                 "(is jupyterlab_widgets installed?)")
    assert not res["failures"], "panels failed the redraw check:\n" + "\n".join(res["failures"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_check_catches_blank_figures_of_an_output_capture_panel(browser):
    """The same check on the old pattern (an Output widget, display() and plt.show() in the callback) finds
    redraws without a figure: the check can see a blank redraw."""
    import random

    browser.run_notebook(FIXTURE.name)
    try:
        res = exercise_panels(browser.driver, [FIXTURE.name], random.Random(17))
    finally:
        browser.close_notebook()
    (ARTIFACTS / "output_capture_panel.json").write_text(json.dumps(res, indent=1))
    assert res["changes"] >= 5
    blank = [f for f in res["failures"] if f.endswith(("no figure", "blank figure")) or "blank figure" in f]
    assert blank, f"the redraw check found no blank redraw of the Output-capture panel: {res['failures']}"


# ------------------------------------------------------------------------ notebook 00: its parameters reach the panel
#: notebook 00's parameters as the test sets them: H100 and sequence 8192 (ep 32: Qwen3-Next at sequence 8192 fits
#: an 80 GB H100 only with its experts spread over 32 ranks)
NB00_PARAMETERS = {"GPU": '"H100"', "SEQ_LEN": "8192", "EP": "32"}


def quickstart_notebook(src: Path, out: Path, values: dict[str, str]) -> str:
    """Notebook 00's import-free cells needed by its panel: its ``parameters`` cell with ``values`` assigned
    (``NAME = value`` lines replaced; a missing name fails) and its ``panel`` cell. Returns the new parameters
    cell's source."""
    import re

    import nbformat

    cells = nbformat.read(src / "00_quickstart.ipynb", as_version=4).cells
    params = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])][0]
    panel_cell = [c for c in cells if "panel" in c.get("metadata", {}).get("tags", [])][0]
    source = params.source
    for name, value in values.items():
        source, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", source, flags=re.M)
        assert n == 1, f"notebook 00's parameters cell has no line '{name} = ...'"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source, metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(panel_cell.source, metadata={"tags": ["panel"]})]
    nbformat.write(nb, out)
    return source


def _select(driver, label: str, value: str) -> None:
    """Pick ``value`` in the panel's dropdown labelled ``label`` the way a user does."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    for kind, el in _controls(driver, 0):
        if kind == "dropdown" and el.text.split("\n")[0].strip() == label:
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
            Select(el.find_element(By.CSS_SELECTOR, "select")).select_by_visible_text(value)
            return
    raise AssertionError(f"no dropdown labelled {label!r} in the panel")


@pytest.mark.timeout(900)
def test_notebook_00_parameters_reach_the_panel_and_pp_shows_the_gpu_count(browser):
    """GPU = "H100" and SEQ_LEN = 8192 in notebook 00's parameters cell: the panel's caption names them and its
    numbers are those of that plan (tokens/s per GPU as the library plans it here); pp 16 shows 512 GPUs; the model
    dropdown switches to Qwen3-30B-A3B and hides the attention-ratio knob (full attention only)."""
    from tessera_lab.report.formatting import label_unit, unit_formatter
    from tessera_lab.ui.widgets import replan, summary_table

    name = "nb00_parameters.ipynb"
    quickstart_notebook(NOTEBOOKS, browser.root_dir / name, NB00_PARAMETERS)
    d = browser.driver
    try:
        browser.run_notebook(name)
        state = _settled(d, 0, time.monotonic() + CHANGE_S)
        text = state["table"]
        assert "H100" in text and "sequence 8192" in text and "256 H100" in text and "pp 8 x ep 32" in text, text
        want = summary_table(replan("qwen3-next-80b-a3b", gpu="H100", pp=8, ep=32, microbatches=32, seq_len=8192))
        per_gpu = unit_formatter(label_unit("tokens/s per GPU"), [])(want.loc["overlap-aware (ilp)", "tokens/s per GPU"])
        assert per_gpu in text, (per_gpu, text)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        panel = d.find_elements("css selector", ".tessera-panel")[0]
        panel.screenshot(str(ARTIFACTS / "00_quickstart_h100_8192.png"))

        _select(d, "pp", "16")
        state = _redraw(d, 0, state, CHANGE_S)
        assert "512 H100" in state["table"] and "pp 16 x ep 32" in state["table"], state["table"] or state["status"]
        panel.screenshot(str(ARTIFACTS / "00_quickstart_pp16.png"))

        labels = lambda: [el.text.split("\n")[0].strip() for _, el in _controls(d, 0)]  # noqa: E731
        assert "attn ratio" in labels()
        _select(d, "pp", "8")
        state = _redraw(d, 0, state, CHANGE_S)
        _select(d, "model", "kimi-linear-48b-a3b")  # a KDA + MLA hybrid of the model zoo: the ratio knob stays
        state = _redraw(d, 0, state, CHANGE_S)
        shown = state["table"] or state["status"]
        assert "kimi-linear-48b-a3b" in shown, shown
        assert "attn ratio" in labels() and "expert width" in labels()
        panel.screenshot(str(ARTIFACTS / "00_quickstart_kimi_linear.png"))
        _select(d, "model", "qwen3-30b-a3b")
        state = _redraw(d, 0, state, CHANGE_S)
        shown = state["table"] or state["status"]
        assert "qwen3-30b-a3b" in shown or "cannot plan" in shown, shown
        assert "attn ratio" not in labels() and "expert width" in labels()
        panel.screenshot(str(ARTIFACTS / "00_quickstart_model.png"))
    except Exception:
        with contextlib.suppress(Exception):
            d.save_screenshot(str(ARTIFACTS / "nb00_failure.png"))
        raise
    finally:
        browser.close_notebook()


#: notebook 00's parameters where no partition fits (H100, 16,384-token sequences on 8 x 8): the panel offers a
#: layout that fits
NB00_NO_FIT = {"GPU": '"H100"', "SEQ_LEN": "16384", "EP": "8"}


@pytest.mark.timeout(600)
def test_suggest_button_applies_a_layout_that_fits_in_chromium(browser):
    """Notebook 00's panel at a setting that cannot plan shows the "suggest a layout that fits" button; a click
    (as a user's) moves the controls to the layout the search found, the panel plans it (a table with tokens/s)
    and the line beside the button names it; the button is hidden again."""
    from selenium.webdriver.common.by import By

    name = "nb00_no_fit.ipynb"
    quickstart_notebook(NOTEBOOKS, browser.root_dir / name, NB00_NO_FIT)
    d = browser.driver
    try:
        browser.run_notebook(name)
        state = _settled(d, 0, time.monotonic() + CHANGE_S)
        assert "cannot plan" in state["status"] and not state["table"].strip(), state
        panel = d.find_elements(By.CSS_SELECTOR, ".tessera-panel")[0]
        button = panel.find_element(By.CSS_SELECTOR, ".tessera-panel-action")
        assert button.is_displayed() and "suggest a layout that fits" in button.text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        panel.screenshot(str(ARTIFACTS / "00_quickstart_cannot_plan.png"))
        d.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
        button.click()
        after = _redraw(d, 0, state, CHANGE_S)
        assert "tokens/s" in after["table"] and "cannot plan" not in after["status"], after
        assert "suggested" in after["status"] and "recompute" in after["status"], after["status"]
        assert (why := _judge(state, after)) is None, why
        assert not button.is_displayed()
        panel.screenshot(str(ARTIFACTS / "00_quickstart_suggested.png"))
    except Exception:
        with contextlib.suppress(Exception):
            d.save_screenshot(str(ARTIFACTS / "nb00_suggest_failure.png"))
        raise
    finally:
        browser.close_notebook()
