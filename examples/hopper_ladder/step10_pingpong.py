"""Step 10: ping-pong consumers. In step 8 both math warpgroups work on every block (64 rows
each) and both run its epilogue at the same time, while the tensor cores wait. Here each
warpgroup is a consumer role of its own that multiplies whole 64 x 256 blocks: consumer 0
takes the CTA's blocks 0, 2, 4, ..., consumer 1 blocks 1, 3, 5, ... The producer fills the
ring in block order as before, so the consumers' main loops alternate, and one consumer's
epilogue runs while the other's wgmmas do.

A consumer may wait on a stage only one phase ahead: a parity names just the last two
phases of an mbarrier. So before its main loop a consumer waits for its turn, which the
other consumer gives (an arrival on `turn`) once it has waited on every k-tile of the block
before. Each consumer has its own store buffer and its own named barrier (its role's).

    python step10_pingpong.py --m 300 --n 520 --k 1000
"""
import sys

import numpy as np
from common import main
from step7_persistent import block_origin   # the grouped block order of step 7

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"
THREADS = 384                  # producer warpgroup + 2 consumer warpgroups
CONSUMER_THREADS = 128         # one warpgroup releases each stage


@tg.kernel
def step10(BM=64, BN=256, BK=64, stages=4, group_m=8, parts=4, buffers=2):
    S = stages
    tg.launch(threads=THREADS, grid=(tg.minimum(tg.cdiv("M", BM) * tg.cdiv("N", BN), tg.SM_COUNT), 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f16", ("M", "N"))
    M, N = A.shape[0], B.shape[1]
    sA = tg.shared("sA", "f16", BM, BK, stages=S)
    sB = tg.shared("sB", "f16", BK, BN, stages=S)
    full = tg.mbarrier("full", stages=S)
    empty = tg.mbarrier("empty", stages=S, arrivals=CONSUMER_THREADS)
    turn = tg.mbarrier("turn", stages=2)          # turn[c]: consumer c may start its next block
    k_tiles = tg.cdiv(A.shape[1], BK)
    blocks = tg.cdiv(M, BM) * tg.cdiv(N, BN)
    pid, ctas = tg.program_id(), tg.num_programs()
    my_blocks = tg.cdiv(blocks - pid, ctas)

    with tg.role("producer", warps=(0, 4), registers=40):
        with tg.if_(tg.lt(tg.warp_id(), 1)):
            for i in tg.range(my_blocks):
                m0, n0 = block_origin(pid + i * ctas, M, N, BM, BN, group_m)
                for kt in tg.range(k_tiles):
                    g = i * k_tiles + kt
                    s = g % S
                    with tg.if_(tg.ge(g, S)):
                        tg.mbarrier_wait(empty[s], ((g // S) + 1) & 1)
                    tg.arrive(full[s], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
                    tg.tma_load(sA[s], A.block(m0, kt * BK), full[s])
                    tg.tma_load(sB[s], B.block(kt * BK, n0), full[s])

    for c in range(2):
        sC = tg.shared(f"sC{c}", "f16", BM, BN // parts, stages=buffers)
        with tg.role(f"consumer{c}", warps=(4 + 4 * c, 8 + 4 * c), registers=232):
            warp_row = (tg.warp_id() % 4) * 16
            for j in tg.range(tg.cdiv(my_blocks - c, 2)):
                i = c + 2 * j                       # this consumer's j-th block
                m0, n0 = block_origin(pid + i * ctas, M, N, BM, BN, group_m)
                with tg.if_(tg.lt(0, i)):           # block i - 1 (the other's) fully waited on
                    tg.mbarrier_wait(turn[c], ((i - 1) // 2) & 1)
                acc = tg.fragment(ATOM, "C", (1, BN // 8))
                for kt in tg.range(k_tiles):
                    g = i * k_tiles + kt
                    s = g % S
                    tg.mbarrier_wait(full[s], (g // S) & 1)
                    tg.wgmma_fence()
                    for kk in range(BK // 16):
                        tg.wgmma(acc, sA[s], sB[s], 0, kk * 16, 0)
                    tg.wgmma_commit()
                    tg.wgmma_wait(1)
                    with tg.if_(tg.ge(kt, 1)):
                        tg.arrive(empty[(g - 1) % S])
                tg.wgmma_wait(0)
                tg.arrive(empty[(i * k_tiles + k_tiles - 1) % S])
                tg.arrive(turn[1 - c], one_per="warpgroup")   # the other consumer's turn
                for p in range(parts):
                    buf = p % buffers
                    tg.tma_store_wait(buffers - 1)
                    tg.barrier()                    # (this consumer's own named barrier)
                    tg.store_stage(sC[buf], acc, warp_row, part=p, parts=parts)
                    tg.fence_proxy_async()
                    tg.barrier()
                    tg.tma_store(C.block(m0, n0 + p * (BN // parts)), sC[buf])
                    tg.tma_store_commit()
            tg.tma_store_wait(0)


if __name__ == "__main__":
    sys.exit(main("step 10, ping-pong consumers", step10, out=np.float16))
