"""Step 3: a grid of CTAs, each computing a 128 x 256 block of C with two warpgroups (64 rows
each, m64n256 wgmmas). Blocks past M or N copy zeros and store nothing.

    python step3_grid.py --m 300 --n 520 --k 200
"""
import sys

from common import main

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"


@tg.kernel
def step3(BM=128, BN=256, BK=64):
    tg.launch(threads=256, grid=(tg.cdiv("N", BN), tg.cdiv("M", BM), 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", BM, BK)
    sB = tg.shared("sB", "f16", BK, BN)
    m0, n0 = tg.program_id("y") * BM, tg.program_id("x") * BN
    group_row = (tg.warp_id() >> 2) * 64          # warpgroup g multiplies rows 64g .. 64g + 63
    acc = tg.fragment(ATOM, "C", (1, BN // 8))
    for kt in tg.range(tg.cdiv(A.shape[1], BK)):
        tg.copy_async(sA[0], A.block(m0, kt * BK))
        tg.copy_async(sB[0], B.block(kt * BK, n0))
        tg.commit()
        tg.wait(0)
        tg.fence_proxy_async()
        tg.barrier()
        tg.wgmma_fence()
        for kk in range(BK // 16):
            tg.wgmma(acc, sA[0], sB[0], group_row, kk * 16, 0)
        tg.wgmma_commit()
        tg.wgmma_wait(0)
        tg.barrier()
    tg.store(C.block(m0 + tg.warp_id() * 16, n0), acc)


if __name__ == "__main__":
    sys.exit(main("step 3, grid of tiles", step3))
