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

A tf32 operand that is MN-major in shared memory cannot be read by wgmma (spec.register_operand):
wgmma takes it as A from registers instead. Each warp retires its previous k-tile's wgmmas
(wgmma_wait(0): the registers are free again), loads its 16 rows of every k-step (rounded
to tf32), fences once and issues the k-tile's wgmmas; the other warpgroup's wgmmas keep the
tensor cores busy meanwhile (measured faster than retiring and reloading one k-step at a
time, docs/perf_notes.md section 15). With a row-major B the kernel computes
C^T = B^T A^T (spec.swaps_operands): wgmma's A is the warpgroup's 64 columns of B, its B
the whole tile of A read as A^T, and the accumulator holds a block of C^T, stored transposed.

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

    def __init__(self, spec, A, B, sA, sB, warp, wm, wn):
        self.spec, self.A, self.B, self.sA, self.sB = spec, A, B, sA, sB
        self.S = spec.stages
        self.ahead = self.S - 2
        self.shape = spec.wgmma
        steps = spec.tile.k // self.shape.k
        # wgmma's operands and origins: (stage tile, first row) of A, (stage tile, first column) of B.
        if spec.swaps_operands:   # C^T = B^T A^T: the warp's 16 columns of B, all rows of A
            self.a_src, self.a_origin, self.b_src, self.b_origin = sB.T, wn, sA.T, wm
        elif spec.register_operand == "A":   # the warp's 16 rows
            self.a_src, self.a_origin, self.b_src, self.b_origin = sA, wm, sB, wn
        else:  # the warpgroup's first row in the tile: warps 4g .. 4g+3 are consecutive along M
            self.a_src, self.a_origin, self.b_src, self.b_origin = sA, ((warp % spec.warps.m) >> 2) * WG_ROWS, sB, wn
        self.frags = ([tg.fragment(spec.mma, "A", (1, 1), name=f"a{kk}") for kk in range(steps)]
                      if spec.register_operand else None)

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

        steps = BK // shape.k
        a_src, b_src, frags = self.a_src, self.b_src, self.frags

        def step(kt, inside_k):
            stage = kt % S
            tg.wait(ahead - 1)        # k-tile kt has landed for this thread
            tg.fence_proxy_async()    # ... and is visible to the tensor cores' reads
            tg.barrier()              # ... for every thread; k-tile kt - 2's wgmmas are retired everywhere
            if frags is None:
                tg.wgmma_fence()
                for kk in range(steps):
                    tg.wgmma(acc, a_src[stage], b_src[stage], self.a_origin, kk * shape.k, self.b_origin)
                tg.wgmma_commit()
            else:
                tg.wgmma_wait(0)      # k-tile kt - 1 retired: its registers are free
                for kk in range(steps):
                    tg.load(frags[kk], a_src[stage], self.a_origin, kk * shape.k, comment=f"k-step {kk} of A")
                tg.wgmma_fence()
                for kk in range(steps):
                    tg.wgmma(acc, frags[kk], b_src[stage], None, kk * shape.k, self.b_origin)
                tg.wgmma_commit()
            self.copy(m0, n0, kt + ahead, inside_k)
            if frags is None:
                tg.wgmma_wait(1)      # k-tile kt - 1 retired for this warpgroup

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
