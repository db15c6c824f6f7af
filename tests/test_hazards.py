"""The pipeline hazard check: a correct multistage schedule passes; each planted mistake is
rejected with a message naming the stage, the tile and the source line."""
import pytest

import tilegen
import tilegen.dsl as tg
from tilegen.ir.hazards import HazardError

ATOM = "m16n8k16.f16.f32"


@tg.kernel
def pipeline(stages, wait_pending=None, barrier=True, ahead=None, final_wait=True, barrier_after=False,
             modulo=True):
    """A one-warp GEMM main loop with the knobs a mistake would turn."""
    S = stages
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"), layout="col")
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", 16, 64, stages=S, swizzle="128B")
    sB = tg.shared("sB", "f16", 16, 64, stages=S, swizzle="128B", logical="col")
    acc = tg.fragment(ATOM, "C", (1, 2))
    a = tg.fragment(ATOM, "A", (1, 1))
    b = tg.fragment(ATOM, "B", (1, 2))
    for s in range(S - 1):
        tg.copy_async(sA[s], A.block(0, s * 64))
        tg.copy_async(sB[s], B.block(s * 64, 0))
        tg.commit()
    for kt in tg.range(tg.cdiv(A.shape[1], 64)):
        stage = kt % S if modulo else kt
        tg.wait(S - 2 if wait_pending is None else wait_pending)
        if barrier:
            tg.barrier()
        for kk in range(4):
            tg.load(a, sA[stage], 0, kk * 16)
            tg.load(b, sB[stage], kk * 16, 0)
            tg.mma(acc, a, b)
        if barrier_after:
            tg.barrier()
        nxt = kt + (S - 1 if ahead is None else ahead)
        tg.copy_async(sA[nxt % S], A.block(0, nxt * 64))
        tg.copy_async(sB[nxt % S], B.block(nxt * 64, 0))
        tg.commit()
    if final_wait:
        tg.wait(0)
    tg.store(C.block(0, 0), acc)


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_correct_schedule_passes(stages):
    k = tilegen.compile(pipeline, stages=stages)
    assert "cp.async.wait_group" in k.ptx


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_every_gemm_spec_schedule_passes(stages):
    for dtype in ("tf32", "f16", "bf16"):
        tilegen.compile(tilegen.GemmSpec(dtype=dtype, stages=stages, tile=(64, 64, 32)))


@pytest.mark.parametrize("stages", [3, 4])
def test_waiting_too_little_is_caught(stages):
    with pytest.raises(HazardError, match=r"stage \d of sA while a cp.async into it may still be in flight"):
        tilegen.compile(pipeline, stages=stages, wait_pending=stages - 1)


def test_missing_barrier_after_wait_is_caught():
    with pytest.raises(HazardError, match="before a barrier makes the other threads' copies visible"):
        tilegen.compile(pipeline, stages=3, barrier=False)


def test_missing_barrier_with_a_barrier_after_compute_is_still_caught():
    # the barrier after the mma orders the overwrite but not the visibility of the copies
    with pytest.raises(HazardError, match="before a barrier"):
        tilegen.compile(pipeline, stages=3, barrier=False, barrier_after=True)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_prefetching_into_the_stage_being_read_is_caught(stages):
    # S tiles ahead lands in stage kt % S, which this iteration just read: no barrier since.
    with pytest.raises(HazardError, match=r"overwrites a stage other warps may still be reading.*test_hazards\.py:\d+"):
        tilegen.compile(pipeline, stages=stages, ahead=stages)


def test_a_stage_index_past_the_tile_is_caught():
    """sA[kt] without the modulo: on the third k-tile the load would read past sA, in sB; the
    check names the stage and the tile instead of wrapping the index round."""
    with pytest.raises(HazardError, match=r"stage 2 of sA, which has 2 stages \(0\.\.1\) \(test_hazards\.py:\d+\)"):
        tilegen.compile(pipeline, stages=2, modulo=False)


def test_ending_with_copies_in_flight_is_caught():
    with pytest.raises(HazardError, match=r"wait_group\(0\)"):
        tilegen.compile(pipeline, stages=3, final_wait=False)


@tg.kernel
def branch_reads_early(bad_side="if"):
    """One side of a uniform branch reads a stage before waiting for its copy."""
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    sA = tg.shared("sA", "f16", 16, 64, stages=1, swizzle="128B")
    a = tg.fragment(ATOM, "A", (1, 1))
    tg.copy_async(sA[0], A.block(0, 0))
    tg.commit()

    def early():
        tg.load(a, sA[0], 0, 0)
        tg.wait(0)
        tg.barrier()

    def late():
        tg.wait(0)
        tg.barrier()
        tg.load(a, sA[0], 0, 0)

    with tg.if_(tg.lt(tg.program_id(), A.shape[0])):  # true for CTA 0 whenever M > 0
        (early if bad_side == "if" else late)()
    with tg.else_():
        (early if bad_side == "else" else late)()


def test_hazards_follow_the_branch_a_cta_takes():
    with pytest.raises(HazardError, match="may still be in flight"):
        tilegen.compile(branch_reads_early, bad_side="if")
    # CTA 0 never takes the else side for the sizes the check tries (M >= 1), so that side is
    # not reported: the check follows the branch a CTA really takes
    tilegen.compile(branch_reads_early, bad_side="else")


def test_a_wait_allowing_more_groups_than_are_pending_retires_none():
    """wait(4) with 3 groups committed leaves all 3 in flight (not the first 2 landed)."""
    with pytest.raises(HazardError, match=r"stage 0 of sA while a cp.async into it may still be in flight"):
        tilegen.compile(pipeline, stages=4, wait_pending=4)


@tg.kernel
def never_committed():
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    sA = tg.shared("sA", "f16", 16, 64, swizzle="128B")
    tg.copy_async(sA[0], A.block(0, 0))
    tg.wait(0)
    tg.load(tg.fragment(ATOM, "A", (1, 1)), sA[0], 0, 0)


def test_a_copy_never_committed_is_named_as_such():
    """wait(0) waits for committed groups only: the missing piece is the commit (it had said to
    wait for the group)."""
    with pytest.raises(HazardError, match=r"the copy was never committed into a group \(tilegen.dsl.commit\(\) after "
                                          r"the copies, then tilegen.dsl.wait\(n\) for its group\) \(test_hazards.py:\d+\)"):
        tilegen.compile(never_committed)


@tg.kernel
def per_warp_origin(rows=32):
    """Each of 4 warps loads its own 16 rows of sA (64 rows needed); sB follows sA in shared memory."""
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    sA = tg.shared("sA", "f16", rows, 32, swizzle="64B")
    sB = tg.shared("sB", "f16", 32, 64, swizzle="128B")
    tg.copy_async(sA[0], A.block(0, 0))
    tg.copy_async(sB[0], A.block(0, 0))
    tg.commit()
    tg.wait(0)
    tg.barrier()
    tg.load(tg.fragment(ATOM, "A", (1, 1)), sA[0], tg.warp_id() * 16, 0)


def test_a_runtime_origin_past_the_tile_is_refused_for_the_warp_it_is_past_for():
    """A constant origin outside the tile was refused; one computed per warp was not, and warps 2
    and 3 read sB's bytes as if they were sA's (a silent wrong answer on the GPU and the emulator)."""
    tilegen.compile(per_warp_origin, rows=64)
    with pytest.raises(HazardError, match=r"fragment \w+ at \(32, 0\) for warp 2 does not fit in sA \(32x32\): it would "
                                          r"read another tile's shared memory \(test_hazards.py:\d+\)"):
        tilegen.compile(per_warp_origin)


# -- branches some threads take and others skip (on the warp or the lane) ---------------------
# tests/test_shared_accumulator.py's two warps (each multiplies half of K of one block; warp 1's
# part goes through shared memory to warp 0), written with branches on the warp, one mistake (or
# none) planted around them; the hazard check walks both ways of such a branch and merges them.
def _two_warps(case):
    from test_shared_accumulator import split_k_in_warps

    return split_k_in_warps(roles=False, case=case)


@pytest.mark.parametrize("case", ["none", "part in the else arm"])
def test_branches_on_the_warp_that_are_right_pass_and_run(case):
    """(The part stored in the else arm had been refused: the walk went on with the then arm's state.)"""
    import numpy as np

    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((16, 64)).astype(np.float16), rng.standard_normal((64, 16)).astype(np.float16)
    C = np.full((16, 16), np.nan, np.float32)
    tilegen.compile(_two_warps(case))(A, B, C, device="sim")
    scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    assert np.all(np.abs(C - A.astype(np.float64) @ B.astype(np.float64)) <= 64 * 2.0 ** -23 * scale)


@pytest.mark.parametrize("case, says", [
    ("wait in one warp", r"reads stage 0 of sA while a cp.async into it may still be in flight"),
    ("loop trips by warp", r"reads stage 0 of sA .*(in flight|before a barrier)"),
    ("refill read in the else arm", r"copy into stage 0 of sA overwrites a stage other warps may still be reading"),
    ("refill by lane 5", r"copy_async \(its pieces are spread over every thread of the CTA\) inside a branch"),
    ("copies by one warp", r"copy_async \(its pieces are spread over every thread of the CTA\) inside a branch"),
    ("barrier in one warp", r"a barrier of the whole CTA inside a branch whose condition differs between threads"),
])
def test_mistakes_around_branches_on_the_warp_or_lane_are_caught_before_running(case, says):
    """Each had compiled (the else arm's reads dropped, a lane-5 branch sampled as uniform, a
    barrier or wait in one warp counted for all, a loop run thread 0's number of times) and only
    the emulator, if run, reported it."""
    with pytest.raises(HazardError, match=says):
        tilegen.compile(_two_warps(case))


def test_a_load_is_bounds_checked_only_for_the_warps_that_run_it():
    """A load whose origin is negative for warp 0, inside a branch warp 0 skips, is not refused
    (its per-warp origin check had ignored the branch)."""
    @tg.kernel
    def upper_warps():
        tg.launch(threads=128, grid=(1, 1, 1))
        A = tg.tensor("A", "f16", ("M", "K"))
        sA = tg.shared("sA", "f16", 16, 64)
        tg.copy_async(sA[0], A.block(0, 0))
        tg.commit()
        tg.wait(0)
        tg.barrier()
        w = tg.warp_id()
        a = tg.fragment(ATOM, "A", (1, 1))
        with tg.if_(tg.ge(w, 1)):
            tg.load(a, sA[0], 0, (w - 1) * 16)   # (warp 0 would start at column -16)

    tilegen.compile(upper_warps)


@pytest.mark.parametrize("where", ["then", "else"])
def test_a_tma_copy_issued_on_either_side_of_a_branch_on_the_thread(where):
    """Thread 0 announces the bytes and issues the copy, in the then side or the else side of a
    branch on the thread; every thread then waits for the phase and reads the stage. (Issued in
    the else side, the merge had dropped its arrival: a deadlock was reported.)"""
    @tg.kernel
    def one_copy():
        tg.launch(threads=128, grid=(1, 1, 1))
        A = tg.tensor("A", "f16", ("M", "K"))
        sA = tg.shared("sA", "f16", 64, 64)
        full = tg.mbarrier("full")

        def issue():
            tg.arrive(full[0], expect_bytes=sA.stage_bytes, single=True)
            tg.tma_load(sA[0], A.block(0, 0), full[0])

        if where == "then":
            with tg.if_(tg.eq(tg.thread_id(), 0)):
                issue()
        else:
            with tg.if_(tg.ne(tg.thread_id(), 0)):
                tg.fence_proxy_async()
            with tg.else_():
                issue()
        tg.mbarrier_wait(full[0], 0)
        a = tg.fragment(ATOM, "A", (1, 1))
        tg.load(a, sA[0], 0, 0)

    tilegen.compile(one_copy, target="sm_90a")


def _mbarrier_kernel(case):
    """One TMA copy (sm_90a) announced and issued under a branch on the warp, or arrivals of every
    thread under one, then every thread waits."""
    @tg.kernel
    def one_copy():
        tg.launch(threads=128, grid=(1, 1, 1))
        A = tg.tensor("A", "f16", ("M", "K"))
        sA = tg.shared("sA", "f16", 64, 64)
        full = tg.mbarrier("full", arrivals=128 if case == "arrivals of warp 0" else 1)
        w = tg.warp_id()
        if case == "arrivals of warp 0":
            with tg.if_(tg.lt(w, 1)):
                tg.arrive(full[0])   # (planted: the other warps' arrivals never come)
        else:
            with tg.if_(tg.eq(w, 0 if case == "copy by warp 0" else 1)):
                tg.arrive(full[0], expect_bytes=sA.stage_bytes, single=True)
                tg.tma_load(sA[0], A.block(0, 0), full[0])
        tg.mbarrier_wait(full[0], 0)
        a = tg.fragment(ATOM, "A", (1, 1))
        tg.load(a, sA[0], 0, 0)
    return one_copy


@pytest.mark.parametrize("case, says", [
    ("copy by warp 1", r"a single arrival runs on the CTA's first thread, which does not take this branch"),
    ("arrivals of warp 0", r"waits for phase 0 \(parity 0\) of full\[0\], which never completes: 32 of its 128 "
                           r"arrivals came: a deadlock"),
])
def test_single_thread_work_and_arrivals_under_branches_on_the_warp(case, says):
    """A single-thread op runs on thread 0 (outside roles): under a branch thread 0 skips it never runs;
    arrivals of every thread under a branch count the threads that take it (they had counted the whole
    CTA). Both had compiled and deadlocked on the emulator. Warp 0 issuing the copy is right, and so
    are arrivals on both sides of a branch (tests/test_wgmma.py's parted warps)."""
    tilegen.compile(_mbarrier_kernel("copy by warp 0"), target="sm_90a")
    with pytest.raises(HazardError, match=says):
        tilegen.compile(_mbarrier_kernel(case), target="sm_90a")


def test_an_accumulator_a_wgmma_may_still_write_is_not_loaded_over():
    """(tg.accumulate there was refused; tg.load of the same accumulator had compiled.)"""
    @tg.kernel
    def over():
        tg.launch(threads=128, grid=(1, 1, 1))
        A = tg.tensor("A", "f16", ("M", "K"))
        B = tg.tensor("B", "f16", ("K", "N"))
        P = tg.tensor("P", "f32", ("M", "N"))
        sA = tg.shared("sA", "f16", 64, 16, swizzle="32B")
        sB = tg.shared("sB", "f16", 16, 64, swizzle="128B")
        sP = tg.shared("sP", "f32", 64, 64, swizzle="128B")
        tg.copy_async(sA[0], A.block(0, 0))
        tg.copy_async(sB[0], B.block(0, 0))
        tg.copy_async(sP[0], P.block(0, 0))
        tg.commit()
        tg.wait(0)
        tg.barrier()
        tg.fence_proxy_async()
        acc = tg.fragment(ATOM, "C", (1, 8))
        tg.wgmma_fence()
        tg.wgmma(acc, sA[0], sB[0], 0, 0, 0)
        tg.wgmma_commit()
        tg.load(acc, sP[0], tg.warp_id() * 16, 0)   # (planted: before wgmma_wait)

    with pytest.raises(HazardError, match=r"load overwrites accumulator .* while a wgmma .* may still be writing it"):
        tilegen.compile(over, target="sm_90a")


def test_a_load_origin_that_moves_with_a_loop_is_checked_at_each_trip():
    """Rows i * 32 of a 32-row tile for i = 0, 1: the second trip reads past it (its origin had been
    checked at the first trip only)."""
    @tg.kernel
    def walks():
        tg.launch(threads=32, grid=(1, 1, 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        sP = tg.shared("sP", "f32", 32, 16, swizzle="none")
        tg.copy_async(sP[0], X.block(0, 0))
        tg.commit()
        tg.wait(0)
        tg.barrier()
        y = tg.fragment(ATOM, "C", (1, 2))
        for i in tg.range(2):
            tg.accumulate(y, sP[0], i * 32, 0)

    with pytest.raises(HazardError, match=r"fragment .* at \(32, 0\) for warp 0 does not fit in sP \(32x16\)"):
        tilegen.compile(walks)

