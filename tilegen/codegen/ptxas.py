"""ptxas, when present: assemble emitted PTX offline to check it and read its resources.

Looked up on PATH, then in the CUDA wheel (`pip install nvidia-cuda-nvcc`), then
$TILEGEN_PTXAS. tilegen never needs it to run kernels (the driver JIT-compiles PTX).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Optional


def find_ptxas() -> Optional[str]:
    env = os.environ.get("TILEGEN_PTXAS")
    if env and os.path.isfile(env):
        return env
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cuda_nvcc", "cu12"):
            path = os.path.join(root, sub, "bin", "ptxas")
            if os.path.isfile(path):
                return path
    return None


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel."""
    arch: str
    registers: int
    shared_static: int
    shared_dynamic: int
    stack_frame: int
    spill_stores: int
    spill_loads: int

    def __str__(self) -> str:
        return (f"{self.arch}: {self.registers} registers, {self.shared_static} B static + "
                f"{self.shared_dynamic} B dynamic shared memory, {self.stack_frame} B stack, "
                f"{self.spill_stores} B spill stores, {self.spill_loads} B spill loads")


class PtxasError(RuntimeError):
    pass


def assemble(ptx: str, arch: str, extra=()) -> str:
    """Run ptxas -v on `ptx`; return its report, or raise PtxasError with its message."""
    exe = find_ptxas()
    if exe is None:
        raise PtxasError("ptxas not found (install the CUDA toolkit or `pip install nvidia-cuda-nvcc`)")
    with tempfile.TemporaryDirectory(prefix="tilegen-") as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        p = subprocess.run([exe, f"-arch={arch}", "-v", *extra, "-o", os.path.join(tmp, "k.cubin"), src],
                           capture_output=True, text=True)
    if p.returncode:
        raise PtxasError(f"ptxas -arch={arch} failed:\n{p.stderr.strip()}")
    return p.stderr


def resources(ptx: str, arch: str, dynamic_smem: int = 0) -> Resources:
    report = assemble(ptx, arch)

    def num(pattern, default=0):
        m = re.search(pattern, report)
        return int(m.group(1)) if m else default

    return Resources(
        arch=arch,
        registers=num(r"Used (\d+) registers"),
        shared_static=num(r"(\d+) bytes smem"),
        shared_dynamic=dynamic_smem,
        stack_frame=num(r"(\d+) bytes stack frame"),
        spill_stores=num(r"(\d+) bytes spill stores"),
        spill_loads=num(r"(\d+) bytes spill loads"),
    )
