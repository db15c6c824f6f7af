"""Step 5: a multistage pipeline. `stages` buffers, each with a `full` barrier (its TMA copies
landed) and an `empty` barrier (all 256 threads are done reading it). The copies run ahead:
k-tile kt + stages - 1 is requested as soon as k-tile kt - 1's wgmmas are retired
(wgmma_wait(1) leaves only kt's in flight) and every thread released its stage.

    python step5_pipeline.py --m 300 --n 520 --k 1000
"""
import sys

from common import main

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"
THREADS = 256


@tg.kernel
def step5(BM=128, BN=256, BK=64, stages=4):
    S = stages
    tg.launch(threads=THREADS, grid=(tg.cdiv("N", BN), tg.cdiv("M", BM), 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", BM, BK, stages=S)
    sB = tg.shared("sB", "f16", BK, BN, stages=S)
    full = tg.mbarrier("full", stages=S)
    empty = tg.mbarrier("empty", stages=S, arrivals=THREADS)
    m0, n0 = tg.program_id("y") * BM, tg.program_id("x") * BN
    group_row = (tg.warp_id() >> 2) * 64
    k_tiles = tg.cdiv(A.shape[1], BK)
    acc = tg.fragment(ATOM, "C", (1, BN // 8))

    def request(t, s):   # k-tile t into stage s
        tg.arrive(full[s], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
        tg.tma_load(sA[s], A.block(m0, t * BK), full[s])
        tg.tma_load(sB[s], B.block(t * BK, n0), full[s])

    for t in range(S - 1):
        with tg.if_(tg.lt(t, k_tiles)):
            request(t, t)
    for kt in tg.range(k_tiles):
        s = kt % S
        tg.mbarrier_wait(full[s], (kt // S) & 1)
        tg.wgmma_fence()
        for kk in range(BK // 16):
            tg.wgmma(acc, sA[s], sB[s], group_row, kk * 16, 0)
        tg.wgmma_commit()
        tg.wgmma_wait(1)                            # k-tile kt - 1 retired
        with tg.if_(tg.ge(kt, 1)):
            prev = (kt - 1) % S
            tg.arrive(empty[prev])                  # this thread is done with kt - 1's stage
            nxt = kt + S - 1                        # ... which takes k-tile kt + S - 1
            with tg.if_(tg.lt(nxt, k_tiles)):
                tg.mbarrier_wait(empty[prev], ((kt - 1) // S) & 1)
                request(nxt, prev)
        with tg.if_(tg.lt(kt, 1)):                  # the first k-tile's next request: stage S - 1 is new
            with tg.if_(tg.lt(S - 1, k_tiles)):
                request(S - 1, S - 1)
    tg.wgmma_wait(0)
    tg.store(C.block(m0 + tg.warp_id() * 16, n0), acc)


if __name__ == "__main__":
    sys.exit(main("step 5, multistage pipeline", step5))
