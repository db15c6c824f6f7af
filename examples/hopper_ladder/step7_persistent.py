"""Step 7: persistent, warp-specialized. One CTA per SM walks the blocks of C in a grouped
order (group_m blocks down M before moving along N, so the B panels they share stay in L2).
The producer's stage and phase counters run on across blocks: while the consumers store one
block's accumulator, the producer already fills the stages with the next block's k-tiles.
The consumers release every stage, the last of each block too (after wgmma_wait(0)).

    python step7_persistent.py --m 300 --n 520 --k 1000
"""
import sys

from common import main

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"
THREADS = 384                  # producer warpgroup + 2 consumer warpgroups
CONSUMER_THREADS = 256


def block_origin(index, M, N, BM, BN, group_m):
    """(m0, n0) of block `index`: group_m consecutive blocks walk down M, then along N."""
    blocks_m, blocks_n = tg.cdiv(M, BM), tg.cdiv(N, BN)
    per_group = blocks_n * group_m
    first_m = (index // per_group) * group_m
    rows = tg.minimum(blocks_m - first_m, group_m)
    in_group = index % per_group
    return (first_m + in_group % rows) * BM, (in_group // rows) * BN


@tg.kernel
def step7(BM=128, BN=256, BK=64, stages=4, group_m=8):
    S = stages
    tg.launch(threads=THREADS, grid=(tg.minimum(tg.cdiv("M", BM) * tg.cdiv("N", BN), tg.SM_COUNT), 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    M, N = A.shape[0], B.shape[1]
    sA = tg.shared("sA", "f16", BM, BK, stages=S)
    sB = tg.shared("sB", "f16", BK, BN, stages=S)
    full = tg.mbarrier("full", stages=S)
    empty = tg.mbarrier("empty", stages=S, arrivals=CONSUMER_THREADS)
    k_tiles = tg.cdiv(A.shape[1], BK)
    blocks = tg.cdiv(M, BM) * tg.cdiv(N, BN)
    pid, ctas = tg.program_id(), tg.num_programs()
    my_blocks = tg.cdiv(blocks - pid, ctas)        # blocks pid, pid + ctas, ...

    with tg.role("producer", warps=(0, 4), registers=40):
        with tg.if_(tg.lt(tg.warp_id(), 1)):
            for i in tg.range(my_blocks):
                m0, n0 = block_origin(pid + i * ctas, M, N, BM, BN, group_m)
                for kt in tg.range(k_tiles):
                    g = i * k_tiles + kt                # k-tiles this CTA requested before
                    s = g % S
                    with tg.if_(tg.ge(g, S)):           # the stage's previous k-tile released
                        tg.mbarrier_wait(empty[s], ((g // S) + 1) & 1)
                    tg.arrive(full[s], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
                    tg.tma_load(sA[s], A.block(m0, kt * BK), full[s])
                    tg.tma_load(sB[s], B.block(kt * BK, n0), full[s])

    with tg.role("consumer", warps=(4, 12), registers=232):
        group_row = ((tg.warp_id() >> 2) - 1) * 64
        for i in tg.range(my_blocks):
            m0, n0 = block_origin(pid + i * ctas, M, N, BM, BN, group_m)
            acc = tg.fragment(ATOM, "C", (1, BN // 8))
            for kt in tg.range(k_tiles):
                g = i * k_tiles + kt
                s = g % S
                tg.mbarrier_wait(full[s], (g // S) & 1)
                tg.wgmma_fence()
                for kk in range(BK // 16):
                    tg.wgmma(acc, sA[s], sB[s], group_row, kk * 16, 0)
                tg.wgmma_commit()
                tg.wgmma_wait(1)                    # k-tile g - 1 retired: release its stage
                with tg.if_(tg.ge(kt, 1)):
                    tg.arrive(empty[(g - 1) % S])
            tg.wgmma_wait(0)
            tg.arrive(empty[(i * k_tiles + k_tiles - 1) % S])   # the block's last k-tile
            tg.store(C.block(m0 + (tg.warp_id() - 4) * 16, n0), acc)


if __name__ == "__main__":
    sys.exit(main("step 7, persistent + warp specialization", step7))
