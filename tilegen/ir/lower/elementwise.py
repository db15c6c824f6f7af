"""Arithmetic on accumulator fragments, as f32 instructions: elementwise ops, per-row
reductions, coordinate masks, and the register-for-register conversion of an
accumulator into an A operand.

Where each value sits comes from tilegen.arch's fragment maps, fit to the lane bits
(lanes.py), never from formulas written here:
- accumulator_layout(): for every accumulator register, which of the lane's rows it
  belongs to (its "row slot") and the lane bits along which the lanes sharing a row differ
  (the xor masks of the shfl.sync.bfly reduction: 1 and 2 for m16n8 atoms, the 4 lanes
  of a quad);
- operand_plan(): for every register of an A fragment, the two accumulator registers of
  the same lane that hold its elements (for m16n8k16 with f32 accumulators: A register 0
  is C atom 2j registers (0, 1), A register 1 is C atom 2j registers (2, 3), A registers 2
  and 3 the same of C atom 2j+1), or an error naming the lane that would need a shuffle.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ...arch.mma import MMA_ATOMS, MmaAtom
from ...errors import IRError
from .. import tile as T
from ..instr import Instr
from ..values import Imm, Value
from .lanes import LANE_BITS, fit_bit_linear

LOG2E = 1.4426950408889634
FULL_WARP = 0xFFFFFFFF
# max.NaN: a NaN on either side is the result, as numpy's maximum and max (plain max.f32 drops it)
_BINARY = {"add": "add.f32", "sub": "sub.f32", "mul": "mul.f32", "div": "div.rn.f32", "max": "max.NaN.f32"}
_REDUCE = {"max": "max.NaN.f32", "sum": "add.f32"}
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


@dataclass(frozen=True)
class AccumulatorLayout:
    """Row structure of an f32 accumulator atom, from its fragment map."""

    slot: tuple         # per register: index into row_slots(atom)
    row_base: tuple     # per register: lane 0's row
    col_base: tuple     # per register: lane 0's column
    row_deltas: tuple   # per lane bit: how much the row grows (the same for every register)
    col_deltas: tuple   # per lane bit: how much the column grows
    shuffle_masks: tuple  # xor lane masks joining the lanes that share a row


@lru_cache(maxsize=None)
def _accumulator_layout(name: str) -> AccumulatorLayout:
    atom = MMA_ATOMS[name]
    cmap = atom.c
    if cmap.elems != 1:
        raise ValueError(f"{name}: fragment arithmetic needs an f32 accumulator (one element per register)")
    slots = T.row_slots(atom)
    fits = [fit_bit_linear([cmap.coord(lane, r, 0) for lane in range(32)]) for r in range(cmap.regs)]
    deltas = fits[0][1]
    if any(d != deltas for _, d in fits):
        raise ValueError(f"{name}: the lanes' coordinates differ in form between registers")
    row_deltas = tuple(d[0] for d in deltas)
    col_deltas = tuple(d[1] for d in deltas)
    masks = tuple(1 << bit for bit in range(LANE_BITS) if row_deltas[bit] == 0)
    # The lanes holding one row must be exactly the lanes the masks reach.
    for lane in range(32):
        same_row = {other for other in range(32) if cmap.coord(other, 0, 0)[0] == cmap.coord(lane, 0, 0)[0]}
        reach = {lane}
        for m in masks:
            reach |= {x ^ m for x in reach}
        if same_row != reach:
            raise ValueError(f"{name}: the lanes sharing a row with lane {lane} are not a xor group")
    return AccumulatorLayout(
        slot=tuple(slots.index(base[0]) for base, _ in fits),
        row_base=tuple(base[0] for base, _ in fits),
        col_base=tuple(base[1] for base, _ in fits),
        row_deltas=row_deltas, col_deltas=col_deltas, shuffle_masks=masks)


def accumulator_layout(atom: MmaAtom) -> AccumulatorLayout:
    """Raises ValueError for accumulators fragment arithmetic cannot handle (f16x2)."""
    return _accumulator_layout(atom.name)


@lru_cache(maxsize=None)
def _operand_plan(c_name: str, a_name: str) -> tuple:
    c_atom, a_atom = MMA_ATOMS[c_name], MMA_ATOMS[a_name]
    cmap, amap = c_atom.c, a_atom.a
    if cmap.elems != 1:
        raise ValueError(f"{c_name}: the accumulator must be f32")
    if a_atom.a_type.bits != 16:
        raise ValueError(f"{a_name}: only 16-bit A operands (f16, bf16) can be made from an accumulator "
                         f"by packing; {a_atom.a_type.name} cannot")
    if a_atom.m != c_atom.m or a_atom.k % c_atom.n:
        raise ValueError(f"{a_name} (m{a_atom.m}, k{a_atom.k}) does not tile {c_name}'s {c_atom.m}x{c_atom.n} atoms")
    owners = cmap.owners()
    plan = []
    for r in range(amap.regs):
        parts = []
        for e in range(amap.elems):
            sources = set()
            for lane in range(32):
                row, k = amap.coord(lane, r, e)
                src_lane, src_reg, _ = owners[(row, k % c_atom.n)]
                if src_lane != lane:
                    raise ValueError(f"{a_name}: A register {r} element {e} of lane {lane} (row {row}, k {k}) "
                                     f"is held by lane {src_lane} of the accumulator: it would need a shuffle")
                sources.add((k // c_atom.n, src_reg))
            if len(sources) != 1:
                raise ValueError(f"{a_name}: A register {r} element {e} comes from different accumulator "
                                 f"registers in different lanes: {sorted(sources)}")
            parts.append(sources.pop())
        plan.append(tuple(parts))
    return tuple(plan)


def operand_plan(c_atom: MmaAtom, a_atom: MmaAtom) -> tuple:
    """plan[r] = ((n-atom offset, C register) of element 0, (...) of element 1) for each
    register r of a_atom's A fragment made from c_atom accumulators. Raises ValueError
    when the conversion is not lane-local."""
    return _operand_plan(c_atom.name, a_atom.name)


# -- Elementwise ------------------------------------------------------------------------------
def _elements(out):
    """(key, register) of every element of a Fragment or RowVector."""
    if isinstance(out, T.Fragment):
        tm, tn = out.tiles
        return [((i, j, r), out.regs[(i, j)][r]) for i in range(tm) for j in range(tn)
                for r in range(out.map.regs)]
    return [((i, s), v) for (i, s), v in sorted(out.regs.items())]


def _reader(x, out):
    """key -> operand for x in an op writing `out`."""
    if isinstance(x, T.Fragment):
        return lambda key: x.regs[key[:2]][key[2]]
    if isinstance(x, T.RowVector):
        if isinstance(out, T.RowVector):
            return lambda key: x.regs[key]
        slot = accumulator_layout(out.atom).slot
        return lambda key: x.regs[(key[0], slot[key[2]])]
    if isinstance(x, Value):
        return lambda key: x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        imm = Imm(float(x), "f32")
        return lambda key: imm
    raise IRError(f"elementwise operand {x!r}")


def lower_elementwise(b, ctx, op):
    x = _reader(op.x, op.out)
    y = _reader(op.y, op.out) if op.y is not None else None
    for key, reg in _elements(op.out):
        if op.fn == "copy":
            b.emit(Instr("mov.f32", (reg,), (x(key),)))
        elif op.fn == "exp2":
            b.emit(Instr("ex2.approx.ftz.f32", (reg,), (x(key),)))
        elif op.fn == "exp":  # e^x = 2^(x log2 e)
            t = b.op("mul.f32", "f32", x(key), Imm(LOG2E, "f32"))
            b.emit(Instr("ex2.approx.ftz.f32", (reg,), (t,)))
        elif op.fn in _BINARY:
            b.emit(Instr(_BINARY[op.fn], (reg,), (x(key), y(key))))
        elif op.fn == "add_if_finite":  # x + y, or x itself where x is inf or NaN
            total = b.op("add.f32", "f32", x(key), y(key))
            finite = b.op("setp.lt.f32", "pred", b.op("abs.f32", "f32", x(key)), Imm(float("inf"), "f32"))
            b.emit(Instr("selp.f32", (reg,), (total, x(key), finite)))
        else:
            raise IRError(f"no lowering for elementwise {op.fn!r}")


# -- RowReduce --------------------------------------------------------------------------------
def lower_row_reduce(b, ctx, op):
    src, out = op.src, op.out
    lay = accumulator_layout(src.atom)
    opcode = _REDUCE[op.fn]
    tm, tn = src.tiles
    for (i, s), dst in sorted(out.regs.items()):
        values = [src.regs[(i, j)][r] for j in range(tn) for r in range(src.map.regs) if lay.slot[r] == s]
        # A balanced tree: shorter dependency chains, and sums that round more evenly.
        while len(values) > 1:
            values = [b.op(opcode, "f32", values[k], values[k + 1]) if k + 1 < len(values) else values[k]
                      for k in range(0, len(values), 2)]
        acc = values[0]
        for mask in lay.shuffle_masks:  # the other lanes holding this row
            other = b.op("shfl.sync.bfly.b32", "f32", acc, Imm(mask), Imm(31), Imm(FULL_WARP))
            acc = b.op(opcode, "f32", acc, other)
        b.emit(Instr("mov.f32", (dst,), (acc,)))


# -- MaskFragment -----------------------------------------------------------------------------
def _uses(cond) -> set:
    if isinstance(cond, T.MaskLogic):
        return set().union(*(_uses(a) for a in cond.args))
    return {t for _, t in cond.lhs.terms + cond.rhs.terms if t in ("row", "col")}


def _side(b, terms, row, col):
    total = 0
    for t in terms:
        v = row if t == "row" else col if t == "col" else t
        total = b.add(total, v)
    return total


def _predicate(b, cond, row, col):
    if isinstance(cond, T.MaskLogic):
        args = [_predicate(b, a, row, col) for a in cond.args]
        if cond.op == "not":
            return b.op("not.pred", "pred", args[0])
        p = args[0]
        for q in args[1:]:
            p = b.op(f"{cond.op}.pred", "pred", p, q)
        return p
    # Move negative terms across, so each side is a sum: lhs+ + rhs- REL rhs+ + lhs-.
    lhs = [t for s, t in cond.lhs.terms if s > 0] + [t for s, t in cond.rhs.terms if s < 0]
    rhs = [t for s, t in cond.rhs.terms if s > 0] + [t for s, t in cond.lhs.terms if s < 0]
    a, c = _side(b, lhs, row, col), _side(b, rhs, row, col)
    rel = cond.rel
    if isinstance(a, int):  # setp wants a register first
        a, c, rel = c, a, _FLIP[rel]
    if isinstance(a, int):
        raise IRError("mask condition without a coordinate")
    return b.cmp(rel, a, c, signed=True)


def lower_mask(b, ctx, op):
    src, out = op.src, op.out
    lay = accumulator_layout(src.atom)
    atom = src.atom
    uses = _uses(op.cond)
    row_term = ctx.lane_term(lay.row_deltas) if "row" in uses else 0
    col_term = ctx.lane_term(lay.col_deltas) if "col" in uses else 0
    rows, cols, preds = {}, {}, {}
    value = Imm(float(op.value), "f32")
    tm, tn = src.tiles
    for i in range(tm):
        for j in range(tn):
            for r in range(src.map.regs):
                rk = (i, lay.row_base[r]) if "row" in uses else None
                ck = (j, lay.col_base[r]) if "col" in uses else None
                if rk is not None and rk not in rows:
                    rows[rk] = b.add(b.add(op.row0, atom.m * i + lay.row_base[r]), row_term)
                if ck is not None and ck not in cols:
                    cols[ck] = b.add(b.add(op.col0, atom.n * j + lay.col_base[r]), col_term)
                pk = (rk, ck)
                if pk not in preds:
                    preds[pk] = _predicate(b, op.cond, rows.get(rk), cols.get(ck))
                b.emit(Instr("selp.f32", (out.regs[(i, j)][r],), (value, src.regs[(i, j)][r], preds[pk])))


# -- FragmentToOperand ------------------------------------------------------------------------
def lower_to_operand(b, ctx, op):
    src, dst = op.src, op.dst
    plan = operand_plan(src.atom, dst.atom)
    j0 = op.col0 // src.atom.n
    pack = f"cvt.rn.{dst.atom.a_type.name}x2.f32"
    for i in range(dst.tiles[0]):
        for r, ((jlo, rlo), (jhi, rhi)) in enumerate(plan):
            lo = src.regs[(i, j0 + jlo)][rlo]
            hi = src.regs[(i, j0 + jhi)][rhi]
            b.emit(Instr(pack, (dst.regs[(i, 0)][r],), (hi, lo)))  # the first source fills the high half
