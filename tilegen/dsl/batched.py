"""Batched tensors: a stack of equally shaped matrices, matrix b starting b * batch_stride
elements after matrix 0 (strided batched GEMM, attention heads).

    A = tg.batched_tensor("A", "f16", ("M", "K"))   # parameters A_ptr, A_ld, A_batch_stride
    a = A.batch(tg.program_id("y"))                  # a 2-D tensor view of matrix b

The view's base pointer is A_ptr + b * A_batch_stride * element size, one mad.wide.u32
(the byte stride must stay below 4 GiB; the product is 64-bit). Rows, columns and the row
pitch are those of every matrix in the stack.
"""
from __future__ import annotations

import dataclasses

from .objects import Tensor
from .primitives import declare_param, tensor
from .scalars import raw, wrap
from .trace import current, fail


class BatchedTensor:
    """What batched_tensor returns: take one matrix with .batch(b)."""

    def __init__(self, base: Tensor, stride_bytes):
        self._base = base
        self._stride_bytes = stride_bytes

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

    def batch(self, b) -> Tensor:
        """Matrix b of the stack (b: a kernel Int such as tilegen.program_id("y"), or an int)."""
        b = wrap(b)
        ptr = current().builder.wide_mad(raw(b), self._stride_bytes, self._base.ir.ptr)
        return Tensor(dataclasses.replace(self._base.ir, ptr=ptr), self._base.shape)

    def block(self, row, col):
        fail(f"{self.name} is batched: take one matrix with {self.name}.batch(b) first, "
             f"then {self.name}_b.block(row, col)")


def batched_tensor(name: str, dtype: str, shape: tuple, layout: str = "row") -> BatchedTensor:
    """Declare a stack of matrices: like tilegen.tensor (shape names the logical (rows, cols)
    size symbols, layout "row" or "col"), plus the parameter `<name>_batch_stride`, the
    distance in elements between consecutive matrices."""
    if not isinstance(name, str) or not name.isidentifier():
        fail(f"batched_tensor: name must be an identifier, got {name!r}")
    base = tensor(name, dtype, shape, layout)
    stride = declare_param(f"{name}_batch_stride", "u32")
    stride_bytes = current().builder.mul(stride, base.dtype.bytes)
    return BatchedTensor(base, stride_bytes)


__all__ = ["BatchedTensor", "batched_tensor"]
