"""Shared-memory allocation: each shared tile gets a 1024-byte aligned offset; the mbarriers
(8 bytes each) follow the tiles."""
from __future__ import annotations

from .layout import STAGE_ALIGN

# The runtime base is rounded up to 1024 bytes inside the kernel, so allocate that much slack.
BASE_SLACK = 1024


def allocate_shared(kernel):
    offset = 0
    for tile in kernel.shared:
        tile.offset = offset
        offset += -(-tile.bytes // STAGE_ALIGN) * STAGE_ALIGN
    for bar in kernel.barriers:
        bar.offset = offset
        offset += bar.BYTES * bar.stages
    kernel.smem_bytes = offset + BASE_SLACK if offset else 0
    return kernel
