"""The GEMM epilogue: each warp's accumulator through the fused operations into C.

    C = act(alpha * acc + beta * C + bias) + residual

(the activation, the bias axis and the residual are the spec's Epilogue; alpha and beta are
launch arguments). A kernel that computes C^T = B^T A^T holds a block of C^T, stored
transposed.
"""
from __future__ import annotations

from .. import dsl as tg


def store_block(spec, C, acc, row, col, alpha, beta, bias, R, scales=(None, None)):
    """Store the warp's accumulator at (row, col) of C through the spec's epilogue (scales: the
    per-row and per-column f32 vectors, or None)."""
    epi = spec.epilogue
    rows, cols = scales
    if spec.swaps_operands:   # the accumulator is a block of C^T: its rows are C's columns
        C, R, row, col, rows, cols = C.T, (R.T if R is not None else None), col, row, cols, rows
    tg.store(C.block(row, col), acc, alpha=alpha, beta=beta, bias=bias, activation=epi.activation,
             residual=R.block(row, col) if R is not None else None, row_scale=rows, col_scale=cols)


__all__ = ["store_block"]
