"""A GEMM call on the emulator: tilegen.gemm_call's host path with the emulator's global
memory in place of the GPU (kept as an entry point for callers that name the emulator)."""
from __future__ import annotations


def run_gemm_sim(kernel, A, B, *, out=None, alpha=1.0, beta=0.0, bias=None, residual=None):
    from ..gemm_call import run_gemm

    return run_gemm(kernel, A, B, out=out, alpha=alpha, beta=beta, bias=bias, residual=residual, device="sim")
