"""The decoded form of a PTX module: what the parser produces and the interpreter runs.

Registers are resolved to slots of one register file per entry, labels to instruction
indices, so running an instruction never looks a name up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from .errors import SimError


@dataclass(frozen=True)
class Reg:
    slot: int
    name: str
    type: str          # declared type without the dot: "b32", "f32", "b64", "pred", ...


@dataclass(frozen=True)
class Special:
    name: str          # "%tid.x", "%ctaid.x", "%laneid", ...


@dataclass(frozen=True)
class Imm:
    value: Union[int, float]
    is_float: bool     # written as 0fXXXXXXXX / 0dXXXXXXXXXXXXXXXX
    bits: int = 0      # the raw bits of a float immediate


@dataclass(frozen=True)
class Sym:
    name: str          # a parameter, a shared array or a label


@dataclass(frozen=True)
class Mem:
    base: Union[Reg, Sym, None]
    offset: int


@dataclass(frozen=True)
class Vec:
    items: tuple


@dataclass(frozen=True)
class TensorRef:
    """[desc, {c0, c1, ...}]: a tensor map's address and coordinates (innermost first)."""
    desc: Reg
    coords: tuple


Operand = Union[Reg, Special, Imm, Sym, Mem, Vec, TensorRef]


@dataclass(frozen=True)
class Instr:
    index: int
    line: int
    text: str                    # the source line, comment stripped
    opcode: str                  # "ld.global.v4.b32"
    guard: Optional[Reg]
    guard_neg: bool
    operands: tuple

    @property
    def parts(self) -> tuple:
        return tuple(self.opcode.split("."))


@dataclass(frozen=True)
class SharedDecl:
    name: str
    align: int
    size: Optional[int]          # None: .extern, sized at launch
    type: str


@dataclass
class Entry:
    name: str
    params: list                 # [(name, type, bytes)]
    reqntid: Optional[tuple]
    regs: list                   # [Reg] in slot order
    shared: list                 # [SharedDecl] declared inside the entry
    instrs: list                 # [Instr]
    labels: dict                 # label -> instruction index
    cluster: Optional[tuple] = None   # .reqnctapercluster (x, y, z)


@dataclass
class Program:
    version: str = ""
    target: str = ""
    address_size: int = 64
    shared: list = field(default_factory=list)     # module-level [SharedDecl]
    entries: dict = field(default_factory=dict)    # name -> Entry
    # Decoded closures per launch shape, reused by later launches (see runner.launch).
    decoded: dict = field(default_factory=dict, repr=False, compare=False)

    def entry(self, name: Optional[str] = None) -> Entry:
        if name is None:
            if len(self.entries) != 1:
                raise SimError(f"the module has {len(self.entries)} entries; name one of "
                               f"{', '.join(self.entries) or '(none)'}")
            return next(iter(self.entries.values()))
        if name not in self.entries:
            raise SimError(f"no entry {name!r} in the module; entries: {', '.join(self.entries) or '(none)'}")
        return self.entries[name]
