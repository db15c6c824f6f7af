"""What a kernel takes for each of its memory parameters, as data: the table a call of the
kernel on arrays reads (compiler/call.py), and the launch's check of leading dimensions.

One ArrayParam per array the kernel declared, in declaration order, naming the parameters
that describe it and what the array must be:

| kind     | the array                                | its parameters                         |
| -------- | ---------------------------------------- | -------------------------------------- |
| matrix   | 2-D, logical rows x cols                 | ptr, ld, the stored rows' and columns' |
|          |                                          | size symbols                           |
| stack    | 3-D: count x (a matrix as above)         | also stride (elements between matrices)|
|          |                                          | and the count's size symbol            |
| vector   | 1-D, `length` elements                   | ptr, the length's size symbol          |
| counters | 1-D u32, zero before the launch          | ptr                                    |
| scalar   | one f32                                  | ptr                                    |

`align` is what the kernel's copies need of a matrix (its address, row pitch and a stack's
stride in bytes): 16 where cp.async moves 16-byte chunks or TMA reads or writes it, 4 for a
transposing cp.async, 0 when its elements are read one by one. `written` says the kernel
stores into it.
"""
from __future__ import annotations

from typing import NamedTuple

from ..arch.tma import ADDRESS_ALIGN
from ..ir import tile as T
from ..ir.access import CHUNK, TRANSPOSE_BYTES
from ..ir.instr import walk

KINDS = ("matrix", "stack", "vector", "counters", "scalar")


class ArrayParam(NamedTuple):
    name: str            # as declared (tg.tensor("A", ...) -> "A")
    kind: str            # KINDS
    dtype: str           # a tilegen dtype name; "u32" for counters, "f32" for a scalar
    ptr: str             # the pointer parameter
    ld: str = ""         # matrix, stack: the leading dimension's parameter
    rows: str = ""       # matrix, stack: the size symbol of the stored rows
    cols: str = ""       # matrix, stack: ... of the stored columns (contiguous)
    logical: str = "row"  # "row": logical (r, c) is stored (r, c); "col": stored (c, r)
    stride: str = ""     # stack: the parameter of the elements between matrices
    count: str = ""      # stack: the size symbol of the number of matrices
    length: str = ""     # vector: the size symbol of its length
    align: int = 0       # bytes (see above)
    written: bool = False

    @property
    def shape(self) -> tuple:
        """The size symbols of the array's shape as a caller passes it (logical order)."""
        if self.kind in ("matrix", "stack"):
            logical = (self.rows, self.cols) if self.logical == "row" else (self.cols, self.rows)
            return ((self.count,) if self.kind == "stack" else ()) + logical
        return (self.length,) if self.kind == "vector" else ()

    def __repr__(self) -> str:   # (what a caller passes first: the shape in the order given)
        params = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("ptr", "ld", "stride") if getattr(self, k))
        return (f"ArrayParam({self.name!r}, {self.kind}, {self.dtype}, shape={self.shape}, layout={self.logical!r}, "
                f"align={self.align}, written={self.written}; {params})")

    def to_data(self) -> list:
        return list(self)

    @classmethod
    def from_data(cls, data) -> "ArrayParam":
        entry = cls(*data)
        if entry.kind not in KINDS:
            raise ValueError(f"array kind {entry.kind!r}")
        return entry


def _uses(kernel) -> tuple[dict, set]:
    """(tensor name -> the alignment its copies need, names of tensors stored into)."""
    align, written = {}, set()

    def need(tensor, n):
        align[tensor.name] = max(align.get(tensor.name, 0), n)

    for tmap in kernel.tensor_maps:
        need(tmap.tensor, ADDRESS_ALIGN)
    for op in walk(kernel.body):
        if isinstance(op, T.CopyAsync):
            need(op.src, TRANSPOSE_BYTES if op.transpose else CHUNK)
        elif isinstance(op, (T.StoreFragment, T.StoreRowVector)):
            written.add(op.dst.name)
        elif isinstance(op, T.TmaStore):
            written.add(op.tmap.tensor.name)
    return align, written


def array_params(kernel) -> tuple:
    """The ArrayParams of a tile-level KernelIR (its ops tell the alignment and the writes)."""
    name_of = {id(p.value): p.name for p in kernel.params}
    name_of.update({id(p.global_value): p.name for p in kernel.params if p.global_value is not None})
    align, written = _uses(kernel)
    out = []
    for decl in kernel.arrays:
        ptr = name_of[id(decl.ptr)]
        if decl.kind in ("matrix", "stack"):
            t = decl.tensor
            stack = (name_of[id(decl.stride)], decl.count) if decl.kind == "stack" else ("", "")
            out.append(ArrayParam(decl.name, decl.kind, t.dtype.name, ptr, name_of[id(t.ld)], name_of[id(t.rows)],
                                  name_of[id(t.cols)], t.logical, *stack, align=align.get(t.name, 0),
                                  written=t.name in written))
        elif decl.kind == "vector":
            v = decl.vector
            out.append(ArrayParam(decl.name, "vector", v.dtype.name, ptr, length=name_of[id(v.length)]))
        elif decl.kind == "counters":
            out.append(ArrayParam(decl.name, "counters", "u32", ptr, written=True))
        else:
            out.append(ArrayParam(decl.name, "scalar", "f32", ptr))
    return tuple(out)


__all__ = ["ArrayParam", "array_params", "KINDS"]
