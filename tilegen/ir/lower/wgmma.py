"""Wgmma -> wgmma.mma_async with two shared-memory descriptors (or A's four registers and
B's descriptor); its fences, commits and waits.

A descriptor holds the unswizzled start address of the operand slice (the hardware applies
the swizzle itself) and the layout's strides (tilegen/arch/wgmma.py). The part that depends
on the thread (stage, warpgroup origin) is built once per region as a 64-bit register; each
k-step adds its compile-time byte offset / 16 to it, which cannot carry out of the 14-bit
address field because shared memory ends below 256 KB.
"""
from __future__ import annotations

from ...arch.wgmma import START_MASK, descriptor_high, descriptor_strides
from ...errors import IRError
from .. import tile as T
from ..instr import Instr
from ..values import Imm, Vec
from .fragment import split_origin
from .smem import value_key, cached_stage_base, emit_linear


def descriptor(b, ctx, tile, stage, row, col_byte, k_major: bool):
    """A b64 register holding the descriptor of the slice whose first element is stored at
    (row, col_byte) of `stage` of `tile` (row/col_byte: Values or ints)."""
    layout = tile.layout
    leading, stride = descriptor_strides(layout.mode, layout.rows, k_major)
    row_rt, row_ct = split_origin(row)
    col_rt, col_ct = split_origin(col_byte)
    span = layout.swizzle.span
    if (isinstance(col_rt, int) or col_rt.align % span == 0) and col_ct % 16 == 0:
        # The runtime parts stay whole panels / rows: the compile-time part is a pure offset.
        const = emit_linear(b, layout, row_ct, col_ct)
        rt_row, rt_col = row_rt, col_rt
    else:
        const, rt_row, rt_col = 0, row, col_byte
    key = ("wgmma-desc", tile.name, value_key(stage), value_key(rt_row), value_key(rt_col), k_major, id(b.region))
    base = ctx.addresses.get(key)
    if base is None:
        addr = b.add(cached_stage_base(b, ctx, tile, stage), emit_linear(b, layout, rt_row, rt_col))
        lo_bits, hi = descriptor_high(layout.mode, leading, stride)
        lo = b.or_(b.shr(b.and_(addr, START_MASK), 4), lo_bits)
        base = b.op("mov.b64", "b64", Vec((lo, ctx.pro.mov(hi))), hint="desc")
        ctx.addresses[key] = base
    if const % 16:
        raise IRError(f"wgmma slice of {tile.name} starts {const} bytes into a 16-byte unit")
    return base if const == 0 else b.op("add.s64", "b64", base, Imm(const >> 4))


def lower_wgmma(b, ctx, op):
    esize = op.b.dtype.bytes
    from_registers = isinstance(op.a, T.Fragment)
    operands = [(op.b, op.b_stage, op.b_n0, op.k0, op.b_k_major)]
    if not from_registers:
        operands.insert(0, (op.a, op.a_stage, op.a_m0, op.k0, op.a_k_major))
    descs = []
    for tile, stage, mn, k, k_major in operands:
        if k_major:
            row, col = mn, k * esize
        else:
            row, col = k, ctx.scaled(b, mn, esize)
        descs.append(descriptor(b, ctx, tile, stage, row, col, k_major))
    if from_registers:  # each warp's 16 rows, in the mma.sync A order (ptx.md 6.2)
        a_regs = op.a.regs[(0, 0)]
        if len(a_regs) != 4:
            raise IRError(f"wgmma from registers: fragment {op.a.name} has {len(a_regs)} registers, not 4")
        descs.insert(0, Vec(tuple(a_regs)))
    acc = op.acc
    regs = [v for j in range(acc.tiles[1]) for v in acc.regs[(0, j)]]
    if len(regs) != op.shape.acc_regs:
        raise IRError(f"wgmma m64n{op.shape.n}: accumulator {acc.name} has {len(regs)} registers, "
                      f"not {op.shape.acc_regs}")
    ins = (descs[0], descs[1], Imm(1 if op.accumulate else 0), Imm(1), Imm(1))
    if op.shape.transposable:  # A from registers takes no imm-trans-a
        ins += ((Imm(0 if op.a_k_major else 1),) if not from_registers else ()) + (Imm(0 if op.b_k_major else 1),)
    elif not (op.a_k_major and op.b_k_major):
        raise IRError(f"wgmma {op.shape.dtype} reads both operands K-major; "
                      f"{op.a.name if not op.a_k_major else op.b.name} is MN-major")
    b.emit(Instr(op.shape.instruction(), (Vec(tuple(regs)),), ins))
    ctx.kernel.features.add("wgmma")


def lower_wgmma_fence(b, ctx, op):
    b.emit(Instr("wgmma.fence.sync.aligned"))
    ctx.kernel.features.add("wgmma")


def lower_wgmma_commit(b, ctx, op):
    b.emit(Instr("wgmma.commit_group.sync.aligned"))


def lower_wgmma_wait(b, ctx, op):
    b.emit(Instr("wgmma.wait_group.sync.aligned", (), (op.pending,)))


def lower_fence_proxy_async(b, ctx, op):
    b.emit(Instr("fence.proxy.async.shared::cta"))
    ctx.kernel.features.add("fence.proxy.async")
