"""How long the emulator will take, said before it starts.

A kernel's dynamic instruction count is estimated from its PTX: the instructions outside loops
run once per CTA, those of a loop once per trip; GEMM loops walk the k-tiles, so a launch of
`ctas` CTAs over `trips` k-tiles costs about ctas * (outside + trips * loop) steps, plus the
parse of the PTX (once per text). Steps are weighed by what the emulator spends on them
(measured on a 2-core machine over the mma.sync and wgmma GEMMs, f32 to fp8): an instruction
that touches memory or the tensor cores (ld / st / cp.async / ldmatrix / mma / barriers) is one
unit, at RATE units a second; a wgmma or a TMA copy (a warpgroup's or a box's worth of work)
BULK units; scalar arithmetic next to nothing (LIGHT). The model's counts match the emulator's
executed instructions within a few percent; its times come out within about 2x, on the high side
(1.0-1.6x for the mma.sync GEMMs, up to 2x for the wgmma ones, on that machine).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

RATE = 12_500.0        # memory / tensor instructions (CTA-wide) per second
BULK = 50.0            # a wgmma or TMA copy, in those units
LIGHT = 0.02           # scalar arithmetic, in those units
PARSE_S = 0.3          # parsing and decoding one GEMM's PTX
# A GEMM's floating-point operations per second on the emulator, above what any kernel reaches
# (the fastest, 16-bit mma.sync with large tiles, ran 1.1e8 on the 2-core machine): what "at
# least" is said with before anything is compiled.
GEMM_FLOPS_MAX = 2.5e8
_LABEL = re.compile(r"^\$loop_\d+:$")
_BACK = re.compile(r"bra(\.uni)?\s+(\$loop_\d+);")
_GUARD = re.compile(r"^@!?%\w+\s+")
_UNIT = ("ld.", "st.", "cp.async", "ldmatrix", "stmatrix", "mma.", "bar.", "barrier.", "mbarrier.", "atom.", "red.",
         "fence.", "redux.")
_BULK = ("wgmma.mma_async", "cp.async.bulk.tensor")


def weight(line: str) -> float:
    """What one PTX instruction costs the emulator, in units of a memory or mma instruction."""
    op = _GUARD.sub("", line)
    if op.startswith(_BULK):
        return BULK
    return 1.0 if op.startswith(_UNIT) else LIGHT


@dataclass(frozen=True)
class Steps:
    outside: float    # weighed instructions outside any loop
    loop: float       # weighed instructions of the largest loop body (innermost loops counted once)


def static_steps(ptx: str) -> Steps:
    """Weighed instruction counts of a PTX module (weight()): outside loops, and the largest
    loop body."""
    depth_open: list = []   # loop labels open, innermost last
    bodies: dict = {}
    outside = 0
    for raw in ptx.splitlines():
        line = raw.strip()
        if not line or line.startswith(("//", ".", "{", "}")):
            continue
        if _LABEL.match(line):
            depth_open.append(line[:-1])
            bodies[line[:-1]] = 0
            continue
        if line.endswith(":"):
            continue
        w = weight(line)
        if depth_open:
            bodies[depth_open[-1]] += w
        else:
            outside += w
        back = _BACK.search(line)
        if back and back.group(2) in depth_open:
            depth_open.remove(back.group(2))
    return Steps(outside, max(bodies.values(), default=0))


def estimate_seconds(ptx: str, ctas: int, trips: int) -> float:
    """Seconds the emulator needs for `ctas` CTAs whose loops run about `trips` times."""
    s = static_steps(ptx)
    return PARSE_S + ctas * (s.outside + max(trips, 0) * s.loop) / RATE


def gemm_seconds_at_least(M: int, N: int, K: int) -> float:
    """A lower bound on the emulator's time for an M x N x K GEMM, before any compiling."""
    return 2.0 * M * N * K / GEMM_FLOPS_MAX


__all__ = ["RATE", "GEMM_FLOPS_MAX", "Steps", "weight", "static_steps", "estimate_seconds", "gemm_seconds_at_least"]
