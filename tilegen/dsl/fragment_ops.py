"""Arithmetic on accumulator fragments: what a softmax or an attention kernel needs after
its mma.

Values:
- an accumulator fragment (operand "C" with f32 registers): one value per element;
- a RowVector: one value per row of such a fragment (`row_max`, `row_sum`, `row_vector`),
  kept in registers by the lanes that own the row; it broadcasts along the columns when
  combined with a fragment;
- scalars: Python numbers (folded into the instructions) and tilegen.dsl.Float parameters.

Every op returns a new fragment or row vector (fresh registers), or writes `out=` when
given: state that lives across tilegen.dsl.range iterations (a running max, a running sum, an
output accumulator) is updated through `out=` or `assign`, as the GEMM updates `acc`.

    s = tg.mul(acc, scale)                                      # scale by a Float parameter
    s = tg.mask(s, m0, 0, lambda r, c: c >= N, float("-inf"))  # columns past N drop out
    p = tg.exp(tg.sub(s, tg.row_max(s)))                        # row-wise, broadcast
    out = tg.div(p, tg.row_sum(p))

Row reductions cover the fragment's own columns: the full rows of the CTA tile when one
warp owns whole rows (warps stacked along M only). Warps that split a row along N each get
their own partial result; combining them is up to the kernel.
"""
from __future__ import annotations

import math

from ..arch.mma import MmaAtom, mma_atom
from ..ir import tile as T
from ..ir.lower.elementwise import accumulator_layout, operand_plan
from ..ir.values import Imm
from .objects import OPERATORS, Arithmetic, Fragment
from .primitives import tile_op
from .scalars import Float, Int, raw, wrap
from .trace import current, fail, made

LOG2E = 1.4426950408889634


class RowVector(Arithmetic):
    """One f32 value per row of an accumulator fragment (see the module docstring)."""

    def __init__(self, ir: T.RowVector):
        self.ir = ir

    @property
    def atom(self):
        return self.ir.atom

    @property
    def rows(self) -> int:
        return self.ir.tm * self.ir.atom.m

    def __bool__(self):
        fail("a row vector has no value at trace time")

    def __repr__(self):
        return f"RowVector({self.ir.name}, {self.rows} rows)"


# -- argument checks --------------------------------------------------------------------------
def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_accumulator(f: Fragment, fn: str):
    if f.operand != "C":
        fail(f"{fn}: takes accumulator fragments (operand 'C'); {f.ir.name} is an {f.operand} fragment")
    if f.ir.reg_type != "f32":
        fail(f"{fn}: {f.ir.name} accumulates in {f.atom.acc_type.name}; fragment arithmetic needs an f32 "
             f"accumulator (atoms ending in .f32)")


def _operand(x, fn: str):
    """The IR form of one operand."""
    if isinstance(x, Fragment):
        _check_accumulator(x, fn)
        return x.ir
    if isinstance(x, RowVector):
        return x.ir
    if isinstance(x, Float):
        return x.raw
    if _is_number(x):
        return float(x)
    fail(f"{fn}: expected an accumulator fragment, a row vector, a number or a tilegen.dsl.Float parameter, "
         f"got {type(x).__name__} {x!r}")


def _shape(fn: str, args):
    """The fragment or row vector that gives the result its shape (None: all scalars)."""
    frags = [a for a in args if isinstance(a, Fragment)]
    rows = [a for a in args if isinstance(a, RowVector)]
    for a in args:
        _operand(a, fn)
    if frags:
        f = frags[0]
        for g in frags[1:]:
            if g.atom is not f.atom or g.tiles != f.tiles:
                fail(f"{fn}: fragments of different shapes: {f.ir.name} is {f.tiles} atoms of {f.atom}, "
                     f"{g.ir.name} {g.tiles} of {g.atom}")
        for r in rows:
            if r.atom is not f.atom or r.ir.tm != f.tiles[0]:
                fail(f"{fn}: row vector {r.ir.name} ({r.rows} rows of {r.atom}) does not match the "
                     f"{f.tiles[0] * f.atom.m} rows of fragment {f.ir.name} ({f.atom})")
        return f
    if rows:
        r = rows[0]
        for s in rows[1:]:
            if s.atom is not r.atom or s.ir.tm != r.ir.tm:
                fail(f"{fn}: row vectors of different shapes: {r.rows} and {s.rows} rows")
        return r
    return None


def _result(shape, out, fn: str, name: str):
    """`out` checked against `shape`, or a new fragment / row vector of that shape."""
    if out is None:
        if isinstance(shape, Fragment):
            return Fragment(made(T.Fragment(name or fn, shape.atom, "C", shape.tiles)))
        return RowVector(made(T.RowVector(name or fn, shape.atom, shape.ir.tm)))
    if isinstance(shape, Fragment):
        if not isinstance(out, Fragment):
            fail(f"{fn}: the result is a fragment; out= must be a fragment of {shape.tiles} atoms, "
                 f"got {type(out).__name__}")
        _check_accumulator(out, fn)
        if out.atom is not shape.atom or out.tiles != shape.tiles:
            fail(f"{fn}: out= is {out.tiles} atoms of {out.atom}, the result {shape.tiles} of {shape.atom}")
    else:
        if not isinstance(out, RowVector):
            fail(f"{fn}: the result is a row vector; out= must be one, got {type(out).__name__}")
        if out.atom is not shape.atom or out.ir.tm != shape.ir.tm:
            fail(f"{fn}: out= has {out.rows} rows, the result {shape.rows}")
    return out


# -- scalars (no fragment involved) -----------------------------------------------------------
def _max_nan(a: float, b: float) -> float:
    """max as numpy's np.maximum and PTX's max.NaN: a NaN on either side is the result."""
    return a if a != a else b if b != b else max(a, b)


_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
         "div": lambda a, b: a / b, "max": _max_nan, "exp": math.exp, "exp2": lambda a: 2.0 ** a}
_SCALAR_OP = {"add": "add.f32", "sub": "sub.f32", "mul": "mul.f32", "div": "div.rn.f32", "max": "max.NaN.f32"}


def _scalar(fn: str, args):
    if all(_is_number(a) for a in args):
        return float(_FOLD[fn](*(float(a) for a in args)))
    b = current().builder
    ops = [a.raw if isinstance(a, Float) else Imm(float(a), "f32") for a in args]
    if fn == "exp":
        ops = [b.op("mul.f32", "f32", ops[0], Imm(LOG2E, "f32"))]
    if fn in ("exp", "exp2"):
        return Float(b.op("ex2.approx.ftz.f32", "f32", ops[0], hint=fn))
    if isinstance(ops[0], Imm):  # keep a register first
        ops[0] = b.op("mov.f32", "f32", ops[0])
    return Float(b.op(_SCALAR_OP[fn], "f32", *ops, hint=fn))


# -- elementwise ------------------------------------------------------------------------------
def _elementwise(fn: str, x, y=None, out=None, name: str = ""):
    args = (x,) if y is None else (x, y)
    shape = _shape(fn, args)
    if shape is None:
        if out is not None:
            fail(f"{fn}: out= needs a fragment or row vector operand")
        return _scalar(fn, args)
    res = _result(shape, out, fn, name)
    if isinstance(res, RowVector) and any(isinstance(a, Fragment) for a in args):
        fail(f"{fn}: a fragment does not fit into a row vector")
    tile_op(T.Elementwise(fn, res.ir, _operand(x, fn), _operand(y, fn) if y is not None else None))
    return res


def add(x, y, *, out=None, name: str = ""):
    """x + y, element by element (a row vector broadcasts along the columns)."""
    return _elementwise("add", x, y, out, name)


def add_if_finite(x, y, *, out=None, name: str = ""):
    """x + y where x is finite, x itself where it is inf or NaN (element by element): adds a
    correction term that means nothing once the main term overflowed (3xTF32)."""
    if not isinstance(x, Fragment):
        fail("add_if_finite: x must be an accumulator fragment")
    return _elementwise("add_if_finite", x, y, out, name)


def sub(x, y, *, out=None, name: str = ""):
    """x - y, element by element (a row vector broadcasts along the columns)."""
    return _elementwise("sub", x, y, out, name)


def mul(x, y, *, out=None, name: str = ""):
    """x * y, element by element (a row vector broadcasts along the columns)."""
    return _elementwise("mul", x, y, out, name)


def div(x, y, *, out=None, name: str = ""):
    """x / y, correctly rounded (div.rn.f32), element by element."""
    return _elementwise("div", x, y, out, name)


def maximum(x, y, *, out=None, name: str = ""):
    """The larger of x and y, element by element, a NaN on either side giving NaN (as numpy's
    np.maximum and torch.maximum); on kernel integers (Int), max.u32."""
    if isinstance(x, Int) or isinstance(y, Int):
        other = y if isinstance(x, Int) else x
        if not (isinstance(other, Int) or isinstance(other, int) and not isinstance(other, bool)):
            fail(f"maximum: a kernel integer (Int) and a {type(other).__name__} do not mix: Ints take Ints and "
                 f"Python ints; fragments and row vectors take numbers and tilegen.dsl.Float values")
        if out is not None:
            fail("maximum: out= is for fragments and row vectors")
        return Int(current().builder.max(raw(x), raw(y)))
    return _elementwise("max", x, y, out, name)


def scale(x, s, *, out=None, name: str = ""):
    """x * s for a scalar s (a number or a tilegen.dsl.Float parameter)."""
    if not (_is_number(s) or isinstance(s, Float)):
        fail(f"scale: the factor must be a number or a tilegen.dsl.Float parameter, got {type(s).__name__}")
    return _elementwise("mul", x, s, out, name or "scaled")


def exp(x, *, out=None, name: str = ""):
    """e^x as ex2.approx.ftz.f32(x * log2(e)): relative error about 2^-22 + |x| 2^-24 (the product's
    rounding grows with |x|: 2e-6 at x = -87), exp(-inf) = 0."""
    return _elementwise("exp", x, None, out, name)


def exp2(x, *, out=None, name: str = ""):
    """2^x (ex2.approx.ftz.f32). Softmax in base 2 folds log2(e) into the scale: one
    multiply per element less than exp."""
    return _elementwise("exp2", x, None, out, name)


def assign(dst, src):
    """dst = src: copy a fragment, a row vector (broadcast into a fragment's rows) or a
    scalar into the registers of dst, e.g. to update loop-carried state."""
    if not isinstance(dst, (Fragment, RowVector)):
        fail(f"assign: the destination must be a fragment or a row vector, got {type(dst).__name__}")
    shape = _shape("assign", (dst, src))
    if isinstance(src, Fragment) and isinstance(dst, RowVector):
        fail("assign: a fragment does not fit into a row vector")
    _result(shape if isinstance(dst, Fragment) else dst, dst, "assign", "")
    tile_op(T.Elementwise("copy", dst.ir, _operand(src, "assign")))
    return dst


def row_vector(like, value: float = 0.0, *, name: str = "") -> RowVector:
    """A row vector for the rows of accumulator fragment `like`, every row set to `value`
    (a number or a tilegen.dsl.Float): the start of a running max or sum."""
    if isinstance(like, Fragment):
        _check_accumulator(like, "row_vector")
        atom, tm = like.atom, like.tiles[0]
    elif isinstance(like, RowVector):
        atom, tm = like.atom, like.ir.tm
    else:
        fail(f"row_vector(like, value): like must be an accumulator fragment, got {type(like).__name__}")
    if not (_is_number(value) or isinstance(value, Float)):
        fail(f"row_vector: value must be a number or a tilegen.dsl.Float, got {type(value).__name__}")
    rv = RowVector(made(T.RowVector(name or "rows", atom, tm)))
    tile_op(T.Elementwise("copy", rv.ir, _operand(value, "row_vector")))
    return rv


# -- row reductions ---------------------------------------------------------------------------
def _reduce(fn: str, x, out, name):
    if not isinstance(x, Fragment):
        fail(f"row_{fn}: takes an accumulator fragment, got {type(x).__name__}")
    _check_accumulator(x, f"row_{fn}")

    try:
        accumulator_layout(x.atom)
    except ValueError as e:
        fail(f"row_{fn}: {e}")
    res = _result(RowVector(T.RowVector("shape", x.atom, x.tiles[0])), out, f"row_{fn}", name or f"row_{fn}")
    tile_op(T.RowReduce(fn, res.ir, x.ir))
    return res


def row_max(x, *, out=None, name: str = "") -> RowVector:
    """The largest element of each row of x, over all of x's columns (NaN where the row holds
    one, as numpy's max)."""
    return _reduce("max", x, out, name)


def row_sum(x, *, out=None, name: str = "") -> RowVector:
    """The sum of each row of x, over all of x's columns."""
    return _reduce("sum", x, out, name)


# -- masks ------------------------------------------------------------------------------------
class Coord:
    """An element coordinate (r or c) in a mask condition, plus or minus kernel integers.
    Compare with <, <=, >, >=, ==, != (coordinate on the left of a kernel Int); combine
    conditions with &, | and ~."""

    __slots__ = ("terms",)
    __hash__ = None

    def __init__(self, terms: tuple):
        self.terms = terms

    @staticmethod
    def _lin(o) -> tuple:
        if isinstance(o, Coord):
            return o.terms
        if isinstance(o, Int) or (isinstance(o, int) and not isinstance(o, bool)):
            return ((1, raw(o)),)
        fail(f"mask: a coordinate combines with kernel integers and ints, not {type(o).__name__} {o!r}")

    @staticmethod
    def _neg(terms) -> tuple:
        return tuple((-s, t) for s, t in terms)

    def __add__(self, o): return Coord(self.terms + self._lin(o))
    def __radd__(self, o): return Coord(self._lin(o) + self.terms)
    def __sub__(self, o): return Coord(self.terms + self._neg(self._lin(o)))
    def __rsub__(self, o): return Coord(self._lin(o) + self._neg(self.terms))
    def __neg__(self): return Coord(self._neg(self.terms))

    def _precedence(self, o):
        fail("mask: & and | bind tighter than comparisons in Python, so `c >= 8 & r < 4` reads "
             "`c >= (8 & r) < 4`: put each comparison in parentheses, (c >= 8) & (r < 4)")

    __and__ = __rand__ = __or__ = __ror__ = _precedence

    def _cmp(self, rel, o):
        return Cond(T.MaskCompare(rel, T.MaskLinear(self.terms), T.MaskLinear(self._lin(o))))

    def __lt__(self, o): return self._cmp("lt", o)
    def __le__(self, o): return self._cmp("le", o)
    def __gt__(self, o): return self._cmp("gt", o)
    def __ge__(self, o): return self._cmp("ge", o)
    def __eq__(self, o): return self._cmp("eq", o)  # noqa: E704
    def __ne__(self, o): return self._cmp("ne", o)  # noqa: E704

    def __bool__(self):
        fail("mask: a coordinate has no value at trace time; compare it, e.g. lambda r, c: c >= N")


class Cond:
    """A condition on element coordinates; & (and), | (or), ~ (not)."""

    __slots__ = ("ir",)

    def __init__(self, ir):
        self.ir = ir

    @staticmethod
    def _other(o):
        if not isinstance(o, Cond):
            fail(f"mask: & and | combine conditions on (r, c), not {type(o).__name__} {o!r}")
        return o.ir

    def __and__(self, o): return Cond(T.MaskLogic("and", (self.ir, self._other(o))))
    def __or__(self, o): return Cond(T.MaskLogic("or", (self.ir, self._other(o))))
    def __rand__(self, o): return Cond(T.MaskLogic("and", (self._other(o), self.ir)))
    def __ror__(self, o): return Cond(T.MaskLogic("or", (self._other(o), self.ir)))
    def __invert__(self): return Cond(T.MaskLogic("not", (self.ir,)))

    def __bool__(self):
        fail("mask: combine conditions with & and | (with parentheses), not `and`/`or`, and write "
             "a < c < b as (a < c) & (c < b)")


def _mentions_coordinate(c) -> bool:
    if isinstance(c, T.MaskLogic):
        return any(_mentions_coordinate(a) for a in c.args)
    return any(t in ("row", "col") for _, t in c.lhs.terms + c.rhs.terms if isinstance(t, str))


def mask(x, row0, col0, where, value: float, *, out=None, name: str = ""):
    """Elements of x whose coordinates (r, c) satisfy `where(r, c)` become `value`; the
    others keep x's value. (r, c) = (row0, col0) + the element's place in the fragment,
    so pass the fragment's origin in whatever frame `where` speaks (e.g. the output's
    rows and columns):

        s = tg.mask(s, q0 + wm, k0, lambda r, c: (c > r) | (c >= S), float("-inf"))
    """
    if not isinstance(x, Fragment):
        fail(f"mask: takes an accumulator fragment, got {type(x).__name__}")
    _check_accumulator(x, "mask")
    if not callable(where):
        fail("mask: where must be a function of the coordinates, e.g. lambda r, c: c >= N")
    if not _is_number(value):
        fail(f"mask: value must be a number (e.g. float('-inf')), got {type(value).__name__}")
    cond = where(Coord(((1, "row"),)), Coord(((1, "col"),)))
    if not isinstance(cond, Cond):
        fail(f"mask: where(r, c) must return a comparison of the coordinates, e.g. c >= N; "
             f"got {type(cond).__name__} {cond!r}")
    if not _mentions_coordinate(cond.ir):
        fail("mask: the condition does not depend on the coordinates r, c")
    r0, c0 = raw(wrap(row0)), raw(wrap(col0))
    res = _result(x, out, "mask", name or "masked")
    tile_op(T.MaskFragment(res.ir, x.ir, r0, c0, cond.ir, float(value)))
    return res


# -- accumulator -> operand -------------------------------------------------------------------
def to_operand(x, operand: str = "A", *, atom=None, name: str = "") -> list:
    """The accumulator x as A operands of `atom` (default: x's own atom), one A fragment
    per k-step of its columns: element (r, c) of x is element (r, c mod k) of fragment
    c // k, rounded to the atom's 16-bit type. For m16n8k16 with f32 accumulators this is
    register for register within each lane (P = softmax(S) feeding P @ V in attention)."""
    if not isinstance(x, Fragment):
        fail(f"to_operand: takes an accumulator fragment, got {type(x).__name__}")
    _check_accumulator(x, "to_operand")
    if operand != "A":
        fail(f"to_operand: operand={operand!r}; allowed: 'A' (a B operand would need the transpose)")
    if atom is None:
        atom = x.atom
    elif not isinstance(atom, MmaAtom):
        try:
            atom = mma_atom(atom)
        except ValueError as e:
            fail(str(e))

    try:
        operand_plan(x.atom, atom)
    except ValueError as e:
        fail(f"to_operand: {e}")
    cols = x.tiles[1] * x.atom.n
    if cols % atom.k:
        fail(f"to_operand: {cols} columns do not split into k-steps of {atom.k}")
    out = []
    for kk in range(cols // atom.k):
        frag = Fragment(made(T.Fragment(f"{name or x.ir.name + '_a'}{kk}", atom, "A", (x.tiles[0], 1))))
        tile_op(T.FragmentToOperand(frag.ir, x.ir, kk * atom.k))
        out.append(frag)
    return out



OPERATORS.update(add=add, sub=sub, mul=mul, div=div, scale=scale)   # (Fragment's and RowVector's operators)

__all__ = ["RowVector", "Coord", "Cond", "add", "add_if_finite", "sub", "mul", "div", "maximum", "scale", "exp", "exp2",
           "assign", "row_vector", "row_max", "row_sum", "mask", "to_operand"]
