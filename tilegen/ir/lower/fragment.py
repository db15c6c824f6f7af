"""LoadFragment -> ldmatrix or ld.shared.b32, with tf32 rounding; Mma -> mma.sync;
FillFragment -> mov.

The method follows from the data: a register whose elements sit in one 16-byte piece of a
shared row (K-major data of any width) comes from a non-transposing ldmatrix; a register
of two 16-bit elements from consecutive shared rows (MN-major f16/bf16) from ldmatrix
.trans; 32-bit elements of MN-major data from single ld.shared.b32. Every ldmatrix plan is
checked against the ldmatrix tables of tilegen.arch before any PTX is written.
"""
from __future__ import annotations

from ...arch.ldmatrix import matrix_op
from ...errors import IRError
from ..instr import Instr
from ..values import Addr, Imm, Vec
from .lanes import fit_bit_linear
from .smem import emit_offset, stage_base


def _stored_bytes(op, i, j, lane, r, e):
    """(stored row, stored byte column) of element e of register r of atom (i, j), relative
    to the fragment origin."""
    frag = op.frag
    esize = op.src.dtype.bytes
    row, col = frag.map.coord(lane, r, e)
    if frag.operand == "A":
        m, k = 16 * i + row, col
        sr, sc = (m, k) if op.k_major else (k, m)
    else:
        k, n = row, 8 * j + col
        sr, sc = (n, k) if op.k_major else (k, n)
    return sr, sc * esize


def _register_list(frag):
    tm, tn = frag.tiles
    return [(i, j, r) for i in range(tm) for j in range(tn) for r in range(frag.map.regs)]


def _block_origin(op, i, j, r):
    """The 8-row x 16-byte block of shared memory that register r of atom (i, j) comes from."""
    cells = [_stored_bytes(op, i, j, lane, r, e) for lane in range(32) for e in range(op.frag.map.elems)]
    r0 = min(c[0] for c in cells)
    c0 = min(c[1] for c in cells)
    return r0, c0


def _check_ldmatrix(op, group, origins, trans):
    """The ldmatrix table must deliver exactly the atom's fragment."""
    frag = op.frag
    esize = op.src.dtype.bytes
    table = matrix_op("ldmatrix", len(group), trans).fragment
    for slot, (i, j, r) in enumerate(group):
        for lane in range(32):
            # 16-bit units, low half first, as ldmatrix fills the register ...
            got = []
            for e16 in range(2):
                mrow, mcol = table.coord(lane, slot, e16)
                got.append((origins[slot][0] + mrow - 8 * slot, origins[slot][1] + 2 * mcol))
            # ... and as the atom wants them, element 0 in the low bits.
            want = []
            for e in range(frag.map.elems):
                sr, sc = _stored_bytes(op, i, j, lane, r, e)
                for byte in range(0, max(esize, 2), 2):
                    unit = (sr, sc + byte - (sc + byte) % 2)
                    if unit not in want:
                        want.append(unit)
            if got != want:
                raise IRError(f"{frag.name}: ldmatrix{'.trans' if trans else ''} would not deliver register {r} "
                              f"of atom ({i},{j}) to lane {lane} (gets {sorted(got)}, needs {sorted(want)})")


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
    regs = _register_list(frag)
    if esize == 4 and not op.k_major:
        _lower_scalar_loads(b, ctx, op, regs, base, o_row, o_colb)
    else:
        if esize == 1 and not op.k_major:
            raise IRError(f"{frag.name}: 8-bit operands must be K-major in shared memory")
        _lower_ldmatrix(b, ctx, op, regs, base, o_row, o_colb, trans=(esize == 2 and not op.k_major))
    if frag.atom.a_type.name == "tf32":
        ctx.kernel.features.add("cvt.rna.tf32")
        for (i, j, r) in regs:
            v = frag.regs[(i, j)][r]
            b.emit(Instr("cvt.rna.tf32.f32", (v,), (v,)))


def _lower_ldmatrix(b, ctx, op, regs, base, o_row, o_colb, trans):
    frag = op.frag
    for g0 in range(0, len(regs), 4):
        group = regs[g0:g0 + 4]
        if len(group) == 3:
            raise IRError(f"{frag.name}: {len(regs)} registers do not split into ldmatrix .x1/.x2/.x4")
        origins = [_block_origin(op, i, j, r) for (i, j, r) in group]
        _check_ldmatrix(op, group, origins, trans)
        # Lane l supplies row (l & 7) of matrix l >> 3: a bit-linear function of the lane.
        coords = []
        for lane in range(32):
            slot = (lane >> 3) % len(group)  # .x1/.x2 ignore the upper lanes
            coords.append((origins[slot][0] + (lane & 7), origins[slot][1]))
        (br, bc), deltas = fit_bit_linear(coords)
        lr = ctx.lane_term([d[0] for d in deltas])
        lc = ctx.lane_term([d[1] for d in deltas])
        row = b.add(b.add(o_row, br), lr)
        colb = b.add(b.add(o_colb, bc), lc)
        addr = b.add(base, emit_offset(b, op.src.layout, row, colb))
        outs = tuple(frag.regs[(i, j)][r] for (i, j, r) in group)
        spelled = matrix_op("ldmatrix", len(group), trans).instruction
        b.emit(Instr(spelled, (Vec(outs),), (Addr(addr),),
                     comment=f"{frag.name} regs {g0}..{g0 + len(group) - 1}"))
    ctx.kernel.features.add("ldmatrix")


def _lower_scalar_loads(b, ctx, op, regs, base, o_row, o_colb):
    frag = op.frag
    for (i, j, r) in regs:
        coords = [_stored_bytes(op, i, j, lane, r, 0) for lane in range(32)]
        (br, bc), deltas = fit_bit_linear(coords)
        row = b.add(b.add(o_row, br), ctx.lane_term([d[0] for d in deltas]))
        colb = b.add(b.add(o_colb, bc), ctx.lane_term([d[1] for d in deltas]))
        addr = b.add(base, emit_offset(b, op.src.layout, row, colb))
        b.emit(Instr("ld.shared.b32", (frag.regs[(i, j)][r],), (Addr(addr),)))


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
