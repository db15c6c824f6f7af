"""What a result file records about where it was measured."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess

from .. import runtime
from ..arch.targets import target_for
from ..version import __version__

DEFAULT_L2_BYTES = 60 * 1024 * 1024  # H200; used when the driver does not say


def device_target(cc) -> str:
    """The tilegen target for a compute capability (arch.targets.target_for)."""
    return target_for(cc)


def l2_bytes(device: int = 0) -> int:
    try:
        n = runtime.device_info(device).l2_bytes
        return n if n > 0 else DEFAULT_L2_BYTES
    except Exception:  # noqa: BLE001
        return DEFAULT_L2_BYTES


def _run(cmd, cwd=None) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
        return p.stdout.strip() if p.returncode == 0 else ""
    except Exception:  # noqa: BLE001
        return ""


def git_commit() -> dict:
    """The tilegen checkout's commit and whether it had local changes ("" when not a checkout)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sha = _run(["git", "rev-parse", "HEAD"], cwd=root)
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)) if sha else None
    return {"commit": sha or None, "dirty": dirty}


def versions() -> dict:
    out = {"python": platform.python_version()}
    import numpy

    out["numpy"] = numpy.__version__

    out["tilegen"] = __version__
    for mod, attr in (("torch", "__version__"), ("triton", "__version__"), ("cupy", "__version__")):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, attr, "?")
        except Exception:  # noqa: BLE001  (absent or broken: recorded as None)
            out[mod] = None
    try:
        from importlib.metadata import version

        out["cuda-bindings"] = version("cuda-bindings")
    except Exception:  # noqa: BLE001
        out["cuda-bindings"] = None
    return out


def environment(device: int = 0) -> dict:
    """GPU, driver, versions, commit and date, for the head of a result file."""
    info = runtime.device_info(device)
    smi = _run(["nvidia-smi", f"--id={device}", "--query-gpu=driver_version", "--format=csv,noheader"])
    git = git_commit()
    return {
        "gpu": info.name,
        "compute_capability": f"{info.cc[0]}.{info.cc[1]}",
        "sm_count": info.sm_count,
        "l2_bytes": l2_bytes(device),
        "driver": smi or None,
        "cuda_driver_api": info.driver_version,
        "versions": versions(),
        "tilegen_commit": git["commit"],
        "tilegen_dirty": git["dirty"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
    }
