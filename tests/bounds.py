"""Error bounds for GEMM results against a float64 reference, by dtype and K.

The check is ||C - ref||_F <= bound * ||(|A| @ |B|)||_F: a relative error against the
magnitude the sums run through, so the bound does not blow up when the entries of C cancel.
Sources of error, in units of 2^-p (p = the type's mantissa bits + 1):
- operand rounding: tf32 inputs are rounded (cvt.rna) to 11 significant bits, so each
  product carries up to 2 * 2^-11; wgmma truncates them instead (truncated=True), up to
  2 * 2^-10; f16/bf16 operands are exact in the reference already.
- f32 accumulation over K terms: up to K * 2^-24 (the worst case; random data sits far under).
- f16 accumulation: the worst case K * 2^-11 says nothing for large K, so the bound is the
  probabilistic one for independent rounding errors (Higham and Mary): 4 * sqrt(K) * 2^-11.
- output rounding: 2^-11 for f16, 2^-8 for bf16, 2^-24 for f32.
"""
UNIT = {"f32": 2.0 ** -24, "tf32": 2.0 ** -11, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}


def gemm_bound(dtype: str, K: int, out_dtype: str = "f32", acc_dtype: str = "f32", truncated: bool = False) -> float:
    operand = 2 * UNIT["tf32"] * (2 if truncated else 1) if dtype == "tf32" else 0.0
    if acc_dtype == "f32":
        accumulate = max(K, 1) * UNIT["f32"]
    else:
        accumulate = 4 * max(K, 1) ** 0.5 * UNIT["f16"]
    return operand + accumulate + UNIT[out_dtype]


def gemm_error(C, ref, A, B) -> float:
    """||C - ref|| / || |A| @ |B| || in float64."""
    import numpy as np

    scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    denom = np.linalg.norm(scale)
    if denom == 0:
        return float(np.linalg.norm(C.astype(np.float64) - ref))
    return float(np.linalg.norm(C.astype(np.float64) - ref) / denom)


FP8_TC_BITS = 14   # mantissa bits the tensor cores keep while wgmma accumulates fp8 products (Hopper)


def fp8_wgmma_bound(K: int, out_dtype: str, window: int) -> float:
    """gemm_bound for an fp8 wgmma GEMM: f32 accumulation across promotion windows of `window`
    products, inside which the tensor cores keep about FP8_TC_BITS bits (DeepSeek-V3 report,
    section 3.3.2): a random walk of sqrt(window) roundings of 2^-(bits - 1) relative to |A||B|."""
    return gemm_bound("f16", K, out_dtype) + min(K, window) ** 0.5 * 2.0 ** -(FP8_TC_BITS - 1)

