"""How long the emulator will take, said before it starts.

The emulator runs about RATE CTA-wide instructions per second (measured on a 2-core CI
machine: 10^4 for GEMM kernels, whose steps are warp-wide mma and ldmatrix). A kernel's
dynamic instruction count is estimated from its PTX: the instructions outside loops run
once per CTA, those of a loop once per trip; GEMM loops walk the k-tiles, so a launch of
`ctas` CTAs over `trips` k-tiles costs about ctas * (outside + trips * loop) steps, plus the
parse of the PTX (once per text).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

RATE = 10_000.0        # CTA-wide instructions per second
PARSE_S = 0.3          # parsing and decoding one GEMM's PTX
# A GEMM's floating-point operations per second on the emulator: the fastest kernels seen
# (16-bit, large tiles) reach this; 3xTF32 runs ten times slower. Used to say "at least".
GEMM_FLOPS_MAX = 5e7
_LABEL = re.compile(r"^\$loop_\d+:$")
_BACK = re.compile(r"bra(\.uni)?\s+(\$loop_\d+);")


@dataclass(frozen=True)
class Steps:
    outside: int    # instructions outside any loop
    loop: int       # instructions of the largest loop body (innermost loops counted once)


def static_steps(ptx: str) -> Steps:
    """Instruction counts of a PTX module: outside loops, and the largest loop body."""
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
        if depth_open:
            bodies[depth_open[-1]] += 1
        else:
            outside += 1
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


__all__ = ["RATE", "GEMM_FLOPS_MAX", "Steps", "static_steps", "estimate_seconds", "gemm_seconds_at_least"]
