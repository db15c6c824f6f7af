"""mma.sync atoms: shapes, dtypes, spellings, version floors and fragment maps.

| atom                    | A, B        | C/D  | regs A/B/C | min target | min PTX |
| ----------------------- | ----------- | ---- | ---------- | ---------- | ------- |
| m16n8k8  tf32           | tf32        | f32  | 4 / 2 / 4  | sm_80      | 7.0     |
| m16n8k4  tf32           | tf32        | f32  | 2 / 1 / 4  | sm_80      | 7.0     |
| m16n8k16 f16 / bf16     | f16 / bf16  | f32  | 4 / 2 / 4  | sm_80      | 7.0     |
| m16n8k8  f16 / bf16     | f16 / bf16  | f32  | 2 / 1 / 4  | sm_80      | 7.0     |
| m16n8k16 f16 (f16 acc)  | f16         | f16  | 4 / 2 / 2  | sm_80      | 7.0     |
| m16n8k32 fp8            | e4m3 / e5m2 | f32  | 4 / 2 / 4  | sm_89      | 8.4     |

Maps are indexed by register (not by the ISA's element numbers, which differ between
types): register 0 holds rows g, register 1 rows g+8, registers 2/3 the same rows at
k + K/2. g = lane >> 2, t = lane & 3. Packed registers hold the lower k in the low bits.
"""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DType, dtype
from .fragments import FragmentMap, group_id, thread_in_group


@dataclass(frozen=True)
class MmaAtom:
    """One warp-wide mma.sync shape with its operand types and fragment maps."""

    name: str
    m: int
    n: int
    k: int
    a_type: DType
    b_type: DType
    acc_type: DType
    min_sm: int
    min_ptx: tuple[int, int]
    a: FragmentMap  # M x K
    b: FragmentMap  # K x N
    c: FragmentMap  # M x N, also D

    @property
    def instruction(self) -> str:
        """The exact PTX opcode, e.g. mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32."""
        acc = self.acc_type.ptx
        return (f"mma.sync.aligned.m{self.m}n{self.n}k{self.k}.row.col"
                f"{acc}{self.a_type.ptx}{self.b_type.ptx}{acc}")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def __str__(self) -> str:
        return self.name


def _a_map(name: str, k: int, bits: int) -> FragmentMap:
    pack = 32 // bits                 # elements per register
    regs = 16 * k // (32 * pack)      # 16 x k elements over 32 lanes
    half = k // 2

    def where(lane, r, e):
        g, t = group_id(lane), thread_in_group(lane)
        return g + 8 * (r & 1), pack * t + e + half * (r >> 1)

    return FragmentMap.from_formula(f"{name}.A", 16, k, regs, pack, where)


def _b_map(name: str, k: int, bits: int) -> FragmentMap:
    pack = 32 // bits
    regs = 8 * k // (32 * pack)
    half = k // 2

    def where(lane, r, e):
        g, t = group_id(lane), thread_in_group(lane)
        return pack * t + e + half * r, g

    return FragmentMap.from_formula(f"{name}.B", k, 8, regs, pack, where)


def _c_map(name: str, acc_bits: int) -> FragmentMap:
    if acc_bits == 32:
        def where(lane, r, e):
            return group_id(lane) + 8 * (r >> 1), 2 * thread_in_group(lane) + (r & 1)
        return FragmentMap.from_formula(f"{name}.C", 16, 8, 4, 1, where)

    def where16(lane, r, e):  # f16x2: register r = rows g + 8r, low half = even column
        return group_id(lane) + 8 * r, 2 * thread_in_group(lane) + e
    return FragmentMap.from_formula(f"{name}.C", 16, 8, 2, 2, where16)


def _atom(k: int, a: str, b: str, acc: str, min_sm: int, min_ptx: tuple[int, int]) -> MmaAtom:
    ta, tb, tc = dtype(a), dtype(b), dtype(acc)
    name = f"m16n8k{k}.{a}" + ("" if a == b else f".{b}") + f".{acc}"
    return MmaAtom(name, 16, 8, k, ta, tb, tc, min_sm, min_ptx,
                   _a_map(name, k, ta.bits), _b_map(name, k, tb.bits), _c_map(name, tc.bits))


MMA_ATOMS: dict[str, MmaAtom] = {
    x.name: x
    for x in (
        _atom(8, "tf32", "tf32", "f32", 80, (7, 0)),
        _atom(4, "tf32", "tf32", "f32", 80, (7, 0)),
        _atom(16, "f16", "f16", "f32", 80, (7, 0)),
        _atom(16, "bf16", "bf16", "f32", 80, (7, 0)),
        _atom(8, "f16", "f16", "f32", 80, (7, 0)),
        _atom(8, "bf16", "bf16", "f32", 80, (7, 0)),
        _atom(16, "f16", "f16", "f16", 80, (7, 0)),
        _atom(32, "e4m3", "e4m3", "f32", 89, (8, 4)),
        _atom(32, "e5m2", "e5m2", "f32", 89, (8, 4)),
        _atom(32, "e4m3", "e5m2", "f32", 89, (8, 4)),
        _atom(32, "e5m2", "e4m3", "f32", 89, (8, 4)),
    )
}

# The atom each operand dtype uses unless a spec names another: the largest k.
DEFAULT_ATOM = {
    ("tf32", "f32"): "m16n8k8.tf32.f32",
    ("f32", "f32"): "m16n8k8.tf32.f32",  # f32 operands: split into tf32 high and low parts
    ("f16", "f32"): "m16n8k16.f16.f32",
    ("bf16", "f32"): "m16n8k16.bf16.f32",
    ("f16", "f16"): "m16n8k16.f16.f16",
    ("e4m3", "f32"): "m16n8k32.e4m3.f32",
    ("e5m2", "f32"): "m16n8k32.e5m2.f32",
}


def mma_atom(name: str) -> MmaAtom:
    try:
        return MMA_ATOMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown mma atom {name!r}; allowed: {', '.join(MMA_ATOMS)}") from None


def atoms_for(a: str, b: str | None = None, acc: str | None = None) -> list[MmaAtom]:
    """All atoms taking operand types (a, b) and, if given, accumulating in `acc`."""
    b = b or a
    return [x for x in MMA_ATOMS.values()
            if x.a_type.name == a and x.b_type.name == b and (acc is None or x.acc_type.name == acc)]
