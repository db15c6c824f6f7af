"""Step 9: a 2-CTA cluster that multicasts B. Step 7's CTAs each loaded their own copy of the
B panel they multiply; two CTAs working on the two 128-row halves of a 256 x 256 block need
the same one. Here they run as a cluster (two multiprocessors launched together): each CTA's
producer loads its A tile and one half of the B tile, and multicasts that half into the
stage of both CTAs, so each stage fills with half the B traffic from L2. A stage may be
refilled only when the consumers of both CTAs are done with it: one thread of each math
warpgroup arrives on its own CTA's `empty` barrier and on the peer's. The two CTAs walk the
same sequence of block pairs, so their pipelines stay in step.

    python step9_cluster.py --m 300 --n 520 --k 1000
"""
import sys

from common import main
from step7_persistent import block_origin   # the grouped block order of step 7, here over block pairs

import tilegen.dsl as tg

ATOM = "m16n8k16.f16.f32"
THREADS = 384                  # producer warpgroup + 2 consumer warpgroups
PAIR = 2                       # CTAs per cluster, along M


@tg.kernel
def step9(BM=128, BN=256, BK=64, stages=4, group_m=8):
    S = stages
    pairs = tg.cdiv("M", PAIR * BM) * tg.cdiv("N", BN)
    tg.launch(threads=THREADS, grid=(tg.minimum(pairs * PAIR, tg.SM_COUNT), 1, 1), cluster=(PAIR, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    M, N = A.shape[0], B.shape[1]
    sA = tg.shared("sA", "f16", BM, BK, stages=S)
    sB = tg.shared("sB", "f16", BK, BN, stages=S)
    full = tg.mbarrier("full", stages=S)
    empty = tg.mbarrier("empty", stages=S, arrivals=PAIR * 2)   # one thread per math warpgroup, of both CTAs
    k_tiles = tg.cdiv(A.shape[1], BK)
    rank = tg.cluster_rank()
    peer = rank ^ 1
    n_pairs = tg.cdiv(M, PAIR * BM) * tg.cdiv(N, BN)
    cid, clusters = tg.cluster_id(), tg.num_clusters()
    my_pairs = tg.cdiv(n_pairs - cid, clusters)              # pairs cid, cid + clusters, ...

    def origin(i):
        m0, n0 = block_origin(cid + i * clusters, M, N, PAIR * BM, BN, group_m)
        return m0 + rank * BM, n0                            # this CTA's half of the pair

    with tg.role("producer", warps=(0, 4), registers=40):
        with tg.if_(tg.lt(tg.warp_id(), 1)):
            for i in tg.range(my_pairs):
                m0, n0 = origin(i)
                for kt in tg.range(k_tiles):
                    g = i * k_tiles + kt
                    s = g % S
                    with tg.if_(tg.ge(g, S)):           # both CTAs' consumers released the stage
                        tg.mbarrier_wait(empty[s], ((g // S) + 1) & 1)
                    tg.arrive(full[s], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
                    tg.tma_load(sA[s], A.block(m0, kt * BK), full[s])
                    tg.tma_load(sB[s], B.block(kt * BK, n0), full[s], multicast=0b11, part=rank, parts=PAIR)

    with tg.role("consumer", warps=(4, 12), registers=232):
        group_row = ((tg.warp_id() >> 2) - 1) * 64

        def release(stage):                          # one thread of each math warpgroup, in both CTAs
            tg.arrive(empty[stage], one_per="warpgroup")
            tg.arrive(empty[stage], cta=peer, one_per="warpgroup")

        for i in tg.range(my_pairs):
            m0, n0 = origin(i)
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
                    release((g - 1) % S)
            tg.wgmma_wait(0)
            release((i * k_tiles + k_tiles - 1) % S)
            tg.store(C.block(m0 + (tg.warp_id() - 4) * 16, n0), acc)


if __name__ == "__main__":
    sys.exit(main("step 9, a 2-CTA cluster multicasting B", step9))
