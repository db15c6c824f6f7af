"""The GEMM main loop on wgmma (sm_90a): cp.async fills the stages, each warpgroup's tensor
cores read them straight from shared memory.

Every thread copies; each warpgroup (4 warps stacked along M) multiplies its 64-row slice
of the stage by its columns of B. The wgmmas of a tile run asynchronously while the next
tile is waited for, so a stage is free again only once the wgmmas of the tile after it
have been issued and their predecessors retired (wgmma_wait(1)) by every warpgroup (the
barrier of the following tile). Hence the copies run stages - 2 tiles ahead:

    tile kt:  wait for its copies; fence (cp.async wrote through the generic proxy, wgmma
              reads through the async proxy); barrier; issue its wgmmas; refill the stage
              of tile kt - 2 with tile kt + stages - 2; wgmma_wait(1) (tile kt - 1 retired)
"""
from __future__ import annotations

from .. import dsl as tg
from ..arch.wgmma import M as WG_ROWS, WARPGROUP


def wgmma_mainloop(spec, A, B, sA, sB, m0, n0, warp, wn):
    """Run the K loop; returns each warp's accumulator (its 16 rows of the warpgroup's 64)."""
    BK, S = spec.tile.k, spec.stages
    K = A.shape[1]
    shape = spec.wgmma
    ahead = S - 2
    # The warpgroup's first row in the tile: warps 4g .. 4g+3 are consecutive along M.
    wg_m = ((warp % spec.warps.m) >> 2) * WG_ROWS
    acc = tg.fragment(spec.mma, "C", (1, shape.n // spec.mma.n), name="acc")

    def copy(tile_index, inside_k):
        inside = ("K",) if inside_k else ()
        stage = tile_index % S
        tg.copy_async(sA[stage], A.block(m0, tile_index * BK), inbounds=inside,
                      comment=f"tile +{ahead} of A")
        tg.copy_async(sB[stage], B.block(tile_index * BK, n0), inbounds=inside,
                      comment=f"tile +{ahead} of B")
        tg.commit()

    # Prologue: tiles 0 .. S-3. Blocks past K arrive as zeros and add nothing.
    for s in range(ahead):
        copy(s, inside_k=False)

    def step(kt, inside_k):
        stage = kt % S
        tg.wait(ahead - 1)        # tile kt has landed for this thread
        tg.fence_proxy_async()    # ... and is visible to the tensor cores' reads
        tg.barrier()              # ... for every thread; tile kt - 2's wgmmas are retired everywhere
        tg.wgmma_fence()
        for kk in range(BK // shape.k):
            tg.wgmma(acc, sA[stage], sB[stage], wg_m, kk * shape.k, wn)
        tg.wgmma_commit()
        copy(kt + ahead, inside_k)
        tg.wgmma_wait(1)          # tile kt - 1 retired for this warpgroup

    k_tiles = tg.cdiv(K, BK)
    full_tiles = K // BK
    steady = full_tiles - tg.minimum(full_tiles, ahead)
    for kt in tg.range(0, steady):
        step(kt, inside_k=True)
    for kt in tg.range(steady, k_tiles):
        step(kt, inside_k=False)
    tg.wgmma_wait(0)
    tg.wait(0)
    return acc


__all__ = ["wgmma_mainloop", "WARPGROUP"]
