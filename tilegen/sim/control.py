"""Control flow and barriers: bra / bra.uni, ret / exit, bar.sync, bar.red.{or,and}.pred, setmaxnreg.

A closure returns None to fall through, the index of the next instruction when it jumps,
END when every running thread leaves the kernel, or a Signal when the threads running it
part or must let other warps run: a branch or exit taken by some of them (Diverge, Exit), a
CTA barrier (Barrier), a wait that found its phase incomplete (sim/mbarrier.py, Wait), a
wgmma reached by part of a warpgroup (sim/wgmma.py, Converge). The runner (sim/runner.py) then
keeps one program counter per group of threads that are together, and runs the groups in turn
until they meet again.
"""
from __future__ import annotations

import numpy as np

from ..arch.targets import SETMAXNREG_RANGE
from .cluster import build_cluster_barrier
from .program import Imm, Reg, Sym
from .signals import END, Barrier, Diverge, Exit, Signal, Wait  # noqa: F401  (re-exported)
from .state import Context

MIN_REGS, MAX_REGS = SETMAXNREG_RANGE


def _mask(ins, ctx: Context):
    """The threads the guard selects (None: all running threads, unguarded lockstep code)."""
    return ctx.guard(ins)


def _by_guard(ins, ctx: Context, all_of_them, some_of_them):
    """A closure for a guarded jump or exit: None when no running thread takes it,
    `all_of_them` when every one does, else some_of_them(the mask) (a Signal)."""
    g = _mask(ins, ctx)
    if g is None:
        return lambda: all_of_them
    whole = _running(ctx)

    def run():
        m = g()
        if not m.any():
            return None
        if np.array_equal(m, whole()):
            return all_of_them
        return some_of_them(m)
    return run


def build_bra(ins, ctx: Context):
    if len(ins.operands) != 1 or not isinstance(ins.operands[0], Sym):
        ctx.unsupported(ins, f"{ins.opcode} with these operands")
    target = ctx.entry.labels[ins.operands[0].name]
    return _by_guard(ins, ctx, target, lambda m: Diverge(target, m))


def _running(ctx: Context):
    """The threads running this code: the group's in masked code, every thread otherwise."""
    if ctx.masked:
        return lambda: ctx.active
    every = np.ones(ctx.threads, dtype=bool)
    return lambda: every


def build_exit(ins, ctx: Context):
    return _by_guard(ins, ctx, END, Exit)


def _reduction(ins, ctx: Context):
    """bar.red.{or,and}.pred d, N{, M}, c: (the barrier's operands, a function that, given
    the threads that met there, writes to each of them d = the or / and of their c)."""
    parts = ins.opcode.split(".")
    ops = ins.operands
    if parts[0] == "barrier" and parts[-1:] == ["aligned"]:
        parts = parts[:-1]
    if parts[1:] not in (["red", "or", "pred"], ["red", "and", "pred"]) or len(ops) not in (3, 4) \
            or not isinstance(ops[0], Reg) or ops[0].type != "pred" or not isinstance(ops[-1], Reg) \
            or ops[-1].type != "pred":
        ctx.unsupported(ins, f"{ins.opcode} (the emulator runs bar.red.or.pred / bar.red.and.pred d, N{{, M}}, c)")
    d, c, either = ops[0].slot, ops[-1].slot, parts[2] == "or"
    R = ctx.R

    def reduce(met):
        vals = R[c][met]
        R[d] = np.where(met, vals.any() if either else vals.all(), R[d])
    return ops[1:-1], reduce


def build_bar(ins, ctx: Context):
    parts = ins.opcode.split(".")
    if parts[:2] == ["barrier", "cluster"]:
        return build_cluster_barrier(ins, ctx)
    reduce = None
    if "red" in parts:
        ops, reduce = _reduction(ins, ctx)
        ok = True
    elif parts[0] == "barrier":
        ok = parts[1:] in (["sync"], ["sync", "aligned"])
        ops = ins.operands
    else:
        ok = parts[1:] in (["sync"],)
        ops = ins.operands
    if not ok or len(ops) not in (1, 2) or not isinstance(ops[0], Imm) or (len(ops) == 2 and not isinstance(ops[1], Imm)):
        ctx.unsupported(ins, f"{ins.opcode} (only bar.sync / bar.red N{{, M}} and barrier.sync N{{, M}} with immediates)")
    ident = int(ops[0].value)
    count = int(ops[1].value) if len(ops) == 2 else None
    if count == ctx.threads:
        count = None
    if not 0 <= ident < 16 or (count is not None and (count <= 0 or count % 32)):
        ctx.fail(ins, f"{ins.opcode} {ident}{'' if count is None else f', {count}'}: barriers 0..15, thread counts "
                      f"multiples of 32", kind="unsupported")
    g = _mask(ins, ctx)
    if ctx.masked:   # warps have parted: the runner holds each group here until all arrive
        def arrive():
            return Barrier(ins, ident, count, reduce) if g().any() else None
        return arrive
    if count is not None:   # reached in lockstep, every thread arrives: more than its count
        def too_many():
            if g is None or g().any():
                ctx.fail(ins, f"bar.sync {ident}, {count} is reached by all {ctx.threads} threads of the CTA together: "
                              f"more than its count (a role's barrier, reached outside the role?)", kind="deadlock")
        return too_many
    if g is None:
        if reduce is None:
            return ctx.shadow_barrier
        every = np.ones(ctx.threads, dtype=bool)
        return lambda: (ctx.shadow_barrier(), reduce(every))[0]

    def run():
        m = g()
        if m.all():
            ctx.shadow_barrier()
            if reduce is not None:
                reduce(m)
        elif m.any():
            ctx.fail(ins, f"divergent barrier at line {ins.line} is not supported by the emulator: its predicate "
                          f"differs between the threads of the CTA", kind="divergence",
                     tid=int(np.flatnonzero(~m)[0]))
    return run


def build_setmaxnreg(ins, ctx: Context):
    """setmaxnreg.{inc,dec}.sync.aligned.u32 N: moves registers between warpgroups. The
    emulator has no register budget; it checks the operand and that whole warpgroups run it."""
    parts = ins.opcode.split(".")
    if parts[1:] not in (["inc", "sync", "aligned", "u32"], ["dec", "sync", "aligned", "u32"]):
        ctx.unsupported(ins, f"the instruction {ins.opcode}")
    ops = ins.operands
    if len(ops) != 1 or not isinstance(ops[0], Imm):
        ctx.unsupported(ins, f"{ins.opcode} without an immediate register count")
    n = int(ops[0].value)
    if not MIN_REGS <= n <= MAX_REGS or n % 8:
        ctx.fail(ins, f"setmaxnreg {n}: the count must be a multiple of 8 in {MIN_REGS}..{MAX_REGS}",
                 kind="unsupported")
    if ins.guard is not None:
        ctx.unsupported(ins, f"a guarded {ins.opcode} (.sync.aligned: every thread of the warpgroup runs it)")
    g = _mask(ins, ctx)
    if g is None:
        return lambda: None
    groups = ctx.threads // 128

    def run():
        m = g()[:groups * 128].reshape(groups, 128)
        part = m.any(axis=1) & ~m.all(axis=1)
        if part.any():
            w = int(np.flatnonzero(part)[0])
            ctx.fail(ins, f"setmaxnreg is run by only part of warpgroup {w}: all its warps must run it together",
                     kind="divergence", tid=w * 128 + int(np.flatnonzero(~m[w])[0]))
    return run


BUILDERS = {"bra": build_bra, "ret": build_exit, "exit": build_exit, "bar": build_bar, "barrier": build_bar,
            "setmaxnreg": build_setmaxnreg}
