"""tilegen.compile: the stages from a spec or DSL kernel to a loaded-on-demand Kernel.

| stage   | input                   | output                     |
| ------- | ----------------------- | -------------------------- |
| trace   | GemmSpec / @kernel fn   | tile-level KernelIR        |
| passes  | tile-level IR           | instruction-level IR       |
| codegen | instruction-level IR    | PTX text                   |
| load    | PTX (at first call)     | CUDA function (runtime)    |
"""
from __future__ import annotations

import os

from . import cache as _cache
from .codegen import emit_ptx
from .dsl.kernel import KernelFunction
from .errors import TilegenError
from .ir import print_ir, run_passes
from .ir.bank_report import bank_report
from .kernel import Kernel
from .spec import GemmSpec


def trace(x, **constants):
    """Stage 1: the tile-level IR of a spec or a DSL kernel."""
    if isinstance(x, GemmSpec):
        if constants:
            raise TilegenError(f"compile(GemmSpec) takes no other arguments, got {', '.join(constants)}")
        from .kernels.gemm import gemm, gemm_kernel_name

        return gemm.trace(spec=x, target=x.target, name=gemm_kernel_name(x)), x
    if isinstance(x, KernelFunction):
        return x.trace(**constants), None
    if isinstance(x, (str, os.PathLike)):  # .tg text, or a path to a .tg file
        from .textspec import parse_spec_text

        return trace(parse_spec_text(x), **constants)
    raise TilegenError(f"tilegen.compile takes a GemmSpec or an @tilegen.kernel function, not {type(x).__name__}")


def compile(x, **constants) -> Kernel:  # noqa: A001  (the public name users expect)
    """Compile a GemmSpec, .tg text (or a path to a .tg file) or a DSL kernel into a Kernel
    (PTX now, GPU module at first call)."""
    if isinstance(x, (str, os.PathLike)):  # .tg text, or a path to a .tg file
        from .textspec import parse_spec_text

        x = parse_spec_text(x)
    # -- disk cache (tilegen/cache.py): a GemmSpec compiled before is read back, untraced --
    if isinstance(x, GemmSpec) and not constants:
        cached = _cache.load_kernel(x)
        if cached is not None:
            return cached
    # -- end disk cache lookup --
    ir, spec = trace(x, **constants)
    texts = {}

    def keep_tile_level(name, kernel):
        if kernel.level == "tile":  # the last tile-level form, offsets assigned
            texts["tile"] = print_ir(kernel)
            texts["banks"] = bank_report(kernel)

    lowered = run_passes(ir, after=keep_tile_level)
    ptx = emit_ptx(lowered)
    kernel = Kernel(lowered, ptx, texts["tile"], spec, banks=texts["banks"])
    if spec is not None:  # disk cache (tilegen/cache.py): store the GEMM for the next process
        _cache.store_kernel(spec, kernel)
    return kernel
