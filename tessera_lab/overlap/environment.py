"""Device and versions of this machine, as profiles and runner observations record them (torch-free)."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path
from typing import Any

from tessera_lab.errors import ConfigError

__all__ = ["current_environment", "cost_model_digest"]


# ---------------------------------------------------------------------- environment
def _torch_version() -> str | None:
    try:
        import importlib.metadata  # imported where needed: planning never asks for the environment

        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_smi() -> tuple[str | None, str | None]:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, None
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None, None
    if not out:
        return None, None
    name, _, driver = out[0].partition(",")
    return name.strip() or None, driver.strip() or None


def cost_model_digest() -> str:
    """Short hash of ``data/hardware/cost_model.json`` (an analytic profile goes stale when it changes)."""
    from tessera_lab.paths import data_dir

    return hashlib.sha256((data_dir() / "hardware" / "cost_model.json").read_bytes()).hexdigest()[:12]


def current_environment(backend: str, gpu: str | None = None) -> dict[str, Any]:
    """Device and versions of this machine as a profile records them.

    ``cpu``: the CPU model and core count; ``cuda``: the GPU name and driver from ``nvidia-smi`` (or torch);
    ``analytic``: ``"analytic model of <gpu>"`` and the cost-model digest. torch's version comes from package
    metadata, its CUDA version from the version suffix or ``torch.version.cuda`` if torch is already loaded.
    """
    import os
    import sys

    tv = _torch_version()
    env: dict[str, Any] = {"torch": tv, "cuda": None, "driver": None, "python": platform.python_version(),
                           "platform": platform.platform(terse=True)}
    if backend == "cpu":
        env["device"] = f"{_cpu_name()} ({os.cpu_count()} cores)"
    elif backend == "cuda":
        name, driver = _nvidia_smi()
        torch = sys.modules.get("torch")
        if name is None and torch is not None and torch.cuda.is_available():
            name = torch.cuda.get_device_name()
        env["device"], env["driver"] = name or "unknown CUDA device", driver
        if torch is not None:
            env["cuda"] = torch.version.cuda
        elif tv and "+cu" in tv:
            suffix = tv.split("+cu", 1)[1]
            env["cuda"] = f"{suffix[:-1]}.{suffix[-1]}" if suffix.isdigit() and len(suffix) >= 3 else suffix
    elif backend == "analytic":
        env["device"] = f"analytic model of {gpu or 'H200'}"
        env["torch"] = None  # the analytic model does not use torch
        env["cost_model"] = cost_model_digest()
    else:
        raise ConfigError(f"field 'backend' = {backend!r} is unknown; allowed: analytic, cpu, cuda")
    return env


