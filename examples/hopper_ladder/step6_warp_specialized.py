"""Step 6: warp specialization. The CTA has three warpgroups with different jobs: warpgroup 0
is the producer (its first warp runs the loop and one thread issues every TMA copy; the other
three warps only give their registers back and finish),
warpgroups 1 and 2 are consumers that only wait for a stage, run its wgmmas and release it.
Nothing in the main loop waits for the whole CTA: the stages' `full` barriers (TMA bytes
landed) and `empty` barriers (all 256 consumer threads done reading) are the only contact.
setmaxnreg moves registers from the producer (40 per thread) to the consumers (232), whose
64 x 256 accumulators take 128 of them.

    python step6_warp_specialized.py --m 300 --n 520 --k 1000
"""
import sys

from common import main

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"
THREADS = 384                  # producer warpgroup + 2 consumer warpgroups
CONSUMER_THREADS = 256


@tg.kernel
def step6(BM=128, BN=256, BK=64, stages=4):
    S = stages
    tg.launch(threads=THREADS, grid=(tg.cdiv("N", BN), tg.cdiv("M", BM), 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", BM, BK, stages=S)
    sB = tg.shared("sB", "f16", BK, BN, stages=S)
    full = tg.mbarrier("full", stages=S)
    empty = tg.mbarrier("empty", stages=S, arrivals=CONSUMER_THREADS)
    m0, n0 = tg.program_id("y") * BM, tg.program_id("x") * BN
    k_tiles = tg.cdiv(A.shape[1], BK)

    with tg.role("producer", warps=(0, 4), registers=40):
        with tg.if_(tg.lt(tg.warp_id(), 1)):       # one warp loops; the other three are done
            for kt in tg.range(k_tiles):
                s = kt % S
                with tg.if_(tg.ge(kt, S)):          # the stage's previous k-tile, kt - S, released
                    tg.mbarrier_wait(empty[s], ((kt // S) + 1) & 1)
                tg.arrive(full[s], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
                tg.tma_load(sA[s], A.block(m0, kt * BK), full[s])
                tg.tma_load(sB[s], B.block(kt * BK, n0), full[s])

    with tg.role("consumer", warps=(4, 12), registers=232):
        group_row = ((tg.warp_id() >> 2) - 1) * 64  # consumer warpgroup 0 or 1: rows 0-63 or 64-127
        acc = tg.fragment(ATOM, "C", (1, BN // 8))
        for kt in tg.range(k_tiles):
            s = kt % S
            tg.mbarrier_wait(full[s], (kt // S) & 1)
            tg.wgmma_fence()
            for kk in range(BK // 16):
                tg.wgmma(acc, sA[s], sB[s], group_row, kk * 16, 0)
            tg.wgmma_commit()
            tg.wgmma_wait(1)                        # k-tile kt - 1 retired: release its stage
            with tg.if_(tg.ge(kt, 1)):
                tg.arrive(empty[(kt - 1) % S])
        tg.wgmma_wait(0)
        tg.store(C.block(m0 + (tg.warp_id() - 4) * 16, n0), acc)


if __name__ == "__main__":
    sys.exit(main("step 6, warp specialization", step6))
