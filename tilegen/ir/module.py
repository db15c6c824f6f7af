"""KernelIR: one kernel as the IR sees it, from front-end to codegen."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .grid import LaunchGrid
from .tile import GlobalTensor, Param, SharedTile


@dataclass(eq=False)
class KernelIR:
    name: str
    threads: int
    target: str
    params: list = field(default_factory=list)      # Param, in launch order (loaded at entry)
    tensors: list = field(default_factory=list)     # GlobalTensor (their ptr/ld/extents are Params)
    arrays: list = field(default_factory=list)      # ArrayDecl: every memory parameter, as declared
    shared: list = field(default_factory=list)      # SharedTile
    barriers: list = field(default_factory=list)    # MBarrier (shared memory after the tiles)
    tensor_maps: list = field(default_factory=list) # TensorMap (each also a Param of type "tensormap")
    body: list = field(default_factory=list)
    features: set = field(default_factory=set)      # PTX features used, for .version
    smem_bytes: int = 0                             # set by the allocation pass
    level: str = "tile"                             # "tile" until lowered, then "instr"
    grid: Optional[LaunchGrid] = None               # (x, y, z) over the size symbols, as data
    symbols: dict = field(default_factory=dict)     # shape symbol name -> Param
    cluster: tuple = (1, 1, 1)                      # CTAs per cluster (x, y, z), sm_90

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def tensor(self, name: str) -> GlobalTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def shared_tile(self, name: str) -> SharedTile:
        for s in self.shared:
            if s.name == name:
                return s
        raise KeyError(name)
