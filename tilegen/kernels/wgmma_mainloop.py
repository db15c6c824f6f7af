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

Persistent kernels (spec.persistent) run one CTA per SM over several blocks of C: the
prologue copies of the next block start before this block's accumulator is stored.
"""
from __future__ import annotations

from .. import dsl as tg
from ..arch.wgmma import M as WG_ROWS


class WgmmaPipeline:
    """The stages of A and B and the wgmmas that read them, for one warpgroup's rows.

    prologue(m0, n0) starts the copies of a block's first stages - 2 k-tiles; k_loop(m0, n0)
    runs the block's K loop and returns each warp's accumulator (its 16 rows of the
    warpgroup's 64), with every copy and wgmma finished."""

    def __init__(self, spec, A, B, sA, sB, warp, wn):
        self.spec, self.A, self.B, self.sA, self.sB, self.wn = spec, A, B, sA, sB, wn
        self.S = spec.stages
        self.ahead = self.S - 2
        self.shape = spec.wgmma
        # The warpgroup's first row in the tile: warps 4g .. 4g+3 are consecutive along M.
        self.wg_m = ((warp % spec.warps.m) >> 2) * WG_ROWS

    def copy(self, m0, n0, tile_index, inside_k):
        BK, S = self.spec.tile.k, self.S
        inside = ("K",) if inside_k else ()
        stage = tile_index % S
        tg.copy_async(self.sA[stage], self.A.block(m0, tile_index * BK), inbounds=inside,
                      comment=f"k-tile +{self.ahead} of A")
        tg.copy_async(self.sB[stage], self.B.block(tile_index * BK, n0), inbounds=inside,
                      comment=f"k-tile +{self.ahead} of B")
        tg.commit()

    def prologue(self, m0, n0):
        # k-tiles 0 .. S-3; blocks past K arrive as zeros and add nothing.
        for s in range(self.ahead):
            self.copy(m0, n0, s, inside_k=False)

    def k_loop(self, m0, n0):
        spec, shape, S, ahead = self.spec, self.shape, self.S, self.ahead
        sA, sB = self.sA, self.sB
        BK = spec.tile.k
        K = self.A.shape[1]
        acc = tg.fragment(spec.mma, "C", (1, shape.n // spec.mma.n), name="acc")

        def step(kt, inside_k):
            stage = kt % S
            tg.wait(ahead - 1)        # k-tile kt has landed for this thread
            tg.fence_proxy_async()    # ... and is visible to the tensor cores' reads
            tg.barrier()              # ... for every thread; k-tile kt - 2's wgmmas are retired everywhere
            tg.wgmma_fence()
            for kk in range(BK // shape.k):
                tg.wgmma(acc, sA[stage], sB[stage], self.wg_m, kk * shape.k, self.wn)
            tg.wgmma_commit()
            self.copy(m0, n0, kt + ahead, inside_k)
            tg.wgmma_wait(1)          # k-tile kt - 1 retired for this warpgroup

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


__all__ = ["WgmmaPipeline"]
