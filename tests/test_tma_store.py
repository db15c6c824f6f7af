"""The epilogue through shared memory and TMA stores: ladder step 8 with its protocol mistakes
planted one at a time (each caught by the emulator), and the GEMM's store="tma" kernels on
the emulator (every out dtype, both operand dtypes, layouts, alpha and beta, ragged shapes,
outputs whose rows TMA cannot take) and on the GPU."""
import copy
import types

import numpy as np
import pytest

import tilegen
from gpu_util import requires_gpu
from ladder_util import common, planted
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.arch.dtypes import numpy_dtype
from tilegen.sim import SimError



def step8_with(old: str = "", new: str = "", **constants):
    return planted("step8_tma_store", "step8", (old, new), **constants)


@pytest.mark.parametrize("constants", [{}, {"buffers": 2, "parts": 4}])
def test_step8_runs_clean(constants):
    err, bound, _ = common.check(step8_with(**constants), 300, 520, 130, device="sim", seed=5, out=np.float16)
    assert err <= bound


WAIT = "                tg.tma_store_wait(buffers - 1)      # (the storing thread) the store that last used buf read it\n"
FIRST_BARRIER = "                tg.barrier()                        # ... as every math thread now knows\n"
FENCE = "                tg.fence_proxy_async()              # visible to TMA, which reads through the async proxy\n"
SECOND_BARRIER = "                tg.barrier()                        # ... from every math thread\n"
LAST_WAIT = "        tg.tma_store_wait(0)\n\n"
PLANTED = {
    "no fence before the store": (FENCE, "", "proxy", "no fence.proxy.async after the write"),
    "no barrier before the store": (SECOND_BARRIER, "", "race", "a TMA store reads bytes that thread"),
    "the buffer rewritten before the store read it": (WAIT, "", "war", "TMA store still in flight reads"),
    "the others not told the store read it": (FIRST_BARRIER, "", "war", "stmatrix overwrites a stage another warp "
                                              "may still be reading: thread 128 read these bytes (last at PTX line"),
    "the kernel ends before its stores read": (LAST_WAIT, "\n", "tma", "the CTA ends while a TMA store still reads"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_store_mistakes_are_caught(name):
    old, new, kind, says = PLANTED[name]
    with pytest.raises(SimError) as e:
        common.check(step8_with(old, new), 300, 520, 130, device="sim", seed=5, out=np.float16)
    assert e.value.kind == kind, str(e.value)
    assert says in str(e.value)


# ---- the GEMM's store="tma" ---------------------------------------------------------------------

def _gemm_case(spec, M, N, K, alpha, beta, seed=0, out_ld=None):
    rng = np.random.default_rng(seed)
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    A = rng.standard_normal((M, K)).astype(in_dt)
    B = rng.standard_normal((K, N)).astype(in_dt)
    A_in = np.asfortranarray(A) if spec.a_layout == "col" else A
    B_in = np.asfortranarray(B) if spec.b_layout == "col" else B
    C0 = rng.standard_normal((M, N)).astype(out_dt)
    out = C0.copy() if out_ld is None else np.zeros((M, out_ld), out_dt)[:, :N]
    if out_ld is not None:
        out[...] = C0
    C = tilegen.compile(spec)(A_in, B_in, out=out, alpha=alpha, beta=beta, device="sim")
    a64, b64 = A.astype(np.float64), B.astype(np.float64)
    ref = alpha * (a64 @ b64) + beta * C0.astype(np.float64)
    scale = abs(alpha) * (np.abs(a64) @ np.abs(b64)) + abs(beta) * np.abs(C0.astype(np.float64))
    rel = np.abs(C.astype(np.float64) - ref) / np.maximum(scale, 1e-30)
    out_eps = {"f32": 0.0, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}[spec.out_dtype]
    assert np.isfinite(C).all()
    assert rel.max() <= K * 2.0 ** -23 + 2.0 ** -20 + out_eps, rel.max()
    return C


@pytest.mark.parametrize("dtype, out, la, lb", [("f16", "f16", "row", "row"), ("bf16", "bf16", "col", "col"),
                                                ("f16", "f32", "col", "row"), ("bf16", "f32", "row", "col")])
def test_tma_store_gemm_on_the_emulator(dtype, out, la, lb):
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype=out, instruction="wgmma", a_layout=la, b_layout=lb)
    assert spec.store == "tma" and spec.warp_specialized
    _gemm_case(spec, 300, 520, 200, alpha=1.5, beta=0.0)


def _activation(x, name):
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    return x


@pytest.mark.parametrize("dtype, out, bias, activation, residual", [
    ("bf16", "bf16", "col", "gelu_tanh", False), ("f16", "f16", "row", "relu", True),
    ("bf16", "f32", "col", "silu", True), ("f16", "f16", None, "gelu_tanh", False)])
def test_fused_epilogues_through_tma_stores(dtype, out, bias, activation, residual):
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype=out, instruction="wgmma",
                            epilogue=tilegen.Epilogue(bias, activation, residual))
    assert spec.store == "tma"
    rng = np.random.default_rng(4)
    M, N, K = 300, 520, 130
    in_dt, out_dt = numpy_dtype(dtype), numpy_dtype(out)
    A, B = rng.standard_normal((M, K)).astype(in_dt), rng.standard_normal((K, N)).astype(in_dt)
    kw = {}
    ref = 0.5 * (A.astype(np.float64) @ B.astype(np.float64))
    if bias:
        vec = rng.standard_normal(N if bias == "col" else M).astype(out_dt)
        kw["bias"] = vec
        ref = ref + (vec.astype(np.float64)[None, :] if bias == "col" else vec.astype(np.float64)[:, None])
    ref = _activation(ref, activation)
    if residual:
        kw["residual"] = rng.standard_normal((M, N)).astype(out_dt)
        ref = ref + kw["residual"].astype(np.float64)
    C = tilegen.compile(spec)(A, B, alpha=0.5, device="sim", **kw)
    out_eps = {"f32": 2.0 ** -20, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}[out]
    assert np.abs(C.astype(np.float64) - ref).max() <= out_eps * np.abs(ref).max() + 1e-6


def test_beta_reads_c_through_the_direct_path():
    spec = tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma")
    _gemm_case(spec, 129, 300, 70, alpha=0.5, beta=-2.0, seed=1)


def test_rows_tma_cannot_store_go_to_the_direct_twin():
    spec = tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma")
    _gemm_case(spec, 70, 131, 40, alpha=1.0, beta=0.0, seed=2, out_ld=133)     # 266-byte rows
    k = tilegen.compile(spec)
    assert k.direct_store_kernel().spec.store == "direct" and k.direct_store_kernel() is k.direct_store_kernel()


def test_store_tma_is_refused_where_it_cannot_work():
    with pytest.raises(tilegen.SpecError, match=r"TMA stores need warps \(n, 1\)"):
        tilegen.GemmSpec(dtype="f16", instruction="wgmma", store="tma", tile=(128, 128, 64), warps=(8, 2))
    with pytest.raises(tilegen.SpecError, match="only the warp-specialized kernels"):
        tilegen.GemmSpec(dtype="f16", instruction="wgmma", store="tma", persistent=False)
    with pytest.raises(tilegen.SpecError, match="store"):
        tilegen.GemmSpec(dtype="f16", store="tma")
    with pytest.raises(tilegen.SpecError, match="allowed: auto, direct, tma"):
        tilegen.GemmSpec(dtype="f16", instruction="wgmma", store="smem")
    # a block too narrow to cut into 128-byte slices says so and names the widths that are not
    # (it had said the slices did not fit in shared memory, beside 48 KB of stages)
    with pytest.raises(tilegen.SpecError, match=r"64 columns of f16 do not cut into .* are 128, 192, 256"):
        tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma", store="tma", tile=(64, 64, 64),
                         warps=(4, 1), stages=3)
    assert tilegen.GemmSpec(dtype="f16", out_dtype="f32", instruction="wgmma", store="tma", tile=(64, 64, 64),
                            warps=(4, 1), stages=3).store == "tma"   # (64 f32 columns: two 128-byte slices)


@needs_ptxas
def test_tma_store_gemm_assembles():
    for out in ("f16", "f32"):
        k = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype=out, instruction="wgmma"))
        assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in k.ptx
        assert_assembles(k.ptx, "sm_90a")


@pytest.mark.gpu
@requires_gpu
def test_tma_store_gemm_on_the_gpu():
    import torch

    for dtype, tdt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        k = tilegen.compile(tilegen.GemmSpec(dtype=dtype, out_dtype=dtype, instruction="wgmma"))
        for M, N, K in [(1000, 1032, 999), (4096, 4096, 256), (1, 8, 1), (257, 264, 4100)]:
            A = torch.randn(M, K, device="cuda", dtype=tdt)
            B = torch.randn(K, N, device="cuda", dtype=tdt)
            C = torch.full((M, N), float("nan"), device="cuda", dtype=tdt)
            k(A, B, out=C, alpha=2.0, repitch=True)   # rows of 999 elements: re-pitched copies
            ref = 2.0 * (A.double() @ B.double())
            scale = 2.0 * (A.double().abs() @ B.double().abs())
            rel = ((C.double() - ref).abs() / scale.clamp_min(1e-30)).max().item()
            bound = K * 2.0 ** -23 + 2.0 ** -20 + (2.0 ** -11 if dtype == "f16" else 2.0 ** -8)
            assert rel <= bound, (dtype, M, N, K, rel)
        # beta != 0 and rows TMA cannot store: the direct paths
        C0 = torch.randn(300, 130, device="cuda", dtype=tdt)
        wide = torch.zeros(300, 133, device="cuda", dtype=tdt)[:, :130]
        wide.copy_(C0)
        A = torch.randn(300, 64, device="cuda", dtype=tdt)
        B = torch.randn(64, 130, device="cuda", dtype=tdt)
        k(A, B, out=wide, alpha=1.0, beta=0.5, repitch=True)   # B's rows of 130 elements: re-pitched
        ref = A.double() @ B.double() + 0.5 * C0.double()
        assert ((wide.double() - ref).abs().max() / ref.abs().max()).item() < 2e-2


def test_gemm_staging_buffers_alternate_and_a_late_wait_is_caught():
    """The GEMM's epilogue alternates two staging buffers and waits until the store two slices
    back has read the one it refills (wait_group.read 1); waiting for one more is a race."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma"))
    assert "cp.async.bulk.wait_group.read 1;" in kernel.ptx
    from tilegen.sim import GlobalMemory, run_kernel

    rng = np.random.default_rng(6)
    M, N, K = 130, 304, 64
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)

    def run(ptx):
        mem = GlobalMemory()
        pa, pb = mem.alloc(A.nbytes), mem.alloc(B.nbytes)
        mem.write(pa, A.tobytes())
        mem.write(pb, B.tobytes())
        pc = mem.alloc(M * 304 * 2)
        args = {"M": M, "N": N, "K": K, "A_ptr": pa, "A_ld": K, "B_ptr": pb, "B_ld": N, "C_ptr": pc, "C_ld": 304,
                "alpha": 1.0, "beta": 0.0}
        k = types.SimpleNamespace(ptx=ptx, name=kernel.name, params=kernel.params, threads=kernel.threads,
                                  smem_bytes=kernel.smem_bytes, tensor_maps=kernel.tensor_maps, barriers=kernel.barriers,
                                  grid=kernel.grid)
        run_kernel(k, args, {"M": M, "N": N, "K": K}, memory=mem)
        return np.frombuffer(mem.read(pc, M * 304 * 2), np.float16).reshape(M, 304)[:, :N]

    C = run(kernel.ptx).astype(np.float64)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C - ref).max() <= 2e-3 * np.abs(ref).max()
    with pytest.raises(SimError) as e:
        run(kernel.ptx.replace("cp.async.bulk.wait_group.read 1;", "cp.async.bulk.wait_group.read 2;"))
    assert e.value.kind == "war" and "TMA store still in flight reads" in str(e.value)


@pytest.mark.parametrize("dtype, tile, lb, extra", [
    ("bf16", (128, 192, 64), "row", {}), ("e4m3", (128, 192, 128), "col", {}),
    ("bf16", (64, 192, 64), "row", dict(pingpong=True, warps=(4, 1))), ("bf16", (128, 192, 64), "col", dict(cluster=(2, 1)))])
def test_an_odd_number_of_slices_waits_for_the_last_blocks_store(dtype, tile, lb, extra):
    """A 192-wide block goes out in three 64-column slices, so the next block's first slice
    refills buffer 0 that the previous block's last slice went out of: it waits for every store
    (wait_group.read 0). Several blocks per CTA (the emulator's 3 SMs) on ragged shapes; the
    usual wait for all but one store is then a race the emulator reports."""
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype="bf16", instruction="wgmma", tile=tile, b_layout=lb, **extra)
    assert spec.warp_specialized and spec.store == "tma" and spec.mainloop.store_staging(spec)[0] == 3
    kernel = tilegen.compile(spec)
    assert "cp.async.bulk.wait_group.read 0;" in kernel.ptx
    rng = np.random.default_rng(3)
    M, N, K = 300, 500, 2 * tile[2] + 8
    dt = numpy_dtype(dtype)
    A = (rng.standard_normal((M, K)) * 0.5).astype(dt)
    B = (rng.standard_normal((K, N)) * 0.5).astype(dt)
    B_in = np.asfortranarray(B) if lb == "col" else B
    C = kernel(A, B_in, alpha=1.5, device="sim").astype(np.float64)
    a64, b64 = A.astype(np.float64), B.astype(np.float64)
    scale = 1.5 * (np.abs(a64) @ np.abs(b64))
    assert (np.abs(C - 1.5 * (a64 @ b64)) / scale).max() <= K * 2.0 ** -23 + 2.0 ** -20 + 2.0 ** -8
    late = copy.copy(kernel)
    late.ptx = kernel.ptx.replace("cp.async.bulk.wait_group.read 0;", "cp.async.bulk.wait_group.read 1;")
    with pytest.raises(SimError) as e:
        late(A, B_in, alpha=1.5, device="sim")
    assert e.value.kind == "war" and "TMA store still in flight reads" in str(e.value)


def _store_kernel(body):
    import tilegen.dsl as tg

    @tg.kernel
    def k():
        tg.launch(threads=128, grid=(1, 1, 1))
        body(tg)
    return tilegen.compile(k, target="sm_90a")


def _acc(tg):
    return tg.fragment("m16n8k16.f16.f32", "C", (1, 8))


@pytest.mark.parametrize("body, says", [
    (lambda tg: tg.tma_store(tg.tensor("C", "f32", ("M", "N")).block(0, 0), tg.shared("s", "f16", 16, 64)[0]),
     "tma_store: C is f32, s is f16"),
    (lambda tg: tg.tma_store(tg.tensor("C", "f16", ("M", "N")).block(0, 0), tg.shared("s", "f16", 16, 64, swizzle="pad")[0]),
     "has padded rows"),
    (lambda tg: tg.tma_store(tg.shared("s", "f16", 16, 64)[0], tg.tensor("C", "f16", ("M", "N")).block(0, 0)),
     "tma_store(tensor.block(r, c), tile[stage])"),
    (lambda tg: tg.store_stage(tg.shared("s", "f16", 16, 128)[0], _acc(tg), 0),
     "the stage's columns must be the slice's"),
    (lambda tg: tg.store_stage(tg.shared("s", "f16", 16, 64)[0], _acc(tg), 0, part=1, parts=3),
     "parts must divide the accumulator's 8 atom columns"),
    (lambda tg: tg.store_stage(tg.shared("s", "f16", 16, 64)[0], _acc(tg), 0, bias=tg.vector("b", "f16", "N")),
     "a bias, residual or scale needs out="),
    (lambda tg: tg.tma_store_wait(-1), "the number of groups left pending must be an int >= 0"),
])
def test_bad_tma_store_use_is_refused(body, says):
    with pytest.raises(tilegen.DSLError) as e:
        _store_kernel(body)
    assert says in str(e.value)


def test_tf32_with_k_major_operands_is_warp_specialized_on_tma():
    """tf32 goes through TMA where no operand needs transposing (A row-major, B column-major):
    the warp-specialized kernel with TMA stores; A and B row-major, when asked (copy="tma"): the
    warp-specialized kernel with B through registers (its C^T goes out with direct stores); both
    column-major, when asked: A through registers, with TMA stores; A column-major with B
    row-major keeps cp.async."""
    spec = tilegen.GemmSpec(dtype="tf32", instruction="wgmma", b_layout="col")
    assert (spec.copy, spec.warp_specialized, spec.store) == ("tma", True, "tma")
    rr = tilegen.GemmSpec(dtype="tf32", instruction="wgmma", copy="tma")
    assert (rr.copy, rr.warp_specialized, rr.store, rr.swaps_operands) == ("tma", True, "direct", True)
    assert tilegen.GemmSpec(dtype="tf32", instruction="wgmma").copy == "cp.async"
    with pytest.raises(tilegen.SpecError, match="or both row-major or both column-major in the persistent kernel"):
        tilegen.GemmSpec(dtype="tf32", instruction="wgmma", persistent=False, copy="tma")
    with pytest.raises(tilegen.SpecError, match="stream-K's pieces do not store transposed"):
        tilegen.GemmSpec(dtype="tf32", instruction="wgmma", copy="tma", stream_k=True)
    with pytest.raises(tilegen.SpecError, match="one arrival per warpgroup"):
        tilegen.GemmSpec(dtype="tf32", instruction="wgmma", copy="tma", cluster=(2, 1))
    assert tilegen.GemmSpec(dtype="tf32", instruction="wgmma", a_layout="col").copy == "cp.async"
    with pytest.raises(tilegen.SpecError, match="tf32 only with a row-major A and a column-major B"):
        tilegen.GemmSpec(dtype="tf32", instruction="wgmma", a_layout="col", b_layout="row", copy="tma")
    cc = tilegen.GemmSpec(dtype="tf32", instruction="wgmma", a_layout="col", b_layout="col", copy="tma")
    assert (cc.warp_specialized, cc.store, cc.register_operand, cc.swaps_operands) == (True, "tma", "A", False)
    rng = np.random.default_rng(8)
    M, N, K = 200, 300, 70
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = tilegen.compile(spec)(A, np.asfortranarray(B), device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    assert (np.abs(C - ref) / scale).max() <= 2 * 2.0 ** -10 + K * 2.0 ** -23   # truncated tf32 operands
    for (M, N, K), store in zip(((200, 300, 70), (257, 129, 100), (5, 40, 33)), ("tma", "direct", "direct")):
        # cc: A rounded in registers, B truncated (through TMA stores, and stored directly as matmul takes it)
        A = np.asfortranarray(rng.standard_normal((M, K)).astype(np.float32))
        B = np.asfortranarray(rng.standard_normal((K, N)).astype(np.float32))
        C = tilegen.compile(cc.replace(store=store))(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
        ref = A.astype(np.float64) @ B.astype(np.float64)
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
        assert (np.abs(C - ref) / scale).max() <= 2.0 ** -11 + 2.0 ** -10 + K * 2.0 ** -23, (M, N, K)
    for M, N, K in ((200, 300, 70), (257, 129, 100), (5, 40, 33)):   # rr: B rounded in registers, A truncated
        A = rng.standard_normal((M, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        C = tilegen.compile(rr)(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
        ref = A.astype(np.float64) @ B.astype(np.float64)
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
        assert (np.abs(C - ref) / scale).max() <= 2 * 2.0 ** -10 + K * 2.0 ** -23


@pytest.mark.parametrize("dtype, out_dtype, epilogue, stmatrix", [
    ("f16", "bf16", tilegen.Epilogue(), True), ("f16", "f16", tilegen.Epilogue("col", "gelu_tanh", True), True),
    ("f16", "f32", tilegen.Epilogue(), False),
    ("e4m3", "bf16", tilegen.Epilogue(scale_rows=True, scale_cols=True), False)])
def test_the_hopper_gemm_writes_16_bit_stages_with_stmatrix(dtype, out_dtype, epilogue, stmatrix):
    """A 16-bit stage is written 8x8 matrices at a time (stmatrix.x4: two atoms of a warp); an
    f32 one with 8-byte stores, and so is one whose epilogue multiplies by scale vectors (where
    stmatrix measured slower on the H200). The values are checked by the emulator runs above."""
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype=out_dtype, instruction="wgmma", epilogue=epilogue,
                            b_layout="col" if dtype == "e4m3" else "row")
    ptx = tilegen.compile(spec).ptx
    body = ptx[ptx.index("-> sC"):]
    assert ("stmatrix.sync.aligned.m8n8.x4.shared.b16" in body) == stmatrix
    assert ("st.shared.b32" in body) == (not stmatrix and out_dtype != "f32")
    assert ("st.shared.v2.f32" in body) == (out_dtype == "f32")


def test_stmatrix_pairs_the_atoms_of_an_odd_slice_row_by_row():
    """Two rows of atoms, 3 atom columns in the slice (part 1 of 2 of 6): each row goes out as one
    stmatrix.x4 (its first two atoms) and one .x2, the pairs never parted by the epilogue's chunks
    of four atoms (which had given one .x4 and four .x2); the values checked on the emulator."""
    import tilegen.dsl as tg

    @tg.kernel
    def odd_slice():
        tg.launch(threads=32, grid=(1, 1, 1))
        C = tg.tensor("C", "f16", ("M", "N"))
        X = tg.tensor("X", "f32", ("M", "N"))
        acc = tg.fragment("m16n8k16.f16.f32", "C", (2, 6))
        tg.accumulate(acc, X.block(0, 0))
        sC = tg.shared("sC", "f16", 32, 24, swizzle="none")
        tg.store_stage(sC[0], acc, 0, part=1, parts=2)
        tg.fence_proxy_async()
        tg.barrier()
        tg.tma_store(C.block(0, 24), sC[0])
        tg.tma_store_commit()
        tg.tma_store_wait(0)

    kernel = tilegen.compile(odd_slice, target="sm_90a")
    assert kernel.ptx.count("stmatrix.sync.aligned.m8n8.x4") == 2
    assert kernel.ptx.count("stmatrix.sync.aligned.m8n8.x2") == 2
    X = np.random.default_rng(3).standard_normal((32, 48)).astype(np.float32)
    C = np.full((32, 48), np.nan, np.float16)
    kernel(C=C, X=X, device="sim")
    np.testing.assert_array_equal(C[:, 24:], X[:, 24:].astype(np.float16))
    assert np.isnan(C[:, :24]).all()
