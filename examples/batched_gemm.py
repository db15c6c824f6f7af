"""Strided batched GEMM written in the tilegen DSL: C[b] = A[b] @ B[b] for b < BATCH.

A (BATCH x M x K) and B (BATCH x K x N) are f16 or bf16, row-major, matrix b starting
b * <name>_batch_stride elements after matrix 0; C (BATCH x M x N) is f32. Grid: x walks
the BM x BN blocks of one C[b], y walks the batch (program_id("y") picks the matrices:
A.batch(b) is a 2-D view whose base pointer moves by b * stride, one mad.wide.u32).

The main loop is the classic multistage pipeline: cp.async fills `stages` shared buffers
(zero-filled past the edges, so ragged M, N, K need no special case), each k-tile waits for
its copies and a barrier, prefetches the tile `stages - 1` ahead, then runs ldmatrix + mma;
the store is predicated on the matrix's bounds.

    python examples/batched_gemm.py                          # GPU if present, else the emulator
    python examples/batched_gemm.py --device sim --batch 3 --m 40 --n 33 --k 50
"""
from __future__ import annotations

import argparse
import numbers
import sys

import numpy as np
from example_util import (Runner, device_arguments, device_for, numpy_dtype, padded, pick_device,  # first: sys.path
                          report, size)

import tilegen
import tilegen.dsl as tg


def _swizzle(row_bytes: int) -> str:
    return "128B" if row_bytes % 128 == 0 else "64B" if row_bytes % 64 == 0 else "32B"


@tg.kernel
def batched_gemm(dtype="f16", block=(128, 128, 32), warps=(2, 2), stages=3):
    BM, BN, BK = block
    if not (isinstance(stages, numbers.Integral) and not isinstance(stages, bool) and stages >= 2):
        # (one stage in use while the next is copied)
        raise ValueError(f"stages={stages!r}; allowed: a whole number, 2 or more")
    WM, WN = BM // warps[0], BN // warps[1]
    S = stages
    atom = f"m16n8k16.{dtype}.f32"
    tg.launch(threads=32 * warps[0] * warps[1],
              grid=(tg.cdiv("M", BM) * tg.cdiv("N", BN), "BATCH", 1))

    A = tg.batched_tensor("A", dtype, ("M", "K"))
    B = tg.batched_tensor("B", dtype, ("K", "N"))
    C = tg.batched_tensor("C", "f32", ("M", "N"))
    M, K = A.shape
    N = B.shape[1]

    b = tg.program_id("y")
    A, B, C = A.batch(b), B.batch(b), C.batch(b)
    pid = tg.program_id("x")
    blocks_n = tg.cdiv(N, BN)
    m0 = (pid // blocks_n) * BM
    n0 = (pid % blocks_n) * BN

    sA = tg.shared("sA", dtype, BM, BK, stages=S, swizzle=_swizzle(2 * BK))
    sB = tg.shared("sB", dtype, BK, BN, stages=S, swizzle=_swizzle(2 * BN))
    warp = tg.warp_id()
    wm = (warp % warps[0]) * WM           # warps M-fastest
    wn = (warp // warps[0]) * WN
    acc = tg.fragment(atom, "C", (WM // 16, WN // 8), name="acc")
    a = tg.fragment(atom, "A", (WM // 16, 1), name="a")
    bf = tg.fragment(atom, "B", (1, WN // 8), name="b")

    def copy_tile(kt, stage):
        tg.copy_async(sA[stage], A.block(m0, kt * BK), comment="A tile")
        tg.copy_async(sB[stage], B.block(kt * BK, n0), comment="B tile")
        tg.commit()

    for s in range(S - 1):  # prologue: tiles 0 .. S-2 (past K they arrive as zeros)
        copy_tile(s, s)
    for kt in tg.range(0, tg.cdiv(K, BK)):
        tg.wait(S - 2)      # tile kt has landed for this thread ...
        tg.barrier()        # ... and for all; every warp is done with tile kt - 1
        copy_tile(kt + (S - 1), (kt + (S - 1)) % S)   # refill the stage tile kt - 1 used
        for kk in range(BK // 16):
            tg.load(a, sA[kt % S], wm, kk * 16)
            tg.load(bf, sB[kt % S], kk * 16, wn)
            tg.mma(acc, a, bf)
    tg.wait(0)
    tg.store(C.block(m0 + wm, n0 + wn), acc)


# -- host side --------------------------------------------------------------------------------
def batched_matmul(A, B, *, device="auto", kernel=None, time=False, **kernel_options):
    """C[b] = A[b] @ B[b] for numpy arrays A (BATCH, M, K), B (BATCH, K, N) of float16 or
    bfloat16; C is float32. Returns C, or (C, milliseconds per launch) with time=True (GPU only).
    device: "auto" (the GPU when present, else the CPU emulator), "gpu" or "sim"."""
    A, B = np.asarray(A), np.asarray(B)
    where = device_for(device)
    if time and where != "gpu":
        raise ValueError("time=True times launches on the GPU; this call runs on the CPU emulator")
    if A.ndim != 3 or B.ndim != 3 or A.shape[0] != B.shape[0] or A.shape[2] != B.shape[1]:
        raise ValueError(f"A (BATCH, M, K) and B (BATCH, K, N) expected; got {A.shape} and {B.shape}")
    dtype = {np.dtype(numpy_dtype("f16")): "f16", np.dtype(numpy_dtype("bf16")): "bf16"}.get(A.dtype)
    if dtype is None or B.dtype != A.dtype:
        raise ValueError(f"A and B must both be float16 or bfloat16, got {A.dtype} and {B.dtype}")
    batch, M, K = A.shape
    N = B.shape[2]
    C = np.zeros((batch, M, N), np.float32)
    if C.size == 0 or K == 0:   # (no products, or sums of none: zeros, as numpy gives)
        return (C, 0.0) if time else C
    kernel = kernel or tilegen.compile(batched_gemm, dtype=dtype, **kernel_options)
    for name, x in (("A", A), ("B", B), ("C", C)):   # (one matrix as the kernel sees it: rows padded to 16 bytes)
        if x.shape[1] * -(-x.shape[2] * x.itemsize // 16) * 16 >= 2 ** 32:
            raise ValueError(f"one matrix of {name} is 4 GB or more: batch strides are 32-bit byte counts")
    C[...] = np.nan   # poisoned: an element the kernel never writes stays NaN
    # the arrays by the names the kernel declared; numpy is copied to the GPU (rows padded for
    # cp.async) and C copied back, or run on the CPU emulator
    kernel(A, B, C, device="sim" if where == "sim" else None)
    if time:
        return C, time_launch(kernel, A, B, C, where)
    return C


def time_launch(kernel, A, B, C, where: str) -> float:
    """Milliseconds per launch on the GPU with the operands already there (kernel.launch from
    device pointers: no copies in the timed loop)."""
    runner = Runner(where)
    (batch, M, K), N = A.shape, B.shape[2]
    a, lda = padded(A)
    b, ldb = padded(B)
    args = {"M": M, "N": N, "K": K,
            "A_ptr": runner.put(a), "A_ld": lda, "A_batch_stride": M * lda,
            "B_ptr": runner.put(b), "B_ld": ldb, "B_batch_stride": K * ldb,
            "C_ptr": runner.poisoned(C.shape, np.float32), "C_ld": N, "C_batch_stride": M * N}
    return runner.time_ms(kernel, args, {"M": M, "N": N, "K": K, "BATCH": batch})


def error(C, A, B, matmul=np.matmul) -> float:
    """||C - ref|| / || |A| @ |B| || against the float64 product (tests/bounds.py's measure).
    `matmul` multiplies float64 arrays (the GPU tests pass one running on torch)."""
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    ref = matmul(A64, B64)
    denom = np.linalg.norm(matmul(np.abs(A64), np.abs(B64)))
    return float(np.linalg.norm(C.astype(np.float64) - ref) / denom) if denom else float(np.abs(C).max())


def error_limit(K: int) -> float:
    """The inputs are exact in the reference, so only the f32 sums err: at worst K roundings
    of 2^-24 each, plus the f32 result's own; twice that."""
    return 2 * (max(K, 1) + 1) * 2.0 ** -24


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    device_arguments(ap)
    ap.add_argument("--batch", type=size, default=None, help="default 16 on the GPU, 3 emulated")
    ap.add_argument("--m", type=size, default=None, help="default 1024 on the GPU, 40 emulated")
    ap.add_argument("--n", type=size, default=None, help="default 1024 on the GPU, 33 emulated")
    ap.add_argument("--k", type=size, default=None, help="default 1024 on the GPU, 50 emulated")
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    args = ap.parse_args(argv)
    device = pick_device(args.device, (args.batch or 3) * (args.m or 40) * (args.n or 33) * (args.k or 50))
    gpu = device == "gpu"
    batch = args.batch or (16 if gpu else 3)
    M, N, K = (x or (1024 if gpu else d) for x, d in ((args.m, 40), (args.n, 33), (args.k, 50)))
    rng = np.random.default_rng(args.seed)
    nd = numpy_dtype(args.dtype)
    A = rng.standard_normal((batch, M, K)).astype(nd)
    B = rng.standard_normal((batch, K, N)).astype(nd)
    result = batched_matmul(A, B, device=device, time=gpu)
    C, ms = result if gpu else (result, None)
    extra = f", {ms:.3f} ms, {2 * batch * M * N * K / ms / 1e9:.1f} TFLOP/s" if ms else ""
    what = f"batched GEMM {args.dtype} {batch} x ({M} x {N} x {K}) on {device}"
    return report(what, error(C, A, B), error_limit(K), extra)


if __name__ == "__main__":
    sys.exit(main())
