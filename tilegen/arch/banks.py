"""A model of shared-memory bank conflicts for one warp-wide access.

Model (a community model, not an NVIDIA specification; ptx.md section 5.1): 32 banks of
4 bytes, bank = (address / 4) mod 32. The return path moves 128 bytes a cycle, so a warp's
request is served in phases: 32 lanes for 4-byte accesses, half-warps for 8-byte accesses,
quarter-warps for 16-byte accesses, one 8x8 matrix (8 rows of 16 bytes) per ldmatrix
phase. Each phase costs as many wavefronts as the largest number of distinct 4-byte words
that fall in one bank. Lanes reading the same word share it.
"""
from __future__ import annotations

from typing import Iterable, Optional

BANKS = 32
WORD = 4


def _phase_cost(addresses: Iterable[int], width: int) -> int:
    words_per_bank: dict[int, set[int]] = {}
    for a in addresses:
        for w in range(a // WORD, (a + width) // WORD):
            words_per_bank.setdefault(w % BANKS, set()).add(w)
    return max((len(s) for s in words_per_bank.values()), default=0)


def wavefronts(addresses: Iterable[Optional[int]], width: int) -> int:
    """Wavefronts for one warp access: `addresses` has one byte address per lane (None = inactive)."""
    if width not in (4, 8, 16):
        raise ValueError(f"access width {width} bytes; allowed: 4, 8, 16")
    addrs = list(addresses)
    if len(addrs) != 32:
        raise ValueError(f"need 32 lane addresses, got {len(addrs)}")
    for a in addrs:
        if a is not None and a % width:
            raise ValueError(f"address {a} is not aligned to the access width {width}")
    lanes_per_phase = 32 * WORD // width
    total = 0
    for p in range(0, 32, lanes_per_phase):
        active = [a for a in addrs[p:p + lanes_per_phase] if a is not None]
        total += _phase_cost(active, width)
    return total


def matrix_wavefronts(row_addresses: Iterable[int], num: int) -> int:
    """Wavefronts of an ldmatrix/stmatrix .x`num`: `row_addresses` are the 8*num row addresses."""
    rows = list(row_addresses)
    if num not in (1, 2, 4) or len(rows) != 8 * num:
        raise ValueError(f"ldmatrix .x{num} takes {8 * num} row addresses, got {len(rows)}")
    for a in rows:
        if a % 16:
            raise ValueError(f"ldmatrix row address {a} is not 16-byte aligned")
    return sum(_phase_cost(rows[8 * i:8 * i + 8], 16) for i in range(num))
