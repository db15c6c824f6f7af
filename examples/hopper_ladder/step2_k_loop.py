"""Step 2: a loop over K. Each k-tile is copied, waited for, multiplied; the accumulator stays
in registers across the loop; a barrier keeps the next copy from overwriting a stage the
tensor cores still read.

    python step2_k_loop.py --m 64 --n 128 --k 1000
"""
import sys

from common import main

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"


@tg.kernel
def step2(BM=64, BN=128, BK=64):
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", BM, BK)
    sB = tg.shared("sB", "f16", BK, BN)
    acc = tg.fragment(ATOM, "C", (1, BN // 8))
    for kt in tg.range(tg.cdiv(A.shape[1], BK)):
        tg.copy_async(sA[0], A.block(0, kt * BK))   # past K: zeros
        tg.copy_async(sB[0], B.block(kt * BK, 0))
        tg.commit()
        tg.wait(0)
        tg.fence_proxy_async()
        tg.barrier()
        tg.wgmma_fence()
        for kk in range(BK // 16):
            tg.wgmma(acc, sA[0], sB[0], 0, kk * 16, 0)
        tg.wgmma_commit()
        tg.wgmma_wait(0)
        tg.barrier()
    tg.store(C.block(tg.warp_id() * 16, 0), acc)


if __name__ == "__main__":
    sys.exit(main("step 2, K loop", step2, most=(64, 128, 0), sizes=(64, 128, 1000)))
