"""SimError: a bug the emulator found in a kernel (or PTX it cannot run), with where it
happened: the PTX line and its text, the thread (CTA id and thread id) and the address."""
from __future__ import annotations

from typing import Optional

from ..errors import TilegenError


class SimError(TilegenError, RuntimeError):
    """Raised by the CPU emulator. Attributes: kind, line, text, cta, tid, address."""

    def __init__(self, message: str, *, kind: str = "error", line: Optional[int] = None,
                 text: str = "", cta=None, tid: Optional[int] = None, address: Optional[int] = None):
        self.kind = kind
        self.line = line
        self.text = text
        self.cta = cta
        self.tid = tid
        self.address = address
        self.message = message
        parts = [message]
        if line is not None:
            parts.append(f"PTX line {line}: {text}")
        if tid is not None:
            parts.append(f"thread: cta {_cta(cta)} tid {tid} (warp {tid // 32}, lane {tid % 32})")
        if address is not None:
            parts.append(f"address: 0x{address:x}")
        super().__init__("\n  ".join(parts))


class PtxSyntaxError(SimError):
    """PTX text outside the subset the emulator's grammar accepts."""


def _cta(cta) -> str:
    if cta is None:
        return "?"
    return "(" + ", ".join(str(int(c)) for c in cta) + ")"
