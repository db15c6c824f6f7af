"""A GEMM fused with a row-wise softmax, written in the tilegen DSL:

    C = softmax(A @ B * scale, axis=1)        A: M x K, B: K x N (f16 or bf16), C: M x N f32

Each CTA owns BM rows and all N columns (N up to BN = 64, 128 or 256, the smallest that
holds N), so a row never leaves the CTA: its warps are stacked along M, each owning WM
whole rows, and the softmax is a row max and a row sum inside each warp (a reduction over
the thread's registers, then over the 4 lanes of a quad with shfl.sync.bfly). Columns past
N (zero-filled by the copies) are masked to -inf before the max, so they add exp(-inf) = 0.
The main loop is the multistage cp.async pipeline of batched_gemm.py.

    python examples/gemm_softmax.py                    # GPU if present, else the emulator
    python examples/gemm_softmax.py --device sim --m 37 --n 100 --k 48
"""
from __future__ import annotations

import argparse
import math
import sys
import weakref

import numpy as np
from example_util import (Runner, device_arguments, device_for, numpy_dtype, padded, pick_device,  # first: sys.path
                          report, size)

import tilegen
import tilegen.dsl as tg

NEG_INF = float("-inf")
BLOCK_N = (64, 128, 256)   # the column tiles a CTA can hold: one of them must cover N


@tg.kernel
def gemm_softmax(dtype="f16", block_n=128, block_m=64, block_k=32, warps=4, stages=3):
    BM, BN, BK, S = block_m, block_n, block_k, stages
    WM = BM // warps
    atom = f"m16n8k16.{dtype}.f32"
    tg.launch(threads=32 * warps, grid=(tg.cdiv("M", BM), 1, 1))

    A = tg.tensor("A", dtype, ("M", "K"))
    B = tg.tensor("B", dtype, ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    scale = tg.scalar("scale")
    K = A.shape[1]
    N = B.shape[1]

    m0 = tg.program_id("x") * BM
    wm = tg.warp_id() * WM
    sA = tg.shared("sA", dtype, BM, BK, stages=S, swizzle="64B" if 2 * BK % 128 else "128B")
    sB = tg.shared("sB", dtype, BK, BN, stages=S)
    acc = tg.fragment(atom, "C", (WM // 16, BN // 8), name="acc")
    a = tg.fragment(atom, "A", (WM // 16, 1), name="a")
    b = tg.fragment(atom, "B", (1, BN // 8), name="b")

    def copy_tile(kt, stage):
        tg.copy_async(sA[stage], A.block(m0, kt * BK), comment="A tile")
        tg.copy_async(sB[stage], B.block(kt * BK, 0), comment="B tile: every column")
        tg.commit()

    for s in range(S - 1):
        copy_tile(s, s)
    for kt in tg.range(0, tg.cdiv(K, BK)):
        tg.wait(S - 2)
        tg.barrier()
        copy_tile(kt + (S - 1), (kt + (S - 1)) % S)
        for kk in range(BK // 16):
            tg.load(a, sA[kt % S], wm, kk * 16)
            tg.load(b, sB[kt % S], kk * 16, 0)
            tg.mma(acc, a, b)
    tg.wait(0)

    # The softmax, on the accumulator registers: each warp holds whole rows.
    logits = tg.mask(tg.scale(acc, scale), m0 + wm, 0, lambda r, c: c >= N, NEG_INF)
    p = tg.exp(tg.sub(logits, tg.row_max(logits)))
    tg.store(C.block(m0 + wm, 0), tg.div(p, tg.row_sum(p)))


# -- host side --------------------------------------------------------------------------------
def block_n_for(N: int) -> int:
    for bn in BLOCK_N:
        if N <= bn:
            return bn
    raise ValueError(f"gemm_softmax: N = {N} columns, but one CTA holds whole rows of at most "
                     f"{BLOCK_N[-1]} columns (the accumulator lives in registers); split the softmax "
                     f"(GEMM, then a separate softmax) for wider rows")


def compile_gemm_softmax(N: int, dtype: str = "f16"):
    """The kernel for rows of N columns (the smallest block_n that holds them)."""
    bn = block_n_for(N)
    kernel = tilegen.compile(gemm_softmax, dtype=dtype, block_n=bn)
    _MADE_FOR[kernel] = (dtype, bn)
    return kernel


_MADE_FOR = weakref.WeakKeyDictionary()   # kernel -> (dtype, block_n) compile_gemm_softmax made it for


def gemm_softmax_call(A, B, *, scale=None, device="auto", kernel=None, time=False):
    """softmax(A @ B * scale, axis=1) for numpy A (M, K), B (K, N) of float16 or bfloat16;
    scale defaults to 1/sqrt(K). Returns C (float32), or (C, ms per launch) with time=True (GPU
    only). device: "auto" (the GPU when present, else the CPU emulator), "gpu" or "sim"; kernel:
    one compile_gemm_softmax made (for rows at least this wide, of this dtype)."""
    A, B = np.asarray(A), np.asarray(B)
    where = device_for(device)
    if time and where != "gpu":
        raise ValueError("time=True times launches on the GPU; this call runs on the CPU emulator")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"A (M, K) and B (K, N) expected; got {A.shape} and {B.shape}")
    dtype = {np.dtype(numpy_dtype("f16")): "f16", np.dtype(numpy_dtype("bf16")): "bf16"}.get(A.dtype)
    if dtype is None or B.dtype != A.dtype:
        raise ValueError(f"A and B must both be float16 or bfloat16, got {A.dtype} and {B.dtype}")
    (M, K), N = A.shape, B.shape[1]
    block_n_for(N)   # (rows wider than a CTA holds are refused)
    scale = 1.0 / math.sqrt(max(K, 1)) if scale is None else float(scale)
    if kernel is not None:   # (a kernel of narrower rows normalises each row over part of it)
        made = _MADE_FOR.get(kernel)
        if made is None:
            raise ValueError("kernel= takes a kernel compile_gemm_softmax returned (it records the row width and "
                             "dtype the kernel holds)")
        if made[0] != dtype or made[1] < N:
            raise ValueError(f"kernel= holds rows of at most {made[1]} {made[0]} columns; these arguments have "
                             f"{N} {dtype} columns: compile_gemm_softmax({N}, {dtype!r})")
    if M == 0 or N == 0:
        return (np.zeros((M, N), np.float32), 0.0) if time else np.zeros((M, N), np.float32)
    if K == 0:   # (every logit 0: each row uniform)
        C = np.full((M, N), 1.0 / N, np.float32)
        return (C, 0.0) if time else C
    kernel = kernel or compile_gemm_softmax(N, dtype)
    C = np.full((M, N), np.nan, np.float32)   # poisoned: an element the kernel never writes stays NaN
    # the arrays by the names the kernel declared, the scalar by its name; numpy is copied to the
    # GPU (rows padded for cp.async) and C copied back, or run on the CPU emulator
    kernel(A, B, C, scale=scale, device="sim" if where == "sim" else None)
    if time:
        return C, time_launch(kernel, A, B, scale, where)
    return C


def time_launch(kernel, A, B, scale: float, where: str) -> float:
    """Milliseconds per launch on the GPU with the operands already there (kernel.launch from
    device pointers: no copies in the timed loop)."""
    runner = Runner(where)
    (M, K), N = A.shape, B.shape[1]
    a, lda = padded(A)
    b, ldb = padded(B)
    args = {"M": M, "N": N, "K": K, "scale": scale, "A_ptr": runner.put(a), "A_ld": lda,
            "B_ptr": runner.put(b), "B_ld": ldb, "C_ptr": runner.poisoned((M, N), np.float32), "C_ld": N}
    return runner.time_ms(kernel, args, {"M": M, "N": N, "K": K})


def reference(A, B, scale, matmul=np.matmul):
    s = matmul(A.astype(np.float64), B.astype(np.float64)) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def error(C, ref) -> float:
    """The largest relative error of an element: max |C - ref| / ref."""
    return float(np.max(np.abs(C.astype(np.float64) - ref) / ref))


def error_limit(A, B, scale, matmul=np.matmul) -> float:
    """Each logit carries the f32 sums' error, at most K * 2^-24 * (|A| @ |B|) * scale; a
    probability's relative error is its logit's error plus the max's (through exp and the
    normalising sum), plus ex2.approx, the log2(e) scaling and the rounded divide (a few
    2^-22). Twice that."""
    K = A.shape[1]
    if A.size == 0 or B.size == 0:
        return 0.0
    worst = float(np.max(matmul(np.abs(A.astype(np.float64)), np.abs(B.astype(np.float64)))))
    return 2 * (2 * scale * K * 2.0 ** -24 * worst + 8 * 2.0 ** -22)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].rstrip(":") + ".")
    device_arguments(ap)
    ap.add_argument("--m", type=size, default=None, help="rows (default 8192 on the GPU, 37 emulated)")
    ap.add_argument("--n", type=size, default=None, help=f"columns, at most {BLOCK_N[-1]} (default 256 / 100)")
    ap.add_argument("--k", type=size, default=None, help="default 1024 on the GPU, 48 emulated")
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    args = ap.parse_args(argv)
    device = pick_device(args.device, (args.m or 37, args.n or 100, args.k or 48))   # (the emulated defaults)
    gpu = device == "gpu"
    M, N, K = (x or (g if gpu else e) for x, g, e in ((args.m, 8192, 37), (args.n, 256, 100), (args.k, 1024, 48)))
    try:
        block_n_for(N)
    except ValueError as e:
        ap.error(str(e))
    rng = np.random.default_rng(args.seed)
    nd = numpy_dtype(args.dtype)
    A = rng.standard_normal((M, K)).astype(nd)
    B = rng.standard_normal((K, N)).astype(nd)
    scale = 1.0 / math.sqrt(K)
    result = gemm_softmax_call(A, B, scale=scale, device=device, time=gpu)
    C, ms = result if gpu else (result, None)
    extra = f", {ms:.3f} ms" if ms else ""
    what = f"GEMM + softmax {args.dtype} {M} x {N} x {K} on {device}"
    return report(what, error(C, reference(A, B, scale)), error_limit(A, B, scale), extra)


if __name__ == "__main__":
    sys.exit(main())
