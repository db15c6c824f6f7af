"""The stages from tile-level IR to a Kernel, and the kernels compiled so far.

| stage   | input                   | output                     | where                 |
| ------- | ----------------------- | -------------------------- | --------------------- |
| trace   | GemmSpec / @kernel fn   | tile-level KernelIR        | tilegen.gemm / dsl    |
| passes  | tile-level IR           | instruction-level IR       | tilegen.ir.passes     |
| codegen | instruction-level IR    | PTX text                   | tilegen.codegen       |
| load    | PTX (at first launch)   | CUDA function, Launcher    | tilegen.runtime       |

`build` runs passes and codegen on a traced kernel. `compile_spec` adds the memo and the
disk cache in front of it for front-ends whose kernels are described by a frozen spec: a
spec compiled before in this process is a dict lookup, one compiled in an earlier process
is read from disk (compiler/cache.py) without tracing.
"""
from __future__ import annotations

import threading

from ..arch.tma import TensorMapDecl
from ..codegen import emit_ptx
from ..ir import print_ir, run_passes
from ..ir.bank_report import bank_report
from . import cache
from .arrays import array_params
from .kernel import Kernel

_memo: dict = {}          # spec -> Kernel, this process
_memo_lock = threading.Lock()


def build(ir, spec=None, kernel_class=Kernel) -> Kernel:
    """Passes and codegen: a traced (tile-level) KernelIR into a Kernel."""
    texts = {}

    def keep_tile_level(name, kernel):
        if kernel.level == "tile":  # the last tile-level form, offsets assigned
            texts["tile"] = print_ir(kernel)
            texts["banks"] = bank_report(kernel)
            texts["arrays"] = array_params(kernel)

    lowered = run_passes(ir, after=keep_tile_level)
    return kernel_class(name=lowered.name, threads=lowered.threads, target=lowered.target,
                        smem_bytes=lowered.smem_bytes, params=[(p.name, p.type) for p in lowered.params],
                        grid=lowered.grid, ptx=emit_ptx(lowered), ir=texts["tile"],
                        instructions=lambda: print_ir(lowered), banks=texts["banks"], spec=spec,
                        tensor_maps=[tensor_map_decl(lowered, m) for m in lowered.tensor_maps],
                        barriers=[(b.name, b.offset, b.stages) for b in lowered.barriers],
                        arrays=texts["arrays"])


def tensor_map_decl(kernel, tmap) -> TensorMapDecl:
    """What the launch needs to build `tmap`: the parameters holding its tensor's pointer,
    stored extents and pitch."""
    t = tmap.tensor
    name_of = {id(p.value): p.name for p in kernel.params}
    name_of.update({id(p.global_value): p.name for p in kernel.params if p.global_value is not None})
    stack = () if tmap.batch is None else (name_of[id(tmap.batch.stride)], tmap.batch.count)
    return TensorMapDecl(tmap.name, t.name, t.dtype.name, t.dtype.bytes, name_of[id(t.ptr)], name_of[id(t.rows)],
                         name_of[id(t.cols)], name_of[id(t.ld)], tmap.box_rows, tmap.box_cols, tmap.swizzle, *stack)


def compile_spec(spec, trace, kernel_class=Kernel) -> Kernel:
    """The Kernel of a frozen, hashable spec whose `trace(spec)` gives its tile-level IR:
    from this process's memo, else the disk cache, else built (and stored)."""
    kernel = _memo.get(spec)
    if kernel is not None:
        return kernel
    kernel = cache.load_kernel(spec, kernel_class)
    if kernel is None:
        kernel = build(trace(spec), spec, kernel_class)
        cache.store_kernel(spec, kernel)
    with _memo_lock:
        return _memo.setdefault(spec, kernel)


def forget() -> None:
    """Empty this process's memo (the next compile_spec reads the disk cache or builds)."""
    with _memo_lock:
        _memo.clear()


__all__ = ["Kernel", "build", "compile_spec", "forget", "cache"]
