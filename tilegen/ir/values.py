"""Scalar values of the IR: typed virtual registers and immediates.

Register types follow PTX: b32 covers u32/s32 and packed 16/8-bit pairs, f32 floats,
b64 addresses, pred predicates. ptxas allocates the physical registers; codegen only
numbers these.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

REG_TYPES = ("b32", "f32", "b64", "pred")


class Value:
    """A virtual register. Identity matters (no two Values are equal unless the same)."""

    __slots__ = ("type", "hint", "align")

    def __init__(self, type: str, hint: str = "", align: int = 1):
        if type not in REG_TYPES:
            raise ValueError(f"register type {type!r}; allowed: {', '.join(REG_TYPES)}")
        self.type = type
        self.hint = hint
        self.align = align  # a power of two known to divide the value (address algebra uses it)

    def __repr__(self) -> str:
        return f"Value({self.type}, {self.hint!r})"


def known_align(x) -> int:
    """The largest power of two known to divide x (an int or a Value); 0 divides by anything."""
    if isinstance(x, int):
        return x & -x if x else 1 << 32
    return getattr(x, "align", 1)


@dataclass(frozen=True)
class Imm:
    """An immediate operand. Floats print as exact hex (0f3F800000), never as decimals."""

    value: object
    type: str = "b32"

    def text(self) -> str:
        if self.type == "f32":
            return "0f%08X" % struct.unpack("<I", struct.pack("<f", float(self.value)))[0]
        return str(int(self.value))


@dataclass(frozen=True)
class Sym:
    """A named symbol used as an operand: a shared array or a kernel parameter."""

    name: str

    def text(self) -> str:
        return self.name


@dataclass(frozen=True)
class Addr:
    """A memory operand [base + offset]."""

    base: object  # Value or Sym
    offset: int = 0


@dataclass(frozen=True)
class TensorAddr:
    """The tensor operand of a TMA copy: [descriptor address, {innermost coordinate, ...}]."""

    desc: object   # b64 Value: the generic address of the tensor map
    coords: tuple  # b32 Values or ints, innermost (contiguous) dimension first


@dataclass(frozen=True)
class Vec:
    """A vector operand {a, b, ...} (mma fragments, ld.v2, ldmatrix results)."""

    items: tuple


Operand = object  # Value | Imm | Sym | Addr | TensorAddr | Vec
