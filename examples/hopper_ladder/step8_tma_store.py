"""Step 8: the epilogue through shared memory and a TMA store. Step 7's math warps stored each
accumulator to global memory themselves, register by register, while the tensor cores
waited. Here they write it, converted to f16, into a shared buffer (half a block at a time:
the buffer is 128 x 128), and one thread hands each half to TMA, which writes it to C while
the math warps go on with the next block. Before the buffer is written again, that thread
waits until the previous store has read it (tma_store_wait) and the role's barrier tells the
other math threads. With buffers=2 (and parts=4: two 16 KB buffers) one slice fills while TMA
reads the other, which is what the GEMM does.

    python step8_tma_store.py --m 300 --n 520 --k 1000
"""
import sys

import numpy as np
from common import main
from step7_persistent import block_origin   # the grouped block order of step 7

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"
THREADS = 384                  # producer warpgroup + 2 consumer warpgroups
CONSUMER_THREADS = 256


@tg.kernel
def step8(BM=128, BN=256, BK=64, stages=4, group_m=8, parts=2, buffers=1):
    S = stages
    tg.launch(threads=THREADS, grid=(tg.minimum(tg.cdiv("M", BM) * tg.cdiv("N", BN), tg.SM_COUNT), 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f16", ("M", "N"))
    M, N = A.shape[0], B.shape[1]
    sA = tg.shared("sA", "f16", BM, BK, stages=S)
    sB = tg.shared("sB", "f16", BK, BN, stages=S)
    sC = tg.shared("sC", "f16", BM, BN // parts, stages=buffers)   # parts of a block of C on their way out
    full = tg.mbarrier("full", stages=S)
    empty = tg.mbarrier("empty", stages=S, arrivals=CONSUMER_THREADS)
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
                tg.wgmma_wait(1)
                with tg.if_(tg.ge(kt, 1)):
                    tg.arrive(empty[(g - 1) % S])
            tg.wgmma_wait(0)
            tg.arrive(empty[(i * k_tiles + k_tiles - 1) % S])
            for p in range(parts):
                buf = p % buffers
                tg.tma_store_wait(buffers - 1)      # (the storing thread) the store that last used buf read it
                tg.barrier()                        # ... as every math thread now knows
                tg.store_stage(sC[buf], acc, (tg.warp_id() - 4) * 16, part=p, parts=parts)
                tg.fence_proxy_async()              # visible to TMA, which reads through the async proxy
                tg.barrier()                        # ... from every math thread
                tg.tma_store(C.block(m0, n0 + p * (BN // parts)), sC[buf])
                tg.tma_store_commit()
        tg.tma_store_wait(0)


if __name__ == "__main__":
    sys.exit(main("step 8, TMA-store epilogue", step8, out=np.float16))
