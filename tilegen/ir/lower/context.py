"""State shared by the lowering of tile ops: thread ids, the shared-memory base, and a
cache of lane-dependent terms so each is computed once per kernel."""
from __future__ import annotations

from ..builder import Builder
from ..values import Sym, Value
from .lanes import emit_lane_term

SMEM_SYMBOL = "smem"


class LowerContext:
    def __init__(self, kernel, prologue: list):
        self.kernel = kernel
        self.pro = Builder(prologue)  # instructions hoisted to the kernel entry
        self.tid = self.pro.special("%tid.x", "tid")
        self.lane = self.pro.and_(self.tid, 31)
        raw = self.pro.op("mov.u32", "b32", Sym(SMEM_SYMBOL), hint="smem_raw")
        # The dynamic shared window is only guaranteed 16-byte aligned: round up to 1024
        # so every swizzle period starts on its boundary (the allocation has 1 KB slack).
        self.smem = self.pro.and_(self.pro.add(raw, 1023), -1024 & 0xFFFFFFFF)
        self._lane_terms: dict[tuple, Value] = {}
        self._ld_bytes: dict[int, Value] = {}
        self.addresses: dict = {}  # per-thread shared addresses, reused across k-steps (smem.py)
        self.role = None           # the warp role (ir/instr.py Role) being lowered, if any

    def lane_term(self, deltas) -> object:
        key = tuple(deltas)
        if key not in self._lane_terms:
            self._lane_terms[key] = emit_lane_term(self.pro, self.lane, list(deltas))
        return self._lane_terms[key]

    def scaled(self, b, x, factor: int):
        """x * factor, computed once per region for the same register x."""
        if isinstance(x, int):
            return x * factor
        key = ("scaled", id(x), factor, id(b.region))
        if key not in self.addresses:
            self.addresses[key] = b.mul(x, factor)
        return self.addresses[key]

    def row_step(self, b, tensor, rows: int):
        """rows * the tensor's pitch as a 64-bit byte offset, computed once at entry."""
        key = ("row_step", id(tensor), rows)
        if key not in self.addresses:
            # panel-major chunk orders step back up to row 0 of the next panel: signed steps
            kind = "mul.wide.s32" if rows < 0 else "mul.wide.u32"
            self.addresses[key] = self.pro.op(kind, "b64", self.ld_bytes(tensor), rows)
        return self.addresses[key]

    def ld_bytes(self, tensor) -> object:
        """The tensor's row pitch in bytes, computed once at entry."""
        if id(tensor) not in self._ld_bytes:
            self._ld_bytes[id(tensor)] = self.pro.mul(tensor.ld, tensor.dtype.bytes)
        return self._ld_bytes[id(tensor)]
