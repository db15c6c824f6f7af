"""ptxas, when present: assemble emitted PTX offline to check it and read its resources, and
assemble the kernels the driver's JIT spills (compiler/kernel.py hands assemble_cubin to the
runtime).

Looked up as $TILEGEN_PTXAS (a path; "off" never uses one), on PATH, in NVIDIA's CUDA wheels
(`pip install nvidia-cuda-nvcc`), then the copy Triton ships. tilegen never needs it to
run kernels (the driver JIT-compiles PTX).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from typing import Optional


OFF = ("0", "off", "none", "no")   # TILEGEN_PTXAS=off: tilegen uses no ptxas
TIMEOUT_S = 120   # one ptxas run (the largest kernels take about a second)


_WARNED: set = set()


def find_ptxas() -> Optional[str]:
    env = os.environ.get("TILEGEN_PTXAS")
    if env and env.lower() in OFF:
        return None
    if env and os.path.isfile(env):
        return env
    if env and env not in _WARNED:   # (a path that names nothing: said once, then the usual search)
        _WARNED.add(env)
        warnings.warn(f"TILEGEN_PTXAS={env!r} is not a file; looking for ptxas on PATH, in NVIDIA's CUDA wheels "
                      f"and in Triton instead (TILEGEN_PTXAS=off uses none)", stacklevel=2)
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cuda_nvcc", "cu12"):
            path = os.path.join(root, sub, "bin", "ptxas")
            if os.path.isfile(path):
                return path
    return _tritons_ptxas()


def _tritons_ptxas() -> Optional[str]:
    """The ptxas Triton ships for its own kernels (located, not imported)."""
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "backends", "nvidia", "bin", "ptxas")
        if os.path.isfile(path):
            return path
    return None


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel. jit_spill_stores: for a kernel whose warpgroups take
    registers with setmaxnreg, the spill stores where each thread gets only the launch's share,
    as the driver's JIT allots them (docs/perf_notes.md section 38); None without setmaxnreg."""
    arch: str
    registers: int
    shared_static: int
    shared_dynamic: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    jit_spill_stores: Optional[int] = None
    wgmma_serialized: Optional[str] = None   # why ptxas runs the kernel's wgmmas one at a time, or None

    def __str__(self) -> str:
        text = (f"{self.arch}: {self.registers} registers, {self.shared_static} B static + "
                f"{self.shared_dynamic} B dynamic shared memory, {self.stack_frame} B stack, "
                f"{self.spill_stores} B spill stores, {self.spill_loads} B spill loads")
        if self.jit_spill_stores is not None:
            text += (f"; with the launch's share of registers (the driver's JIT ignores setmaxnreg): "
                     f"{self.jit_spill_stores} B spill stores")
        if self.wgmma_serialized:
            text += f"; wgmmas serialized: {self.wgmma_serialized}"
        return text


class PtxasError(RuntimeError):
    pass


def assemble(ptx: str, arch: str, extra=()) -> str:
    """Run ptxas -v on `ptx`; return its report, or raise PtxasError with its message."""
    return _ptxas(ptx, arch, extra)[1]


def assemble_cubin(ptx: str, arch: str, exe: Optional[str] = None) -> tuple:
    """(cubin bytes, ptxas -v report) of `ptx` for `arch` (sm_90a, sm_86, ...) by `exe` (else
    the ptxas find_ptxas finds), or PtxasError."""
    return _ptxas(ptx, arch, exe=exe)


def _ptxas(ptx: str, arch: str, extra=(), exe: Optional[str] = None) -> tuple:
    exe = exe or find_ptxas()
    if exe is None:
        raise PtxasError("ptxas not found (install the CUDA toolkit or `pip install nvidia-cuda-nvcc`)")
    try:
        with tempfile.TemporaryDirectory(prefix="tilegen-") as tmp:
            src, out = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "k.cubin")
            with open(src, "w") as f:
                f.write(ptx)
            p = subprocess.run([exe, f"-arch={arch}", "-v", *extra, "-o", out, src], capture_output=True,
                               text=True, errors="replace", timeout=TIMEOUT_S)
            if p.returncode:
                raise PtxasError(f"ptxas -arch={arch} failed:\n{p.stderr.strip()}")
            with open(out, "rb") as f:
                return f.read(), p.stderr
    except (OSError, subprocess.SubprocessError) as e:   # not runnable, timed out, no room for its files
        raise PtxasError(f"ptxas -arch={arch} did not run: {e}") from None


def spill_stores(report: str) -> int:
    """Bytes of spill stores a ptxas -v report gives (the most of any function in it)."""
    return max((int(n) for n in re.findall(r"(\d+) bytes spill stores", report)), default=0)


def wgmma_serialized(report: str) -> Optional[str]:
    """Why ptxas serialized a kernel's wgmmas (each waits for the one before: its "Potential
    Performance Loss" notes, C7510-C7519), or None. Such a kernel runs its tensor cores a
    quarter below their pace or worse (docs/perf_notes.md section 47)."""
    m = re.search(r"\((C75\d\d)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized "
                  r"(due to .*?)(?: in the function '[^']*')?$", report, re.MULTILINE)
    return None if m is None else f"{m.group(2)} ({m.group(1)})"


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
        spill_stores=spill_stores(report),
        spill_loads=num(r"(\d+) bytes spill loads"),
        jit_spill_stores=_without_setmaxnreg(ptx, arch),
        wgmma_serialized=wgmma_serialized(report),
    )


def _without_setmaxnreg(ptx: str, arch: str) -> Optional[int]:
    """Spill stores of `ptx` assembled without its setmaxnreg (None where it has none)."""
    if "setmaxnreg" not in ptx:
        return None
    capped = "\n".join(line for line in ptx.split("\n") if "setmaxnreg" not in line)
    return spill_stores(assemble(capped, arch))
