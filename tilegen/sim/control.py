"""Control flow and barriers: bra / bra.uni, ret / exit, bar.sync.

All threads of a CTA run in lockstep, so control flow must be uniform across the CTA: a
branch, exit or barrier whose guard differs between threads raises a SimError (the
emulator has no per-thread program counters). A closure returns the index of the next
instruction when it jumps, END to finish the CTA, or None to fall through.
"""
from __future__ import annotations

import numpy as np

from .program import Imm, Sym
from .state import Context

END = 1 << 62


def _uniform_guard(ins, ctx: Context, what: str):
    """A function telling whether the guarded instruction runs: True, False, or a
    SimError when the threads disagree."""
    g = ctx.guard(ins)
    if g is None:
        return None

    def taken():
        m = g()
        if m.all():
            return True
        if not m.any():
            return False
        ctx.fail(ins, f"{what} at line {ins.line} is not supported by the emulator: its predicate "
                      f"differs between the threads of the CTA", kind="divergence",
                 tid=int(np.flatnonzero(m != m[0])[0]))
    return taken


def build_bra(ins, ctx: Context):
    if len(ins.operands) != 1 or not isinstance(ins.operands[0], Sym):
        ctx.unsupported(ins, f"{ins.opcode} with these operands")
    target = ctx.entry.labels[ins.operands[0].name]
    taken = _uniform_guard(ins, ctx, "divergent branch")
    if taken is None:
        return lambda: target
    return lambda: target if taken() else None


def build_exit(ins, ctx: Context):
    taken = _uniform_guard(ins, ctx, "divergent exit")
    if taken is None:
        return lambda: END
    return lambda: END if taken() else None


def build_bar(ins, ctx: Context):
    parts = ins.opcode.split(".")
    if parts[0] == "barrier":
        ok = parts[1:] in (["sync"], ["sync", "aligned"])
    else:
        ok = parts[1:] in (["sync"],)
    ops = ins.operands
    if not ok or len(ops) not in (1, 2) or not isinstance(ops[0], Imm):
        ctx.unsupported(ins, f"{ins.opcode} (only bar.sync N / barrier.sync N)")
    if len(ops) == 2 and not (isinstance(ops[1], Imm) and int(ops[1].value) == ctx.threads):
        ctx.unsupported(ins, "a barrier over part of the CTA")
    taken = _uniform_guard(ins, ctx, "divergent barrier")

    def run():
        if taken is None or taken():
            ctx.shadow.barrier()
    return run


BUILDERS = {"bra": build_bra, "ret": build_exit, "exit": build_exit, "bar": build_bar, "barrier": build_bar}
