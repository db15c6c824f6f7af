"""Instruction level of the IR: PTX-like instructions over virtual registers, with
structured control flow (Loop, If, SpinWait). Codegen prints these almost one to one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .values import Value


@dataclass(eq=False)
class Instr:
    """One PTX instruction: `opcode` is the full spelling ("add.u32", "mma.sync...")."""

    opcode: str
    outs: tuple = ()
    ins: tuple = ()
    pred: Optional[Value] = None
    pred_neg: bool = False
    comment: str = ""


@dataclass(eq=False)
class Comment:
    """A line of commentary in the PTX: which stage, k-step, fragment or IR op follows."""

    text: str


@dataclass(eq=False)
class Loop:
    """for counter in range(start, stop): body. `start`/`stop` are Values or Imms.

    The body runs at least zero times; the counter is a b32 register."""

    counter: Value
    start: object
    stop: object
    body: list = field(default_factory=list)
    comment: str = ""


@dataclass(eq=False)
class If:
    """Run `body` when `cond` (a pred Value) holds, else `orelse`. `cond` may differ between
    threads (the branch is a divergent bra; the hazard check walks both ways of such a branch)."""

    cond: Value
    body: list = field(default_factory=list)
    negate: bool = False
    comment: str = ""
    orelse: list = field(default_factory=list)


@dataclass(eq=False)
class Role(If):
    """A warp role (warp specialization): `body` runs on warps first_warp .. end_warp - 1
    only, at the same time as the other roles' bodies. Unlike a plain If, the condition
    differs between warps (never within one): the role's warps branch into the body while
    the others go past it."""

    name: str = ""
    first_warp: int = 0
    end_warp: int = 0


@dataclass(eq=False)
class SpinWait:
    """Run `body` again and again until `until` (a pred Value the body writes) holds: the
    loop around mbarrier.try_wait, which may give up before the phase completes."""

    body: list
    until: Value
    comment: str = ""


def walk(body):
    """Every node of a body in program order, inside loops, branches (both arms) and spin
    waits too; containers are yielded before their contents."""
    for node in body:
        yield node
        if isinstance(node, (Loop, If, SpinWait)):
            yield from walk(node.body)
        if isinstance(node, If):
            yield from walk(node.orelse)
