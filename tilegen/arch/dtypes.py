"""Element types the tensor cores take, with their storage and PTX spellings."""
from __future__ import annotations

from dataclasses import dataclass

F32_MAX = 3.4028234663852886e38          # float32's largest finite value
F32_INF_FROM = 2.0 ** 128 - 2.0 ** 103   # the least magnitude float32's rounding takes to infinity


@dataclass(frozen=True)
class DType:
    """One element type.

    name      tilegen's name ("tf32", "f16", ...)
    bits      bits one element occupies in memory
    ptx       the type suffix in mma/cvt spellings (".tf32")
    storage   numpy (or ml_dtypes) type name of host arrays holding it
    min_sm    lowest compute capability whose mma.sync takes it as an operand
    """

    name: str
    bits: int
    ptx: str
    storage: str
    min_sm: int

    @property
    def bytes(self) -> int:
        return self.bits // 8

    def __str__(self) -> str:
        return self.name


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        # tf32 lives in memory as f32; the kernel rounds it (cvt.rna.tf32.f32).
        DType("tf32", 32, ".tf32", "float32", 80),
        DType("f16", 16, ".f16", "float16", 80),
        DType("bf16", 16, ".bf16", "bfloat16", 80),
        DType("f32", 32, ".f32", "float32", 80),
        DType("e4m3", 8, ".e4m3", "float8_e4m3fn", 89),
        DType("e5m2", 8, ".e5m2", "float8_e5m2", 89),
    )
}

FP8 = tuple(n for n, d in DTYPES.items() if d.bits == 8)   # e4m3, e5m2


def dtype(name: str | DType) -> DType:
    """Look up a dtype by name; KeyError-free: raises ValueError listing the legal names."""
    if isinstance(name, DType):
        return name
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}") from None


def numpy_dtype(d: DType | str):
    """The host numpy dtype for arrays of `d` (bfloat16 and fp8 come from ml_dtypes)."""
    import numpy as np

    d = dtype(d)
    if d.storage in ("float32", "float16"):
        return np.dtype(d.storage)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, d.storage))
