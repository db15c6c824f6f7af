"""SimError: a bug the emulator found in a kernel (or PTX it cannot run), with where it
happened: the PTX line and its text, the thread (CTA id and thread id) and the address."""
from __future__ import annotations

from typing import Optional

from ..errors import TilegenError


class SimError(TilegenError, RuntimeError):
    """Raised by the CPU emulator. Attributes: kind, line, text, cta, tid, address, and where
    known the kernel source of the PTX line (source) and the argument the address falls in
    (within)."""

    def __init__(self, message: str, *, kind: str = "error", line: Optional[int] = None,
                 text: str = "", cta=None, tid: Optional[int] = None, address: Optional[int] = None,
                 source: str = "", within: str = ""):
        self.kind = kind
        self.line = line
        self.text = text
        self.cta = cta
        self.tid = tid
        self.address = address
        self.message = message
        self.source = source
        self.within = within
        parts = [message]
        if line is not None:
            parts.append(f"PTX line {line}: {text}")
        if source:
            parts.append(f"source: {source}")
        if tid is not None:
            parts.append(f"thread: cta {_cta(cta)} tid {tid} (warp {tid // 32}, lane {tid % 32})")
        if address is not None:
            parts.append(f"address: 0x{address:x}" + (f" ({within})" if within else ""))
        super().__init__("\n  ".join(parts))

    def _again(self, **changes) -> "SimError":
        fields = dict(kind=self.kind, line=self.line, text=self.text, cta=self.cta, tid=self.tid,
                      address=self.address, source=self.source, within=self.within)
        self.__init__(self.message, **{**fields, **changes})
        return self

    def at_source(self, source: str) -> "SimError":
        """This error with the kernel source its PTX line comes from (the DSL file:line and op)."""
        return self._again(source=source) if source and not self.source else self

    def within_argument(self, within: str) -> "SimError":
        """This error with the kernel argument its address falls in (e.g. "A_ptr + 96 bytes")."""
        return self._again(within=within) if within and not self.within else self


class PtxSyntaxError(SimError):
    """PTX text outside the subset the emulator's grammar accepts."""


def _cta(cta) -> str:
    if cta is None:
        return "?"
    return "(" + ", ".join(str(int(c)) for c in cta) + ")"
