"""Decode an entry once into a list of closures: one table from opcode family to builder.

An opcode the table does not know fails at decode time, naming the PTX line, so a kernel
never runs half-way into something the emulator cannot do.
"""
from __future__ import annotations

from . import alu, atomics, cluster, control, mbarrier, memops, tensor, tma, warp, wgmma
from .state import Context

BUILDERS = {**alu.BUILDERS, **memops.BUILDERS, **control.BUILDERS, **tensor.BUILDERS, **warp.BUILDERS,
            **wgmma.BUILDERS, **mbarrier.BUILDERS, **tma.BUILDERS, **cluster.BUILDERS,
            **atomics.BUILDERS}


def family(opcode: str) -> str:
    if opcode.startswith("cp.async.bulk"):
        return "cp.async.bulk"
    return "cp.async" if opcode.startswith("cp.async") else opcode.split(".")[0]


def decode(ctx: Context, masked: bool = False) -> list:
    """The entry's closures; masked=True: the code warps run once they have parted, every
    instruction guarded by the running group's threads (sim/state.py)."""
    code = []
    ctx.masked = masked
    held = wgmma.held_slots(ctx.entry)
    try:
        for ins in ctx.entry.instrs:
            kind = family(ins.opcode)
            build = BUILDERS.get(kind)
            if build is None:
                ctx.unsupported(ins, f"the instruction {ins.opcode}")
            run = build(ins, ctx)
            if held and kind != "wgmma":
                run = wgmma.guard_registers(ins, ctx, run, held, kind)
            code.append(run)
    finally:
        ctx.masked = False
    return code
