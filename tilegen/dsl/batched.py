"""Batched tensors: a stack of equally shaped matrices, matrix b starting b * batch_stride
elements after matrix 0 (strided batched GEMM, attention heads).

    A = tg.batched_tensor("A", "f16", ("M", "K"))   # parameters A_ptr, A_ld, A_batch_stride
    a = A.batch(tg.program_id("y"))                  # a 2-D tensor view of matrix b

The view's base pointer is A_ptr + b * A_batch_stride * element size, one mad.wide.u32
(the byte stride must stay below 4 GiB; the product is 64-bit). Rows, columns and the row
pitch are those of every matrix in the stack.

TMA copies of a view's blocks (tma_load, tma_store) go through one 3-D tensor map of the
whole stack (columns, rows, matrices; its extent the `count` size, "BATCH"), so a box stops
at its matrix's edges: M, N and K need not be multiples of a tile. A stride of 0 (every
matrix is matrix 0: a broadcast operand) is a map of one matrix, read at index 0.
"""
from __future__ import annotations

import dataclasses

from ..ir import tile as T
from .objects import Tensor
from .primitives import declare_param, tensor
from .scalars import Int, raw, wrap
from .trace import current, fail


class BatchedTensor:
    """What batched_tensor returns: take one matrix with .batch(b)."""

    def __init__(self, base: Tensor, stride, stride_bytes, count, step):
        self._base = base
        self._stride = stride              # the parameter (elements)
        self._stride_bytes = stride_bytes
        self._count = count                # the size symbol of the matrices
        self._step = step                  # 0 for a broadcast (stride 0), else 1: the TMA index per matrix

    @property
    def name(self) -> str:
        return self._base.ir.name

    @property
    def shape(self) -> tuple:
        return self._base.shape

    @property
    def dtype(self):
        return self._base.dtype

    @property
    def layout(self) -> str:
        return self._base.layout

    @property
    def ir(self):
        """Matrix 0's description (its names and shape symbols are every matrix's)."""
        return self._base.ir

    def batch(self, b) -> Tensor:
        """Matrix b of the stack (b: a kernel Int such as tilegen.dsl.program_id("y"), or an int)."""
        b = wrap(b)
        ptr = current().builder.wide_mad(raw(b), self._stride_bytes, self._base.ir.ptr)
        batch = T.TensorBatch(self._base.ir, self._stride, self._count, raw(b * self._step))
        return Tensor(dataclasses.replace(self._base.ir, ptr=ptr, batch=batch), self._base.shape)

    def block(self, row, col):
        fail(f"{self.name} is batched: take one matrix with {self.name}.batch(b) first, "
             f"then {self.name}_b.block(row, col)")


def batched_tensor(name: str, dtype: str, shape: tuple, layout: str = "row", count: str = "BATCH") -> BatchedTensor:
    """Declare a stack of matrices: like tilegen.dsl.tensor (shape names the logical (rows, cols)
    size symbols, layout "row" or "col"), plus the parameter `<name>_batch_stride`, the
    distance in elements between consecutive matrices, and the size symbol `count`, the
    number of matrices (what a TMA map of the stack spans)."""
    if not isinstance(name, str) or not name.isidentifier():
        fail(f"batched_tensor: name must be an identifier, got {name!r}")
    base = tensor(name, dtype, shape, layout)
    if not isinstance(count, str) or not count.isidentifier():
        fail(f"batched_tensor: count={count!r}; allowed: a size name like 'BATCH'")
    stride = declare_param(f"{name}_batch_stride", "u32")
    decl = next(d for d in current().kernel.arrays if d.tensor is base.ir)   # (tensor()'s: a matrix of a stack)
    decl.kind, decl.stride, decl.count = "stack", stride, count
    builder = current().builder
    stride_bytes = builder.mul(stride, base.dtype.bytes)
    # (at the declaration, so that every view's coordinate can use it, whichever branch takes one)
    step = Int(builder.min(stride, 1))
    return BatchedTensor(base, stride, stride_bytes, count, step)


__all__ = ["BatchedTensor", "batched_tensor"]
