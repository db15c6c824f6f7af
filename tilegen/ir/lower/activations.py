"""Activation functions as f32 instructions, for fused epilogues.

Each is written to stay accurate to a few f32 ulps (torch's reference is the yardstick):
- relu(x) = max(x, 0)
- silu(x) = x / (1 + exp(-x))
- gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), rewritten as
  x / (1 + exp(-2u)) so no tanh (tanh.approx has only 11 good bits) and no cancellation
- gelu_erf(x) = 0.5 x (1 + erf(x / sqrt(2))), erf from Abramowitz and Stegun 7.1.26
  (absolute error under 1.5e-7) with erf(-z) = -erf(z)
exp(y) is ex2.approx.ftz.f32(y * log2(e)): relative error about 2^-22 + |y| 2^-24. Divisions are
div.full.f32 (full range, at most 2 ulp): div.rn.f32 is a long subroutine that made a fused
GELU epilogue a third slower than a plain one (docs/perf_notes.md section 18). Both keep the
IEEE cases: x = +inf gives +inf, x = -inf gives NaN (as numpy's -inf * 0), NaN stays NaN.
"""
from __future__ import annotations

import math

from ...errors import IRError
from ..values import Imm

LOG2E = 1.4426950408889634
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _f(v) -> Imm:
    return Imm(float(v), "f32")


def _exp_neg(b, x, scale: float):
    """exp(-scale * x)."""
    y = b.op("mul.f32", "f32", x, _f(-scale * LOG2E))
    return b.op("ex2.approx.ftz.f32", "f32", y)


def _x_over_one_plus(b, x, e):
    """x / (1 + e)."""
    d = b.op("add.f32", "f32", e, _f(1.0))
    return b.op("div.full.f32", "f32", x, d)


def relu(b, x):
    return b.op("max.NaN.f32", "f32", x, _f(0.0))   # NaN stays NaN (plain max returns the 0)


def silu(b, x):
    return _x_over_one_plus(b, x, _exp_neg(b, x, 1.0))


def gelu_tanh(b, x):
    x3 = b.op("mul.f32", "f32", b.op("mul.f32", "f32", x, x), x)
    u = b.op("fma.rn.f32", "f32", x3, _f(0.044715), x)  # x + 0.044715 x^3
    return _x_over_one_plus(b, x, _exp_neg(b, u, 2.0 * math.sqrt(2.0 / math.pi)))


def gelu_erf(b, x):
    z = b.op("mul.f32", "f32", b.op("abs.f32", "f32", x), _f(1.0 / math.sqrt(2.0)))
    t = b.op("div.full.f32", "f32", _f(1.0), b.op("fma.rn.f32", "f32", z, _f(_AS_P), _f(1.0)))
    poly = _f(_AS_A[-1])
    for a in reversed(_AS_A[:-1]):  # Horner: ((a5 t + a4) t + a3) t + a2) t + a1
        poly = b.op("fma.rn.f32", "f32", poly, t, _f(a))
    poly = b.op("mul.f32", "f32", poly, t)
    tail = b.op("mul.f32", "f32", poly, _exp_neg(b, b.op("mul.f32", "f32", z, z), 1.0))  # 1 - erf(z)
    two_minus = b.op("sub.f32", "f32", _f(2.0), tail)                                     # 1 + erf(z)
    positive = b.op("setp.ge.f32", "pred", x, _f(0.0))
    one_plus_erf = b.op("selp.f32", "f32", two_minus, tail, positive)
    return b.op("mul.f32", "f32", b.op("mul.f32", "f32", x, _f(0.5)), one_plus_erf)


EMITTERS = {"none": lambda b, x: x, "relu": relu, "silu": silu, "gelu_tanh": gelu_tanh, "gelu_erf": gelu_erf}


def apply_activation(b, name: str, x):
    if name not in EMITTERS:
        raise IRError(f"no lowering for activation {name!r}; known: {', '.join(EMITTERS)}")
    return EMITTERS[name](b, x)
