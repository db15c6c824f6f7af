"""What an instruction's closure returns when the running threads part or wait (sim/control.py
has the whole story): Diverge, Exit, Barrier, Wait, Converge; END when every running thread leaves."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .errors import SimError

END = 1 << 62


class Signal:
    """What a closure returns when the running threads part or wait (see the module doc)."""


@dataclass(eq=False)
class Diverge(Signal):
    target: int
    taken: np.ndarray           # the threads that jump (a mask over the CTA)


@dataclass(eq=False)
class Exit(Signal):
    leaving: np.ndarray         # the threads that leave the kernel


@dataclass(eq=False)
class Barrier(Signal):
    """A bar.sync reached: barrier `ident` completes when `count` threads (None: every live
    thread of the CTA) wait at it."""
    ins: object
    ident: int = 0
    count: Optional[int] = None
    reduce: Optional[object] = None   # bar.red: reduce(the threads that met) writes each one's result


@dataclass(eq=False)
class Wait(Signal):
    """A try_wait found its phase incomplete: other warps run first. `stuck` is the deadlock
    to report if no other warp can move either (nothing left to land on the barrier); `again`:
    the waiting instruction runs again (a cluster barrier's wait), else the next one (the
    try_wait's loop tests its predicate)."""
    stuck: Optional[SimError]
    again: bool = False


__all__ = ["END", "Signal", "Diverge", "Exit", "Barrier", "Wait", "Converge"]


@dataclass(eq=False)
class Converge(Signal):
    """A warpgroup instruction (.sync.aligned: all 128 threads together) reached by part of a
    warpgroup whose other warps parted from it (a branch by warp): the threads wait at it until
    the rest of the warpgroup comes to the same instruction, and `error` is raised if it never can."""
    ins: object
    error: SimError

