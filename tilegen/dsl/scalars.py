"""Int: a 32-bit unsigned integer of the kernel (a register or a Python int), with the
usual operators. Arithmetic on two Python ints folds at trace time."""
from __future__ import annotations

from ..ir.values import Imm, Value
from .trace import current, fail


def _raw(x):
    if isinstance(x, Int):
        return x.raw
    if isinstance(x, Float):
        fail("expected an integer kernel value (an Int, a size or a Python int), got a Float (an f32 value: "
             "tilegen.dsl.scalar declares f32 parameters, tilegen.dsl.size integer ones)")
    if isinstance(x, bool) or not isinstance(x, int):
        fail(f"expected an integer kernel value, got {type(x).__name__} {x!r}")
    if not 0 <= x < 2 ** 32:
        fail(f"integer {x} does not fit in 32 unsigned bits")
    return x


def _divisor(x, op: str):
    """x as a divisor: a constant 0 is refused here (a runtime divisor is the kernel's to keep
    from 0: div.u32 and rem.u32 by zero give no defined result)."""
    d = _raw(x)
    if isinstance(d, int) and d == 0:
        fail(f"kernel integer {op} 0: the divisor is 0; allowed: an integer from 1, or a runtime Int")
    return d


class Int:
    __slots__ = ("raw",)

    def __init__(self, raw):
        self.raw = raw  # Value or int

    def _b(self):
        return current().builder

    def __add__(self, o): return Int(self._b().add(self.raw, _raw(o)))
    def __radd__(self, o): return Int(self._b().add(_raw(o), self.raw))
    def __sub__(self, o): return Int(self._b().sub(self.raw, _raw(o)))
    def __rsub__(self, o): return Int(self._b().sub(_raw(o), self.raw))
    def __mul__(self, o): return Int(self._b().mul(self.raw, _raw(o)))
    def __rmul__(self, o): return Int(self._b().mul(_raw(o), self.raw))
    def __floordiv__(self, o): return Int(self._b().div(self.raw, _divisor(o, "//")))
    def __rfloordiv__(self, o): return Int(self._b().div(_raw(o), _divisor(self, "//")))
    def __mod__(self, o): return Int(self._b().rem(self.raw, _divisor(o, "%")))
    def __rmod__(self, o): return Int(self._b().rem(_raw(o), _divisor(self, "%")))
    def __and__(self, o): return Int(self._b().and_(self.raw, _raw(o)))
    def __xor__(self, o): return Int(self._b().xor(self.raw, _raw(o)))
    def __rshift__(self, n): return Int(self._b().shr(self.raw, n))
    def __lshift__(self, n): return Int(self._b().shl(self.raw, n))

    def __truediv__(self, o):
        fail("kernel integers divide with // (and %): / would make a float")

    __rtruediv__ = __truediv__

    def _compare(self, other):
        if not isinstance(other, (Int, int)) or isinstance(other, bool):
            return NotImplemented   # (the other side may compare: a Coord of tilegen.dsl.mask)
        fail("comparing kernel integers gives a value known only on the GPU; Python if/while cannot "
             "branch on it: use tilegen.dsl.range for loops, tilegen.dsl.minimum for bounds, and "
             "tilegen.dsl.lt / le / gt / ge / eq / ne in `with tilegen.dsl.if_(...)`")

    __lt__ = __le__ = __gt__ = __ge__ = _compare

    def _equal(self, other, equal: bool):
        """== and != of two constants fold; of a runtime value they are refused (Python's own
        identity test would answer at trace time, silently: `if kt == 0` in a tilegen.dsl.range
        loop would never be taken)."""
        if not isinstance(other, (Int, int)) or isinstance(other, bool):
            return NotImplemented
        a, b = self.raw, other.raw if isinstance(other, Int) else other
        if isinstance(a, int) and isinstance(b, int):
            return (a == b) == equal
        fail(f"`{'==' if equal else '!='}` on a kernel integer gives a value known only on the GPU; Python if/while "
             f"cannot branch on it: use tilegen.dsl.{'eq' if equal else 'ne'}(a, b) in `with tilegen.dsl.if_(...)`")

    def __eq__(self, other): return self._equal(other, True)
    def __ne__(self, other): return self._equal(other, False)
    __hash__ = object.__hash__   # (identity, as before: an Int is a value of the trace)

    def __bool__(self):
        fail("a kernel integer has no value at trace time: use tilegen.dsl.range for loops over it, "
             "not Python if/while")

    def __index__(self):
        if isinstance(self.raw, int):
            return self.raw
        fail("a runtime kernel integer cannot be used where Python needs a constant (Python's range() unrolls at "
             "trace time: a loop over a runtime count is tilegen.dsl.range(...))")

    def __repr__(self):
        return f"Int({self.raw!r})"


def wrap(x):
    return x if isinstance(x, Int) else Int(_raw(x))


def raw(x):
    """The IR operand of an Int or int."""
    return _raw(x)


def is_value(x) -> bool:
    return isinstance(x, Int) and isinstance(x.raw, Value)


class Pred:
    """A condition known on the GPU (tilegen.dsl.le(a, b) ...), for tilegen.dsl.if_; combine with &
    and |."""

    __slots__ = ("raw",)

    def __init__(self, raw):
        self.raw = raw  # a pred Value, or a Python bool when both sides were constants

    def _combine(self, other, op: str):
        if not isinstance(other, Pred):
            fail("conditions combine only with other conditions (tilegen.dsl.le, tilegen.dsl.lt, ...)")
        if isinstance(self.raw, bool) and isinstance(other.raw, bool):
            return Pred(self.raw and other.raw if op == "and" else self.raw or other.raw)
        if isinstance(self.raw, bool) or isinstance(other.raw, bool):
            const, var = (self.raw, other.raw) if isinstance(self.raw, bool) else (other.raw, self.raw)
            if op == "and":
                return Pred(var) if const else Pred(False)
            return Pred(True) if const else Pred(var)
        return Pred(current().builder.op(f"{op}.pred", "pred", self.raw, other.raw))

    def __and__(self, other):
        return self._combine(other, "and")

    def __or__(self, other):
        return self._combine(other, "or")

    def __bool__(self):
        fail("a kernel condition has no value at trace time: use `with tilegen.dsl.if_(cond):`, not Python if, "
             "and combine conditions with & and |, not Python's and / or")


class Float:
    """An f32 kernel parameter (alpha, beta), a value read where it is used (tilegen.dsl.device_scalar:
    `make` emits it at each use, in the code that uses it), or a product of them (`*`, itself
    made where used when a factor is). Only passed to primitives that take it."""

    __slots__ = ("_raw", "_make")

    def __init__(self, raw: Value = None, make=None):
        self._raw, self._make = raw, make

    @property
    def raw(self) -> Value:
        return self._raw if self._make is None else self._make()

    def _with(self, other, opcode: str, swap: bool = False) -> "Float":
        """self (op) other, other a Float or a Python number (an f32 immediate)."""
        if isinstance(other, bool) or not isinstance(other, (Float, int, float)):
            fail(f"a Float combines with another Float or a Python number, not {type(other).__name__}")
        if not isinstance(other, Float):
            other = Float(Imm(float(other), "f32"))
        a, b = (other, self) if swap else (self, other)
        if self._make is None and other._make is None:
            return Float(current().builder.op(opcode, "f32", a.raw, b.raw))
        return Float(make=lambda: current().builder.op(opcode, "f32", a.raw, b.raw))

    def __mul__(self, other): return self._with(other, "mul.f32")
    def __rmul__(self, other): return self._with(other, "mul.f32", swap=True)
    def __add__(self, other): return self._with(other, "add.f32")
    def __radd__(self, other): return self._with(other, "add.f32", swap=True)
    def __sub__(self, other): return self._with(other, "sub.f32")
    def __rsub__(self, other): return self._with(other, "sub.f32", swap=True)
    def __neg__(self): return self._with(-1.0, "mul.f32")
