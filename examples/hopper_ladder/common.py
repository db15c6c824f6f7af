"""What the ladder's steps share: run a step's kernel on f16 matrices on the GPU (when one is
present) or on the CPU emulator, check it against numpy in float64, and on the GPU time it.

Every step computes C (M x N, f32) = A (M x K, row-major) @ B (K x N, row-major) with f16
operands. Run a step as a script (python step5_pipeline.py --m 256 --n 256 --k 512), or
import its kernel.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))   # examples/: example_util (it puts the checkout's tilegen first)
from example_util import Runner, padded, pick_device, report, seed, size  # noqa: E402

import tilegen  # noqa: E402

TARGET = "sm_90a"


def arguments(m=256, n=512, k=512):
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=size, default=m)
    parser.add_argument("--n", type=size, default=n)
    parser.add_argument("--k", type=size, default=k)
    parser.add_argument("--device", choices=("auto", "gpu", "sim"), default="auto")
    parser.add_argument("--seed", type=seed, default=0)
    return parser.parse_args()


def error_bound(K: int, out=np.float32) -> float:
    """Relative to max |A| |B|: f16 inputs are exact in f32; the f32 accumulation of K terms;
    an f16 C rounds once more (2^-11 of |C| <= |A| |B|)."""
    return K * 2.0 ** -23 + 2.0 ** -20 + (2.0 ** -11 if np.dtype(out) == np.float16 else 0.0)


def check(kernel, M: int, N: int, K: int, device: str = "auto", seed: int = 0, time: bool = False, out=np.float32):
    """(relative error, bound, ms per launch or None) of kernel on random N(0, 1) f16 inputs;
    C is f32, or `out` (np.float16) for a step that stores f16."""
    device = pick_device(device)
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    C = np.full((M, N), np.nan, out)                       # poisoned: an element never stored stays NaN
    kernel(A, B, C, device="sim" if device == "sim" else None)   # the arrays by the names the kernel declared
    ref = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    got = C.astype(np.float64)
    err = float(np.max(np.abs(got - ref) / np.maximum(scale, 1e-30))) if np.all(np.isfinite(got)) else float("inf")
    ms = time_ms(kernel, A, B, out) if time and device == "gpu" else None
    return err, error_bound(K, out), ms


def time_ms(kernel, A, B, out) -> float:
    """Mean time of one launch on the GPU, the operands in device memory (rows padded to 16 bytes)
    and every parameter given by name (kernel.launch: no host arrays in the timed loop)."""
    (a, lda), (b, ldb) = padded(A), padded(B)
    c, ldc = padded(np.zeros((A.shape[0], B.shape[1]), out))
    run = Runner("gpu")
    M, K = A.shape
    N = B.shape[1]
    args = {"M": M, "N": N, "K": K, "A_ptr": run.put(a), "A_ld": lda, "B_ptr": run.put(b), "B_ld": ldb,
            "C_ptr": run.put(c), "C_ld": ldc}
    return run.time_ms(kernel, args, {"M": M, "N": N, "K": K})


def main(step: str, kernel_fn, most=None, sizes=(256, 512, 512), out=np.float32, **constants):
    """Run a step from the command line (default sizes `sizes`); `most` (M, N, K) bounds a
    kernel that computes one tile (K 0: any K)."""
    args = arguments(*sizes)
    if most is not None and (args.m > most[0] or args.n > most[1] or (most[2] and args.k > most[2])):
        raise SystemExit(f"{step} computes one {most[0]} x {most[1]} block of C"
                         + (f" from one k-tile of {most[2]}" if most[2] else "")
                         + f": --m at most {most[0]}, --n at most {most[1]}" + (f", --k at most {most[2]}" if most[2] else ""))
    device = pick_device(args.device, (args.m, args.n, args.k))
    kernel = tilegen.compile(kernel_fn, target=TARGET, **constants)
    err, bound, ms = check(kernel, args.m, args.n, args.k, device, args.seed, time=True, out=out)
    extra = f", {2.0 * args.m * args.n * args.k / ms / 1e9:.1f} TFLOP/s" if ms else ""
    return report(f"{step}: {args.m}x{args.n}x{args.k} on the {'GPU' if device == 'gpu' else 'emulator'}",
                  err, bound, extra)
