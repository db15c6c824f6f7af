"""LoadFragment -> ldmatrix or ld.shared.b32 (the plan comes from ir/access.py), with tf32
rounding; Mma -> mma.sync; FillFragment -> mov."""
from __future__ import annotations

from ...arch.ldmatrix import matrix_op
from ...arch.targets import target
from ...errors import IRError
from ..access import fragment_accesses, register_list
from ..instr import Instr
from ..values import Addr, Imm, Vec
from .lanes import fit_bit_linear
from .smem import shared_address


def split_origin(x):
    """(runtime part, compile-time part) of an origin coordinate."""
    return (0, x) if isinstance(x, int) else (x, 0)


def lower_load_fragment(b, ctx, op):
    frag, tile = op.frag, op.src
    esize = tile.dtype.bytes
    # The fragment's origin in stored coordinates (rows, byte columns).
    if frag.operand == "A":
        o_row, o_col = (op.row0, op.col0) if op.k_major else (op.col0, op.row0)
    else:
        o_row, o_col = (op.col0, op.row0) if op.k_major else (op.row0, op.col0)
    row_rt, row_ct = split_origin(o_row)
    col_rt, col_ct = split_origin(o_col)
    col_rt = ctx.scaled(b, col_rt, esize)
    col_ct *= esize
    for acc in fragment_accesses(op):
        (br, bc), deltas = fit_bit_linear(list(acc.lanes))
        row_deltas, col_deltas = [d[0] for d in deltas], [d[1] for d in deltas]
        lane_rows = [r - br for r, _ in acc.lanes]
        lane_cols = [c - bc for _, c in acc.lanes]
        row = (row_rt, ctx.lane_term(row_deltas), lane_rows, row_ct + br)
        col = (col_rt, ctx.lane_term(col_deltas), lane_cols, col_ct + bc)
        addr, disp = shared_address(b, ctx, tile, op.stage, row, col)
        outs = tuple(frag.regs[(i, j)][r] for (i, j, r) in acc.regs)
        if acc.kind == "ldmatrix":
            spelled = matrix_op("ldmatrix", len(outs), acc.trans).instruction
            atoms = sorted({(i, j) for (i, j, _) in acc.regs})
            b.emit(Instr(spelled, (Vec(outs),), (Addr(addr, disp),),
                         comment=f"{frag.name}: atom{'s' if len(atoms) > 1 else ''} "
                                 + " ".join(f"({i},{j})" for i, j in atoms)))
            ctx.kernel.features.add("ldmatrix")
        else:
            b.emit(Instr("ld.shared.b32", outs, (Addr(addr, disp),)))
    if frag.atom.a_type.name == "tf32" and op.round_tf32:
        # sm_90 rounds to nearest even in one instruction; .rna (ties away) takes three there
        rounding = "rn" if target(ctx.kernel.target).sm >= 90 else "rna"
        ctx.kernel.features.add(f"cvt.{rounding}.tf32")
        for (i, j, r) in register_list(frag):
            v = frag.regs[(i, j)][r]
            b.emit(Instr(f"cvt.{rounding}.tf32.f32", (v,), (v,)))


TF32_MASK = 0xFFFFE000   # the bits tf32 keeps of an f32


def lower_split(b, ctx, op):
    """hi <- tf32(x), lo <- tf32(x - tf32(x)) for every register (x is hi's f32 content).

    IEEE specials: x = +-inf or NaN gives hi = x and a NaN lo (x - x), which the 3xTF32 GEMM
    leaves out with every correction term where the main product is not finite; a finite x
    whose rounding to tf32 overflows (within 2^-11 of the largest f32) is truncated instead,
    and so is its lo (rounded, x - hi could reach 2^128 with hi: the largest f32 times 1 gave
    inf), so hi + lo stays within 2^-21 of x and finite."""
    parts = (op.lo,) + ((op.finite_hi,) if op.finite_hi is not None else ())
    if any(p.tiles != op.hi.tiles or p.operand != op.hi.operand for p in parts):
        raise IRError(f"split: {', '.join(p.name for p in (op.hi,) + parts)} differ in shape")
    ctx.kernel.features.add("cvt.rna.tf32")
    inf = Imm(float("inf"), "f32")
    zero = Imm(0.0, "f32")
    for key, regs in op.hi.regs.items():
        for i, (x, lo) in enumerate(zip(regs, op.lo.regs[key])):
            high = b.op("cvt.rna.tf32.f32", "b32", x)
            overflow = b.op("setp.eq.f32", "pred", b.op("abs.f32", "f32", high), inf)
            b.emit(Instr("and.b32", (high,), (x, Imm(TF32_MASK)), pred=overflow))   # inf stays inf
            rest = b.op("sub.f32", "f32", x, high)
            if op.finite_hi is None:
                b.emit(Instr("cvt.rna.tf32.f32", (lo,), (rest,)))
                b.emit(Instr("and.b32", (lo,), (rest, Imm(TF32_MASK)), pred=overflow))
            else:   # accumulator registers are .f32, which cvt.rna.tf32 cannot write: through a .b32
                low = b.op("cvt.rna.tf32.f32", "b32", rest)
                b.emit(Instr("and.b32", (low,), (rest, Imm(TF32_MASK)), pred=overflow))
                finite = b.op("setp.lt.f32", "pred", b.op("abs.f32", "f32", x), inf)   # (NaN: false)
                b.emit(Instr("selp.b32", (op.finite_hi.regs[key][i],), (high, zero, finite)))
                b.emit(Instr("selp.b32", (lo,), (low, zero, finite)))
            b.emit(Instr("mov.b32", (x,), (high,)))


def lower_mma(b, ctx, op):
    acc, a, bf = op.acc, op.a, op.b
    tm, tn = acc.tiles
    if a.tiles != (tm, 1) or bf.tiles != (1, tn):
        raise IRError(f"mma shapes: acc {acc.tiles}, a {a.tiles}, b {bf.tiles}")
    zero = None
    if not op.accumulate:  # acc = a @ b: every atom reads the same zero registers as its C
        zero = b.op(f"mov.{'f32' if acc.reg_type == 'f32' else 'b32'}", acc.reg_type,
                    Imm(0.0, "f32") if acc.reg_type == "f32" else Imm(0))
    for i in range(tm):
        for j in range(tn):
            d = acc.regs[(i, j)]
            c = d if zero is None else [zero] * len(d)
            b.emit(Instr(acc.atom.instruction, (Vec(tuple(d)),),
                         (Vec(tuple(a.regs[(i, 0)])), Vec(tuple(bf.regs[(0, j)])), Vec(tuple(c)))))
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
