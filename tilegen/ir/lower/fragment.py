"""LoadFragment -> ldmatrix or ld.shared.b32 (the plan comes from ir/access.py), with tf32
rounding; Mma -> mma.sync; FillFragment -> mov."""
from __future__ import annotations

from ...arch.ldmatrix import matrix_op
from ...errors import IRError
from ..access import fragment_accesses, register_list
from ..instr import Instr
from ..values import Addr, Imm, Vec
from .lanes import fit_bit_linear
from .smem import emit_offset, stage_base


def lower_load_fragment(b, ctx, op):
    frag, tile = op.frag, op.src
    esize = tile.dtype.bytes
    base = stage_base(b, ctx, tile, op.stage)
    # Runtime origin of the fragment in stored coordinates.
    if frag.operand == "A":
        o_row, o_col = (op.row0, op.col0) if op.k_major else (op.col0, op.row0)
    else:
        o_row, o_col = (op.col0, op.row0) if op.k_major else (op.row0, op.col0)
    o_colb = b.mul(o_col, esize)
    for acc in fragment_accesses(op):
        (br, bc), deltas = fit_bit_linear(list(acc.lanes))
        row = b.add(b.add(o_row, br), ctx.lane_term([d[0] for d in deltas]))
        colb = b.add(b.add(o_colb, bc), ctx.lane_term([d[1] for d in deltas]))
        addr = b.add(base, emit_offset(b, tile.layout, row, colb))
        outs = tuple(frag.regs[(i, j)][r] for (i, j, r) in acc.regs)
        if acc.kind == "ldmatrix":
            spelled = matrix_op("ldmatrix", len(outs), acc.trans).instruction
            atoms = sorted({(i, j) for (i, j, _) in acc.regs})
            b.emit(Instr(spelled, (Vec(outs),), (Addr(addr),),
                         comment=f"{frag.name}: atom{'s' if len(atoms) > 1 else ''} "
                                 + " ".join(f"({i},{j})" for i, j in atoms)))
            ctx.kernel.features.add("ldmatrix")
        else:
            b.emit(Instr("ld.shared.b32", outs, (Addr(addr),)))
    if frag.atom.a_type.name == "tf32":
        ctx.kernel.features.add("cvt.rna.tf32")
        for (i, j, r) in register_list(frag):
            v = frag.regs[(i, j)][r]
            b.emit(Instr("cvt.rna.tf32.f32", (v,), (v,)))


def lower_mma(b, ctx, op):
    acc, a, bf = op.acc, op.a, op.b
    tm, tn = acc.tiles
    if a.tiles != (tm, 1) or bf.tiles != (1, tn):
        raise IRError(f"mma shapes: acc {acc.tiles}, a {a.tiles}, b {bf.tiles}")
    for i in range(tm):
        for j in range(tn):
            d = acc.regs[(i, j)]
            b.emit(Instr(acc.atom.instruction, (Vec(tuple(d)),),
                         (Vec(tuple(a.regs[(i, 0)])), Vec(tuple(bf.regs[(0, j)])), Vec(tuple(d)))))
    ctx.kernel.features.add("mma.fp8" if acc.atom.a_type.bits == 8 else "mma")


def lower_fill(b, ctx, op):
    frag = op.frag
    for regs in frag.regs.values():
        for v in regs:
            if frag.reg_type == "f32":
                b.emit(Instr("mov.f32", (v,), (Imm(op.value, "f32"),)))
            else:
                if op.value != 0:
                    raise IRError("packed fragments can only be filled with zero")
                b.emit(Instr("mov.b32", (v,), (Imm(0),)))
