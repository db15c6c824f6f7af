"""Bit-exact number conversions of the PTX instructions the emulator runs, on numpy arrays.

Every function takes and returns raw bits (uint32 for f32/tf32, uint16 for f16/bf16,
uint8 for fp8) or float arrays, as named; nothing depends on ml_dtypes.
"""
from __future__ import annotations

import numpy as np

F32_EXP = np.uint32(0x7F800000)
TF32_KEEP = np.uint32(0xFFFFE000)   # sign, 8 exponent bits, 10 mantissa bits


def tf32_rna(bits: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero (low 13 bits zero).

    Adding half an ulp to the magnitude bits rounds ties away because f32 is sign-magnitude;
    a carry into the exponent is the correct round-up (to inf past the largest tf32).
    inf and NaN are truncated, as the H200 does (tests/test_conversions_gpu.py): a NaN whose
    payload lies in the low 13 bits only comes out as inf, as the tensor cores read it anyway."""
    bits = np.asarray(bits, dtype=np.uint32)
    rounded = (bits + np.uint32(0x1000)) & TF32_KEEP
    special = (bits & F32_EXP) == F32_EXP
    return np.where(special, bits & TF32_KEEP, rounded) if special.any() else rounded


TF32_NAN = np.uint32(0x7FFFE000)   # the NaN cvt.rn.tf32.f32 gives for every NaN (H200)


def tf32_rn(bits: np.ndarray) -> np.ndarray:
    """cvt.rn.tf32.f32 (sm_90): round to 10 mantissa bits, ties to even (low 13 bits zero);
    past the largest tf32 to inf. inf passes through; every NaN becomes TF32_NAN, as on the
    H200 (tests/test_conversions_gpu.py)."""
    bits = np.asarray(bits, dtype=np.uint32)
    odd = (bits >> np.uint32(13)) & np.uint32(1)
    rounded = (bits + np.uint32(0xFFF) + odd) & TF32_KEEP
    special = (bits & F32_EXP) == F32_EXP
    if not special.any():
        return rounded
    nan = special & ((bits & np.uint32(0x7FFFFF)) != 0)
    return np.where(nan, TF32_NAN, np.where(special, bits, rounded))


def tf32_operand(bits: np.ndarray) -> np.ndarray:
    """What the tensor core reads of a .tf32 operand: the top 19 bits (the low 13 mantissa
    bits are ignored, i.e. truncated), as float32 values."""
    return (np.asarray(bits, dtype=np.uint32) & TF32_KEEP).view(np.float32)


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """cvt.rn.f16.f32 (round to nearest even, overflow to inf)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def f16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    return np.asarray(h, dtype=np.uint16).view(np.float16).astype(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """cvt.rn.bf16.f32: round to nearest even on the top 16 bits; NaN stays a (quiet) NaN."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    r = ((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > F32_EXP
    if nan.any():
        r = np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), r)
    return r


def bf16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _fp8_table(exp_bits: int, man_bits: int, bias: int, ieee_specials: bool) -> np.ndarray:
    """Values of all 256 codes of an 8-bit float (e4m3 'fn': no inf, S.1111.111 is NaN;
    e5m2: IEEE-style inf and NaN)."""
    out = np.empty(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if ieee_specials and e == top:
            v = float("inf") if m == 0 else float("nan")
        elif not ieee_specials and e == top and m == (1 << man_bits) - 1:
            v = float("nan")
        elif e == 0:
            v = m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        out[code] = sign * v
    return out


FP8_VALUES = {"e4m3": _fp8_table(4, 3, 7, False), "e5m2": _fp8_table(5, 2, 15, True)}


def decode_operand(words: np.ndarray, dtype: str) -> np.ndarray:
    """(..., regs) uint32 registers of mma operand type `dtype` -> (..., regs * per) float32
    element values, element 0 of each register (the low bits) first."""
    w = np.ascontiguousarray(words, dtype=np.uint32)
    if dtype == "tf32":
        return tf32_operand(w)
    if dtype == "f32":
        return w.view(np.float32)
    if dtype == "f16":
        return w.view(np.uint16).view(np.float16).astype(np.float32)
    if dtype == "bf16":
        return bf16_bits_to_f32(w.view(np.uint16))
    if dtype in FP8_VALUES:
        return FP8_VALUES[dtype][w.view(np.uint8)]
    raise ValueError(f"no mma operand type {dtype!r}")
