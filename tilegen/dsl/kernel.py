"""@tilegen.kernel: a Python function of compile-time constants whose body, written with
tile primitives, is traced once into IR."""
from __future__ import annotations

import functools
import inspect

from ..arch.targets import TARGETS
from ..errors import DSLError
from ..ir.builder import Builder
from ..ir.module import KernelIR
from . import trace


class _Trace:
    def __init__(self, kernel: KernelIR):
        self.kernel = kernel
        self.builder = Builder(kernel.body)
        self._entry: list = []   # computed once at the kernel's entry, where every thread runs (warp_index)
        self._warp = None
        self.homes: dict = {}     # id(fragment) -> (fragment, open regions where made, user line): trace.made

    def warp_index(self):
        """tid / 32, computed once at the entry and passed through redux.sync.min: ptxas takes
        that as warp-uniform and keeps what derives from it (wgmma descriptors, stage
        addresses) in uniform registers instead of moving it there before every wgmma."""
        if self._warp is None:
            entry = Builder(self._entry)
            self._warp = entry.op("redux.sync.min.u32", "b32", entry.shr(entry.special("%tid.x", "tid"), 5),
                                  0xFFFFFFFF, hint="warp", comment="the warp index, warp-uniform")
        return self._warp

    def finish(self):
        """Put the entry's instructions first (launch() takes whole warps only, as redux.sync
        needs)."""
        self.kernel.body[0:0] = self._entry


class KernelFunction:
    """What @kernel returns: call `.trace(**constants)` (or tilegen.compile) to build IR."""

    def __init__(self, fn, name: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        functools.update_wrapper(self, fn)

    def trace(self, *, target: str = "sm_80", name: str | None = None, **constants) -> KernelIR:
        if target not in TARGETS:
            raise DSLError(f"{self.name}: target={target!r}; allowed: {', '.join(TARGETS)} (wgmma, TMA, mbarrier "
                           f"and clusters need sm_90a)")
        sig = inspect.signature(self.fn)
        try:
            sig.bind(**constants)
        except TypeError as e:
            raise DSLError(f"{self.name}: {e} (compile-time arguments: {', '.join(sig.parameters) or 'none'})") from None
        kernel = KernelIR(name=name or self.name, threads=128, target=target)
        tr = _Trace(kernel)
        trace.begin(tr)
        try:
            self.fn(**constants)
        finally:
            trace.end()
        tr.finish()
        if kernel.grid is None:
            raise DSLError(f"{self.name}: call tilegen.dsl.launch(threads=..., grid=...) in the kernel body")
        return kernel

    def __call__(self, *args, **kwargs):
        raise DSLError(f"{self.name} is a tilegen kernel: compile it with kernel = tilegen.compile({self.name}, ...) "
                       f"(compile-time constants by name) and call the result on arrays, kernel(A, B, ..., alpha=...) "
                       f"(device='sim': the CPU emulator), or launch it with kernel.launch(args, sizes)")


def kernel(fn=None, *, name: str | None = None):
    """Decorator: @tilegen.kernel or @tilegen.kernel(name="my_kernel")."""
    if fn is None:
        return lambda f: KernelFunction(f, name)
    return KernelFunction(fn, name)
