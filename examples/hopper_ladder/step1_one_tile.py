"""Step 1: one warpgroup, one 64 x 128 tile of C, one k-tile of 64: copy A and B into shared
memory (cp.async), wait, and let wgmma multiply them straight from there.

    python step1_one_tile.py --m 64 --n 128 --k 64
"""
import sys

from common import main

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"


@tg.kernel
def step1(BM=64, BN=128, BK=64):
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", BM, BK)
    sB = tg.shared("sB", "f16", BK, BN)
    acc = tg.fragment(ATOM, "C", (1, BN // 8))
    tg.copy_async(sA[0], A.block(0, 0))
    tg.copy_async(sB[0], B.block(0, 0))
    tg.commit()
    tg.wait(0)
    tg.fence_proxy_async()    # cp.async wrote through the generic proxy; wgmma reads through the async one
    tg.barrier()
    tg.wgmma_fence()
    for kk in range(BK // 16):
        tg.wgmma(acc, sA[0], sB[0], 0, kk * 16, 0)
    tg.wgmma_commit()
    tg.wgmma_wait(0)
    tg.store(C.block(tg.warp_id() * 16, 0), acc)   # each warp holds 16 rows of the 64


if __name__ == "__main__":
    sys.exit(main("step 1, one tile", step1, most=(64, 128, 64), sizes=(64, 128, 64)))
