"""The Triton baseline: the standard tiled tl.dot matmul (as in Triton's tutorial), autotuned
over a few classic configurations. Imported only when `triton` and `torch` import.

4-byte inputs go through tl.dot as TF32 (input_precision="tf32") for tilegen's tf32 rows, and as
three tf32 products (input_precision="tf32x3", f32 accuracy, the same method as tilegen's f32) for
its f32 rows. C is written in the dtype of the output tensor (tilegen's out_dtype), accumulating in
f32.
"""
from __future__ import annotations

import triton
import triton.language as tl

VERSION = triton.__version__


def _config(bm, bn, bk, stages, warps, group=8):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                         num_stages=stages, num_warps=warps)


# (2-byte operands, 4-byte operands): shared memory per stage is what changes.
CONFIGS_16 = [_config(128, 256, 64, 3, 8), _config(128, 128, 64, 4, 4), _config(64, 256, 32, 4, 4),
              _config(128, 128, 32, 4, 4), _config(256, 128, 64, 3, 8)]
CONFIGS_32 = [_config(128, 256, 32, 3, 8), _config(128, 128, 32, 4, 4), _config(64, 256, 32, 4, 4),
              _config(128, 64, 32, 4, 4), _config(128, 128, 64, 3, 8)]
KEY = ["M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "PRECISION"]


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   PRECISION: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc += tl.dot(a, b, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


_tuned_16 = triton.autotune(configs=CONFIGS_16, key=KEY)(_matmul_kernel)
_tuned_32 = triton.autotune(configs=CONFIGS_32, key=KEY)(_matmul_kernel)


def matmul(a, b, c, f32: bool = False):
    """c = a @ b for 2-D torch CUDA tensors of any strides (a: M x K, b: K x N, c: M x N); 4-byte
    operands as TF32, or with f32=True as three tf32 products (f32 accuracy)."""
    M, K = a.shape
    K2, N = b.shape
    assert K == K2 and tuple(c.shape) == (M, N), "shape mismatch"
    fn = _tuned_32 if a.element_size() == 4 else _tuned_16
    precision = ("tf32x3" if f32 else "tf32") if a.element_size() == 4 else None   # (16-bit: exact products)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    fn[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
             PRECISION=precision)
    return c


def best_config(a, b) -> str:
    """The configuration the autotuner picked for these operands' key (after a call)."""
    fn = _tuned_32 if a.element_size() == 4 else _tuned_16
    cfg = getattr(fn, "best_config", None)
    if cfg is None:
        return ""
    kw = getattr(cfg, "kwargs", {})
    return (f"{kw.get('BLOCK_M')}x{kw.get('BLOCK_N')}x{kw.get('BLOCK_K')} "
            f"w{getattr(cfg, 'num_warps', '?')} s{getattr(cfg, 'num_stages', '?')}")
