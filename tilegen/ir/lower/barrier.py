"""bar.sync: the CTA's barrier 0, or a warp role's own named barrier (its id and thread count)."""
from __future__ import annotations

from ..instr import Instr


def lower_barrier(b, ctx, op):
    if op.threads:   # a warp role's own barrier
        b.emit(Instr("bar.sync", (), (op.ident, op.threads)))
    else:
        b.emit(Instr("bar.sync", (), (0,)))
