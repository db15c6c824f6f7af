"""Main-loop families of the GEMM, one module each, registered in one table.

A family is how a GEMM walks K and feeds the tensor cores: its spec defaults, the rules
its specs must meet, where its operands live in shared memory, and the DSL code of its
pipeline. GemmSpec.instruction names the family; GemmSpec asks it for everything that
depends on it; the GEMM template (gemm/template.py) runs its pipeline.

| instruction | module        | what                                                       |
| ----------- | ------------- | ---------------------------------------------------------- |
| mma.sync    | mma_sync.py   | cp.async multistage pipeline, fragments in registers (sm_80+) |
| wgmma       | wgmma.py      | cp.async stages read by warpgroup mma from shared memory (sm_90a) |

Adding a family: a module with a subclass of base.MainLoop, one entry in MAINLOOPS.
"""
from __future__ import annotations

from .base import MainLoop
from .mma_sync import MmaSyncLoop
from .wgmma import WgmmaLoop

MAINLOOPS = {f.instruction: f for f in (MmaSyncLoop(), WgmmaLoop())}

__all__ = ["MainLoop", "MAINLOOPS"]
