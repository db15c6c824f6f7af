"""The `tilegen` command line."""
from __future__ import annotations

import argparse
import sys


def _demo(args) -> int:
    """Compile the default GEMM, run it (GPU, else the CPU emulator) and check it against numpy."""
    import time

    import numpy as np

    from .arch.dtypes import numpy_dtype
    from .compiler import compile as compile_spec
    from .runtime import gpu_available
    from .spec import GemmSpec

    spec = GemmSpec(dtype=args.dtype)
    print(spec)
    atom = spec.mma
    print(f"\nmma atom {atom.name}: {atom.instruction}")
    for frag in (atom.a, atom.b, atom.c):
        print()
        print(frag.lane_grid())
    kernel = compile_spec(spec)
    print(f"\n{kernel.name}: {len(kernel.ptx.splitlines())} lines of PTX, {kernel.threads} threads, "
          f"{kernel.smem_bytes} bytes of shared memory")
    device = "gpu" if gpu_available() else "sim"
    M, N, K = (args.size,) * 3
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K)).astype(numpy_dtype(spec.dtype))
    B = rng.standard_normal((K, N)).astype(numpy_dtype(spec.dtype))
    start = time.perf_counter()
    C = kernel(A, B, device=device)
    seconds = time.perf_counter() - start
    ref = A.astype(np.float64) @ B.astype(np.float64)
    rel = float(np.linalg.norm(C - ref) / np.linalg.norm(ref))
    limit = 2e-3 if spec.dtype == "tf32" else 1e-4
    where = "GPU" if device == "gpu" else "CPU emulator"
    print(f"C = A @ B, {M}x{N}x{K}, on the {where} in {seconds:.2f} s: "
          f"relative error {rel:.2e} against numpy float64 ({'ok' if rel < limit else 'WRONG'})")
    return 0 if rel < limit else 1


def _bench(argv) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


def _verify_fragments(argv) -> int:
    from .verify.fragments import main as verify_main

    return verify_main(argv)


# Commands whose own parser takes the rest of the command line.
PASSTHROUGH = {"verify-fragments": _verify_fragments, "bench": _bench}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilegen", description="A Python kernel DSL that generates PTX.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="compile the default GEMM, run it on the GPU (or the CPU emulator) "
                                       "and check it against numpy")
    demo.add_argument("--dtype", default="f16", choices=["tf32", "f16", "bf16"], help="operand dtype (default f16)")
    demo.add_argument("--size", type=int, default=256, help="M = N = K of the check (default 256)")
    demo.set_defaults(run=_demo)
    sub.add_parser("bench", add_help=False, help="benchmark GEMMs against cuBLAS and Triton (GPU)")
    sub.add_parser("verify-fragments", add_help=False,
                   help="run probe kernels on the GPU and compare every lane's registers with the tables")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]](argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    from .errors import TilegenError

    try:
        return args.run(args)
    except TilegenError as e:
        print(f"tilegen: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
