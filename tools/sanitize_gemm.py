"""Run a few ragged GEMMs for compute-sanitizer (memcheck / racecheck); exits non-zero on a
wrong result. Usage: compute-sanitizer --tool memcheck python3 tools/sanitize_gemm.py"""
import sys

import numpy as np

import tilegen
from tilegen.arch.dtypes import numpy_dtype

CASES = [("f16", "row", "col", (133, 70, 45)), ("tf32", "col", "row", (67, 201, 99)),
         ("bf16", "col", "col", (129, 255, 70)), ("f32", "row", "row", (77, 90, 130))]


def main() -> int:
    rng = np.random.default_rng(11)
    bad = 0
    for dtype, la, lb, (M, N, K) in CASES:
        kernel = tilegen.compile(tilegen.GemmSpec(dtype=dtype, a_layout=la, b_layout=lb, tile=(64, 64, 32)))
        A = rng.standard_normal((M, K)).astype(numpy_dtype(dtype))
        B = rng.standard_normal((K, N)).astype(numpy_dtype(dtype))
        C = kernel(A, B, out=np.full((M, N), np.nan, np.float32))
        ref = A.astype(np.float64) @ B.astype(np.float64)
        if dtype == "bf16":  # the fused epilogue too: bias per column, GELU, residual
            fused = tilegen.compile(tilegen.GemmSpec(dtype=dtype, a_layout=la, b_layout=lb, tile=(64, 64, 32),
                                                     epilogue=tilegen.Epilogue("col", "gelu_erf", True)))
            bias, res = rng.standard_normal(N).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
            F = fused(A, B, bias=bias, residual=res)
            ok_fused = np.isfinite(F).all()
            bad += not ok_fused
            print(f"{dtype} fused epilogue {M}x{N}x{K}: {'ok' if ok_fused else 'WRONG'}")
        rel = np.linalg.norm(C - ref) / np.linalg.norm(ref)
        ok = np.isfinite(C).all() and rel < 2e-3
        bad += not ok
        print(f"{dtype} {la}/{lb} {M}x{N}x{K}: rel {rel:.2e} {'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
