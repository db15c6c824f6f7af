"""XOR swizzles on shared-memory offsets (CuTe's Swizzle<B, M, S>).

swz(x) = x ^ (((x >> (M + S)) & (2^B - 1)) << M): bits [M+S, M+S+B) are XORed into
bits [M, M+B). Within each block of 2^(M+S+B) units the map is a bijection and an
involution. On byte offsets from a base aligned to that block:

| mode  | Swizzle<B,M,S> | moves                          | period  |
| ----- | -------------- | ------------------------------ | ------- |
| 128B  | <3,4,3>        | 16-byte chunk within 128 bytes | 1024 B  |
| 64B   | <2,4,3>        | 16-byte chunk within 64 bytes  | 512 B   |
| 32B   | <1,4,3>        | 16-byte chunk within 32 bytes  | 256 B   |

These match TMA's CU_TENSOR_MAP_SWIZZLE_{128,64,32}B and the wgmma descriptor modes.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Swizzle:
    bits: int   # B: how many bits of the unit index are permuted
    base: int   # M: low bits left alone (the moving unit is 2^M)
    shift: int  # S: distance from the permuted bits up to their XOR source

    def __post_init__(self):
        if self.bits < 0 or self.base < 0 or self.shift < self.bits:
            raise ValueError(f"Swizzle<{self.bits},{self.base},{self.shift}> needs B >= 0, M >= 0, S >= B")

    @property
    def period(self) -> int:
        """Size of the block the map permutes within (and repeats over)."""
        return 1 << (self.base + self.shift + self.bits)

    @property
    def span(self) -> int:
        """The row length whose units get permuted: 2^(M+B)."""
        return 1 << (self.base + self.bits)

    def __call__(self, x):
        """Works on Python ints and numpy integer arrays alike."""
        mask = (1 << self.bits) - 1
        return x ^ (((x >> (self.base + self.shift)) & mask) << self.base)

    def __str__(self) -> str:
        return f"Swizzle<{self.bits},{self.base},{self.shift}>"


SWIZZLE_MODES: dict[str, Swizzle] = {
    "128B": Swizzle(3, 4, 3),
    "64B": Swizzle(2, 4, 3),
    "32B": Swizzle(1, 4, 3),
}


def swizzle_mode(name: str) -> Swizzle:
    try:
        return SWIZZLE_MODES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown swizzle mode {name!r}; allowed: {', '.join(SWIZZLE_MODES)}") from None
