"""IEEE special values through a GEMM: inputs seeded with +-inf, NaN and exact zeros (so that
inf * 0 happens), the result compared with a float64 reference that follows numpy's rules,
cast to the output type (overflow to inf). Shared by the emulator tests and the GPU tests."""
import math

import numpy as np

from bounds import gemm_bound
from tilegen.arch.dtypes import numpy_dtype

ACT = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "gelu_erf": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
}
SPECIALS = (np.inf, -np.inf, np.nan)


def operands(spec, M, N, K, rng, n_specials):
    """A (M x K) and B (K x N) in the spec's operand type and layouts, N(0,1) values with
    `n_specials` specials each, a zero row of B and a zero column of A (inf * 0)."""
    host = np.float32 if spec.dtype in ("tf32", "f32") else numpy_dtype(spec.dtype)
    A = rng.standard_normal((M, K))
    B = rng.standard_normal((K, N))
    A[:, rng.integers(K)] = 0.0
    B[rng.integers(K), :] = 0.0
    for X in (A, B):
        for _ in range(n_specials):
            X[rng.integers(X.shape[0]), rng.integers(X.shape[1])] = SPECIALS[rng.integers(3)]
    A, B = A.astype(host), B.astype(host)
    if spec.a_layout == "col":
        A = np.asfortranarray(A)
    if spec.b_layout == "col":
        B = np.asfortranarray(B)
    return A, B


def epilogue_operands(spec, M, N, rng):
    """bias and residual of the spec's epilogue (with one special each), in the output type."""
    out = numpy_dtype(spec.out_dtype)
    extra = {}
    epi = spec.epilogue
    if epi.bias:
        v = rng.standard_normal(N if epi.bias == "col" else M)
        v[rng.integers(len(v))] = SPECIALS[rng.integers(3)]
        extra["bias"] = v.astype(out)
    if epi.residual:
        r = rng.standard_normal((M, N))
        r[rng.integers(M), rng.integers(N)] = SPECIALS[rng.integers(3)]
        extra["residual"] = r.astype(out)
    return extra


def reference(spec, A, B, extra, alpha=1.0):
    """numpy float64, cast to the output type: the specials an f32-accumulating GEMM gives."""
    with np.errstate(all="ignore"):
        ref = alpha * (A.astype(np.float64) @ B.astype(np.float64))
        if "bias" in extra:
            b = extra["bias"].astype(np.float64)
            ref = ref + (b[None, :] if spec.epilogue.bias == "col" else b[:, None])
        ref = ACT[spec.epilogue.activation](ref)
        if "residual" in extra:
            ref = ref + extra["residual"].astype(np.float64)
        return ref.astype(np.float32).astype(numpy_dtype(spec.out_dtype)).astype(np.float64)


def check(spec, C, A, B, extra, alpha=1.0):
    """Every NaN, +inf and -inf where the reference has one; finite values within the bound."""
    C = np.asarray(C).astype(np.float64)
    ref = reference(spec, A, B, extra, alpha)
    for name, f in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        got, want = f(C), f(ref)
        if not np.array_equal(got, want):
            where = np.argwhere(got != want)[:5].tolist()
            raise AssertionError(f"{spec.dtype} {spec.instruction} {spec.epilogue}: {name} at "
                                 f"{int(got.sum())} places, reference {int(want.sum())}; first differences at "
                                 f"{where}: got {[C[r, c] for r, c in where]}, want {[ref[r, c] for r, c in where]}")
    with np.errstate(all="ignore"):
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
        scale = scale + sum(np.abs(v.astype(np.float64))[None, :] if v.ndim == 1 and spec.epilogue.bias == "col"
                            else np.abs(v.astype(np.float64))[:, None] if v.ndim == 1 else np.abs(v.astype(np.float64))
                            for v in extra.values())
    ok = np.isfinite(ref) & np.isfinite(scale)
    bound = gemm_bound(spec.mma_dtype, A.shape[1], spec.out_dtype, spec.acc_dtype, spec.tf32_truncates) + 2.0 ** -16
    err = np.abs(C[ok] - ref[ok]) / np.maximum(scale[ok], 1e-30)
    assert err.size == 0 or err.max() <= 4 * bound, f"finite values off by {err.max():.2e} of the scale (bound {bound:.2e})"
