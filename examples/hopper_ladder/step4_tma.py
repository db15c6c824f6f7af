"""Step 4: TMA and an mbarrier. One thread announces the bytes of the k-tile (arrive with
expect_bytes) and starts two TMA copies; every thread waits for the barrier's phase, whose
parity alternates 0, 1, 0, ... with the k-tiles. TMA fills the tile in the 128B-swizzled
layout wgmma reads (one box per 128-byte panel: A in one, B's 256 columns in four), zeros
past the edges, and needs no proxy fence before wgmma.

    python step4_tma.py --m 300 --n 520 --k 200
"""
import sys

from common import main

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"


@tg.kernel
def step4(BM=128, BN=256, BK=64):
    tg.launch(threads=256, grid=(tg.cdiv("N", BN), tg.cdiv("M", BM), 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", BM, BK)
    sB = tg.shared("sB", "f16", BK, BN)
    full = tg.mbarrier("full")                     # one arrival per phase: the thread that announces the bytes
    m0, n0 = tg.program_id("y") * BM, tg.program_id("x") * BN
    group_row = (tg.warp_id() >> 2) * 64
    acc = tg.fragment(ATOM, "C", (1, BN // 8))
    for kt in tg.range(tg.cdiv(A.shape[1], BK)):
        tg.arrive(full[0], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
        tg.tma_load(sA[0], A.block(m0, kt * BK), full[0])
        tg.tma_load(sB[0], B.block(kt * BK, n0), full[0])
        tg.mbarrier_wait(full[0], kt & 1)
        tg.wgmma_fence()
        for kk in range(BK // 16):
            tg.wgmma(acc, sA[0], sB[0], group_row, kk * 16, 0)
        tg.wgmma_commit()
        tg.wgmma_wait(0)
        tg.barrier()                               # both warpgroups are done before the stage is refilled
    tg.store(C.block(m0 + tg.warp_id() * 16, n0), acc)


if __name__ == "__main__":
    sys.exit(main("step 4, TMA + mbarrier", step4))
