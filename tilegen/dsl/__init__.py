"""The kernel DSL: @kernel plus tile primitives, traced into tilegen's IR."""
from .kernel import KernelFunction, kernel
from .objects import Block, Fragment, SharedTile, Stage, Tensor, Vector
from .primitives import (SM_COUNT, accumulate, else_, eq, ge, gt, if_, is_zero, le, lt, ne, barrier, cdiv, commit, copy_async, device_scalar, divmod_by, fragment, lane_id, launch, load, minimum,
                         mma, num_programs, program_id, range_, scalar, share, shared, size, split_tf32, store, tensor,
                         thread_id, vector, wait, warp_id, wgmma, wgmma_fence, wgmma_commit, wgmma_wait,
                         fence_proxy_async)
from .scalars import Float, Int, Pred
from .tma import (BarrierStage, MBarrier, StagedVector, arrive, fetch_vector, mbarrier, mbarrier_wait, park_vector,
                  staged_vector, store_stage, tma_load, tma_store, tma_store_commit, tma_store_wait)
from .roles import role
from .arrivals import Counters, counters
from .cluster import cluster_id, cluster_rank, cluster_size, cluster_sync, num_clusters
from .batched import BatchedTensor, batched_tensor
from .fragment_ops import (RowVector, add, add_if_finite, assign, div, exp, exp2, mask, maximum, mul, row_max, row_sum,
                           row_vector, scale, sub, to_operand)

range = range_  # noqa: A001  (tilegen.dsl.range is the runtime loop, as in the DSL docs)

__all__ = ["lt", "le", "gt", "ge", "eq", "ne", "is_zero", "if_", "else_", "Pred", "vector", "split_tf32", "Vector", "kernel", "KernelFunction", "Tensor", "Block", "SharedTile", "Stage", "Fragment", "Int", "Float",
           "tensor", "size", "scalar", "program_id", "num_programs", "thread_id", "warp_id", "lane_id", "cdiv", "divmod_by", "device_scalar",
           "minimum", "share", "shared", "copy_async", "commit", "wait", "barrier", "fragment", "load", "mma",
           "store", "accumulate", "range", "launch", "SM_COUNT"]
# Hopper (sm_90a) warpgroup mma from shared memory
__all__ += ["wgmma", "wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_proxy_async"]
# Batched tensors and fragment arithmetic (dsl/batched.py, dsl/fragment_ops.py)
__all__ += ["BatchedTensor", "batched_tensor", "RowVector", "add", "add_if_finite", "sub", "mul", "div", "maximum", "scale",
            "exp", "exp2", "assign", "row_vector", "row_max", "row_sum", "mask", "to_operand"]
# TMA copies and mbarriers (sm_90; dsl/tma.py)
__all__ += ["MBarrier", "BarrierStage", "mbarrier", "arrive", "mbarrier_wait", "tma_load", "store_stage", "tma_store",
            "tma_store_commit", "tma_store_wait", "StagedVector", "staged_vector", "fetch_vector", "park_vector"]
# Warp roles (warp specialization; dsl/roles.py)
__all__ += ["role"]
# Arrival counters across the CTAs of a launch (dsl/arrivals.py)
__all__ += ["Counters", "counters"]
# Thread-block clusters (sm_90; dsl/cluster.py)
__all__ += ["cluster_rank", "cluster_id", "num_clusters", "cluster_sync", "cluster_size"]
