"""Staged epilogue vectors (tilegen.staged_vector / fetch_vector / park_vector): the bias and
the scales a TMA-store epilogue reads are fetched when a block starts (4-byte elements by
cp.async into shared memory, 16-bit ones into registers), parked in shared memory after its
main loop, and read there by store_stage, so their latency hides behind the main loop. Checked: where the loads sit in the GEMM's PTX, results on the emulator,
the protocol's barriers (planted: a park after the barrier, a missing park), the emulator's
rule for bytes read by several warps, and the IR's hazard rule outside roles."""
import numpy as np
import pytest

import tilegen
from tilegen.arch.dtypes import numpy_dtype
from tilegen.errors import IRError
from tilegen.sim.errors import SimError
from tilegen.sim.race import SharedShadow
from ptxas_util import assert_assembles, needs_ptxas

FUSED = dict(instruction="wgmma", epilogue=tilegen.Epilogue(bias="col", activation="relu"))


def _fused_case(spec, M=200, N=300, K=130, seed=2):
    rng = np.random.default_rng(seed)
    dt, od = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    A = rng.standard_normal((M, K)).astype(dt)
    B = rng.standard_normal((K, N)).astype(dt)
    bias = rng.standard_normal(N).astype(od)
    C = tilegen.compile(spec)(A, B, bias=bias, device="sim")
    ref = np.maximum(A.astype(np.float64) @ B.astype(np.float64) + bias.astype(np.float64)[None, :], 0)
    return np.abs(C.astype(np.float64) - ref).max() / np.abs(ref).max()


def test_the_gemm_loads_its_epilogue_vectors_before_the_main_loop():
    k = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", **FUSED))
    ptx = k.ptx
    first_wgmma = ptx.index("wgmma.mma_async")
    epilogue = ptx[ptx.index("-> sC"):ptx.rindex(".bulk_group [")]   # the TMA-store epilogue's slices
    assert "ld.global.b16" in ptx[:first_wgmma]          # the bias: fetched before the main loop ...
    assert "ld.global" not in epilogue and "ld.shared.b32" in epilogue   # ... read from shared memory,
    assert "ld.shared.b16" not in epilogue                                 # two neighbouring columns a load
    assert "st.shared.b16" in ptx[first_wgmma:ptx.index("-> sC")]     # parked after the main loop
    assert tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", **FUSED).smem_bytes() == k.smem_bytes


@pytest.mark.parametrize("kw", [dict(dtype="bf16", out_dtype="bf16"),
                                dict(dtype="f16", out_dtype="f32", pingpong=True, tile=(64, 128, 64), warps=(4, 1))])
def test_staged_bias_on_the_emulator(kw):
    spec = tilegen.GemmSpec(**kw, **FUSED)
    assert _fused_case(spec) <= 2 ** -7


def test_staged_row_and_column_scales_with_alpha_on_the_emulator():
    """fp8 on wgmma with f32 row and column scales and an alpha: the TMA-store epilogue reads
    the column scales two at a time and folds alpha into the row scale; every element matches
    alpha * scale_a[i] * scale_b[j] * (A @ B)[i, j] of a float64 product (ragged M and N, so
    pairs at the edge are checked too)."""
    import ml_dtypes

    rng = np.random.default_rng(7)
    M, N, K = 130, 150, 128
    A = rng.standard_normal((M, K)).astype(ml_dtypes.float8_e4m3fn)
    W = rng.standard_normal((N, K)).astype(ml_dtypes.float8_e4m3fn)
    sa = (rng.random(M) + 0.5).astype(np.float32)
    sb = (rng.random(N) * 3 + 0.25).astype(np.float32)
    spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="f32", instruction="wgmma", b_layout="col",
                            epilogue=tilegen.Epilogue(scale_rows=True, scale_cols=True))
    kernel = tilegen.compile(spec)
    assert "ld.shared.v2.f32" in kernel.ptx
    C = kernel(A, W.T, alpha=0.75, scale_a=sa, scale_b=sb, device="sim")
    ref = 0.75 * sa[:, None].astype(np.float64) * sb[None, :] * (A.astype(np.float64) @ W.T.astype(np.float64))
    assert np.abs(C - ref).max() <= 2 ** -20 * np.abs(ref).max()


def test_a_park_after_the_barrier_is_a_race(monkeypatch):
    """Parking the vector right before store_stage reads it (after the epilogue's barrier):
    a thread reads an element another thread has just written, with no barrier between."""
    from tilegen.gemm.mainloops import wgmma as loops

    real_park, real_store = loops.tg.park_vector, loops.tg.store_stage
    held = []
    monkeypatch.setattr(loops.tg, "park_vector", lambda sv, buffer=0: held.append((sv, buffer)))

    def late_park(*a, **kw):
        for sv, buffer in held:
            real_park(sv, buffer=buffer)
        return real_store(*a, **kw)
    monkeypatch.setattr(loops.tg, "store_stage", late_park)
    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", group_m=5, **FUSED)   # (not in the disk cache)
    with pytest.raises(SimError) as e:
        _fused_case(spec)
    assert e.value.kind == "race" and "no bar.sync" in str(e.value)


def test_a_missing_park_gives_wrong_results(monkeypatch):
    from tilegen.gemm.mainloops import wgmma as loops

    monkeypatch.setattr(loops.tg, "park_vector", lambda sv, buffer=0: None)
    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", group_m=6, **FUSED)
    assert _fused_case(spec) > 4 * 2 ** -7     # the bias read as zeros: far outside the bound above


def test_bytes_read_by_several_warps_need_every_reader_released():
    """The race detector's rule for a byte read by threads of several warps: a later write is
    ordered only if the writer acquired an arrival after the read from every thread of each
    reading warp (a named barrier of their role does that)."""
    def shadow():
        s = SharedShadow(64, threads=128)
        s.read(np.arange(64), np.zeros((64, 1), dtype=np.int64), line=1)   # warps 0 and 1 read byte 0
        return s

    s = shadow()
    assert s.write(np.array([5]), np.zeros((1, 1), dtype=np.int64), line=2).kind == "war"   # nothing between
    s = shadow()   # a barrier of warps 0 and 1 (as a role's bar.sync, sim/runner.py)
    for t in range(64):
        s.release(t, ("bar", 0, 1, 0))
    s.acquire(np.arange(64), ("bar", 0, 1, 0))
    assert s.write(np.array([5]), np.zeros((1, 1), dtype=np.int64), line=2) is None
    s = shadow()   # a barrier of warp 0 only: warp 1's reads are not ordered
    for t in range(32):
        s.release(t, ("bar", 0, 2, 0))
    s.acquire(np.arange(32), ("bar", 0, 2, 0))
    assert s.write(np.array([5]), np.zeros((1, 1), dtype=np.int64), line=2).kind == "war"
    s = shadow()   # every reader released, but before a later read by warp 1
    for t in range(64):
        s.release(t, ("bar", 0, 3, 0))
    s.acquire(np.arange(64), ("bar", 0, 3, 0))
    s.read(np.array([40]), np.zeros((1, 1), dtype=np.int64), line=3)
    assert s.write(np.array([5]), np.zeros((1, 1), dtype=np.int64), line=2).kind == "war"


def _vector_kernel(with_barrier: bool):
    import tilegen.dsl as tg

    @tg.kernel
    def k():
        tg.launch(threads=128, grid=(1, 1, 1))
        C = tg.tensor("C", "f16", ("M", "N"))
        bias = tg.vector("b", "f16", "N")
        sb = tg.staged_vector(bias, 64)
        tg.fetch_vector(sb, 0)
        tg.park_vector(sb)
        if with_barrier:
            tg.barrier()
        acc = tg.fragment("m16n8k16.f16.f32", "C", (1, 8))
        tg.store_stage(tg.shared("s", "f16", 16, 64)[0], acc, 0, out=C.block(0, 0), bias=sb)
    return tilegen.compile(k, target="sm_90a")


def test_the_ir_hazard_rule_for_staged_vectors_outside_roles():
    _vector_kernel(True)
    with pytest.raises(IRError, match="before a barrier"):
        _vector_kernel(False)


def _refetch_kernel(dtype: str, barrier_before_refetch: bool, park_again: bool, read_in_flight: bool = False,
                    target: str = "sm_90a"):
    """A staged vector read by store_stage, then fetched again (the next block's); with
    read_in_flight, read again (after a barrier) before that fetch is parked."""
    import tilegen.dsl as tg

    @tg.kernel
    def k():
        tg.launch(threads=128, grid=(1, 1, 1))
        C = tg.tensor("C", "f32", ("M", "N"))
        scale = tg.vector("s", dtype, "N")
        sv = tg.staged_vector(scale, 64)
        tg.fetch_vector(sv, 0)
        tg.park_vector(sv)
        tg.barrier()
        acc = tg.fragment("m16n8k16.f16.f32", "C", (1, 8))
        stage = tg.shared("s", "f32", 16, 64)[0]
        tg.store_stage(stage, acc, 0, out=C.block(0, 0), bias=sv)
        if barrier_before_refetch:
            tg.barrier()
        tg.fetch_vector(sv, 64)
        if read_in_flight:
            tg.barrier()
            tg.store_stage(stage, acc, 0, out=C.block(0, 0), bias=sv)
        if park_again:
            tg.park_vector(sv)
    return tilegen.compile(k, target=target)


def test_a_fetch_by_cp_async_writes_the_tile_at_once():
    """4-byte elements go into the tile by cp.async at the fetch (no register in flight at the
    main loop's wgmma_fence), 16-bit ones through registers at the park: the IR's hazard rule
    sees the write where it happens, so fetching the next block's f32 vector while other warps
    may still read this one's (no barrier since) is refused, and for 16-bit only the park is."""
    k = _refetch_kernel("f32", True, True)
    fetched = k.ptx[:k.ptx.index("cp.async.wait_all")]
    assert "cp.async.ca.shared.global" in fetched and "ld.global" not in fetched
    with pytest.raises(IRError, match=r"fetch \(cp.async\) into stage 0 of .* other warps may still be reading"):
        _refetch_kernel("f32", False, False)
    _refetch_kernel("f16", False, False)
    with pytest.raises(IRError, match="park into stage 0"):
        _refetch_kernel("f16", False, True)
    # the copies are in flight until the park (cp.async.wait_all): a read before it, or an
    # end without it, is refused as for copy_async
    with pytest.raises(IRError, match="while a cp.async into it may still be in flight"):
        _refetch_kernel("f32", True, True, read_in_flight=True)
    with pytest.raises(IRError, match="the kernel ends with cp.async copies in flight"):
        _refetch_kernel("f32", True, False)


@needs_ptxas
def test_a_fetch_by_cp_async_assembles_for_sm_80():
    """The zero-fill past the vector's end is a src-size operand (PTX 7.0), not the ignore-src
    predicate (PTX 7.5), so an sm_80 kernel (PTX 7.0) with an f32 staged vector assembles."""
    k = _refetch_kernel("f32", True, True, target="sm_80")
    assert ".version 7.0" in k.ptx and "cp.async.ca.shared.global" in k.ptx
    assert_assembles(k.ptx, "sm_80")


def test_staged_vectors_refuse_misuse():
    import tilegen.dsl as tg

    def build(body):
        @tg.kernel
        def k():
            tg.launch(threads=256, grid=(1, 1, 1))
            body()
        return tilegen.compile(k, target="sm_90a")

    with pytest.raises(tilegen.DSLError, match="length=0"):
        build(lambda: tg.staged_vector(tg.vector("b", "f16", "N"), 0))

    def other_role():
        sb = tg.staged_vector(tg.vector("b", "f16", "N"), 64)
        with tg.role("r", warps=(0, 4)):
            tg.fetch_vector(sb, 0)
    with pytest.raises(tilegen.DSLError, match="fetch and park it in the role that declared it"):
        build(other_role)

    def short():
        C = tg.tensor("C", "f16", ("M", "N"))
        sb = tg.staged_vector(tg.vector("b", "f16", "N"), 32)
        tg.store_stage(tg.shared("s", "f16", 16, 64)[0], tg.fragment("m16n8k16.f16.f32", "C", (1, 8)), 0,
                       out=C.block(0, 0), bias=sb)
    with pytest.raises(tilegen.DSLError, match="stages 32 elements; the block has 64 cols"):
        build(short)


@pytest.mark.parametrize("first", ["wgmma", "tma store"])
def test_a_retired_async_read_keeps_its_warps_among_the_readers(first):
    """A byte a wgmma (warpgroup 1) or a TMA store (thread 200) read, then warp 0: a write after
    a barrier of warp 0 alone is not ordered after the first reader."""
    s = SharedShadow(64, threads=256)
    off = np.array([0])
    if first == "wgmma":
        assert s.issue_async_read(1, off, 10) is None
        s.retire_async_read(1, off, 10)
    else:
        s.inflight[0] += 1
        s.retire_bulk_read(200, off, 10)
    assert s.read(np.arange(32), np.zeros((32, 1), dtype=np.int64), line=20) is None
    for t in range(32):
        s.release(t, ("bar", 0, 1, 0))
    s.acquire(np.array([64]), ("bar", 0, 1, 0))
    assert s.write(np.array([64]), np.zeros((1, 1), dtype=np.int64), line=30).kind == "war"


def test_16_bit_vectors_are_double_buffered_and_read_before_the_slice_barrier():
    """A bf16 bias is staged a block ahead in two buffers, so store_stage reads it before the
    barrier that protects its staging buffer (the loads overlap the wait); f32 vectors (fp8's
    scales) keep one buffer, read after the barrier that publishes them (runs 159, 165, 166)."""
    def loads_before_barrier(spec):
        ptx = tilegen.compile(spec).ptx
        head = ptx[:ptx.index("-> sC")]   # up to the first slice's first store
        last_load = max(head.rfind(op) for op in ("ld.shared.b32", "ld.shared.v2.f32", "ld.shared.f32"))
        return last_load < head.rindex("bar.sync")

    bias = tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", **FUSED)
    scales = tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", instruction="wgmma", b_layout="col",
                              epilogue=tilegen.Epilogue(scale_rows=True, scale_cols=True))
    assert bias.mainloop.store_staging(bias)[2] == 2 and loads_before_barrier(bias)
    assert scales.mainloop.store_staging(scales)[2] == 1 and not loads_before_barrier(scales)
