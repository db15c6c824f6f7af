"""Shared-memory allocation: each shared tile gets an offset aligned as it needs (1024 bytes,
whole swizzle periods, for stages; 16 for the small staged vectors), in declaration order;
the mbarriers (8 bytes each) follow the tiles."""
from __future__ import annotations

from ..arch.targets import target as _target
from ..errors import IRError

# The runtime base is rounded up to 1024 bytes inside the kernel, so allocate that much slack.
BASE_SLACK = 1024
MBARRIER_ALIGN = 8


def shared_bytes(tiles, barriers, place: bool = False) -> int:
    """The dynamic shared memory these tiles and mbarriers take, laid out as allocate_shared
    lays them (with `place`, their offsets set)."""
    offset = 0
    for tile in tiles:
        at = -(-offset // tile.align) * tile.align
        if place:
            tile.offset = at
        offset = at + tile.bytes
    offset = -(-offset // MBARRIER_ALIGN) * MBARRIER_ALIGN
    for bar in barriers:
        if place:
            bar.offset = offset
        offset += bar.BYTES * bar.stages
    return offset + BASE_SLACK if offset else 0


def smem_limit(target: str) -> int:
    return _target(target).smem_per_block


def allocate_shared(kernel):
    kernel.smem_bytes = shared_bytes(kernel.shared, kernel.barriers, place=True)
    limit = smem_limit(kernel.target)
    if kernel.smem_bytes > limit:
        parts = ", ".join([f"{t.name} {t.stages} x {t.layout.stage_bytes} B" for t in kernel.shared]
                          + [f"{b.name} {b.stages} x {b.BYTES} B" for b in kernel.barriers])
        raise IRError(f"{kernel.name} needs {kernel.smem_bytes} bytes of shared memory ({parts}, and {BASE_SLACK} "
                      f"to align the base), more than the {limit} a block may use on {kernel.target}: use fewer "
                      f"stages or smaller tiles")
    return kernel
