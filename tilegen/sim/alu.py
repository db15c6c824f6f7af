"""Arithmetic, logic, comparison, selection, moves and conversions, vectorised over the
CTA's threads. Each builder decodes one instruction once and returns a closure.

Integer arithmetic wraps like the hardware (numpy unsigned/signed arrays wrap silently);
f32 add/mul round once in float32; fma rounds a*b+c through float64 (the product is exact
there, the sum may double-round in rare ties: documented limit).
"""
from __future__ import annotations

import numpy as np

from . import numerics as nm
from .program import Reg, Vec
from .state import TYPE, Context, per_thread

FLOAT_MODS = {"rn", "ftz", "approx", "full"}
INT_TYPES = {"u16", "s16", "u32", "s32", "u64", "s64", "b16", "b32", "b64"}


def _split(ins):
    parts = ins.opcode.split(".")
    return parts[0], parts[1:-1], parts[-1]


def _need(ctx: Context, ins, cond: bool, what: str):
    if not cond:
        ctx.unsupported(ins, what)


def _check_mods(ctx, ins, mods, allowed):
    bad = [m for m in mods if m not in allowed]
    if bad:
        ctx.unsupported(ins, f"the modifier(s) .{', .'.join(bad)} of {ins.opcode}")


def _n_operands(ctx, ins, n):
    if len(ins.operands) != n:
        ctx.unsupported(ins, f"{ins.opcode} with {len(ins.operands)} operands (expected {n})")


def _unsigned(dt):
    """The unsigned type of dt's width (a dtype) or of that many bytes (an int)."""
    size = dt if isinstance(dt, int) else np.dtype(dt).itemsize
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size])


# ---- two- and three-operand arithmetic --------------------------------------------------------

def _signed_div(a, b):
    # PTX div.s truncates toward zero; numpy floor-divides.
    q = np.abs(a.astype(np.int64)) // np.maximum(np.abs(b.astype(np.int64)), 1)
    return np.where((a < 0) ^ (b < 0), -q, q).astype(a.dtype)


def _signed_rem(a, b):
    return (a.astype(np.int64) - _signed_div(a, b).astype(np.int64) * b.astype(np.int64)).astype(a.dtype)


def _shift_left(a, s, width):
    s = np.asarray(s).astype(a.dtype) if np.ndim(s) else a.dtype.type(s)
    big = s >= width                        # PTX clamps the shift amount to the width
    r = np.left_shift(a, np.where(big, 0, s).astype(a.dtype))
    return np.where(big, a.dtype.type(0), r)


def _shift_right(a, s, width):
    s = np.asarray(s).astype(np.int64)
    big = s >= width
    r = np.right_shift(a, np.where(big, 0, s).astype(a.dtype))
    if a.dtype.kind == "i":
        fill = np.where(a < 0, a.dtype.type(-1), a.dtype.type(0))
    else:
        fill = a.dtype.type(0)
    return np.where(big, fill, r)


def build_binary(ins, ctx: Context):
    """add sub mul div rem min max and or xor shl shr (+ .lo/.hi/.wide)."""
    fam, mods, t = _split(ins)
    _n_operands(ctx, ins, 3)
    d, a, b = ins.operands
    if t == "pred":
        _need(ctx, ins, fam in ("and", "or", "xor"), f"{ins.opcode}")
        fn = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[fam]
        ra, rb, put = ctx.reader(ins, a, np.bool_), ctx.reader(ins, b, np.bool_), ctx.writer(ins, d, np.bool_)
        return lambda: put(fn(ra(), rb()))
    _need(ctx, ins, t in TYPE, f"type .{t}")
    dt = np.dtype(TYPE[t])
    if fam in ("shl", "shr"):
        width = 8 * dt.itemsize
        if t.startswith("b") and fam == "shr":
            dt = _unsigned(dt)
        ra, put = ctx.reader(ins, a, dt), ctx.writer(ins, d, dt)
        rb = ctx.reader(ins, b, np.uint32)
        sh = _shift_left if fam == "shl" else _shift_right
        if not isinstance(b, Reg):
            amount = int(rb())
            if amount < width:
                s = dt.type(amount)
                op = np.left_shift if fam == "shl" else np.right_shift
                return lambda: put(op(ra(), s))
        return lambda: put(sh(ra(), rb(), width))
    if dt.kind == "f":
        nan = fam in ("min", "max") and "NaN" in mods   # .NaN: a NaN operand gives NaN
        _check_mods(ctx, ins, [m for m in mods if not (nan and m == "NaN")], FLOAT_MODS)
        fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "min": np.minimum if nan else np.fmin, "max": np.maximum if nan else np.fmax}.get(fam)
        _need(ctx, ins, fn is not None and t in ("f32", "f64"), ins.opcode)
        ra, rb, put = ctx.reader(ins, a, dt), ctx.reader(ins, b, dt), ctx.writer(ins, d, dt)
        return lambda: put(fn(ra(), rb()))
    if fam == "mul":
        mode = mods[0] if mods else "lo"
        _check_mods(ctx, ins, mods, {"lo", "hi", "wide"})
        ra, rb = ctx.reader(ins, a, dt), ctx.reader(ins, b, dt)
        if mode == "lo":
            put = ctx.writer(ins, d, dt)
            return lambda: put(np.multiply(ra(), rb()))
        wide = np.dtype(np.int64 if dt.kind == "i" else np.uint64)
        _need(ctx, ins, dt.itemsize == 4, f"{ins.opcode} on {t}")
        if mode == "wide":
            put = ctx.writer(ins, d, wide)
            return lambda: put(np.multiply(np.asarray(ra()).astype(wide), np.asarray(rb()).astype(wide)))
        put = ctx.writer(ins, d, dt)
        return lambda: put((np.multiply(np.asarray(ra()).astype(wide), np.asarray(rb()).astype(wide))
                            >> wide.type(32)).astype(dt))
    if fam in ("div", "rem") and dt.kind == "i":
        fn = _signed_div if fam == "div" else _signed_rem
    else:
        fn = {"add": np.add, "sub": np.subtract, "div": np.floor_divide, "rem": np.remainder,
              "min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
              "xor": np.bitwise_xor}.get(fam)
    _need(ctx, ins, fn is not None, ins.opcode)
    _check_mods(ctx, ins, mods, set())
    if fam in ("and", "or", "xor"):
        dt = _unsigned(dt)
    ra, rb, put = ctx.reader(ins, a, dt), ctx.reader(ins, b, dt), ctx.writer(ins, d, dt)
    if fam in ("div", "rem"):
        ones = dt.type(-1) if dt.kind == "i" else ~dt.type(0)

        def run():
            x, y = ra(), rb()
            # Division by zero is undefined in PTX: give all ones instead of a numpy warning.
            put(np.where(y == 0, ones, fn(x, np.where(y == 0, 1, y).astype(dt))).astype(dt))
        return run
    return lambda: put(fn(ra(), rb()))


def build_mad(ins, ctx: Context):
    """mad.lo / mad.wide / mad.hi (integers), mad.rn.f32 (= fma), fma.rn.f32/f64."""
    fam, mods, t = _split(ins)
    _n_operands(ctx, ins, 4)
    d, a, b, c = ins.operands
    dt = np.dtype(TYPE.get(t, np.void))
    if dt.kind == "f":
        _check_mods(ctx, ins, mods, FLOAT_MODS)
        ra, rb, rc = (ctx.reader(ins, x, dt) for x in (a, b, c))
        put = ctx.writer(ins, d, dt)
        if dt == np.float32:
            f64 = np.float64
            return lambda: put((np.asarray(ra(), f64) * np.asarray(rb(), f64)
                                + np.asarray(rc(), f64)).astype(np.float32))
        return lambda: put(ra() * rb() + rc())
    _need(ctx, ins, fam == "mad" and t in INT_TYPES, ins.opcode)
    mode = mods[0] if mods else "lo"
    _check_mods(ctx, ins, mods, {"lo", "hi", "wide"})
    ra, rb = ctx.reader(ins, a, dt), ctx.reader(ins, b, dt)
    if mode == "lo":
        rc, put = ctx.reader(ins, c, dt), ctx.writer(ins, d, dt)
        return lambda: put(np.add(np.multiply(ra(), rb()), rc()))
    wide = np.dtype(np.int64 if dt.kind == "i" else np.uint64)
    if mode == "wide":
        rc, put = ctx.reader(ins, c, wide), ctx.writer(ins, d, wide)
        return lambda: put(np.asarray(ra()).astype(wide) * np.asarray(rb()).astype(wide) + rc())
    rc, put = ctx.reader(ins, c, dt), ctx.writer(ins, d, dt)
    return lambda: put(((np.asarray(ra()).astype(wide) * np.asarray(rb()).astype(wide)) >> wide.type(32))
                       .astype(dt) + rc())


def build_unary(ins, ctx: Context):
    """not, neg, abs, and the approximate float functions ex2/rcp/tanh/sqrt."""
    fam, mods, t = _split(ins)
    _n_operands(ctx, ins, 2)
    d, a = ins.operands
    if fam == "not" and t == "pred":
        ra, put = ctx.reader(ins, a, np.bool_), ctx.writer(ins, d, np.bool_)
        return lambda: put(np.logical_not(ra()))
    _need(ctx, ins, t in TYPE, f"type .{t}")
    dt = np.dtype(TYPE[t])
    if fam == "not":
        dt = _unsigned(dt)
        fn = np.invert
    elif fam == "neg":
        fn = np.negative
    elif fam == "abs":
        fn = np.abs
    else:
        _need(ctx, ins, dt.kind == "f", ins.opcode)
        # Approximate instructions: computed correctly rounded here (documented limit).
        fn = {"ex2": np.exp2, "rcp": np.reciprocal, "tanh": np.tanh, "sqrt": np.sqrt, "lg2": np.log2,
              "sin": np.sin, "cos": np.cos, "rsqrt": lambda x: 1 / np.sqrt(x)}.get(fam)
        _need(ctx, ins, fn is not None, ins.opcode)
    if dt.kind == "f":
        _check_mods(ctx, ins, mods, FLOAT_MODS)
    ra, put = ctx.reader(ins, a, dt), ctx.writer(ins, d, dt)
    if dt == np.float32 and "ftz" in mods:  # subnormal inputs and results become sign-preserving zeros
        return lambda: put(_flush(fn(_flush(ra())).astype(dt)))
    return lambda: put(fn(ra()).astype(dt))


_F32_TINY = np.float32(2.0 ** -126)


def _flush(x):
    """.ftz on f32: subnormals to zero of the same sign."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.abs(x) < _F32_TINY, np.copysign(np.float32(0), x), x).astype(np.float32)


# ---- comparisons and selection --------------------------------------------------------------

_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}


def _float_cmp(rel):
    if rel in ("eq", "lt", "le", "gt", "ge"):
        return _CMP[rel]                         # ordered: false when either is NaN
    if rel == "ne":
        return lambda a, b: (a != b) & ~np.isnan(a) & ~np.isnan(b)
    if rel == "num":
        return lambda a, b: ~np.isnan(a) & ~np.isnan(b)
    if rel == "nan":
        return lambda a, b: np.isnan(a) | np.isnan(b)
    if rel.endswith("u") and rel[:-1] in _CMP:  # unordered: true when either is NaN
        base = _CMP[rel[:-1]]
        if rel == "neu":
            return np.not_equal                 # numpy's != is already true for NaN
        return lambda a, b: base(a, b) | np.isnan(a) | np.isnan(b)
    return None


def build_setp(ins, ctx: Context):
    fam, mods, t = _split(ins)
    _need(ctx, ins, len(mods) == 1 and len(ins.operands) == 3 and t in TYPE,
          f"{ins.opcode} (only setp.<cmp>.<type> p, a, b)")
    rel = mods[0]
    dt = np.dtype(TYPE[t])
    if t.startswith("b"):
        dt = _unsigned(dt)
    fn = _float_cmp(rel) if dt.kind == "f" else _CMP.get(rel)
    _need(ctx, ins, fn is not None, f"comparison .{rel} on .{t}")
    d, a, b = ins.operands
    ra, rb, put = ctx.reader(ins, a, dt), ctx.reader(ins, b, dt), ctx.writer(ins, d, np.bool_)
    return lambda: put(fn(ra(), rb()))


def build_selp(ins, ctx: Context):
    fam, mods, t = _split(ins)
    _n_operands(ctx, ins, 4)
    _need(ctx, ins, t in TYPE and not mods, ins.opcode)
    dt = np.dtype(TYPE[t])
    d, a, b, p = ins.operands
    ra, rb, rp = ctx.reader(ins, a, dt), ctx.reader(ins, b, dt), ctx.reader(ins, p, np.bool_)
    put = ctx.writer(ins, d, dt)
    return lambda: put(np.where(rp(), ra(), rb()).astype(dt, copy=False))


# ---- moves and conversions ------------------------------------------------------------------

def build_mov(ins, ctx: Context):
    fam, mods, t = _split(ins)
    _n_operands(ctx, ins, 2)
    _need(ctx, ins, t in TYPE and not mods, ins.opcode)
    d, a = ins.operands
    dt = np.dtype(TYPE[t])
    if isinstance(a, Vec) or isinstance(d, Vec):
        return _mov_pack(ins, ctx, d, a, dt)
    ra, put = ctx.reader(ins, a, dt), ctx.writer(ins, d, dt)
    return lambda: put(ra())


def _mov_pack(ins, ctx, d, a, dt):
    """mov.b32 d, {lo, hi} packs halves; mov.b32 {lo, hi}, a unpacks (low part first)."""
    if isinstance(a, Vec) and not isinstance(d, Vec):
        k = len(a.items)
        part = _unsigned(np.dtype(dt).itemsize // k)
        readers = [ctx.reader(ins, x, part) for x in a.items]
        put = ctx.writer(ins, d, _unsigned(dt))
        n = ctx.threads

        def pack():
            parts = np.stack([per_thread(r(), n) for r in readers], axis=1)
            put(np.ascontiguousarray(parts).view(_unsigned(dt)).reshape(n))
        return pack
    if isinstance(d, Vec) and not isinstance(a, Vec):
        k = len(d.items)
        part = _unsigned(np.dtype(dt).itemsize // k)
        ra = ctx.reader(ins, a, _unsigned(dt))
        puts = [ctx.writer(ins, x, part) for x in d.items]
        n = ctx.threads

        def unpack():
            halves = np.ascontiguousarray(per_thread(ra(), n)).view(part).reshape(n, k)
            for i, p in enumerate(puts):
                p(halves[:, i].copy())
        return unpack
    ctx.unsupported(ins, "a vector-to-vector mov")


def build_cvta(ins, ctx: Context):
    """cvta.to.global, cvta.param: generic and global addresses coincide in the emulator, and
    parameters keep the addresses of their own window."""
    _n_operands(ctx, ins, 2)
    _need(ctx, ins, ins.opcode in ("cvta.to.global.u64", "cvta.global.u64", "cvta.param.u64"),
          f"{ins.opcode} (only the global and parameter windows are modelled)")
    d, a = ins.operands
    ra, put = ctx.reader(ins, a, np.uint64), ctx.writer(ins, d, np.uint64)
    return lambda: put(ra())


_INT_RANGE = {"u8": (0, 255), "s8": (-128, 127), "u16": (0, 65535), "s16": (-32768, 32767),
              "u32": (0, 2 ** 32 - 1), "s32": (-2 ** 31, 2 ** 31 - 1), "u64": (0, 2 ** 64 - 1),
              "s64": (-2 ** 63, 2 ** 63 - 1)}
_ROUND_INT = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}


def build_cvt(ins, ctx: Context):
    parts = ins.opcode.split(".")
    _need(ctx, ins, len(parts) >= 3, ins.opcode)
    dst_t, src_t = parts[-2], parts[-1]
    mods = set(parts[1:-2])
    if dst_t in ("f16x2", "bf16x2") and src_t == "f32":
        return _cvt_pack(ins, ctx, dst_t, mods)
    _n_operands(ctx, ins, 2)
    d, a = ins.operands
    if (dst_t, src_t) == ("tf32", "f32"):
        _need(ctx, ins, mods in ({"rna"}, {"rn"}), f"{ins.opcode} (.rna, or .rn on sm_90)")
        ra, put = ctx.reader(ins, a, np.uint32), ctx.writer(ins, d, np.uint32)
        rounding = nm.tf32_rna if mods == {"rna"} else nm.tf32_rn
        return lambda: put(rounding(ra()))
    if (dst_t, src_t) in (("f16", "f32"), ("bf16", "f32")):
        _need(ctx, ins, mods <= {"rn"}, f"{ins.opcode} (only round-to-nearest)")
        conv = nm.f32_to_f16_bits if dst_t == "f16" else nm.f32_to_bf16_bits
        ra, put = ctx.reader(ins, a, np.float32), ctx.writer(ins, d, np.uint16)
        return lambda: put(conv(ra()))
    if (dst_t, src_t) in (("f32", "f16"), ("f32", "bf16")):
        conv = nm.f16_bits_to_f32 if src_t == "f16" else nm.bf16_bits_to_f32
        ra, put = ctx.reader(ins, a, np.uint16), ctx.writer(ins, d, np.float32)
        return lambda: put(conv(ra()))
    if dst_t in _INT_RANGE and src_t in _INT_RANGE:
        sdt, ddt = np.dtype(TYPE[src_t]), np.dtype(TYPE[dst_t])
        ra, put = ctx.reader(ins, a, sdt), ctx.writer(ins, d, ddt)
        if "sat" in mods:
            lo, hi = _INT_RANGE[dst_t]
            return lambda: put(np.clip(np.asarray(ra()).astype(np.float64), lo, hi).astype(ddt))
        return lambda: put(np.asarray(ra()).astype(ddt))     # truncate / sign- or zero-extend
    if dst_t in ("f32", "f64") and src_t in _INT_RANGE:
        sdt, ddt = np.dtype(TYPE[src_t]), np.dtype(TYPE[dst_t])
        _need(ctx, ins, mods <= {"rn"}, f"{ins.opcode} (only .rn)")
        ra, put = ctx.reader(ins, a, sdt), ctx.writer(ins, d, ddt)
        return lambda: put(np.asarray(ra()).astype(ddt))
    if dst_t in _INT_RANGE and src_t in ("f32", "f64"):
        rnd = [m for m in mods if m in _ROUND_INT]
        _need(ctx, ins, len(rnd) == 1, f"{ins.opcode} (name one of .rni/.rzi/.rmi/.rpi)")
        fn, (lo, hi) = _ROUND_INT[rnd[0]], _INT_RANGE[dst_t]
        ddt = np.dtype(TYPE[dst_t])
        ra, put = ctx.reader(ins, a, TYPE[src_t]), ctx.writer(ins, d, ddt)

        def f2i():
            x = fn(np.asarray(ra(), dtype=np.float64))
            put(np.where(np.isnan(x), 0, np.clip(x, lo, hi)).astype(ddt))    # PTX saturates
        return f2i
    if (dst_t, src_t) in (("f32", "f64"), ("f64", "f32"), ("f32", "f32")):
        _need(ctx, ins, mods <= {"rn", "ftz"}, ins.opcode)
        ra, put = ctx.reader(ins, a, TYPE[src_t]), ctx.writer(ins, d, TYPE[dst_t])
        return lambda: put(np.asarray(ra()).astype(TYPE[dst_t]))
    ctx.unsupported(ins, ins.opcode)


def _cvt_pack(ins, ctx, dst_t, mods):
    """cvt.rn.{f16x2,bf16x2}.f32 d, a, b: a converted into the upper half, b the lower."""
    _n_operands(ctx, ins, 3)
    _need(ctx, ins, mods == {"rn"}, f"{ins.opcode} (only .rn)")
    conv = nm.f32_to_f16_bits if dst_t == "f16x2" else nm.f32_to_bf16_bits
    d, a, b = ins.operands
    ra, rb, put = ctx.reader(ins, a, np.float32), ctx.reader(ins, b, np.float32), ctx.writer(ins, d, np.uint32)
    n = ctx.threads

    def run():
        hi = conv(per_thread(ra(), n)).astype(np.uint32)
        lo = conv(per_thread(rb(), n)).astype(np.uint32)
        put((hi << np.uint32(16)) | lo)
    return run


BUILDERS = {
    **{f: build_binary for f in ("add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor",
                                 "shl", "shr")},
    "mad": build_mad, "fma": build_mad,
    **{f: build_unary for f in ("not", "neg", "abs", "ex2", "rcp", "tanh", "sqrt", "lg2", "sin", "cos", "rsqrt")},
    "setp": build_setp, "selp": build_selp, "mov": build_mov, "cvta": build_cvta, "cvt": build_cvt,
}

__all__ = ["BUILDERS"]
