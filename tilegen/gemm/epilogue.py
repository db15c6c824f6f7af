"""The GEMM epilogue: each warp's accumulator through the fused operations into C.

    C = act(alpha * acc + beta * C + bias) + residual

(the activation, the bias axis and the residual are the spec's Epilogue; alpha and beta are
launch arguments). A kernel that computes C^T = B^T A^T holds a block of C^T, stored
transposed.
"""
from __future__ import annotations

from .. import dsl as tg


def store_block(spec, C, acc, row, col, alpha, beta, bias, R):
    """Store the warp's accumulator at (row, col) of C through the spec's epilogue."""
    epi = spec.epilogue
    if spec.swaps_operands:
        C, R, row, col = C.T, (R.T if R is not None else None), col, row
    tg.store(C.block(row, col), acc, alpha=alpha, beta=beta, bias=bias, activation=epi.activation,
             residual=R.block(row, col) if R is not None else None)


__all__ = ["store_block"]
