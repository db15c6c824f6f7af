"""TMA copies and mbarriers (sm_90): the DSL primitives, their PTX (assembled by ptxas), the
static pipeline check and the emulator's protocol checks, each with planted mistakes, and
TMA GEMM kernels against numpy on the emulator (and on the GPU, marked gpu)."""
import re

import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from tilegen.ir.hazards import HazardError
from tilegen.sim import GlobalMemory, SimError, run_kernel
from gpu_util import requires_gpu
from ptxas_util import assert_assembles, needs_ptxas
from test_sim_bugs import PtxKernel

ATOM = "m16n8k16.f16.f32"
BM, BN, BK = 64, 64, 64


@tg.kernel
def tma_one_stage(parity_offset=0, expect=None, wait=True, barrier=True, arrive=True):
    """Ladder step 4: each k-tile is copied by TMA, waited for on an mbarrier, multiplied by
    two warpgroups (64 rows each)."""
    tg.launch(threads=256, grid=(tg.cdiv("N", BN), tg.cdiv("M", 2 * BM), 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", 2 * BM, BK)
    sB = tg.shared("sB", "f16", BK, BN)
    full = tg.mbarrier("full")
    m0, n0 = tg.program_id("y") * (2 * BM), tg.program_id("x") * BN
    group_row = (tg.warp_id() >> 2) * 64
    acc = tg.fragment(ATOM, "C", (1, BN // 8))
    for kt in tg.range(tg.cdiv(A.shape[1], BK)):
        if arrive:
            tg.arrive(full[0], expect_bytes=sA.stage_bytes + sB.stage_bytes if expect is None else expect, single=True)
        tg.tma_load(sA[0], A.block(m0, kt * BK), full[0])
        tg.tma_load(sB[0], B.block(kt * BK, n0), full[0])
        if wait:
            tg.mbarrier_wait(full[0], (kt + parity_offset) & 1)
        tg.wgmma_fence()
        for kk in range(BK // 16):
            tg.wgmma(acc, sA[0], sB[0], group_row, kk * 16, 0)
        tg.wgmma_commit()
        tg.wgmma_wait(0)
        if barrier:
            tg.barrier()   # both warpgroups are done with the stage before thread 0 refills it
    tg.store(C.block(m0 + tg.warp_id() * 16, n0), acc)


@tg.kernel
def tma_pipeline(stages=3, b_layout="row", release=True):
    """Ladder step 5: `stages` stages, a full and an empty mbarrier per stage; the copies run
    `stages` k-tiles ahead, a stage is refilled once every thread released it."""
    S = stages
    tg.launch(threads=128, grid=(tg.cdiv("N", BN), tg.cdiv("M", BM), 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"), layout=b_layout)
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", BM, BK, stages=S)
    sB = (tg.shared("sB", "f16", BK, BN, stages=S) if b_layout == "row"
          else tg.shared("sB", "f16", BN, BK, stages=S, logical="col"))
    full = tg.mbarrier("full", stages=S)
    empty = tg.mbarrier("empty", stages=S, arrivals=128)
    m0, n0 = tg.program_id("y") * BM, tg.program_id("x") * BN
    k_tiles = tg.cdiv(A.shape[1], BK)
    acc = tg.fragment(ATOM, "C", (1, BN // 8))

    def issue(t, s):
        tg.arrive(full[s], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
        tg.tma_load(sA[s], A.block(m0, t * BK), full[s])
        tg.tma_load(sB[s], B.block(t * BK, n0), full[s])

    for t in range(S):
        with tg.if_(tg.lt(t, k_tiles)):
            issue(t, t)
    for kt in tg.range(k_tiles):
        s, phase = kt % S, (kt // S) & 1
        tg.mbarrier_wait(full[s], phase)
        tg.wgmma_fence()
        for kk in range(BK // 16):
            tg.wgmma(acc, sA[s], sB[s], 0, kk * 16, 0)
        tg.wgmma_commit()
        tg.wgmma_wait(0)
        if release:
            tg.arrive(empty[s])
        with tg.if_(tg.lt(kt + S, k_tiles)):
            if release:
                tg.mbarrier_wait(empty[s], phase)
            issue(kt + S, s)
    tg.store(C.block(m0 + tg.warp_id() * 16, n0), acc)


def run_sim(kernel, M=64, N=64, K=320, seed=0, ptx=None, b_layout="row"):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    Bs = B if b_layout == "row" else np.ascontiguousarray(B.T)
    mem = GlobalMemory()
    ptrs, lds = [], []
    for x in (A, Bs, np.full((M, N), np.nan, np.float32)):
        x, ld = pitched(x)
        ptrs.append(mem.alloc(x.nbytes))
        lds.append(ld)
        mem.write(ptrs[-1], x)
    k = kernel if ptx is None else PtxKernel(kernel, ptx)
    run_kernel(k, {"M": M, "N": N, "K": K, "A_ptr": ptrs[0], "A_ld": lds[0], "B_ptr": ptrs[1],
                   "B_ld": lds[1], "C_ptr": ptrs[2], "C_ld": lds[2]}, {"M": M, "N": N, "K": K}, mem)
    C = mem.read(ptrs[2], M * lds[2] * 4, np.float32).reshape(M, lds[2])[:, :N]
    return C, A.astype(np.float64) @ B.astype(np.float64)


def pitched(x):
    """x in rows padded to 16 bytes (TMA needs 16-byte pitches), NaN in the padding; (array, ld)."""
    ld = -(-x.shape[1] * x.itemsize // 16) * 16 // x.itemsize
    out = np.full((x.shape[0], ld), np.nan, x.dtype)
    out[:, :x.shape[1]] = x
    return out, ld




def _bound(K):
    return 4 * K * 2.0 ** -24 * np.sqrt(K) * 4   # f32 accumulation of K products of N(0,1) f16 values


@pytest.fixture(scope="module")
def one_stage():
    return tilegen.compile(tma_one_stage, target="sm_90a")


@pytest.fixture(scope="module")
def pipeline():
    return tilegen.compile(tma_pipeline, target="sm_90a")


# ---- correct kernels ----------------------------------------------------------------------------

@pytest.mark.parametrize("M, N, K", [(64, 64, 320), (100, 72, 200), (64, 128, 64), (1, 1, 1)])
def test_one_stage_tma_gemm_on_the_emulator(one_stage, M, N, K):
    """Ragged M, N, K: the boxes past the matrix arrive as zeros and add nothing."""
    C, ref = run_sim(one_stage, M, N, K)
    assert np.abs(C - ref).max() <= _bound(K) * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("stages, K", [(3, 64), (3, 200), (3, 448), (2, 320), (4, 1000)])
def test_pipelined_tma_gemm_on_the_emulator(stages, K):
    k = tilegen.compile(tma_pipeline, stages=stages, target="sm_90a")
    C, ref = run_sim(k, 70, 96, K)
    assert np.abs(C - ref).max() <= _bound(K) * max(1.0, np.abs(ref).max())


def test_tma_into_a_k_major_b(tmp_path):
    """A column-major B lands K-major, one box per panel of 64 K-values."""
    k = tilegen.compile(tma_pipeline, b_layout="col", target="sm_90a")
    C, ref = run_sim(k, 64, 80, 256, b_layout="col")
    assert np.abs(C - ref).max() <= _bound(256) * max(1.0, np.abs(ref).max())


def test_a_pitch_tma_cannot_take_is_refused_with_the_reason(one_stage):
    mem = GlobalMemory()
    a = mem.alloc(64 * 70 * 2)
    with pytest.raises(SimError, match="A cannot go through TMA: its rows are 140 bytes apart, not a multiple of 16"):
        run_kernel(one_stage, {"M": 64, "N": 64, "K": 70, "A_ptr": a, "A_ld": 70, "B_ptr": a, "B_ld": 64,
                               "C_ptr": a, "C_ld": 64}, {"M": 64, "N": 64, "K": 70}, mem)


def test_tensor_maps_and_barriers_are_declared(pipeline):
    maps = {m.param: m for m in pipeline.tensor_maps}
    assert set(maps) == {"A_tmap", "B_tmap"}
    a = maps["A_tmap"]
    assert (a.ptr, a.rows, a.cols, a.ld, a.box_rows, a.box_cols, a.swizzle) == ("A_ptr", "M", "K", "A_ld", 64, 64, "128B")
    assert ("A_tmap", "tensormap") in pipeline.params
    assert [b[0] for b in pipeline.barriers] == ["full", "empty"]
    assert ".param .align 64 .b8 A_tmap[128]" in pipeline.ptx and "cvta.param.u64" in pipeline.ptx
    assert "mbarrier.try_wait.parity.shared::cta.b64" in pipeline.ptx
    assert "tensor map A_tmap: A, box 64 x 64, swizzle 128B" in pipeline.ir


@needs_ptxas
def test_tma_kernels_assemble(one_stage, pipeline):
    for k in (one_stage, pipeline, tilegen.compile(tma_pipeline, b_layout="col", target="sm_90a")):
        assert_assembles(k.ptx, "sm_90a")


# ---- the static check: planted mistakes -----------------------------------------------------------

@pytest.mark.parametrize("knobs, says", [
    # parity 1 first: passes at once, too early; the report names the wait and both parities
    (dict(parity_offset=1), "asked for parity 1, which a new mbarrier counts as complete (the phase before its "
                            "first), so it returned at once; the copy completes phase 0 (parity 0)"),
    (dict(arrive=False), "0 of its 1 arrivals came"),              # a deadlock
    (dict(expect=8192), "announced 8192 bytes and its TMA copies deliver 24576"),
    (dict(wait=False), "before waiting on the mbarrier"),
    (dict(barrier=False), "other warpgroups' may still read it"),  # thread 0 refills too early
])
def test_planted_tma_mistakes_are_rejected(knobs, says):
    with pytest.raises(HazardError) as e:
        tilegen.compile(tma_one_stage, target="sm_90a", **knobs)
    assert says in str(e.value)


def test_refill_without_release_is_rejected():
    with pytest.raises(HazardError, match="retired, but other warpgroups"):
        tilegen.compile(tma_pipeline, release=False, target="sm_90a")


# ---- the emulator: the same mistakes in the PTX ------------------------------------------------------

def _wait_parity_flipped(ptx):
    """The wait's parity register xor 1: the wait passes before the phase completed."""
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        if "mbarrier.try_wait.parity" in line:
            reg = line.split(",")[-1].strip().rstrip(";")
            lines.insert(i, f"            xor.b32 {reg}, {reg}, 1;")
            return "\n".join(lines) + "\n"
    raise AssertionError("no wait found")


def _expect_tx(ptx, nbytes):
    return "\n".join(line.replace(", 24576;", f", {nbytes};") if "expect_tx" in line else line
                     for line in ptx.splitlines()) + "\n"


def test_the_test_kernel_runs_clean(one_stage):
    C, ref = run_sim(one_stage, 128, 64, 192)
    assert np.abs(C - ref).max() < 1e-3


def test_emulator_reports_a_wait_on_the_wrong_parity(one_stage):
    with pytest.raises(SimError) as e:
        run_sim(one_stage, 128, 64, 192, ptx=_wait_parity_flipped(one_stage.ptx))
    assert e.value.kind == "pending" and "TMA copy" in str(e.value) and "no mbarrier wait" in str(e.value)
    assert "(full[0]: the copy completes its phase 0, parity 0)" in str(e.value)   # the barrier, by name


def test_emulator_reports_a_spin_loop_that_exits_early(one_stage):
    ptx = one_stage.ptx.replace("@!%p", "@%p", 1)   # leaves the loop when the phase has NOT completed
    with pytest.raises(SimError) as e:
        run_sim(one_stage, 128, 64, 192, ptx=ptx)
    assert e.value.kind == "pending" and "TMA copy" in str(e.value)


def test_emulator_reports_the_deadlock_of_a_missing_arrival(one_stage):
    ptx = "\n".join("// arrive removed" if "mbarrier.arrive" in line else line for line in one_stage.ptx.splitlines())
    with pytest.raises(SimError) as e:
        run_sim(one_stage, 128, 64, 192, ptx=ptx + "\n")
    msg = str(e.value)
    assert e.value.kind == "deadlock" and "full[0]" in msg and "1 of its 1 arrivals have not come" in msg


@pytest.mark.parametrize("nbytes, says", [(8192, "deliver 8192 bytes more than its arrivals announced"),
                                          (32768, "8192 announced bytes have not been delivered")])
def test_emulator_reports_expect_tx_mismatches(one_stage, nbytes, says):
    with pytest.raises(SimError) as e:
        run_sim(one_stage, 128, 64, 192, ptx=_expect_tx(one_stage.ptx, nbytes))
    assert says in str(e.value)


def test_emulator_reports_a_refill_while_another_warpgroup_reads(one_stage):
    head, body = one_stage.ptx.split("$wait_", 1)
    ptx = head + "$wait_" + body.replace("bar.sync 0;", "// barrier removed", 1)
    with pytest.raises(SimError) as e:
        run_sim(one_stage, 128, 64, 192, ptx=ptx)
    assert e.value.kind == "war" and "TMA copy" in str(e.value) and "warpgroup 1" in str(e.value)


# ---- the DSL's rules ---------------------------------------------------------------------------------

def _trace(body, target="sm_90a"):
    @tg.kernel
    def k():
        tg.launch(threads=128, grid=(1, 1, 1))
        body()
    return tilegen.compile(k, target=target)


def test_tma_needs_hopper():
    def body():
        tg.mbarrier("full")
    with pytest.raises(tilegen.DSLError, match="sm_90"):
        _trace(body, target="sm_80")


@pytest.mark.parametrize("make, says", [
    (lambda A, sA, bar: tg.tma_load(sA.T[0], A.block(0, 0), bar[0]), "keeps the tensor's memory order"),
    (lambda A, sA, bar: tg.mbarrier_wait(bar[0], 2), "parity=2"),
    (lambda A, sA, bar: tg.arrive(bar[0], expect_bytes=-1), "expect_bytes=-1"),
    (lambda A, sA, bar: bar[3], "it has 1 stage"),
    (lambda A, sA, bar: tg.tma_load(sA[0], A.block(0, 0), sA[0]), re.escape("tma_load(tile[stage]")),
])
def test_dsl_rejects_bad_tma_use(make, says):
    def body():
        A = tg.tensor("A", "f16", ("M", "K"))
        sA = tg.shared("sA", "f16", 64, 64)
        make(A, sA, tg.mbarrier("full"))
    with pytest.raises(tilegen.DSLError, match=says):
        _trace(body)


def test_a_box_beyond_256_rows_is_refused():
    def body():
        A = tg.tensor("A", "f16", ("M", "K"))
        sA = tg.shared("sA", "f16", 512, 64)
        tg.tma_load(sA[0], A.block(0, 0), tg.mbarrier("full")[0])
    with pytest.raises(tilegen.DSLError, match="at most 256"):
        _trace(body)


# ---- on the GPU ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("M, N, K", [(64, 64, 320), (200, 136, 1000), (1, 1, 1)])
def test_tma_kernels_on_the_gpu(pipeline, one_stage, M, N, K):
    from tilegen.runtime import DeviceBuffer, synchronize

    rng = np.random.default_rng(7)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    for kernel in (one_stage, pipeline):
        (a, lda), (b, ldb), (c, ldc) = (pitched(x) for x in (A, B, np.full((M, N), np.nan, np.float32)))
        bufs = [DeviceBuffer.from_host(x) for x in (a, b, c)]
        kernel.launch({"M": M, "N": N, "K": K, "A_ptr": bufs[0].ptr, "A_ld": lda, "B_ptr": bufs[1].ptr, "B_ld": ldb,
                       "C_ptr": bufs[2].ptr, "C_ld": ldc}, {"M": M, "N": N, "K": K})
        synchronize()
        C = bufs[2].copy_to_host(np.empty((M, ldc), np.float32))[:, :N]
        assert np.abs(C - ref).max() <= _bound(K) * max(1.0, np.abs(ref).max()), kernel.name


# ---- stacks through 3-D tensor maps (dsl/batched.py) ----------------------------------------------

@tg.kernel
def stack_copy():
    """Each CTA copies one 64 x 64 block of matrix z of a stack through shared memory with TMA:
    A.batch(z) in, C.batch(z) out, each through its stack's 3-D tensor map."""
    tg.launch(threads=128, grid=(tg.cdiv("N", 64), tg.cdiv("M", 64), "BATCH"))
    A = tg.batched_tensor("A", "f16", ("M", "N"))
    C = tg.batched_tensor("C", "f16", ("M", "N"))
    s = tg.shared("s", "f16", 64, 64)
    full = tg.mbarrier("full")
    z = tg.program_id("z")
    m0, n0 = tg.program_id("y") * 64, tg.program_id("x") * 64
    tg.arrive(full[0], expect_bytes=s.stage_bytes, single=True)
    tg.tma_load(s[0], A.batch(z).block(m0, n0), full[0])
    tg.mbarrier_wait(full[0], 0)
    tg.tma_store(C.batch(z).block(m0, n0), s[0])
    tg.tma_store_commit()
    tg.tma_store_wait(0)


@pytest.mark.parametrize("broadcast", [False, True])
def test_a_stack_copied_through_3d_tensor_maps(broadcast):
    """Three 50 x 72 matrices (ragged in both 64-wide tiles), C's 8 rows apart more than they
    need: each C matrix is its A matrix (or, A's stride 0, matrix 0 for all), the gap rows keep
    their NaN (a box past a matrix's edge writes nothing there), and the PTX copies in 3-D."""
    from tilegen.sim import GlobalMemory, run_kernel

    k = tilegen.compile(stack_copy, target="sm_90a")
    assert "cp.async.bulk.tensor.3d" in k.ptx and {m.rank for m in k.tensor_maps} == {3}
    count, M, N, ld, gap = 3, 50, 72, 80, 8
    rng = np.random.default_rng(5)
    A = rng.standard_normal((count, M, ld)).astype(np.float16)
    C = np.full((count, M + gap, ld), np.nan, np.float16)
    mem = GlobalMemory()
    a_ptr, c_ptr = mem.alloc(A.nbytes), mem.alloc(C.nbytes)
    mem.write(a_ptr, A)
    mem.write(c_ptr, C)
    run_kernel(k, {"M": M, "N": N, "BATCH": count, "A_ptr": a_ptr, "A_ld": ld, "A_batch_stride": 0 if broadcast
                   else M * ld, "C_ptr": c_ptr, "C_ld": ld, "C_batch_stride": (M + gap) * ld},
               {"M": M, "N": N, "BATCH": count}, mem)
    got = mem.read(c_ptr, C.nbytes, np.float16).reshape(C.shape)
    for z in range(count):
        assert np.array_equal(got[z, :M, :N], A[0 if broadcast else z, :, :N])
    assert np.isnan(got[:, M:, :]).all() and np.isnan(got[:, :, N:]).all()


# ---- a TMA load's global reads are in flight until the copy lands (sim/ordering.py) ---------------

@tg.kernel
def tma_in_place(write="after_wait"):
    """One 64 x 64 block of A copied into shared memory by TMA, then overwritten in place with
    zeros by every warp: after every thread's wait ("after_wait"), before it ("early", planted),
    after warp 0's wait and a CTA barrier ("after_barrier"), or after warp 0's wait alone
    ("unordered", planted: the other warps never see the copy land)."""
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f32", ("M", "N"))
    s = tg.shared("s", "f32", 64, 64)
    full = tg.mbarrier("full")
    zeros = tg.fragment(ATOM, "C", (1, 8))
    tg.arrive(full[0], expect_bytes=s.stage_bytes, single=True)
    tg.tma_load(s[0], A.block(0, 0), full[0])
    if write == "early":
        tg.store(A.block(tg.warp_id() * 16, 0), zeros)
    if write in ("after_wait", "early"):
        tg.mbarrier_wait(full[0], 0)
    else:
        with tg.role("waiter", warps=(0, 1)):
            tg.mbarrier_wait(full[0], 0)
        if write == "after_barrier":
            tg.barrier()
    if write != "early":
        tg.store(A.block(tg.warp_id() * 16, 0), zeros)


@pytest.mark.parametrize("write, says", [
    ("after_wait", None), ("after_barrier", None),
    ("early", "writes global memory that a TMA load of this CTA (thread 0, PTX line {load}) may still be reading"),
    ("unordered", "writes global memory that a TMA load (PTX line {load}) read, with nothing ordering this write "
                  "after the copy")])
def test_a_tma_load_reads_its_source_until_the_copy_lands(write, says):
    """Writing what a TMA load reads is ordered after the load only once a wait saw the copy land:
    the threads that waited, and those after them by a barrier, may write it in place; a write
    before the wait, or by warps that neither waited nor met a waiter, may land before the read."""
    kernel = tilegen.compile(tma_in_place, target="sm_90a", write=write)
    mem = GlobalMemory()
    A = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    ptr = mem.alloc(A.nbytes)
    mem.write(ptr, A)
    args, sizes = {"M": 64, "N": 64, "A_ptr": ptr, "A_ld": 64}, {"M": 64, "N": 64}
    if says is None:
        run_kernel(kernel, args, sizes, mem)
        assert not mem.read(ptr, A.nbytes, np.float32).any()
        return
    load = next(i + 1 for i, ln in enumerate(kernel.ptx.splitlines()) if "cp.async.bulk.tensor" in ln)
    with pytest.raises(SimError) as e:
        run_kernel(kernel, args, sizes, mem)
    assert e.value.kind == "race" and says.format(load=load) in str(e.value), str(e.value)


def test_a_cta_that_ends_before_its_tma_copy_landed_is_reported():
    """Nothing waits for the copy (the wait and the stores taken out of the PTX): the CTA would
    leave while the copy still writes its shared memory, which the GPU may by then have given
    to another CTA."""
    kernel = tilegen.compile(tma_in_place, target="sm_90a", write="after_barrier")
    ptx = "\n".join(line for line in kernel.ptx.splitlines()
                    if "mbarrier.try_wait" not in line and "bra $wait" not in line and "st.global" not in line)
    mem = GlobalMemory()
    ptr = mem.alloc(64 * 64 * 4)
    mem.write(ptr, np.random.default_rng(4).standard_normal((64, 64)).astype(np.float32))
    with pytest.raises(SimError) as e:
        run_kernel(PtxKernel(kernel, ptx + "\n"), {"M": 64, "N": 64, "A_ptr": ptr, "A_ld": 64}, {"M": 64, "N": 64}, mem)
    assert e.value.kind == "tma" and "the CTA ends while a TMA copy into its shared memory has not landed" in \
        str(e.value) and "full[0]" in str(e.value), str(e.value)


def _run_on_a(kernel, M=64, N=64):
    """The kernel on a random M x N f32 matrix A; A as it is after."""
    mem = GlobalMemory()
    A = np.random.default_rng(7).standard_normal((M, N)).astype(np.float32)
    ptr = mem.alloc(A.nbytes)
    mem.write(ptr, A)
    run_kernel(kernel, {"M": M, "N": N, "A_ptr": ptr, "A_ld": N}, {"M": M, "N": N}, mem)
    return mem.read(ptr, A.nbytes, np.float32).reshape(M, N)


@tg.kernel
def tma_ring(loads=4, relay_warp=None):
    """A producer warp loads `loads` blocks of A through one barrier (a phase each), the consumer
    warps wait for each; then block 0 (whose copy landed phases ago) is zeroed in place: by the
    consumers, or (relay_warp) by warps that only waited for an arrival of consumer warp
    relay_warp made after it saw the copies land."""
    tg.launch(threads=256, grid=(1, 1, 1))
    A = tg.tensor("A", "f32", ("M", "N"))
    s = tg.shared("s", "f32", 64, 64)
    full, empty, handed = tg.mbarrier("full"), tg.mbarrier("empty"), tg.mbarrier("handed")
    zeros = tg.fragment(ATOM, "C", (1, 8))
    with tg.role("producer", warps=(0, 1)):
        for i in range(loads):
            if i:
                tg.mbarrier_wait(empty[0], (i - 1) & 1)
            tg.arrive(full[0], expect_bytes=s.stage_bytes, single=True)
            tg.tma_load(s[0], A.block(64 * i, 0), full[0])
    with tg.role("consumers", warps=(1, 4)):
        for i in range(loads):
            tg.mbarrier_wait(full[0], i & 1)
            tg.arrive(empty[0], single=True)
        if relay_warp is None:
            tg.store(A.block((tg.warp_id() - 1) * 16, 0), zeros)
        else:
            with tg.if_(tg.eq(tg.warp_id(), relay_warp)):
                tg.arrive(handed[0], one_per="warp")
    with tg.role("writers", warps=(4, 8)):
        if relay_warp is not None:
            tg.mbarrier_wait(handed[0], 0)
            tg.store(A.block((tg.warp_id() - 4) * 16, 0), zeros)


@pytest.mark.parametrize("loads, relay_warp", [(1, None), (4, None), (4, 1), (4, 3)])
def test_threads_that_saw_a_copy_land_or_waited_for_one_that_did_may_write_its_source(loads, relay_warp):
    """Which consumer thread's wait happened to land the copy does not matter, nor how many phases
    of the barrier completed since (both had been refused)."""
    got = _run_on_a(tilegen.compile(tma_ring, target="sm_90a", loads=loads, relay_warp=relay_warp), M=64 * loads)
    assert not got[:48 if relay_warp is None else 64].any()


@tg.kernel
def tma_two_boxes(second=32):
    """Two loads on two barriers, the second box from row `second`; only the first is waited for
    before rows 0..63 are zeroed (with second < 64 the second copy may still read some of them)."""
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f32", ("M", "N"))
    s = tg.shared("s", "f32", 64, 64, stages=2)
    full = tg.mbarrier("full", stages=2)
    zeros = tg.fragment(ATOM, "C", (1, 8))
    for i, row in enumerate((0, second)):
        tg.arrive(full[i], expect_bytes=s.stage_bytes, single=True)
        tg.tma_load(s[i], A.block(row, 0), full[i])
    tg.mbarrier_wait(full[0], 0)
    tg.store(A.block(tg.warp_id() * 16, 0), zeros)
    tg.mbarrier_wait(full[1], 0)


def test_a_landed_copy_leaves_another_copys_reads_of_the_same_bytes_in_flight():
    assert not _run_on_a(tilegen.compile(tma_two_boxes, target="sm_90a", second=64), M=128)[:64].any()
    with pytest.raises(SimError, match="a TMA load of this CTA .* may still be reading") as e:
        _run_on_a(tilegen.compile(tma_two_boxes, target="sm_90a", second=32), M=128)
    assert e.value.kind == "race"


@tg.kernel
def tma_multicast_in_place(issuer=0):
    """One CTA of a 2-CTA cluster multicasts a block of A into both; each CTA waits for its own
    barrier, then zeroes its half of the block in place."""
    tg.launch(threads=128, grid=(2, 1, 1), cluster=(2, 1, 1))
    A = tg.tensor("A", "f32", ("M", "N"))
    s = tg.shared("s", "f32", 64, 64)
    full = tg.mbarrier("full")
    rank = tg.cluster_rank()
    zeros = tg.fragment(ATOM, "C", (1, 4))
    tg.arrive(full[0], expect_bytes=s.stage_bytes, single=True)
    with tg.if_(tg.eq(rank, issuer)):
        tg.tma_load(s[0], A.block(0, 0), full[0], multicast=0b11)
    tg.cluster_sync()
    tg.mbarrier_wait(full[0], 0)
    tg.store(A.block(tg.warp_id() * 16, rank * 32), zeros)


@pytest.mark.parametrize("issuer", [0, 1])
def test_every_cta_a_multicast_landed_in_may_write_its_source_after_its_wait(issuer):
    """(The reads had been credited to the first CTA the copy landed in: the other was refused.)"""
    assert not _run_on_a(tilegen.compile(tma_multicast_in_place, target="sm_90a", issuer=issuer)).any()


@tg.kernel
def tma_role_waits(waited="full"):
    """A copy issued outside the warp roles on `full`; a role waits on the barrier `waited`."""
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f32", ("M", "N"))
    s = tg.shared("s", "f32", 64, 64)
    bars = {"full": tg.mbarrier("full"), "other": tg.mbarrier("other")}
    tg.arrive(bars["full"][0], expect_bytes=s.stage_bytes, single=True)
    tg.arrive(bars["other"][0], single=True)
    tg.tma_load(s[0], A.block(0, 0), bars["full"][0])
    with tg.role("waiter", warps=(0, 1)):
        tg.mbarrier_wait(bars[waited][0], 0)


def test_a_copy_no_role_waits_for_is_still_refused_statically():
    """The static walk leaves waits inside warp roles to the emulator, but only for copies on a
    barrier some role waits on: a copy on a barrier nothing waits on is refused as before."""
    _run_on_a(tilegen.compile(tma_role_waits, target="sm_90a"))
    with pytest.raises(HazardError, match="the kernel ends with a TMA copy into stage 0 of s .* that nothing waited for"):
        tilegen.compile(tma_role_waits, target="sm_90a", waited="other")


@tg.kernel
def tma_wait_parity(parity=0):
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f32", ("M", "N"))
    s = tg.shared("s", "f32", 64, 64)
    full = tg.mbarrier("full")
    tg.arrive(full[0], expect_bytes=s.stage_bytes, single=True)
    tg.tma_load(s[0], A.block(0, 0), full[0])
    tg.mbarrier_wait(full[0], parity)


def test_a_wait_on_the_wrong_parity_is_named_when_the_copy_is_never_waited_for():
    """(It had said only that nothing waited for the copy: there was a wait, on parity 1.)"""
    tilegen.compile(tma_wait_parity, target="sm_90a")
    with pytest.raises(HazardError, match=r"that nothing waited for: the wait on full\[0\] \(test_tma.py:\d+\) asked "
                                          r"for parity 1, which a new mbarrier counts as complete .* so it returned at "
                                          r"once; the copy completes phase 0 \(parity 0\)"):
        tilegen.compile(tma_wait_parity, target="sm_90a", parity=1)
