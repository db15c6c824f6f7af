"""Generated GEMMs run end to end on the CPU emulator (device="sim") against float64
references, within the per-dtype bounds of tests/bounds.py. Every output starts poisoned
with NaN, so an element the kernel fails to write, or a beta=0 run that reads C, shows."""
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tilegen
from bounds import UNIT, gemm_bound, gemm_error
from tilegen.arch.dtypes import numpy_dtype
from tilegen.errors import LaunchError, SpecError

DTYPES = ["tf32", "f16", "bf16"]
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


@lru_cache(maxsize=None)
def kernel_for(**kw):
    return tilegen.compile(tilegen.GemmSpec(**kw))


def small(**kw):
    """A one- or two-warp spec: small tiles keep the emulator fast."""
    kw.setdefault("tile", (32, 32, 32))
    kw.setdefault("warps", (2, 1))
    return kernel_for(**kw)


def inputs(dtype, M, N, K, seed):
    rng = np.random.default_rng(seed)
    nd = numpy_dtype(dtype)
    return rng.standard_normal((M, K)).astype(nd), rng.standard_normal((K, N)).astype(nd)


def check(kernel, M, N, K, *, alpha=1.0, beta=0.0, seed=0):
    spec = kernel.spec
    A, B = inputs(spec.dtype, M, N, K, seed)
    out_dt = numpy_dtype(spec.out_dtype)
    if beta:
        C0 = np.random.default_rng(seed + 1).standard_normal((M, N)).astype(out_dt)
        out = C0.copy()
    else:
        C0 = np.zeros((M, N))
        out = np.full((M, N), np.nan, dtype=out_dt)        # poison: beta = 0 must not read it
    C = kernel(A, B, out=out, alpha=alpha, beta=beta, device="sim")
    assert C is out
    C64 = C.astype(np.float64)
    assert not np.isnan(C64).any(), "unwritten (NaN-poisoned) elements remain"
    ref = alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * C0.astype(np.float64)
    err = gemm_error(C, ref, A * abs(alpha) if alpha else A, B)
    bound = gemm_bound(spec.dtype, K, spec.out_dtype, spec.acc_dtype)
    if beta:  # the output rounding also applies to beta * C0, which |A||B| does not bound
        scale = np.linalg.norm(np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))) * abs(alpha)
        bound += 2 * UNIT[spec.out_dtype] * np.linalg.norm(beta * C0.astype(np.float64)) / max(scale, 1e-300)
    assert err <= bound, f"{spec}: {M}x{N}x{K} error {err:.3g} over the bound {bound:.3g}"
    return C


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda x: x[0][0] + x[1][0])
def test_default_tiles_every_layout(dtype, layouts):
    """The default (128 x 128, 4 warps, 3 stages, widest swizzle) kernels on a ragged shape."""
    check(kernel_for(dtype=dtype, a_layout=layouts[0], b_layout=layouts[1]), 130, 70, 45)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", ["f32", "f16", "bf16"])
def test_output_dtypes(dtype, out_dtype):
    check(small(dtype=dtype, out_dtype=out_dtype, b_layout="col"), 50, 45, 70, seed=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha,beta,out_dtype", [(0.5, -2.0, "f32"), (2.0, 1.0, "f16"), (0.0, 0.5, "f32"),
                                                  (-1.0, 0.0, "bf16")])
def test_alpha_beta(dtype, alpha, beta, out_dtype):
    check(small(dtype=dtype, out_dtype=out_dtype, a_layout="col"), 40, 50, 33, alpha=alpha, beta=beta, seed=5)


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 80, 7), (80, 1, 80), (17, 33, 5), (64, 64, 64),
                                   (33, 65, 80), (80, 80, 1), (31, 8, 17)], ids=lambda s: "x".join(map(str, s)))
def test_ragged_shapes(shape):
    check(small(dtype="f16", tile=(32, 32, 16), warps=(1, 1), stages=4), *shape, seed=sum(shape))


def test_f16_accumulator():
    check(small(dtype="f16", acc_dtype="f16", out_dtype="f16", b_layout="col"), 48, 40, 40, seed=8)


def test_fp8():
    check(kernel_for(dtype="e4m3", b_layout="col", target="sm_89", tile=(32, 32, 64), warps=(2, 1)), 45, 40, 100)


def test_mma_k4_and_k8_atoms():
    check(small(dtype="tf32", atom="m16n8k4.tf32.f32", tile=(32, 32, 16)), 40, 40, 40, seed=9)
    check(small(dtype="bf16", atom="m16n8k8.bf16.f32", tile=(32, 32, 16)), 40, 40, 40, seed=10)


def test_k_zero_gives_beta_c():
    k = small(dtype="f16")
    C0 = np.random.default_rng(0).standard_normal((20, 30)).astype(np.float32)
    A, B = np.zeros((20, 0), np.float16), np.zeros((0, 30), np.float16)
    C = k(A, B, out=C0.copy(), alpha=1.0, beta=0.5, device="sim")
    np.testing.assert_array_equal(C, (0.5 * C0).astype(np.float32))


def test_run_kernel_on_global_memory():
    """The lower-level API: pointers are addresses in an emulated GlobalMemory."""
    import tilegen.sim as sim
    from tilegen.gemm.call import _pitched

    k = small(dtype="f16", b_layout="col")
    M, N, K = 33, 20, 40
    A, B = inputs("f16", M, N, K, 4)
    mem = sim.global_memory()                  # the process-wide default
    a, lda = _pitched(A)
    b, ldb = _pitched(np.ascontiguousarray(B.T))
    ptrs = [mem.alloc(x.nbytes) for x in (a, b)] + [mem.alloc(4 * M * N)]
    mem.write(ptrs[0], a)
    mem.write(ptrs[1], b)
    args = {"M": M, "N": N, "K": K, "A_ptr": ptrs[0], "A_ld": lda, "B_ptr": ptrs[1], "B_ld": ldb,
            "C_ptr": ptrs[2], "C_ld": N, "alpha": 1.0, "beta": 0.0}
    stats = sim.run_kernel(k, args, {"M": M, "N": N, "K": K})
    assert stats.ctas == 2 and stats.instructions > 0
    C = mem.read(ptrs[2], 4 * M * N, np.float32).reshape(M, N)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-3, atol=1e-3)
    with pytest.raises(sim.SimError, match="missing arguments C_ptr"):
        sim.run_kernel(k, {n: v for n, v in args.items() if n != "C_ptr"}, {"M": M, "N": N, "K": K})
    for p in ptrs:
        mem.free(p)


def test_sim_takes_numpy_only():
    class NotAnArray:
        shape = (4, 4)

    with pytest.raises(LaunchError, match="numpy"):
        small(dtype="f16")(NotAnArray(), np.zeros((4, 4), np.float16), device="sim")
    with pytest.raises(LaunchError, match="dtype"):
        small(dtype="f16")(np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float16), device="sim")


def test_no_gpu_falls_back_to_the_emulator(monkeypatch):
    import warnings

    import tilegen.runtime
    from tilegen import errors

    monkeypatch.setattr(tilegen.runtime, "gpu_available", lambda: False)
    monkeypatch.setattr(errors, "_said", set())
    k = small(dtype="f16")
    A, B = inputs("f16", 20, 30, 40, 0)
    with pytest.warns(tilegen.EmulatorWarning) as said:
        C = k(A, B)
    assert len(said) == 1 and str(said[0].message).startswith(
        "no GPU found; GEMMs on numpy arrays run on the CPU emulator (device='sim')")
    assert said[0].filename == __file__      # the caller's line, not tilegen's
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-3, atol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # any warning now fails the test
        k(A, B)                               # said once per process
        k(A, B, device="sim")                 # asked for by name: no notice
    monkeypatch.setattr(errors, "_said", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=tilegen.EmulatorWarning)   # silenced as warnings are
        k(A, B)


def test_no_gpu_refuses_long_emulations_at_once(monkeypatch, capsys):
    """Without a GPU and without device="sim", a GEMM the emulator would take minutes over is
    refused in well under a second, with the estimate; with device="sim" it would run (and
    report its progress)."""
    import time

    import tilegen.runtime
    from tilegen import errors
    from tilegen.gemm import call

    monkeypatch.setattr(tilegen.runtime, "gpu_available", lambda: False)
    monkeypatch.setattr(errors, "_said", set())
    A = np.ones((2048, 2048), np.float16)
    t0 = time.perf_counter()
    with pytest.raises(tilegen.LaunchError, match=r"2048x2048x2048 GEMM would take at least \d+ (s|min) .*device='sim'"):
        tilegen.matmul(A, A)
    k = small(dtype="f16")
    with pytest.raises(tilegen.LaunchError, match=r"would take about \d+ (min|h)"), \
            pytest.warns(tilegen.EmulatorWarning, match="no GPU found"):
        k(A, A)                     # compiled already: the estimate from its PTX
    assert time.perf_counter() - t0 < 1.0 + 0.5   # the small kernel's compile included
    est = call.refuse_long_emulation  # the limit is documented in seconds of emulation
    assert call.EMULATOR_LIMIT_S == 30.0 and est(256, 256, 256) is None


def test_a_long_stacks_refusal_names_the_stack(monkeypatch):
    """A stack of many small products the emulator would take minutes over names the stack (it
    said 'this 8x8x8 GEMM', one product, beside the whole stack's estimate)."""
    import tilegen.runtime

    monkeypatch.setattr(tilegen.runtime, "gpu_available", lambda: False)
    S = np.ones((20000, 8, 8), np.float16)
    with pytest.raises(tilegen.LaunchError, match=r"this stack of 20000 8x8x8 GEMMs would take about"):
        tilegen.matmul(S, S)


def test_the_emulation_estimate_counts_a_slice_of_k_per_split_k_cta(monkeypatch):
    """Split-K (2-D, or a stack on the TMA kernel): each row of CTAs walks one slice of K, so the
    estimate counts the k-tiles of a slice, not of all K (a split emulation is not refused for
    S times its length)."""
    import tilegen.sim.estimate as estimate

    seen = []
    real = estimate.estimate_seconds
    monkeypatch.setattr(estimate, "estimate_seconds", lambda ptx, ctas, trips: seen.append(trips) or real(ptx, ctas, trips))
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), split_k=3, persistent=False))
    A, B = inputs("f16", 64, 64, 320, 1)      # 10 k-tiles: slices of 4
    k(A, B, device="sim")
    assert seen[0] == 4, seen


def test_the_emulation_estimate_counts_every_block_a_persistent_cta_walks(monkeypatch):
    """A persistent kernel's CTAs (EMULATOR_SM_COUNT of them) each walk several blocks: the
    estimate counts the k-tiles of all of a CTA's blocks, not of one."""
    import tilegen.sim.estimate as estimate

    seen = []
    real = estimate.estimate_seconds
    monkeypatch.setattr(estimate, "estimate_seconds", lambda ptx, ctas, trips: seen.append((ctas, trips)) or
                        real(ptx, ctas, trips))
    spec = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", out_dtype="bf16", tile=(64, 128, 64), warps=(4, 1))
    assert spec.persistent
    A, B = inputs("bf16", 200, 300, 130, 2)   # 4 x 3 blocks of 3 k-tiles over 3 CTAs: 4 blocks each
    tilegen.compile(spec)(A, B, device="sim")
    assert seen[0] == (3, 3 * 4), seen


def test_the_emulator_cost_of_an_instruction():
    from tilegen.sim.estimate import BULK, LIGHT, weight

    assert weight("@%p3 ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd2];") == 1.0
    assert weight("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0}, {%r0}, {%r1}, {%f0};") == 1.0
    assert weight("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {...};") == BULK
    assert weight("@!%p0 cp.async.bulk.tensor.2d.shared::cluster.global.tile [%r1], [%rd1, {%r2, %r3}], [%r4];") == BULK
    assert weight("add.u32 %r5, %r4, 1;") == LIGHT


def test_long_emulations_report_their_progress(monkeypatch, capsys, caplog):
    import logging

    from tilegen.gemm import call
    from tilegen.sim import progress

    monkeypatch.setattr(call, "PROGRESS_S", 0.0)   # every run counts as long
    monkeypatch.setattr(call, "TICK_S", 0.02)
    k = small(dtype="f16")
    A, B = inputs("f16", 64, 64, 256, 1)
    # logging set up by the program: the "tilegen" logger at INFO carries it
    with caplog.at_level(logging.INFO, logger="tilegen"):
        k(A, B, device="sim")
    said = [r.getMessage() for r in caplog.records if r.name == "tilegen"]
    assert said[0].startswith("emulating 64x64x256 on the CPU: about ") and said[0].endswith(" s")
    assert any(" s of about " in line for line in said[1:])
    assert capsys.readouterr().err == ""
    # logging not set up: stderr, unless the tilegen logger was turned down
    monkeypatch.setattr(progress._log, "hasHandlers", lambda: False)
    k(A, B, device="sim")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("tilegen: emulating 64x64x256 on the CPU: about ") and err[0].endswith(" s")
    assert any(" s of about " in line for line in err[1:])
    monkeypatch.setattr(progress._log, "level", logging.WARNING)
    k(A, B, device="sim")
    assert capsys.readouterr().err == ""


def test_a_dsl_kernel_still_running_says_how_far_it_got(monkeypatch, caplog):
    """run_kernel of any kernel: a run still going after a while says so (a u32 trip count that
    wrapped, N - 1 with N = 0, runs for hours: it had run without a word)."""
    import logging

    import tilegen.dsl as tg
    from tilegen.sim import GlobalMemory, progress, run_kernel

    monkeypatch.setattr(progress, "AFTER_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.01)

    @tg.kernel
    def spin():
        tg.launch(threads=32, grid=(1, 1, 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        acc = tg.fragment("m16n8k16.f16.f32", "C", (1, 1))
        for _ in tg.range(0, tg.size("T")):
            tg.accumulate(acc, X.block(0, 0))
        tg.store(X.block(0, 0), acc)

    k = tilegen.compile(spin)
    mem = GlobalMemory()
    x = mem.alloc(16 * 8 * 4)
    mem.write(x, np.zeros(16 * 8, np.float32))
    with caplog.at_level(logging.INFO, logger="tilegen"):
        run_kernel(k, {"M": 16, "N": 8, "X_ptr": x, "X_ld": 8, "T": 400}, {"M": 16, "N": 8, "T": 400}, mem)
    said = [r.getMessage() for r in caplog.records if r.name == "tilegen"]
    assert said and said[0].startswith(f"emulating {k.name}: ") and "0 of 1 CTAs done" in said[0], said
    assert "loop trips" in said[0]   # (no CTA done yet: the hint about trip counts)


def test_a_long_emulation_of_many_ctas_says_the_pace(monkeypatch, caplog):
    """Many quick CTAs: the progress says how long the rest takes at the pace so far, not the hint
    about loop trips (which had been said of every long emulation)."""
    import logging

    import tilegen.dsl as tg
    from tilegen.sim import GlobalMemory, progress, run_kernel

    monkeypatch.setattr(progress, "AFTER_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.05)

    @tg.kernel
    def copies():
        tg.launch(threads=32, grid=(tg.cdiv("M", 16), 1, 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        acc = tg.fragment("m16n8k16.f16.f32", "C", (1, 1))
        tg.accumulate(acc, X.block(tg.program_id("x") * 16, 0))
        tg.store(X.block(tg.program_id("x") * 16, 0), acc)

    k = tilegen.compile(copies)
    mem = GlobalMemory()
    M = 16 * 400
    x = mem.alloc(M * 8 * 4)
    mem.write(x, np.zeros(M * 8, np.float32))
    with caplog.at_level(logging.INFO, logger="tilegen"):
        run_kernel(k, {"M": M, "N": 8, "X_ptr": x, "X_ld": 8}, {"M": M, "N": 8}, mem)
    said = [r.getMessage() for r in caplog.records if r.name == "tilegen"]
    paced = [m for m in said if "s left at this pace" in m]
    assert paced and not any("loop trips" in m for m in paced), said


# ---- property test over the spec space --------------------------------------------------------

@st.composite
def specs_and_shapes(draw):
    kw = dict(dtype=draw(st.sampled_from(DTYPES)),
              a_layout=draw(st.sampled_from(["row", "col"])), b_layout=draw(st.sampled_from(["row", "col"])),
              out_dtype=draw(st.sampled_from(["f32", "f16", "bf16"])),
              tile=draw(st.sampled_from([(32, 32, 16), (64, 32, 32), (32, 32, 32)])),
              warps=draw(st.sampled_from([(1, 1), (2, 1), (2, 2)])), stages=draw(st.integers(2, 4)))
    try:
        base = tilegen.GemmSpec(**kw)
    except SpecError:
        assume(False)
    legal = []
    for mode in ("128B", "64B", "32B", "pad", "none"):
        try:
            base.replace(swizzle=mode)
            legal.append(mode)
        except SpecError:
            pass
    kw["swizzle"] = draw(st.sampled_from(legal))
    shape = tuple(draw(st.integers(1, 80)) for _ in range(3))
    return kw, shape


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                HealthCheck.too_slow])
@given(specs_and_shapes(), st.integers(0, 2 ** 16))
def test_property_random_specs_and_shapes(case, seed):
    kw, (M, N, K) = case
    check(kernel_for(**kw), M, N, K, seed=seed)


def test_run_kernel_checks_each_argument_as_the_gpu_launch_does():
    """tilegen.sim.run_kernel with a negative pitch, a pitch past 32 bits, a float for an int, a
    bool, a string for alpha or an alpha past float32's range: a SimError naming the parameter,
    its type and what is allowed (the GPU's launch refuses the same, runtime/params.py), before
    anything runs; the same arguments with the pitch fixed run."""
    from tilegen.sim import GlobalMemory, SimError, run_kernel

    k = small(dtype="f16", out_dtype="f32")
    mem = GlobalMemory()

    def put(x):
        address = mem.alloc(x.nbytes)
        mem.write(address, x)
        return address

    A = np.ones((32, 32), np.float16)
    args = {"M": 32, "N": 32, "K": 32, "A_ptr": put(A), "A_ld": 32, "B_ptr": put(A), "B_ld": 32,
            "C_ptr": put(np.full((32, 32), np.nan, np.float32)), "C_ld": 32, "alpha": 1.0, "beta": 0.0}
    sizes = {"M": 32, "N": 32, "K": 32}
    for name, bad, message in (("C_ld", -1, r"C_ld \(.u32\): -1 is out of range 0..4294967295"),
                               ("C_ld", 2 ** 32, "out of range"), ("M", 32.0, r"32.0 \(float\) is not an integer"),
                               ("K", True, "is not an integer"), ("alpha", "2", "is not a real number"),
                               ("alpha", 1e39, "overflows float32")):
        with pytest.raises(SimError, match=message):
            run_kernel(k, {**args, name: bad}, sizes, mem)
    with pytest.raises(SimError, match=r"A_ptr \(.u64\) takes an address, not an array \(float16 \(32, 32\)\).*memory.alloc"):
        run_kernel(k, {**args, "A_ptr": A}, sizes, mem)
    run_kernel(k, args, sizes, mem)
    C = mem.read(args["C_ptr"], 32 * 32 * 4, np.float32).reshape(32, 32)
    assert np.all(C == 32.0)


def test_operands_too_large_to_copy_are_refused_with_their_size(monkeypatch):
    """A broadcast view (np.broadcast_to) is tiny, its dense copy for the launch need not be: when the
    copies cannot be allocated, a LaunchError gives the product and the bytes, not a MemoryError."""
    import tilegen.gemm.call as call

    def no_memory(stored):
        raise MemoryError("cannot allocate")

    monkeypatch.setattr(call, "_pitched_stack", no_memory)
    A = np.broadcast_to(np.ones((1, 1), np.float16), (64, 4096))
    B = np.broadcast_to(np.ones((1, 1), np.float16), (4096, 64))
    with pytest.raises(LaunchError, match=r"64x64x4096 product's operands, copied into dense rows .*\(\d+ bytes"):
        small(dtype="f16", out_dtype="f32")(A, B, device="sim")
