"""StoreFragment -> predicated global stores of alpha * acc + beta * C.

beta == 0 must not read C: the output may hold garbage (or NaN poison), and 0 * NaN is NaN.
So C is read only under a predicate that beta != 0."""
from __future__ import annotations

from ...errors import IRError
from ..instr import Instr
from ..values import Addr, Imm, Value
from .lanes import fit_bit_linear



def _to_f32(b, raw: Value, dtype: str) -> Value:
    """A 16-bit value in the low half of a b32 register, widened to f32."""
    if dtype == "f16":
        return b.op("cvt.f32.f16", "f32", raw)
    if dtype == "bf16":  # bf16 is the top half of an f32; cvt.f32.bf16 needs sm_90
        return b.op("mov.b32", "f32", b.shl(raw, 16))
    raise IRError(f"no widening from {dtype}")


def lower_store(b, ctx, op):
    frag, dst = op.frag, op.dst
    if frag.operand != "C":
        raise IRError(f"only accumulator fragments can be stored, not operand {frag.operand}")
    out = dst.dtype.name
    osize = dst.dtype.bytes
    cmap = frag.map
    ld_bytes = ctx.ld_bytes(dst)
    use_beta = None
    if op.beta is not None:
        use_beta = b.op("setp.neu.f32", "pred", op.beta, Imm(0.0, "f32"))
    rows_cache: dict = {}
    cols_cache: dict = {}
    tm, tn = frag.tiles
    for i in range(tm):
        for j in range(tn):
            b.comment(f"store {frag.name} atom ({i},{j})")
            for r in range(cmap.regs):
                for e in range(cmap.elems):
                    (br, bc), deltas = fit_bit_linear([cmap.coord(lane, r, e) for lane in range(32)])
                    rkey = (i, br, tuple(d[0] for d in deltas))
                    if rkey not in rows_cache:
                        row = b.add(b.add(op.row0, 16 * i + br), ctx.lane_term(rkey[2]))
                        rows_cache[rkey] = (row, b.cmp("lt", row, dst.rows), b.wide_mad(row, ld_bytes, dst.ptr))
                    ckey = (j, bc, tuple(d[1] for d in deltas))
                    if ckey not in cols_cache:
                        col = b.add(b.add(op.col0, 8 * j + bc), ctx.lane_term(ckey[2]))
                        cols_cache[ckey] = (col, b.cmp("lt", col, dst.cols))
                    _, row_ok, row_addr = rows_cache[rkey]
                    _, col_ok = cols_cache[ckey]
                    inside = b.pred_and(row_ok, col_ok)
                    addr = b.wide_mad(cols_cache[ckey][0], osize, row_addr)
                    value = _accumulator_value(b, frag, frag.regs[(i, j)][r], e)
                    if op.alpha is not None:
                        value = b.op("mul.f32", "f32", value, op.alpha)
                    if use_beta is not None:
                        value = _add_beta_c(b, value, op.beta, use_beta, inside, addr, out)
                    _store(b, value, addr, inside, out)


def _accumulator_value(b, frag, reg: Value, e: int) -> Value:
    if frag.reg_type == "f32":
        return reg
    half = reg if e == 0 else b.shr(reg, 16)
    return b.op("cvt.f32.f16", "f32", half)


def _add_beta_c(b, value, beta, use_beta, inside, addr, out):
    read = b.pred_and(use_beta, inside)
    if out == "f32":
        old = b.op("mov.f32", "f32", Imm(0.0, "f32"))
        b.emit(Instr("ld.global.f32", (old,), (Addr(addr),), pred=read))
    else:
        raw = b.op("mov.b32", "b32", Imm(0))
        b.emit(Instr("ld.global.b16", (raw,), (Addr(addr),), pred=read))
        old = _to_f32(b, raw, out)
    return b.op("fma.rn.f32", "f32", old, beta, value)


def _store(b, value, addr, inside, out):
    if out == "f32":
        b.emit(Instr("st.global.f32", (), (Addr(addr), value), pred=inside))
        return
    if out == "f16":
        packed = b.op("cvt.rn.f16.f32", "b32", value)
    else:  # cvt.rn.bf16.f32 wants a 16-bit register; the x2 form packs into a b32 (low half = value)
        packed = b.op("cvt.rn.bf16x2.f32", "b32", Imm(0.0, "f32"), value)
    b.emit(Instr("st.global.b16", (), (Addr(addr), packed), pred=inside))
