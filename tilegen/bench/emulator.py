"""Time the emulator on one GEMM (a benchmark, not a test).

    python3 -m tilegen.bench.emulator                    # 128x128x64 tf32, GemmSpec(dtype="tf32")
    python3 -m tilegen.bench.emulator --dtype f16 --shape 256 256 128 --profile

"first run" includes parsing the PTX and decoding it into closures (the parse is cached
per PTX text, the decoded closures per launch shape); "warm run" repeats the call.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ..arch.dtypes import numpy_dtype
from ..frontend import compile as tg_compile
from ..gemm import GemmSpec
from ..sim import EMULATOR_SM_COUNT, parse_ptx
from ..sim.parser import grammar_parser


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tilegen.bench.emulator", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="tf32")
    ap.add_argument("--shape", type=int, nargs=3, default=(128, 128, 64), metavar=("M", "N", "K"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print the hottest functions of a warm run")
    args = ap.parse_args(argv)

    spec = GemmSpec(dtype=args.dtype)
    t0 = time.perf_counter()
    kernel = tg_compile(spec)
    t_compile = time.perf_counter() - t0
    M, N, K = args.shape
    rng = np.random.default_rng(0)
    nd = numpy_dtype(spec.dtype)
    A, B = rng.standard_normal((M, K)).astype(nd), rng.standard_normal((K, N)).astype(nd)

    t0 = time.perf_counter()
    grammar_parser()                                   # the grammar, built once per process
    t_grammar = time.perf_counter() - t0
    parse_ptx.cache_clear()
    t0 = time.perf_counter()
    parse_ptx(kernel.ptx)
    t_parse = time.perf_counter() - t0
    parse_ptx.cache_clear()
    t0 = time.perf_counter()
    C = kernel(A, B, device="sim")
    t_first = time.perf_counter() - t0
    warm = []
    for _ in range(max(args.repeat, 1)):
        t0 = time.perf_counter()
        kernel(A, B, device="sim")
        warm.append(time.perf_counter() - t0)
    err = float(np.abs(C - A.astype(np.float64) @ B.astype(np.float64)).max())

    print(f"kernel     {kernel.name} ({kernel.threads} threads, {len(kernel.ptx.splitlines())} PTX lines)")
    print(f"problem    {M}x{N}x{K} {spec.dtype}, grid {kernel.grid({'M': M, 'N': N, 'K': K}, EMULATOR_SM_COUNT)}")
    print(f"compile    {t_compile:.3f} s (tilegen, not the emulator)")
    print(f"grammar    {t_grammar:.3f} s (lark, once per process)")
    print(f"parse      {t_parse:.3f} s")
    print(f"first run  {t_first:.3f} s (parse + decode + run)")
    print(f"warm run   {min(warm):.3f} s (best of {len(warm)})")
    print(f"max |error| vs float64: {err:.3g}")
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(kernel, A, B, device="sim")
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
