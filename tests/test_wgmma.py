"""wgmma (sm_90a): the descriptor model, the spec rules, the PTX (assembled by ptxas), the
pipeline's hazard rules and the GEMM end to end on the emulator, with planted mistakes."""
import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from tilegen.arch import wgmma as W
from tilegen.arch.mma import mma_atom
from tilegen.ir.hazards import HazardError
from tilegen.ir.layout import SmemLayout
from tilegen.sim import SimError
from tilegen.sim import wgmma as simw
from tilegen.errors import DSLError, SpecError
from bounds import fp8_wgmma_bound, gemm_bound
from tilegen.codegen.ptxas import resources
from ptxas_util import assert_assembles, needs_ptxas
from test_sim_bugs import PtxKernel
from seeds import seed

ATOM = "m16n8k16.f16.f32"


# ---- the descriptor and accumulator model ----------------------------------------------------

@pytest.mark.parametrize("mode", ["128B", "64B", "32B"])
@pytest.mark.parametrize("k_major", [True, False])
def test_descriptor_reads_the_panel_layout(mode, k_major):
    """Element (mn, k) of a slice, read through the descriptor the generator builds, is where
    tilegen.layout stores it (K-major: stored (mn, k); MN-major: stored (k, mn))."""
    esize, rows_mn, k = 2, 128, 64
    rows, cols = (rows_mn, k) if k_major else (k, rows_mn)
    layout = SmemLayout(rows, cols, esize, mode)
    base = 4096
    lead, stride = W.descriptor_strides(mode, rows, k_major)
    for mn0, k0 in [(0, 0), (64, 16), (64, 32)]:
        if k_major:
            start = (mn0 * layout.swizzle.span + (k0 * esize // layout.swizzle.span) * rows * layout.swizzle.span
                     + (k0 * esize) % layout.swizzle.span)
        else:
            start = (mn0 * esize // layout.swizzle.span) * rows * layout.swizzle.span + k0 * layout.swizzle.span
        if k_major and (k0 * esize) % layout.swizzle.span + 16 * esize > layout.swizzle.span:
            continue  # a k-step must stay inside one swizzle span
        d = W.Descriptor.decode(W.encode_descriptor(base + start, mode, lead, stride))
        mn = np.arange(64)[:, None]
        kk = np.arange(16)[None, :]
        got = d.address(mn, kk, esize, k_major)
        r, c = (mn0 + mn, k0 + kk) if k_major else (k0 + kk, mn0 + mn)
        want = base + layout.element_offset(r, c)
        np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))


@pytest.mark.parametrize("k_major", [True, False])
def test_emulator_decodes_descriptors_like_the_generator(k_major):
    """The emulator's own descriptor decoding (from the ISA text) agrees with tilegen.arch."""
    rng = np.random.default_rng(1)
    for mode in ("128B", "64B", "32B"):
        for _ in range(20):
            start = int(rng.integers(0, 1 << 14)) << 4
            lead, stride = (int(rng.integers(1, 1 << 10)) << 4 for _ in range(2))
            desc = W.encode_descriptor(start, mode, lead, stride)
            got = simw.operand_addresses(desc, 64, 16, 2, k_major)
            want = W.Descriptor.decode(desc).address(np.arange(64)[:, None], np.arange(16)[None, :], 2, k_major)
            np.testing.assert_array_equal(got, want)


def test_descriptor_fields():
    d = W.encode_descriptor(0x12340, "128B", 16, 1024)
    assert d & 0x3FFF == 0x1234 and (d >> 16) & 0x3FFF == 1 and (d >> 32) & 0x3FFF == 64 and d >> 62 == 1
    assert W.Descriptor.decode(d) == W.Descriptor(0x12340, 16, 1024, "128B")


def test_accumulator_is_m16n8_fragments_side_by_side():
    """Register 4j + r of warp w is register r of the m16n8 C atom j, 16w rows down."""
    c = mma_atom(ATOM).c
    for w in range(4):
        for lane in range(32):
            for i in range(0, 256 // 2):
                row, col = W.accumulator_coord(w, lane, i)
                r0, c0 = c.coord(lane, i % 4, 0)
                assert (row, col) == (16 * w + r0, 8 * (i // 4) + c0)
    pos = simw._acc_positions(256)
    want = [[W.accumulator_coord(t // 32, t % 32, i) for i in range(128)] for t in range(128)]
    np.testing.assert_array_equal(pos, [[r * 256 + cc for r, cc in row] for row in want])


def test_shape_rules():
    assert W.WgmmaShape("bf16", 128).instruction() == "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
    assert W.WgmmaShape("tf32", 256).instruction() == "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32"
    assert W.WgmmaShape("f16", 8).transposable and not W.WgmmaShape("tf32", 8).transposable
    assert W.WgmmaShape("e4m3", 256).instruction() == "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3"
    assert W.WgmmaShape("e4m3", 64, "e5m2").instruction().endswith("m64n64k32.f32.e4m3.e5m2")
    assert not W.WgmmaShape("e5m2", 8).transposable
    for bad in [("f16", 260), ("f16", 12), ("f32", 64), ("e4m3", 60), ("f16", 64, "bf16"), ("e4m3", 64, "f16")]:
        with pytest.raises(ValueError):
            W.WgmmaShape(*bad)


def test_fp8_wgmma_gemm_on_the_emulator():
    """e4m3 / e5m2 on wgmma: k32 steps of 128-byte K rows, both operands K-major; the products of
    fp8 values are exact in f32, so an f32 output matches the float64 product closely."""
    import ml_dtypes
    rng = np.random.default_rng(3)
    for dt, npdt, out in (("e4m3", ml_dtypes.float8_e4m3fn, "f32"), ("e5m2", ml_dtypes.float8_e5m2, "bf16")):
        spec = tilegen.GemmSpec(dtype=dt, out_dtype=out, instruction="wgmma")
        assert (tuple(spec.tile), spec.copy, spec.warp_specialized, spec.b_layout, spec.promote) == \
            ((128, 128, 128), "tma", True, "col", 2)
        k = tilegen.compile(spec)
        assert f"k32.f32.{dt}.{dt}" in k.ptx and "_promote2_" in k.name
        # promotion every second k-tile: the first k-tile's first wgmma restarts the accumulator
        # (scale-d 0), the other three and the next k-tile's four add; before the loop, the
        # second warpgroup's lone first k-tile (its groups are staggered by one k-tile)
        issues = [line for line in k.ptx.splitlines() if "wgmma.mma_async" in line]
        assert [line.rstrip(";").split(",")[-3].strip() for line in issues] == \
            ["0", "1", "1", "1"] + ["0", "1", "1", "1"] + ["1"] * 4
        two = tilegen.compile(spec.replace(promote=1, frag_buffers=2))   # every k-tile (matmul's, with ptxas)
        assert "_promote1_" in two.name and two.name.endswith("_fb2")
        issues = [line for line in two.ptx.splitlines() if "wgmma.mma_async" in line]
        # two accumulators take turns, each k-tile's products from zero: k-tile 0, the loop's
        # two, an even count's last one; every accumulator is read once wgmma_wait(1) retired it
        # (only the block's last waits for none in flight)
        assert [line.rstrip(";").split(",")[-3].strip() for line in issues] == ["0", "1", "1", "1"] * 4
        assert [two.ptx.count(f"wgmma.wait_group.sync.aligned {n};") for n in (0, 1)] == [2, 3]
        assert len({line.split("{")[1].split(",")[0] for line in issues}) == 2     # two accumulators
        # 5 k-tiles (groups of two end with a lone one) on 6 blocks: each of the emulator's
        # CTAs walks two; one k-tile on 8 blocks (three each for two CTAs); 3 k-tiles on 2
        # blocks (CTAs of one block and of none); 4 and 2 k-tiles (an even count: promote=1's
        # last k-tile in the second accumulator)
        for M, N, K in ((130, 260, 300 + 128 * 2), (130, 390, 100), (70, 200, 300), (70, 260, 500), (70, 130, 256)):
            A = rng.standard_normal((M, K)).astype(npdt)
            B = np.asfortranarray(rng.standard_normal((K, N)).astype(npdt))
            ref = 0.5 * (A.astype(np.float64) @ B.astype(np.float64))
            scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
            for kernel in (k, two):
                C = np.full((M, N), np.nan, dtype=np.float32 if out == "f32" else ml_dtypes.bfloat16)   # poisoned
                kernel(A, B, out=C, alpha=0.5, device="sim")
                assert np.max(np.abs(C.astype(np.float64) - ref) / (0.5 * scale.max())) <= gemm_bound("f16", K, out)


def test_fp8_promoted_every_k_tile_with_three_warpgroups_staggered_on_the_emulator():
    """192x128 tiles (three math warpgroups) promoted every k-tile: warpgroup w's groups run from
    step (w * 4) // 3 of one k-tile to the same step of the next, so no two drain at once (the PTX:
    each warpgroup restarts its accumulator at its own step); the sums stay whole k-tiles' over 1,
    2, 3 and 5 k-tiles, one and several blocks a CTA, ragged edges, a poisoned output."""
    import ml_dtypes
    spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="f32", instruction="wgmma", tile=(192, 128, 128),
                            warps=(12, 1), promote=1)
    k = tilegen.compile(spec)
    issues = [line for line in k.ptx.splitlines() if "wgmma.mma_async" in line]
    assert [line.rstrip(";").split(",")[-3].strip() for line in issues] == \
        ["0", "1", "1", "1"] + ["1", "0", "1", "1"] + ["1", "1", "0", "1"]
    rng = np.random.default_rng(6)
    for M, N, K in ((200, 130, 100), (190, 260, 256), (390, 130, 300), (200, 390, 128 * 4 + 60)):
        A = rng.standard_normal((M, K)).astype(ml_dtypes.float8_e4m3fn)
        B = np.asfortranarray(rng.standard_normal((K, N)).astype(ml_dtypes.float8_e4m3fn))
        C = k(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
        ref = A.astype(np.float64) @ B.astype(np.float64)
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
        assert (np.abs(C - ref) <= fp8_wgmma_bound(K, "f32", 128) * scale + 1e-6).all(), (M, N, K)


@needs_ptxas
@pytest.mark.parametrize("promote, buffers, swapped", [(1, 1, False), (1, 2, False), (2, 1, False), (1, 2, (16, 8)),
                                                      (1, 2, (16, 12)), (1, 2, (32, 8)), (1, 2, (32, 12))])
def test_fp8_promotion_keeps_the_wgmmas_asynchronous(promote, buffers, swapped):
    """An accumulator is read only once the wait_group that retires it ran (wgmma_wait(0), or
    wgmma_wait(1) with two accumulators taking turns): were it read with its wgmma in flight,
    ptxas would serialise every wgmma of the kernel (advisory C7514; 0.2x measured). With it:
    the swapped kernels matmul runs fp8 decoding's products on (16 and 32 rows, 8 and 12 stages)."""
    from tilegen.gemm.matmul import FP8_FEW_ROWS

    few = dict(FP8_FEW_ROWS, b_layout="col", tile=(swapped[0], 64, 128), stages=swapped[1]) if swapped else {}
    k = tilegen.compile(tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", instruction="wgmma",
                                         **{**few, "promote": promote, "frag_buffers": buffers}))
    report = assert_assembles(k.ptx, "sm_90a")
    assert "C7514" not in report and "serialized" not in report, report


def test_mixed_fp8_pairs_on_the_emulator():
    """e4m3 x e5m2 and e5m2 x e4m3 (the atom names B's type): B is declared, copied and read as
    its own type, on wgmma and on mma.sync, and through tilegen.matmul."""
    import ml_dtypes
    rng = np.random.default_rng(4)
    types = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    M, N, K = 70, 130, 300
    for a, b in (("e4m3", "e5m2"), ("e5m2", "e4m3")):
        A = rng.standard_normal((M, K)).astype(types[a])
        B = np.asfortranarray(rng.standard_normal((K, N)).astype(types[b]))
        ref = A.astype(np.float64) @ B.astype(np.float64)
        bound = gemm_bound("f16", K, "f32") * np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
        for kw in (dict(instruction="wgmma"), dict(target="sm_89")):
            spec = tilegen.GemmSpec(dtype=a, atom=f"m16n8k32.{a}.{b}.f32", **kw)
            k = tilegen.compile(spec)
            assert spec.b_dtype == b and f"{a}x{b}" in k.name and f".{a}.{b}" in k.ptx
            C = k(A, B, device="sim")
            assert (np.abs(C - ref) <= bound).all(), (a, b, kw)
            with pytest.raises(tilegen.LaunchError, match="B has dtype"):
                k(A, np.asfortranarray(B.astype(types[a])), device="sim")   # B of A's type is refused, not misread
        C = tilegen.matmul(A, B, out_dtype="f32", device="sim")
        assert (np.abs(C - ref) <= bound).all()


def test_fp8_wgmma_needs_k_major_operands():
    with pytest.raises(SpecError, match="fp8 operands must be K-major"):
        tilegen.GemmSpec(dtype="e4m3", instruction="wgmma", b_layout="row")
    with pytest.raises(SpecError, match="promotion is built for fp8"):
        tilegen.GemmSpec(dtype="f16", instruction="wgmma", promote=True)


# ---- spec -------------------------------------------------------------------------------------

def test_wgmma_spec_defaults():
    s = tilegen.GemmSpec(dtype="bf16", instruction="wgmma")
    assert (s.target, tuple(s.tile), tuple(s.warps), s.stages, s.frag_buffers, s.copy, s.persistent, s.store) == \
        ("sm_90a", (128, 256, 64), (8, 1), 4, 1, "tma", True, "tma")
    assert s.warp_specialized and s.threads == 384 and s.math_threads == 256
    tf32 = tilegen.GemmSpec(dtype="tf32", instruction="wgmma")
    assert (tf32.copy, tf32.persistent, tf32.store, tf32.threads) == ("cp.async", False, "direct", 256)
    cp = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", copy="cp.async")
    assert (cp.persistent, cp.store, cp.warp_specialized) == (False, "direct", False)
    one = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", persistent=False)
    assert (one.copy, one.store, one.threads) == ("tma", "direct", 256)
    fused = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", epilogue=tilegen.Epilogue("col", "gelu"))
    assert fused.warp_specialized and fused.store == "tma"
    assert tilegen.GemmSpec(dtype="bf16").copy == "cp.async"
    assert s.mainloop.shape(s).n == 256
    assert tilegen.GemmSpec.from_text(s.to_text()) == s
    assert tilegen.GemmSpec.from_text(s.to_text(minimal=True)) == s


def test_tf32_wgmma_spec_reads_mn_major_operands_through_registers():
    """wgmma reads tf32 from shared memory only K-major and takes only A from registers: a
    row-major B makes the kernel compute C^T = B^T A^T with B in registers (a column-major
    A is then transposed while copied); a column-major A with a column-major B goes through
    registers. The tensor cores truncate what they read from shared memory."""
    spec = lambda **kw: tilegen.GemmSpec(dtype="tf32", instruction="wgmma", **kw)  # noqa: E731
    s = spec(a_layout="col", b_layout="row")
    assert (tuple(s.tile), tuple(s.warps), s.swizzle, s.mainloop.shape(s).k, s.mainloop.shape(s).n) == ((256, 128, 32), (1, 8), "128B", 8, 256)
    assert s.swaps_operands and s.register_operand == "B"
    assert (s.stage_layout("A"), s.stage_layout("B")) == ("row", "row")
    assert s.transposes("A") and not s.transposes("B") and s.is_k_major("A") and not s.is_k_major("B")
    assert (s.operand_tile("A"), s.operand_tile("B")) == ((256, 32), (32, 128))
    rr, rc, cc = spec(), spec(b_layout="col"), spec(a_layout="col", b_layout="col")
    assert (rr.swaps_operands, rr.register_operand, rr.transposes("A"), tuple(rr.warps)) == (True, "B", False, (1, 8))
    assert (rc.swaps_operands, rc.register_operand, tuple(rc.tile)) == (False, None, (128, 256, 32))
    assert (cc.swaps_operands, cc.register_operand, cc.transposes("A"), cc.mainloop.shape(cc).n) == (False, "A", False, 256)
    assert s.tf32_truncates and not tilegen.GemmSpec(dtype="tf32").tf32_truncates
    f16 = tilegen.GemmSpec(dtype="f16", instruction="wgmma", a_layout="col")
    assert f16.stage_layout("A") == "col" and not f16.transposes("A") and f16.register_operand is None
    assert not tilegen.GemmSpec(dtype="f16", instruction="wgmma").swaps_operands


@pytest.mark.parametrize("kw, field, says", [
    (dict(target="sm_90"), "target", "sm_90a"),
    (dict(dtype="f32", acc_dtype="f16"), "acc_dtype", "f32"),   # (f32 itself runs as tf32 parts: test_prepare.py)
    (dict(dtype="tf32", a_layout="col", warps=(1, 8), tile=(48, 128, 8), swizzle="32B"), "tile", "8 rows x 16 bytes"),
    (dict(dtype="tf32", warps=(16, 1), tile=(256, 128, 32)), "warps", "C^T = B^T A^T"),
    (dict(dtype="tf32", warps=(1, 4), tile=(320, 64, 32)), "tile", "tile.m a multiple of 8 up to 256"),
    (dict(warps=(2, 2), tile=(128, 128, 64)), "warps", "warpgroup"),
    (dict(swizzle="pad"), "swizzle", "swizzled"),
    (dict(stages=2), "stages", "3..32"),
    (dict(frag_buffers=2), "frag_buffers", "accumulator of a product promoted every k-tile"),
    (dict(dtype="e4m3", frag_buffers=2), "frag_buffers", "2 with promote=1"),       # (promoted every 2)
    (dict(dtype="e4m3", promote=1, frag_buffers=2, tile=(128, 192, 128)), "frag_buffers", "3 x 96 registers"),
    (dict(tile=(128, 192, 64), warps=(8, 2)), "tile", "multiple of 64"),
    (dict(instruction="tcgen05"), "instruction", "mma.sync, wgmma"),
    (dict(copy="dma"), "copy", "auto, cp.async, tma"),
    (dict(copy="tma", dtype="tf32", a_layout="col"), "copy", "tf32 wgmma kernels copy with cp.async"),
    (dict(store="tma", persistent=False), "store", "only the warp-specialized kernels (persistent, copy=tma) store"),
    (dict(copy="tma", instruction="mma.sync"), "copy", "mma.sync kernels copy with cp.async"),
])
def test_wgmma_spec_errors(kw, field, says):
    with pytest.raises(tilegen.SpecError) as e:
        tilegen.GemmSpec(**{"dtype": "f16", "instruction": "wgmma", **kw})
    assert e.value.field == field and says in str(e.value)


# ---- PTX ---------------------------------------------------------------------------------------

SPECS = [dict(), dict(copy="cp.async"), dict(dtype="bf16", b_layout="col"), dict(persistent=True), dict(a_layout="col", tile=(64, 128, 64), warps=(4, 1), stages=3),
         dict(dtype="tf32"), dict(dtype="tf32", a_layout="col", b_layout="col", persistent=True),
         dict(a_layout="col", b_layout="col", tile=(128, 128, 64), warps=(8, 2), out_dtype="bf16",
              epilogue=tilegen.Epilogue(bias="col", activation="gelu_tanh"))]


@needs_ptxas
@pytest.mark.parametrize("kw", SPECS, ids=lambda k: "-".join(f"{a}" for a in k.values()) or "default")
def test_wgmma_kernels_assemble_without_spills(kw):
    spec = tilegen.GemmSpec(**{"dtype": "f16", "instruction": "wgmma", **kw})
    k = tilegen.compile(spec)
    assert ".target sm_90a" in k.ptx
    if spec.copy == "tma":   # TMA writes through the async proxy: no fence, mbarriers instead (but for the
        # generic writes of a TMA store's staging buffer)
        assert "cp.async.bulk.tensor.2d" in k.ptx and "mbarrier.try_wait" in k.ptx
        assert ("fence.proxy.async" in k.ptx) == (spec.store == "tma")
    else:
        assert "fence.proxy.async.shared::cta;" in k.ptx and "cp.async.bulk" not in k.ptx
    loops = 2 if spec.copy == "cp.async" else 1  # cp.async: a steady loop without K checks, then the drain
    assert k.ptx.count(f"wgmma.mma_async.sync.aligned.m64n{spec.mainloop.shape(spec).n}k{spec.mainloop.shape(spec).k}") == \
        loops * (spec.tile.k // spec.mainloop.shape(spec).k)
    assert_assembles(k.ptx, "sm_90a")
    info = resources(k.ptx, "sm_90a", k.smem_bytes)
    assert info.spill_stores == 0 and info.spill_loads == 0, str(info)


# ---- the pipeline's hazard rules, on a one-warpgroup main loop -----------------------------------

@tg.kernel
def wg_pipeline(stages=4, ahead=None, fence=True, barrier=True, retire=1, final_wait=True, wgmma_fence=True,
                commit=True):
    S = stages
    P = S - 2 if ahead is None else ahead
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "f16", 64, 64, stages=S)
    sB = tg.shared("sB", "f16", 64, 64, stages=S)
    acc = tg.fragment(ATOM, "C", (1, 8))

    def copy(t):
        tg.copy_async(sA[t % S], A.block(0, t * 64))
        tg.copy_async(sB[t % S], B.block(t * 64, 0))
        tg.commit()

    for s in range(P):
        copy(s)
    for kt in tg.range(tg.cdiv(A.shape[1], 64)):
        stage = kt % S
        tg.wait(P - 1)
        if fence:
            tg.fence_proxy_async()
        if barrier:
            tg.barrier()
        if wgmma_fence:
            tg.wgmma_fence()
        for kk in range(4):
            tg.wgmma(acc, sA[stage], sB[stage], 0, kk * 16, 0)
        if commit:
            tg.wgmma_commit()
        copy(kt + P)
        tg.wgmma_wait(retire)
    if final_wait:
        tg.wgmma_wait(0)
    tg.wait(0)
    tg.store(C.block(tg.warp_id() * 16, 0), acc)


def _run_sim(kernel, K=320, ptx=None):
    from tilegen.sim import GlobalMemory, run_kernel

    rng = np.random.default_rng(3)
    A = rng.standard_normal((64, K)).astype(np.float16)
    B = rng.standard_normal((K, 64)).astype(np.float16)
    mem = GlobalMemory()
    ptrs = []
    for x in (A, B, np.full((64, 64), np.nan, np.float32)):
        ptrs.append(mem.alloc(x.nbytes))
        mem.write(ptrs[-1], x)
    k = kernel if ptx is None else PtxKernel(kernel, ptx)
    run_kernel(k, {"M": 64, "N": 64, "K": K, "A_ptr": ptrs[0], "A_ld": K, "B_ptr": ptrs[1], "B_ld": 64,
                   "C_ptr": ptrs[2], "C_ld": 64}, {"M": 64, "N": 64, "K": K}, mem)
    return mem.read(ptrs[2], 64 * 64 * 4, np.float32).reshape(64, 64), A.astype(np.float64) @ B.astype(np.float64)


@pytest.mark.parametrize("stages", [3, 4, 5])
def test_correct_wgmma_pipeline_passes_and_computes(stages):
    k = tilegen.compile(wg_pipeline, stages=stages, target="sm_90a")
    C, ref = _run_sim(k)
    assert np.abs(C - ref).max() < 1e-3


@pytest.mark.parametrize("knobs, says", [
    (dict(fence=False), "fence_proxy_async"),
    (dict(ahead=3), "wgmma"),                        # refills the stage the last tile's wgmma reads
    (dict(retire=2), "no wgmma_wait has retired it"),
    (dict(barrier=False), "barrier"),
    (dict(final_wait=False), "wgmma_wait(0)"),
    # the accumulator's zero fill (ordinary moves) before the first wgmma with no wgmma_fence: the PTX ISA
    # asks for one; the emulator cannot show it (it runs the wgmma after the moves anyway)
    (dict(wgmma_fence=False), "wgmma accumulates into fragment c, written"),
    # never committed, so no wait retires it: the advice names the commit (it said wgmma_wait(0) alone)
    (dict(commit=False), "wgmma_commit(), then wgmma_wait(0), first"),
])
def test_planted_pipeline_mistakes_are_rejected(knobs, says):
    with pytest.raises(HazardError) as e:
        tilegen.compile(wg_pipeline, target="sm_90a", **knobs)
    assert says in str(e.value)


@pytest.mark.parametrize("m0, n0, says", [(16, 0, r"m0=16 reads A\[rows 16..79\] of sA, whose stage is 64 x 64"),
                                          (0, 8, r"n0=8 reads B\[columns 8..71\] of sB, whose stage is 64 x 64")])
def test_a_wgmma_box_past_its_stage_is_refused(m0, n0, says):
    """A constant origin whose 64-row (or n-column) box runs past the stage: refused at trace time
    (the descriptor would read the next stage silently: error 0.77 on the emulator, no report)."""
    @tg.kernel
    def shifted():
        tg.launch(threads=128, grid=(1, 1, 1))
        sA = tg.shared("sA", "f16", 64, 64)
        sB = tg.shared("sB", "f16", 64, 64)
        acc = tg.fragment(ATOM, "C", (1, 8))
        tg.wgmma_fence()
        tg.wgmma(acc, sA[0], sB[0], m0, 0, n0)

    with pytest.raises(DSLError, match=says):
        tilegen.compile(shifted, target="sm_90a")


@tg.kernel
def rs_pipeline(retire=3, fence=True):
    """C = A @ B for one warpgroup, tf32, both operands column-major: A is M-major in shared
    memory, so each warp loads its 16 rows of every k-step into registers."""
    S, P = 3, 1
    tg.launch(threads=128, grid=(1, 1, 1))
    A = tg.tensor("A", "tf32", ("M", "K"), layout="col")
    B = tg.tensor("B", "tf32", ("K", "N"), layout="col")
    C = tg.tensor("C", "f32", ("M", "N"))
    sA = tg.shared("sA", "tf32", 32, 64, stages=S, swizzle="pad", pad=32, logical="col")
    sB = tg.shared("sB", "tf32", 64, 32, stages=S, logical="col")
    atom = "m16n8k8.tf32.f32"
    acc = tg.fragment(atom, "C", (1, 8))
    frags = [tg.fragment(atom, "A", (1, 1), name=f"a{kk}") for kk in range(4)]

    def copy(t):
        tg.copy_async(sA[t % S], A.block(0, t * 32))
        tg.copy_async(sB[t % S], B.block(t * 32, 0))
        tg.commit()

    copy(0)
    for kt in tg.range(tg.cdiv(A.shape[1], 32)):
        stage = kt % S
        tg.wait(P - 1)
        tg.fence_proxy_async()
        tg.barrier()
        for kk in range(4):
            tg.wgmma_wait(retire)
            tg.load(frags[kk], sA[stage], tg.warp_id() * 16, kk * 8)
            if fence:
                tg.wgmma_fence()
            tg.wgmma(acc, frags[kk], sB[stage], None, kk * 8, 0)
            tg.wgmma_commit()
        copy(kt + P)
    tg.wgmma_wait(0)
    tg.wait(0)
    tg.store(C.block(tg.warp_id() * 16, 0), acc)


def test_correct_register_pipeline_passes_and_computes():
    from bounds import gemm_bound, gemm_error

    from tilegen.sim import GlobalMemory, run_kernel

    k = tilegen.compile(rs_pipeline, target="sm_90a")
    rng = np.random.default_rng(8)
    K = 200
    A, B = rng.standard_normal((64, K)).astype(np.float32), rng.standard_normal((K, 64)).astype(np.float32)
    mem = GlobalMemory()
    ptrs = []
    for x in (A.T, B.T, np.full((64, 64), np.nan, np.float32)):   # column-major A and B
        ptrs.append(mem.alloc(x.nbytes))
        mem.write(ptrs[-1], np.ascontiguousarray(x))
    run_kernel(k, {"M": 64, "N": 64, "K": K, "A_ptr": ptrs[0], "A_ld": 64, "B_ptr": ptrs[1], "B_ld": K,
                   "C_ptr": ptrs[2], "C_ld": 64}, {"M": 64, "N": 64, "K": K}, mem)
    C = mem.read(ptrs[2], 64 * 64 * 4, np.float32).reshape(64, 64)
    assert gemm_error(C, A.astype(np.float64) @ B, A, B) <= gemm_bound("tf32", K, truncated=True)


@pytest.mark.parametrize("knobs, says", [
    (dict(retire=4), "load overwrites fragment a0 while a wgmma"),   # k-step 0 of the last tile may still read it
    (dict(fence=False), "with no wgmma_fence since"),
])
def test_planted_register_operand_mistakes_are_rejected(knobs, says):
    with pytest.raises(HazardError) as e:
        tilegen.compile(rs_pipeline, target="sm_90a", **knobs)
    assert says in str(e.value)


def test_wgmma_register_operand_errors():
    @tg.kernel
    def k(mistake):
        tg.launch(threads=128, grid=(1, 1, 1))
        sB = tg.shared("sB", "tf32", 64, 32, logical="col")
        acc = tg.fragment("m16n8k8.tf32.f32", "C", (1, 8))
        a = tg.fragment("m16n8k8.tf32.f32", "A", (2, 1) if mistake == "tiles" else (1, 1))
        tg.wgmma(acc, a, sB[0], 0 if mistake == "m0" else None, 0, 0)

    for mistake, says in (("tiles", "one m16 x k8 A fragment"), ("m0", "pass m0=None")):
        with pytest.raises(tilegen.DSLError) as e:
            tilegen.compile(k, mistake=mistake, target="sm_90a")
        assert says in str(e.value)


# ---- the emulator finds the same mistakes in the PTX --------------------------------------------

@pytest.fixture(scope="module")
def wg_kernel():
    return tilegen.compile(wg_pipeline, stages=4, target="sm_90a")


def test_emulator_without_proxy_fence(wg_kernel):
    ptx = wg_kernel.ptx.replace("fence.proxy.async.shared::cta;", "// fence removed")
    with pytest.raises(SimError) as e:
        _run_sim(wg_kernel, ptx=ptx)
    assert e.value.kind == "proxy" and e.value.text.startswith("wgmma.mma_async")


def test_emulator_refill_while_wgmma_in_flight(wg_kernel):
    ptx = wg_kernel.ptx.replace("wgmma.wait_group.sync.aligned 1;", "wgmma.wait_group.sync.aligned 2;")
    with pytest.raises(SimError) as e:
        _run_sim(wg_kernel, ptx=ptx)
    assert e.value.kind == "war" and "a wgmma or TMA store still in flight reads" in str(e.value)


def test_emulator_wgmma_before_copies_land(wg_kernel):
    ptx = wg_kernel.ptx.replace("cp.async.wait_group 1;", "cp.async.wait_group 2;")
    with pytest.raises(SimError) as e:
        _run_sim(wg_kernel, ptx=ptx)
    assert e.value.kind == "pending"


def test_emulator_without_barrier(wg_kernel):
    ptx = wg_kernel.ptx.replace("bar.sync 0;", "// barrier removed")
    with pytest.raises(SimError) as e:
        _run_sim(wg_kernel, ptx=ptx)
    assert e.value.kind == "race"


# ---- the GEMM template on the emulator -------------------------------------------------------------

def _inputs(dtype, M, N, K, a_layout, b_layout, rng):
    from tilegen.arch.dtypes import numpy_dtype

    A = rng.standard_normal((M, K)).astype(numpy_dtype(dtype))
    B = rng.standard_normal((K, N)).astype(numpy_dtype(dtype))
    return (np.asfortranarray(A) if a_layout == "col" else A), (np.asfortranarray(B) if b_layout == "col" else B)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32"])
@pytest.mark.parametrize("layouts", ["rr", "rc", "cr", "cc"])
def test_wgmma_gemm_on_the_emulator(dtype, layouts):
    from bounds import gemm_bound, gemm_error

    al, bl = ({"r": "row", "c": "col"}[x] for x in layouts)
    swapped = dtype == "tf32" and bl == "row"   # C^T = B^T A^T: warpgroups side by side along N
    spec = tilegen.GemmSpec(dtype=dtype, instruction="wgmma", a_layout=al, b_layout=bl,
                            tile=(64, 128, 64 if dtype != "tf32" else 32), warps=(1, 8) if swapped else (4, 2),
                            stages=3)
    rng = np.random.default_rng(seed(dtype, layouts))
    M, N, K = 70, 150, 200     # ragged in every dimension, several k-tiles
    A, B = _inputs(dtype, M, N, K, al, bl, rng)
    out = np.full((M, N), np.nan, np.float32)
    C = tilegen.compile(spec)(A, B, out=out, device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert not np.isnan(C).any()
    assert gemm_error(C, ref, A, B) <= gemm_bound(dtype, K, truncated=spec.tf32_truncates)


def test_wgmma_gemm_with_fused_epilogue_on_the_emulator():
    from tilegen.arch.dtypes import numpy_dtype

    spec = tilegen.GemmSpec(dtype="f16", instruction="wgmma", tile=(64, 64, 64), warps=(4, 1), stages=3,
                            out_dtype="f16", epilogue=tilegen.Epilogue(bias="col", activation="relu"))
    rng = np.random.default_rng(5)
    M, N, K = 64, 100, 70
    A, B = _inputs("f16", M, N, K, "row", "row", rng)
    bias = rng.standard_normal(N).astype(numpy_dtype("f16"))
    C = tilegen.compile(spec)(A, B, bias=bias, device="sim")
    ref = np.maximum(A.astype(np.float64) @ B.astype(np.float64) + bias.astype(np.float64), 0)
    assert np.abs(C.astype(np.float64) - ref).max() <= 1e-2 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("dtype, layouts", [("f16", "rr"), ("f16", "cc"), ("tf32", "rr")])
def test_persistent_wgmma_gemm_on_the_emulator(dtype, layouts):
    """Three CTAs (the emulator's persistent grid) walk 35 blocks, each prefetching the next
    block's first k-tiles before storing its own (tf32 rr: blocks of C^T, stored transposed)."""
    from bounds import gemm_bound, gemm_error
    from tilegen.sim import EMULATOR_SM_COUNT

    al, bl = ({"r": "row", "c": "col"}[x] for x in layouts)
    shape = SMALL_TF32["row"] if dtype == "tf32" else dict(tile=(64, 64, 64), warps=(4, 1))
    spec = tilegen.GemmSpec(dtype=dtype, instruction="wgmma", persistent=True, a_layout=al, b_layout=bl,
                            stages=3, group_m=2, **shape)
    kernel = tilegen.compile(spec)
    M, N, K = 300, 450, 150
    assert kernel.grid({"M": M, "N": N, "K": K}, EMULATOR_SM_COUNT) == (EMULATOR_SM_COUNT, 1, 1)
    assert kernel.grid({"M": 64, "N": 64, "K": K}, 132) == (1, 1, 1)   # fewer blocks than SMs
    rng = np.random.default_rng(9)
    A, B = _inputs(dtype, M, N, K, al, bl, rng)
    C = kernel(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert not np.isnan(C).any()
    assert gemm_error(C, ref, A, B) <= gemm_bound(dtype, K, truncated=spec.tf32_truncates)


@pytest.mark.parametrize("bias", ["row", "col"])
def test_swapped_tf32_wgmma_epilogue_lands_on_c_on_the_emulator(bias):
    """A kernel computing C^T = B^T A^T stores its accumulator transposed: alpha, beta * C,
    the bias (per row or per column of C) and the residual meet C's elements."""
    from bounds import gemm_bound

    spec = tilegen.GemmSpec(dtype="tf32", instruction="wgmma", stages=3, **SMALL_TF32["row"],
                            epilogue=tilegen.Epilogue(bias=bias, activation="silu", residual=True))
    assert spec.swaps_operands
    rng = np.random.default_rng(6)
    M, N, K = 70, 100, 40
    A, B = _inputs("tf32", M, N, K, "row", "row", rng)
    vec = rng.standard_normal(M if bias == "row" else N).astype(np.float32)
    R, C0 = (rng.standard_normal((M, N)).astype(np.float32) for _ in range(2))
    C = tilegen.compile(spec)(A, B, out=C0.copy(), alpha=0.5, beta=0.25, bias=vec, residual=R, device="sim")
    x = 0.5 * (A.astype(np.float64) @ B) + 0.25 * C0 + (vec[:, None] if bias == "row" else vec[None, :])
    ref = x / (1 + np.exp(-x)) + R
    scale = np.abs(A).astype(np.float64) @ np.abs(B) + np.abs(C0) + np.abs(vec).max() + np.abs(R)
    assert (np.abs(C - ref) <= gemm_bound("tf32", K, truncated=True) * scale).all()


def test_persistent_needs_wgmma():
    with pytest.raises(tilegen.SpecError) as e:
        tilegen.GemmSpec(dtype="f16", persistent=True)
    assert e.value.field == "persistent" and "wgmma" in str(e.value)


# ---- tf32: transposing copies and truncated operands ---------------------------------------

def truncate_tf32(x):
    """f32 values with their low 13 mantissa bits dropped: what wgmma reads as tf32."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def round_tf32(x):
    """f32 values rounded to tf32, to nearest with ties to even (cvt.rn, what sm_90 kernels use)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def tf32_copy_problems(rng, M=192, N=300, K=72):
    """(A, B, C, source) with one exact 1.0 in each sum of A @ B, so C copies elements of
    the other operand, `source` ("A" or "B"): X @ P selects columns of X, Q @ Y rows of Y. A
    kernel computes C = the selected elements as its tensor cores read them; X and Y carry
    full 23-bit mantissas, so reading by truncation and by rounding differ for about half;
    a quarter of them sit exactly halfway between two tf32 values, where ties to even and
    ties away (cvt.rn and cvt.rna) differ for half."""
    def operand(shape):
        x = rng.standard_normal(shape).astype(np.float32).view(np.uint32)
        tie = rng.random(shape) < 0.25
        x[tie] = (x[tie] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
        return x.view(np.float32)
    X, Y = operand((M, K)), operand((K, N))
    cols = rng.integers(0, K, size=N)
    P = np.zeros((K, N), np.float32)
    P[cols, np.arange(N)] = 1.0
    rows = rng.integers(0, K, size=M)
    Q = np.zeros((M, K), np.float32)
    Q[np.arange(M), rows] = 1.0
    out = [(X, P, X[:, cols], "A"), (Q, Y, Y[rows, :], "B")]
    for _, _, want, _ in out:
        assert (truncate_tf32(want) != round_tf32(want)).mean() > 0.3
        ties_away = ((want.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
        assert (ties_away != round_tf32(want)).mean() > 0.05
    return out


def tf32_as_read(spec, want, source):
    """The operand elements `want` of operand `source` as a tf32 wgmma kernel reads them:
    rounded to nearest when loaded into registers, truncated when read from shared memory."""
    return round_tf32(want) if spec.register_operand == source else truncate_tf32(want)


# (tile, warps) small enough for the emulator: warpgroups side by side along N when swapped
SMALL_TF32 = {"row": dict(tile=(64, 64, 32), warps=(1, 4)), "col": dict(tile=(64, 128, 32), warps=(4, 2))}


@pytest.mark.parametrize("layouts", ["rr", "rc", "cr", "cc"])
def test_tf32_wgmma_reads_every_element_where_and_as_expected_on_the_emulator(layouts):
    """Bit-exact: every element of both operands arrives where wgmma reads it (registers,
    transposed copies, C^T stored transposed) and is read as tf32_as_read says."""
    al, bl = ({"r": "row", "c": "col"}[x] for x in layouts)
    spec = tilegen.GemmSpec(dtype="tf32", instruction="wgmma", a_layout=al, b_layout=bl, stages=3, **SMALL_TF32[bl])
    kernel = tilegen.compile(spec)
    order = lambda x, lay: np.asfortranarray(x) if lay == "col" else x  # noqa: E731
    for A, B, want, source in tf32_copy_problems(np.random.default_rng(4), M=70, N=150, K=40):
        got = kernel(order(A, al), order(B, bl), out=np.full(want.shape, np.nan, np.float32), device="sim")
        np.testing.assert_array_equal(got, tf32_as_read(spec, want, source))


def test_transposing_copy_needs_32_bit_elements():
    @tg.kernel
    def k():
        tg.launch(threads=128, grid=(1, 1, 1))
        B = tg.tensor("B", "f16", ("K", "N"))
        sB = tg.shared("sB", "f16", 64, 64, logical="col")
        tg.copy_async(sB[0], B.block(0, 0))

    with pytest.raises(tilegen.DSLError) as e:
        tilegen.compile(k)
    assert "transposes only 32-bit elements" in str(e.value)


def test_tf32_wgmma_rejects_mn_major_stages():
    @tg.kernel
    def k():
        tg.launch(threads=128, grid=(1, 1, 1))
        sA = tg.shared("sA", "tf32", 64, 32)
        sB = tg.shared("sB", "tf32", 32, 64)      # logical "row": MN-major for B
        acc = tg.fragment("m16n8k8.tf32.f32", "C", (1, 8))
        tg.wgmma(acc, sA[0], sB[0], 0, 0, 0)

    with pytest.raises(tilegen.DSLError) as e:
        tilegen.compile(k, target="sm_90a")
    assert "must both be K-major" in str(e.value) and "logical='col'" in str(e.value)


def test_transposing_copies_and_register_loads_are_conflict_free():
    """Each warp's 32 elements land in 32 banks (bank report), for both swizzles tf32 uses;
    the single loads of the register operand read 32 banks too."""
    for kw in (dict(a_layout="col"), dict(a_layout="col", swizzle="64B", tile=(256, 128, 16), warps=(1, 8)),
               dict(a_layout="col", tile=(128, 128, 32), warps=(1, 8))):
        k = tilegen.compile(tilegen.GemmSpec(dtype="tf32", instruction="wgmma", **kw))
        rows = [line for line in k.bank_report().splitlines() if "transposing" in line]
        assert rows and all(line.split()[5:7] == ["1", "1"] for line in rows), k.bank_report()
    for kw in (dict(), dict(a_layout="col", b_layout="col")):
        k = tilegen.compile(tilegen.GemmSpec(dtype="tf32", instruction="wgmma", **kw))
        rows = [line for line in k.bank_report().splitlines() if line.startswith("ld.shared.b32")]
        assert len(rows) == 4 and all(line.split()[-2] == "1.0x" for line in rows), k.bank_report()


def test_emulator_reports_an_accumulator_read_while_its_wgmma_is_in_flight():
    """The emulator runs each wgmma at issue, so a read of its accumulator before the wait_group
    that retires it would see the final sum; the hardware promises nothing there. Planted: the
    promoted kernel's wait for the last k-tile (an even count: acc[1]) lets one group stay in
    flight, and its add reads acc[1]."""
    import copy
    import ml_dtypes
    rng = np.random.default_rng(8)
    k = tilegen.compile(tilegen.GemmSpec(dtype="e4m3", out_dtype="f32", instruction="wgmma", promote=1, frag_buffers=2))
    A = rng.standard_normal((70, 256)).astype(ml_dtypes.float8_e4m3fn)        # 2 k-tiles
    B = np.asfortranarray(rng.standard_normal((256, 130)).astype(ml_dtypes.float8_e4m3fn))
    C = np.full((70, 130), np.nan, dtype=np.float32)
    k(A, B, out=C, device="sim")
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-6, atol=1e-6)
    planted = copy.copy(k)
    planted.ptx = k.ptx.replace("wgmma.wait_group.sync.aligned 0;", "wgmma.wait_group.sync.aligned 1;", 1)
    assert planted.ptx != k.ptx
    with pytest.raises(SimError, match=r"is an accumulator of warpgroup \d's wgmma at PTX line \d+, still in flight") as e:
        planted(A, B, out=C, device="sim")
    assert e.value.kind == "race" and e.value.text.startswith("add.f32")


def test_emulator_reports_a_register_a_written_while_its_wgmma_is_in_flight():
    """A from registers (tf32 with B row-major: C^T = B^T A^T, B's k-steps loaded into registers):
    the k loop loads the next k-tile's fragments only after wgmma_wait(0). Planted: that wait
    keeps a group in flight, so the loads overwrite registers the previous k-tile's wgmmas read."""
    import copy
    rng = np.random.default_rng(9)
    k = tilegen.compile(tilegen.GemmSpec(dtype="tf32", instruction="wgmma", b_layout="row"))
    assert any("wgmma.mma_async" in line and "}, {%r" in line for line in k.ptx.splitlines())   # A in registers
    A = rng.standard_normal((40, 70)).astype(np.float32)             # 3 k-tiles of 32
    B = rng.standard_normal((70, 50)).astype(np.float32)
    C = k(A, B, device="sim")
    assert np.abs(C - A.astype(np.float64) @ B).max() <= 2e-2
    planted = copy.copy(k)
    head, wait, loop = k.ptx.partition("wgmma.wait_group.sync.aligned 0;")    # (before the first k-tile: none in flight)
    planted.ptx = head + wait + loop.replace("wgmma.wait_group.sync.aligned 0;", "wgmma.wait_group.sync.aligned 1;", 1)
    with pytest.raises(SimError, match=r"is a register A operand of warpgroup \d's wgmma at PTX line \d+, still in flight"):
        planted(A, B, device="sim")


def test_emulator_skips_an_accumulator_access_whose_predicate_is_false():
    """The in-flight check looks at the threads that run the instruction: a predicated move into
    an accumulator whose wgmma is in flight is reported only when its predicate holds."""
    import copy
    import re
    import ml_dtypes
    rng = np.random.default_rng(10)
    k = tilegen.compile(tilegen.GemmSpec(dtype="e4m3", out_dtype="f32", instruction="wgmma", promote=1, frag_buffers=2))
    A = rng.standard_normal((70, 256)).astype(ml_dtypes.float8_e4m3fn)
    B = np.asfortranarray(rng.standard_normal((256, 130)).astype(ml_dtypes.float8_e4m3fn))
    count = int(re.search(r"\.reg \.pred %p<(\d+)>;", k.ptx).group(1))
    acc = re.search(r"wgmma\.mma_async\S* \{(%f\d+),", k.ptx).group(1)

    def planted(holds):
        p = copy.copy(k)
        ptx = k.ptx.replace(f".reg .pred %p<{count}>;", f".reg .pred %p<{count + 1}>;")
        p.ptx = ptx.replace("wgmma.commit_group.sync.aligned;", "wgmma.commit_group.sync.aligned;\n"
                            f"setp.{'eq' if holds else 'ne'}.s32 %p{count}, 0, 0;\n"
                            f"@%p{count} mov.f32 {acc}, 0f00000000;", 1)
        return p

    C = planted(False)(A, B, device="sim")
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-6, atol=1e-6)
    with pytest.raises(SimError, match=f"{acc} is an accumulator of warpgroup"):
        planted(True)(A, B, device="sim")


# ---- warps that part inside a warpgroup and meet again at its wgmma ------------------------------

@tg.kernel
def _parted_then_wgmma(only_warp0_multiplies=False):
    """One warpgroup: a branch by warp (both sides arrive on an mbarrier, per thread) before a
    TMA + wgmma k-loop; with `only_warp0_multiplies`, the wgmmas sit inside warp 0's side."""
    tg.launch(threads=128, grid=(1, 1, 1))
    A, B = tg.tensor("A", "f16", ("M", "K")), tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    sA, sB = tg.shared("sA", "f16", 64, 64), tg.shared("sB", "f16", 64, 64)
    full, bar = tg.mbarrier("full"), tg.mbarrier("bar", arrivals=128)
    acc = tg.fragment(ATOM, "C", (1, 8))
    with tg.if_(tg.lt(tg.warp_id(), 1)):
        tg.arrive(bar[0])
    with tg.else_():
        tg.arrive(bar[0])
    for kt in tg.range(tg.cdiv(A.shape[1], 64)):
        tg.arrive(full[0], expect_bytes=sA.stage_bytes + sB.stage_bytes, single=True)
        tg.tma_load(sA[0], A.block(0, kt * 64), full[0])
        tg.tma_load(sB[0], B.block(kt * 64, 0), full[0])
        tg.mbarrier_wait(full[0], kt & 1)
        tg.wgmma_fence()
        if only_warp0_multiplies:
            with tg.if_(tg.lt(tg.warp_id(), 1)):
                tg.wgmma(acc, sA[0], sB[0], 0, 0, 0)
        else:
            for kk in range(4):
                tg.wgmma(acc, sA[0], sB[0], 0, kk * 16, 0)
        tg.wgmma_commit()
        tg.wgmma_wait(0)
        tg.barrier()
    tg.store(C.block(tg.warp_id() * 16, 0), acc)


def _run_parted(kernel, M=64, N=64, K=128):
    from tilegen.sim import GlobalMemory, run_kernel

    rng = np.random.default_rng(seed("parted", M, N, K))
    A, B = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
    mem = GlobalMemory()
    pa, pb, pc = mem.alloc(A.nbytes), mem.alloc(B.nbytes), mem.alloc(M * N * 4)
    mem.write(pa, A), mem.write(pb, B), mem.write(pc, np.full(M * N, np.nan, np.float32))
    run_kernel(kernel, {"A_ptr": pa, "A_ld": K, "B_ptr": pb, "B_ld": N, "C_ptr": pc, "C_ld": N, "M": M, "N": N,
                        "K": K}, {"M": M, "N": N, "K": K}, mem)
    C = np.frombuffer(mem.read(pc, M * N * 4), np.float32).reshape(M, N)
    return C, A.astype(np.float64) @ B.astype(np.float64)


def test_warps_that_part_meet_again_at_their_warpgroups_wgmma():
    """A branch by warp is valid before a wgmma that every thread of the warpgroup then reaches:
    the emulator holds the first warps there until the others come (it had refused the kernel,
    "run by only part of warpgroup 0", unless a bar.sync joined them first)."""
    C, ref = _run_parted(tilegen.compile(_parted_then_wgmma, target="sm_90a"))
    assert np.abs(C - ref).max() <= 1e-3 * np.abs(ref).max()


def test_a_wgmma_the_rest_of_its_warpgroup_never_reaches_is_refused():
    with pytest.raises(SimError, match=r"wgmma is run by only part of warpgroup 0, and the rest of it never reaches"):
        _run_parted(tilegen.compile(_parted_then_wgmma, target="sm_90a", only_warp0_multiplies=True))
