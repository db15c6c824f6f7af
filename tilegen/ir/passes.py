"""The pass pipeline: an ordered list, each an IR -> IR function, verified after each."""
from __future__ import annotations

from .alloc import allocate_shared
from .hazards import check_hazards
from .lower import lower_tile_ops
from .verify import verify

PASSES = [
    # Reject unsafe pipelines while copies, waits and reads are still visible as tile ops.
    ("check_hazards", check_hazards),
    # Shared tiles need offsets before anything computes a shared address.
    ("allocate_shared", allocate_shared),
    # Tile ops become PTX-like instructions; after this only codegen runs.
    ("lower_tile_ops", lower_tile_ops),
]


def run_passes(kernel, passes=PASSES, after=None):
    """Run `passes` in order, verifying after each; `after(name, kernel)` sees each result."""
    verify(kernel)
    for name, fn in passes:
        kernel = fn(kernel)
        verify(kernel)
        if after is not None:
            after(name, kernel)
    return kernel
