"""An accumulator read back from shared memory (tg.load / tg.accumulate of a C fragment from a
stage, ir LoadAccumulator): warps that split a sum combine their parts through shared memory.
Two warps each multiply half of K for the same block; warp 1 (a role) puts its part in a shared
tile with store_stage, and after a barrier warp 0 adds it (or loads it) and stores C. On the emulator, against
float64; the swizzled and 16-bit tiles; the PTX assembles; and the mistakes: no barrier between the
part's store and its read (the emulator's race check), a fragment that does not fit the tile, a
column-major tile, a tile of another dtype."""
import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.sim import SimError

ATOM = "m16n8k16.f16.f32"


def split_k_in_warps(part_dtype="f32", swizzle="64B", barrier=True, how="accumulate", roles=True, case="none"):
    """The two-warp kernel; `case` plants a mistake around branches on the warp or lane (or, "part
    in the else arm", stores the part from an else side) for tests/test_hazards.py."""
    @tg.kernel
    def halves():
        tg.launch(threads=64, grid=(1, 1, 1))
        A = tg.tensor("A", "f16", ("M", "K"))
        B = tg.tensor("B", "f16", ("K", "N"))
        C = tg.tensor("C", "f32", ("M", "N"))
        sA = tg.shared("sA", "f16", 16, 64)
        sB = tg.shared("sB", "f16", 64, 16, swizzle="32B")
        sP = tg.shared("sP", part_dtype, 16, 16, swizzle=swizzle)
        w = tg.warp_id()
        if case == "copies by one warp":
            with tg.if_(tg.eq(w, 0)):   # (planted: each thread copies its own pieces; warp 1's never come)
                tg.copy_async(sA[0], A.block(0, 0))
                tg.copy_async(sB[0], B.block(0, 0))
        else:
            tg.copy_async(sA[0], A.block(0, 0))
            tg.copy_async(sB[0], B.block(0, 0))
        tg.commit()
        if case == "wait in one warp":
            with tg.if_(tg.eq(w, 0)):
                tg.wait(0)   # (planted: warp 1's own copies are not waited for)
        else:
            tg.wait(0)
        a = tg.fragment(ATOM, "A", (1, 1))
        if case == "loop trips by warp":
            for _ in tg.range(w):   # (planted: warp 1 reads before the barrier that publishes the copies)
                tg.load(a, sA[0], 0, 0)
        tg.barrier()
        acc = tg.fragment(ATOM, "C", (1, 2))
        b = tg.fragment(ATOM, "B", (1, 2))
        for kk in range(2):   # warp w: k = 32 w .. 32 w + 31
            tg.load(a, sA[0], 0, w * 32 + 16 * kk)
            tg.load(b, sB[0], w * 32 + 16 * kk, 0)
            tg.mma(acc, a, b)
        if case == "refill read in the else arm":
            with tg.if_(tg.eq(w, 0)):
                tg.mul(acc, 1.0, out=acc)
            with tg.else_():
                tg.load(a, sA[0], 0, 0)   # warp 1 reads sA ...
            tg.copy_async(sA[0], A.block(0, 0))   # (planted: ... and it is refilled with no barrier)
            tg.commit()
            tg.wait(0)
        if case == "refill by lane 5":
            with tg.if_(tg.eq(tg.lane_id(), 5)):
                tg.copy_async(sA[0], A.block(0, 0))   # (planted: while other warps may still read sA)
            tg.commit()
            tg.wait(0)
        only = (lambda name, first: tg.role(name, warps=(first, first + 1))) if roles else \
            (lambda name, first: tg.if_(tg.eq(w, first)))   # (roles, or branches on the warp)
        if case == "part in the else arm":
            with tg.if_(tg.eq(w, 0)):
                tg.mul(acc, 1.0, out=acc)
            with tg.else_():
                tg.store_stage(sP[0], acc, 0)
        else:
            with only("upper", 1):
                tg.store_stage(sP[0], acc, 0)
                if case == "barrier in one warp":
                    tg.barrier()   # (planted: warp 0 never arrives)
        if barrier and case != "barrier in one warp":
            tg.barrier()
        with only("lower", 0):
            if how == "accumulate":
                tg.accumulate(acc, sP[0], 0, 0)
            else:   # the part alone, then this warp's added to it
                part = tg.fragment(ATOM, "C", (1, 2))
                tg.load(part, sP[0], 0, 0)
                acc = part + acc
            tg.store(C.block(0, 0), acc)
    return halves


def _run(kernel, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((16, 64)).astype(np.float16)
    B = rng.standard_normal((64, 16)).astype(np.float16)
    C = np.full((16, 16), np.nan, np.float32)
    kernel(A, B, C, device="sim")
    return C, A.astype(np.float64) @ B.astype(np.float64), np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))


@pytest.mark.parametrize("part_dtype, swizzle, how", [("f32", "64B", "accumulate"), ("f32", "none", "load"),
                                                      ("f32", "32B", "load"), ("bf16", "32B", "accumulate"),
                                                      ("f16", "none", "accumulate")])
def test_warps_that_split_k_combine_through_shared_memory(part_dtype, swizzle, how):
    C, want, scale = _run(tilegen.compile(split_k_in_warps(part_dtype, swizzle, how=how)))
    # f16 products are exact in f32; 64 f32 additions; a 16-bit part rounds once more (half the sum's scale)
    bound = 64 * 2.0 ** -23 + {"f32": 0.0, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}[part_dtype]
    assert np.all(np.abs(C - want) <= bound * scale)


def test_branches_on_the_warp_are_checked_as_every_warp_takes_them():
    """The same with tg.if_(warp == k) instead of roles: the hazard check walks a branch on the
    warp for the warps that take it (it had walked thread 0's way alone, reporting the part read
    "before anything was copied into it" and leaving warp 1's code unchecked)."""
    C, want, scale = _run(tilegen.compile(split_k_in_warps(roles=False)))
    assert np.all(np.abs(C - want) <= 64 * 2.0 ** -23 * scale)
    with pytest.raises(tilegen.HazardError, match=r"reads stage 0 of sP before a barrier makes the other threads'"):
        tilegen.compile(split_k_in_warps(roles=False, barrier=False))


def test_the_part_read_at_an_offset():
    """The fragment's origin in the tile: the part stored at row 16 of a 32-row tile, read there."""
    @tg.kernel
    def offset():
        tg.launch(threads=32, grid=(1, 1, 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        Y = tg.tensor("Y", "f32", ("M", "N"))
        sP = tg.shared("sP", "f32", 32, 16, swizzle="64B")
        x = tg.fragment(ATOM, "C", (1, 2))
        tg.accumulate(x, X.block(0, 0))
        tg.store_stage(sP[0], x, 16)
        tg.barrier()
        y = tg.fragment(ATOM, "C", (1, 2))
        tg.load(y, sP[0], 16, 0)
        tg.store(Y.block(0, 0), y * 2.0)

    X = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    Y = np.full_like(X, np.nan)
    tilegen.compile(offset)(X, Y, device="sim")
    assert np.array_equal(Y, 2 * X)


@needs_ptxas
def test_the_ptx_assembles():
    for dtype, swizzle in (("f32", "64B"), ("bf16", "32B")):
        ptx = tilegen.compile(split_k_in_warps(dtype, swizzle)).ptx
        assert "ld.shared.f32" in ptx or "ld.shared.b16" in ptx
        assert_assembles(ptx, "sm_80")


def test_no_barrier_between_the_part_and_its_read_is_a_race():
    with pytest.raises(SimError, match="race"):
        _run(tilegen.compile(split_k_in_warps(barrier=False)))


def _reads(origin=(0, 0), logical="row", rows=16):
    @tg.kernel
    def reads():
        tg.launch(threads=32, grid=(1, 1, 1))
        sP = tg.shared("sP", "f32", rows, 16, swizzle="none", logical=logical)
        acc = tg.fragment(ATOM, "C", (1, 2))
        tg.load(acc, sP[0], *origin)
    return reads


@pytest.mark.parametrize("make, says", [
    (lambda: _reads(rows=8), r"fragment .* at \(0, 0\) does not fit in sP \(8x16\)"),
    (lambda: _reads(origin=(8, 0)), r"fragment .* at \(8, 0\) does not fit in sP \(16x16\)"),
    (lambda: _reads(origin=(0, 8)), r"fragment .* at \(0, 8\) does not fit in sP \(16x16\)"),
    (lambda: _reads(logical="col"), r"an accumulator is read from a row-major tile; sP is declared col-major"),
])
def test_what_cannot_be_read_is_said(make, says):
    with pytest.raises((tilegen.DSLError, tilegen.IRError), match=says):
        tilegen.compile(make())


def test_a_tile_of_another_dtype_is_refused():
    @tg.kernel
    def wrong():
        tg.launch(threads=32, grid=(1, 1, 1))
        sP = tg.shared("sP", "f16", 16, 16, swizzle="32B")
        acc = tg.fragment("m16n8k16.f16.f16", "C", (1, 2))
        tg.load(acc, sP[0], 0, 0)

    with pytest.raises(tilegen.DSLError, match=r"reads an f32, f16 or bf16 tile into an f32 accumulator"):
        tilegen.compile(wrong)
