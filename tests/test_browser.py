"""A real-browser check of the notebook experience.

Starts JupyterLab on 127.0.0.1 (a free port, a random token, headless, isolated config/runtime/settings folders)
in a temporary copy of ``notebooks/``, opens ``00_quickstart.ipynb`` in headless Chromium driven by selenium,
runs all cells through JupyterLab's own ``notebook:run-all-cells`` command, waits until the kernel is idle and
every code cell has run, and asserts that

* no cell raised,
* the ipywidgets panel rendered (a visible ``.widget-slider`` inside ``.jupyter-widgets``),
* a plot image (``img`` in an output area) is shown.

It saves ``artifacts/browser/quickstart.png`` (the widget panel and its plot) and
``artifacts/browser/quickstart_top.png`` (the top of the notebook). Needs the Debian packages ``chromium`` and
``chromium-driver`` (``/usr/bin/chromium``, ``/usr/bin/chromedriver``); the test skips when they are missing.
JupyterLab, its kernel, chromedriver and Chromium are stopped in every case, each step has its own timeout.
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

from tessera_lab.runner.launch import _alive, _free_port  # process helpers shared with the runner

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "artifacts" / "browser"
NOTEBOOK = "00_quickstart.ipynb"

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--disable-breakpad", "--disable-crash-reporter",
                "--window-size=1400,1050", "--hide-scrollbars"]

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
            deadline = time.monotonic() + SERVER_START_S
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


def _wait(driver, what: str, timeout: float, predicate, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = driver.execute_script(_notebook_state_js())
        if predicate(last):
            return last
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last notebook state: {last}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_renders_widgets_and_plots_in_chromium(tmp_path):
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium is not installed (need /usr/bin/chromium and /usr/bin/chromedriver: "
                    "apt-get install -y chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    os.environ.setdefault("SE_AVOID_STATS", "true")  # selenium: never phone home
    work = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    lab = JupyterLab(tmp_path, work)
    driver = None
    service = None
    browser_pids: set[int] = set()
    try:
        lab.start()
        t_server = time.monotonic() - t0
        opts = Options()
        opts.binary_location = CHROMIUM
        for flag in CHROME_FLAGS:
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
        service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
        driver = webdriver.Chrome(service=service, options=opts)
        browser_pids.add(service.process.pid)
        driver.set_page_load_timeout(PAGE_READY_S)
        driver.set_script_timeout(30)
        driver.get(f"{lab.base}/lab/tree/{NOTEBOOK}?token={lab.token}")
        browser_pids.update(_descendants(service.process.pid))

        _wait(driver, "the notebook to open with an idle kernel", PAGE_READY_S,
              lambda s: s and s.get("ready") and s.get("path", "").endswith(NOTEBOOK) and s.get("kernel") == "idle")
        lab.remember_children()
        driver.execute_script("window.jupyterapp.shell.collapseLeft();")
        # fire and forget: the command's promise settles only when every cell has run
        t_run = time.monotonic()
        driver.execute_script("window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')"
                              ".then(() => window.jupyterapp.commands.execute('notebook:run-all-cells')); return true;")
        state = _wait(driver, "every cell to run and the kernel to go idle", RUN_ALL_S,
                      lambda s: s.get("ready") and (s["errors"] or (s["notRun"] == 0 and s["kernel"] == "idle"
                                                                   and s["busyPrompts"] == 0)))
        run_s = time.monotonic() - t_run
        assert not state["errors"], f"cells raised: {state['errors']}"
        assert state["code"] > 0

        # the ipywidgets panel: controls rendered by the widget manager, not a text repr
        sliders = [e for e in driver.find_elements(By.CSS_SELECTOR, ".jupyter-widgets .widget-slider, "
                                                                    ".jupyter-widgets.widget-slider")
                   if e.is_displayed()]
        assert sliders, "no rendered ipywidgets slider (is jupyterlab_widgets installed?)"
        panel = driver.find_element(By.CSS_SELECTOR, ".widget-vbox")
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", panel)
        time.sleep(1.0)
        panel_imgs = [i for i in panel.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img") if i.is_displayed()]
        imgs = [i for i in driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
                if i.is_displayed() and driver.execute_script("return arguments[0].naturalWidth", i) > 0]
        assert imgs, "no plot image in any output area"
        assert panel_imgs, "the widget panel shows no plot"
        driver.save_screenshot(str(ARTIFACTS / "quickstart.png"))
        first = driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell")
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", first)
        time.sleep(0.5)
        driver.save_screenshot(str(ARTIFACTS / "quickstart_top.png"))
        (ARTIFACTS / "quickstart.json").write_text(json.dumps({
            "server_start_s": round(t_server, 1), "run_all_s": round(run_s, 1),
            "total_s": round(time.monotonic() - t0, 1), "code_cells": state["code"], "sliders": len(sliders),
            "plot_images": len(imgs), "kernel": state["kernelName"]}, indent=1))
    except Exception:
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.save_screenshot(str(ARTIFACTS / "quickstart_failure.png"))
        print("---- JupyterLab log ----\n" + lab.log_tail())
        raise
    finally:
        if service is not None and service.process is not None:
            browser_pids.update(_descendants(service.process.pid))
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        browser_left = _kill_pids(sorted(browser_pids))
        server_left = lab.stop()
    assert not browser_left, f"browser processes survived: {browser_left}"
    assert not server_left, f"JupyterLab/kernel processes survived: {server_left}"
