"""Fused epilogues and 3xTF32 on the CPU emulator, against float64 references:
C = act(alpha * A @ B + beta * C0 + bias) + residual, in one kernel, one store."""
import math

import numpy as np
import pytest

import tilegen
from tilegen.arch.dtypes import numpy_dtype
from seeds import seed

SMALL = dict(tile=(32, 32, 32), warps=(1, 1))


def _act(name, x):
    if name == "none":
        return x
    if name == "relu":
        return np.maximum(x, 0)
    if name == "silu":
        return x / (1 + np.exp(-x))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "gelu_erf":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    raise ValueError(name)


def _inputs(dtype, M, N, K, rng):
    A = rng.standard_normal((M, K)).astype(numpy_dtype(dtype))
    B = rng.standard_normal((K, N)).astype(numpy_dtype(dtype))
    return A, B


# Output rounding plus a small epilogue term (ex2.approx, divisions), relative to |C|'s scale.
TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}


@pytest.mark.parametrize("activation", ["none", "relu", "silu", "gelu_tanh", "gelu_erf"])
@pytest.mark.parametrize("bias,residual,out", [("col", False, "f32"), ("row", True, "bf16"), (None, True, "f16")])
def test_epilogue_matches_reference(activation, bias, residual, out):
    spec = tilegen.GemmSpec(dtype="f16", out_dtype=out, epilogue=tilegen.Epilogue(bias, activation, residual),
                            **SMALL)
    k = tilegen.compile(spec)
    rng = np.random.default_rng(seed(activation, bias, out))
    M, N, K = 37, 45, 40
    A, B = _inputs("f16", M, N, K, rng)
    odt = numpy_dtype(out)
    C0 = rng.standard_normal((M, N)).astype(odt)
    b = rng.standard_normal(N if bias == "col" else M).astype(odt) if bias else None
    R = rng.standard_normal((M, N)).astype(odt) if residual else None
    C = k(A, B, out=C0.copy(), alpha=0.5, beta=0.25, bias=b, residual=R, device="sim")
    x = 0.5 * (A.astype(np.float64) @ B.astype(np.float64)) + 0.25 * C0.astype(np.float64)
    if bias == "col":
        x = x + b.astype(np.float64)[None, :]
    elif bias == "row":
        x = x + b.astype(np.float64)[:, None]
    ref = _act(activation, x) + (R.astype(np.float64) if residual else 0)
    err = np.abs(C.astype(np.float64) - ref).max() / max(1.0, np.abs(ref).max())
    assert err < TOL[out], f"{activation} bias={bias} residual={residual} out={out}: {err:.3g}"


def test_epilogue_arguments_are_checked():
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", epilogue=tilegen.Epilogue(bias="col"), **SMALL))
    A, B = _inputs("f16", 8, 8, 8, np.random.default_rng(0))
    with pytest.raises(tilegen.LaunchError, match="pass bias="):
        k(A, B, device="sim")
    with pytest.raises(tilegen.LaunchError, match="bias has 7 elements"):
        k(A, B, bias=np.zeros(7, np.float32), device="sim")
    with pytest.raises(tilegen.LaunchError, match="this kernel has none"):
        k(A, B, bias=np.zeros(8, np.float32), residual=np.zeros((8, 8), np.float32), device="sim")
    plain = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    with pytest.raises(tilegen.LaunchError, match="this kernel has no bias"):
        plain(A, B, bias=np.zeros(8, np.float32), device="sim")


@pytest.mark.parametrize("layouts", [("row", "row"), ("col", "row"), ("row", "col")])
def test_3xtf32_is_as_accurate_as_f32(layouts):
    """f32 operands through three tf32 products: error against float64 at or below numpy's
    own float32 matmul, and far below one tf32 product."""
    rng = np.random.default_rng(3)
    M, N, K = 48, 40, 96
    A, B = _inputs("f32", M, N, K, rng)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    k3 = tilegen.compile(tilegen.GemmSpec(dtype="f32", a_layout=layouts[0], b_layout=layouts[1], **SMALL))
    k1 = tilegen.compile(tilegen.GemmSpec(dtype="tf32", a_layout=layouts[0], b_layout=layouts[1], **SMALL))
    err3 = np.linalg.norm(k3(A, B, device="sim") - ref) / np.linalg.norm(ref)
    err1 = np.linalg.norm(k1(A, B, device="sim") - ref) / np.linalg.norm(ref)
    err32 = np.linalg.norm((A @ B).astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err3 <= 2 * err32, f"3xTF32 {err3:.3g} vs float32 {err32:.3g}"
    assert err3 < err1 / 100, f"3xTF32 {err3:.3g} vs one tf32 product {err1:.3g}"
