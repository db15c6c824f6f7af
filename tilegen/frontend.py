"""tilegen.compile: one entry point for every way of describing a kernel.

| given                                  | compiled by                                   |
| -------------------------------------- | --------------------------------------------- |
| a GemmSpec                             | tilegen.gemm.compile_gemm (memo, disk cache)   |
| .tg text, or a path to a .tg file      | parsed to a GemmSpec, then as above           |
| an @tilegen.kernel function            | traced with the constants given, then built   |
"""
from __future__ import annotations

import os

from .compiler import Kernel, build
from .dsl.kernel import KernelFunction
from .errors import TilegenError
from .gemm import GemmSpec, compile_gemm, parse_spec_text


def compile(x, **constants) -> Kernel:  # noqa: A001  (the public name users expect)
    """Compile a GemmSpec, .tg text (or a path to a .tg file) or a DSL kernel into a Kernel
    (PTX now, GPU module at first launch)."""
    if isinstance(x, (str, os.PathLike)):
        x = parse_spec_text(x)
    if isinstance(x, GemmSpec):
        if constants:
            raise TilegenError(f"compile(GemmSpec) takes no other arguments, got {', '.join(constants)}")
        return compile_gemm(x)
    if isinstance(x, KernelFunction):
        return build(x.trace(**constants))
    raise TilegenError(f"tilegen.compile takes a GemmSpec, .tg text or an @tilegen.kernel function, "
                       f"not {type(x).__name__}")


__all__ = ["compile"]
