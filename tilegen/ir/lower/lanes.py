"""Lane-dependent coordinates as bit-linear functions of %laneid.

Every fragment map and ldmatrix address pattern tilegen uses is linear over GF(2)-free
integer sums of the lane's bits: coord(lane) = base + sum_i bit_i(lane) * delta_i. Fitting
that form (and checking it on all 32 lanes) lets codegen compute a lane's coordinates with
a few shifts and masks instead of a table in memory.
"""
from __future__ import annotations

from ...errors import IRError

LANE_BITS = 5


def fit_bit_linear(coords: list[tuple[int, ...]]) -> tuple[tuple, tuple]:
    """coords[lane] -> (base, deltas[5]) such that coords[l] == base + sum bit_i(l)*deltas[i]."""
    base = coords[0]
    deltas = tuple(tuple(c - b for c, b in zip(coords[1 << i], base)) for i in range(LANE_BITS))
    for lane, c in enumerate(coords):
        want = list(base)
        for i in range(LANE_BITS):
            if lane >> i & 1:
                want = [w + d for w, d in zip(want, deltas[i])]
        if tuple(want) != tuple(c):
            raise IRError(f"lane coordinates are not bit-linear in the lane id (lane {lane}: {c} vs {tuple(want)})")
    return base, deltas


def emit_lane_term(b, lane, deltas: list[int]):
    """sum_i bit_i(lane) * deltas[i] as instructions; runs of bits with doubling deltas
    become one shift-and-mask."""
    total = 0
    i = 0
    while i < LANE_BITS:
        if deltas[i] == 0:
            i += 1
            continue
        j = i + 1
        while j < LANE_BITS and deltas[j] == 2 * deltas[j - 1]:
            j += 1
        field = b.and_(b.shr(lane, i), (1 << (j - i)) - 1)
        total = b.add(total, b.mul(field, deltas[i]))
        i = j
    return total
