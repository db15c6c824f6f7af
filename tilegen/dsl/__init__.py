"""The kernel DSL: @kernel plus tile primitives, traced into tilegen's IR."""
from .kernel import KernelFunction, kernel
from .objects import Block, Fragment, SharedTile, Stage, Tensor
from .primitives import (barrier, cdiv, commit, copy_async, fragment, lane_id, launch, load, minimum,
                         mma, num_programs, program_id, range_, scalar, shared, store, tensor,
                         thread_id, wait, warp_id)
from .scalars import Float, Int

range = range_  # noqa: A001  (tilegen.range is the runtime loop, as in the DSL docs)

__all__ = ["kernel", "KernelFunction", "Tensor", "Block", "SharedTile", "Stage", "Fragment", "Int", "Float",
           "tensor", "scalar", "program_id", "num_programs", "thread_id", "warp_id", "lane_id", "cdiv",
           "minimum", "shared", "copy_async", "commit", "wait", "barrier", "fragment", "load", "mma",
           "store", "range", "launch"]
