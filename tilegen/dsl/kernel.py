"""@tilegen.kernel: a Python function of compile-time constants whose body, written with
tile primitives, is traced once into IR."""
from __future__ import annotations

import functools
import inspect

from ..errors import DSLError
from ..ir.builder import Builder
from ..ir.module import KernelIR
from . import trace


class _Trace:
    def __init__(self, kernel: KernelIR):
        self.kernel = kernel
        self.builder = Builder(kernel.body)


class KernelFunction:
    """What @kernel returns: call `.trace(**constants)` (or tilegen.compile) to build IR."""

    def __init__(self, fn, name: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        functools.update_wrapper(self, fn)

    def trace(self, *, target: str = "sm_80", name: str | None = None, **constants) -> KernelIR:
        sig = inspect.signature(self.fn)
        try:
            sig.bind(**constants)
        except TypeError as e:
            raise DSLError(f"{self.name}: {e} (compile-time arguments: {', '.join(sig.parameters) or 'none'})") from None
        kernel = KernelIR(name=name or self.name, threads=128, target=target)
        trace.begin(_Trace(kernel))
        try:
            self.fn(**constants)
        finally:
            trace.end()
        if kernel.grid is None:
            raise DSLError(f"{self.name}: call tilegen.launch(threads=..., grid=...) in the kernel body")
        return kernel

    def __call__(self, *args, **kwargs):
        raise DSLError(f"{self.name} is a tilegen kernel: compile it with tilegen.compile({self.name}, ...) "
                       "and call the result on arrays")


def kernel(fn=None, *, name: str | None = None):
    """Decorator: @tilegen.kernel or @tilegen.kernel(name="my_kernel")."""
    if fn is None:
        return lambda f: KernelFunction(f, name)
    return KernelFunction(fn, name)
