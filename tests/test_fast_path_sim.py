"""The fast paths GPU arrays take (gemm/call.py FastCall and BatchedCall, gemm/matmul.py's
remembered choices), run on the CPU: tests/sim_device.py stands the emulator in for the GPU
under them, so each call below runs the same code a PyTorch user's call runs, launch by
launch, and is checked against numpy. A call the fast paths declined would go on to the
general path, which the stand-in makes fail: so every call that returns here went through
them."""
import importlib
import re

import numpy as np
import pytest

import tilegen
from tilegen.arch.dtypes import numpy_dtype
from tilegen.runtime.module import module_generation
import sim_device
from bounds import gemm_bound, gemm_error
from seeds import seed

call = importlib.import_module("tilegen.gemm.call")

SMALL = dict(tile=(64, 64, 32), warps=(2, 2))          # mma.sync (sm_80)
WGMMA = dict(instruction="wgmma", tile=(64, 128, 64), warps=(4, 1), stages=3)   # warp-specialized TMA (sm_90a)


def _operands(M, N, K, dtype=np.float16, *parts):
    rng = np.random.default_rng(seed(M, N, K, str(dtype), *parts))
    return rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)


def _ref(A, B, alpha=1.0, beta=0.0, C=None):
    ref = alpha * (A.astype(np.float64) @ B.astype(np.float64))
    return ref if C is None or beta == 0 else ref + beta * C.astype(np.float64)


def _check(C, ref, A, B, dtype="f16", out="f32"):
    got = C.numpy() if hasattr(C, "numpy") else C
    assert not np.isnan(got).any(), "an element was not written"
    assert gemm_error(got, ref, A, B) <= gemm_bound(dtype, A.shape[1], out)


def test_a_kernel_call_launches_once_and_again_with_the_same_arrays(sim_gpu):
    """kernel(A, B, out=C) on GPU arrays: one launch on the library's stream; the same arrays
    again launch the remembered arguments, and read the operands' new contents."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(70, 96, 48)
    a, b, c = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.empty((70, 96), "float32")
    assert kernel(a, b, out=c) is c
    _check(c, _ref(A, B), A, B)
    assert [(np.prod(g), s) for _, g, s in sim_gpu.launches] == [(4, sim_gpu.stream)]   # (2 x 2 blocks)
    remembered = kernel.fast_call._last
    A2 = (A * -0.5).astype(np.float16)
    a.write(A2)
    assert kernel(a, b, out=c) is c
    assert remembered is not None and kernel.fast_call._last is remembered and len(sim_gpu.launches) == 2
    _check(c, _ref(A2, B), A2, B)


def test_layers_called_in_turn_each_launch_their_remembered_arguments(sim_gpu, monkeypatch):
    """One kernel called for each of a model's layers, each with its own weights and output, round
    after round: after the first round every call launches its layer's remembered arguments (no
    arguments built again), and reads the arrays' contents of that round."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    layers = [_operands(40, 24, 16, np.float16, "layer", i) for i in range(3)]
    arrays = [(sim_gpu.array(A), sim_gpu.array(B), sim_gpu.empty((40, 24), "float32")) for A, B in layers]
    built = []
    arguments = call.FastCall.arguments
    monkeypatch.setattr(call.FastCall, "arguments", lambda self, values: built.append(1) or arguments(self, values))
    for round_ in range(3):
        for i, (a, b, c) in enumerate(arrays):
            A = (layers[i][0] * (round_ + 1)).astype(np.float16)   # new contents each round
            a.write(A)
            assert kernel(a, b, out=c) is c
            _check(c, _ref(A, layers[i][1]), A, layers[i][1])
    assert len(built) == len(arrays) and len(sim_gpu.launches) == 3 * len(arrays)


def test_new_arrays_of_the_same_shapes_take_only_new_pointers(sim_gpu):
    """Other arrays of the remembered shapes, layouts and dtypes: the launch with their pointers
    (and new scalars), not the arrays of the call before."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(65, 40, 24)
    kernel(sim_gpu.array(A), sim_gpu.array(B), out=sim_gpu.empty((65, 40), "float32"))
    A2, B2 = _operands(65, 40, 24, np.float16, "second")
    c2 = sim_gpu.empty((65, 40), "float32")
    kernel(sim_gpu.array(A2), sim_gpu.array(B2), out=c2, alpha=-1.5)
    _check(c2, _ref(A2, B2, alpha=-1.5), A2, B2)


def test_beta_reads_out_and_alpha_minus_zero_signs_zeros(sim_gpu):
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(30, 24, 16)
    C0 = np.random.default_rng(5).standard_normal((30, 24)).astype(np.float32)
    a, b, c = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.array(C0)
    kernel(a, b, out=c, alpha=0.5, beta=-2.0)
    _check(c, _ref(A, B, 0.5, -2.0, C0), A, B)
    z = sim_gpu.empty((30, 24), "float32")
    kernel(a, b, out=z, alpha=0.0)
    kernel(a, b, out=z, alpha=-0.0)   # the same arrays: not the remembered launch of alpha = +0.0
    assert np.all(np.signbit(z.numpy()) == np.signbit(-0.0 * (A.astype(np.float32) @ B.astype(np.float32))))


def test_no_out_makes_one_per_call(sim_gpu):
    """Without out the fast path makes C (the library's allocator, poisoned here), each call a
    new one."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(50, 64, 40)
    a, b = sim_gpu.array(A), sim_gpu.array(B)
    c1, c2 = kernel(a, b), kernel(a, b)
    assert c1 is not c2 and c1.ptr != c2.ptr and c1.shape == (50, 64) and c1.dtype == np.float32
    _check(c1, _ref(A, B), A, B)
    _check(c2, _ref(A, B), A, B)


@pytest.mark.parametrize("which", ["A", "B", "both"])
def test_rows_whose_pitch_is_not_16_bytes_are_repitched(sim_gpu, which):
    """repitch=True (what tilegen.matmul passes): an operand whose rows are not 16-byte multiples
    apart is copied into an aligned array of the library's on the call's stream first; without
    it the fast path declines."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(33, 35, 37)
    a = sim_gpu.array(A, pitch=37 if which != "B" else 40)
    b = sim_gpu.array(B, pitch=35 if which != "A" else 40)
    c = sim_gpu.empty((33, 35), "float32")
    assert kernel.fast_call(a, b, c, None, None, 1.0, 0.0, False) is None
    kernel(a, b, out=c, repitch=True)
    assert sim_gpu.copies == (2 if which == "both" else 1)
    _check(c, _ref(A, B), A, B)


@pytest.mark.parametrize("order", ["rc", "cr", "cc"])
def test_operands_in_the_other_layouts(sim_gpu, order):
    """A spec of each layout pair takes views of that layout (a transposed, column-major B: W.T)."""
    al, bl = ({"r": "row", "c": "col"}[x] for x in order)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", a_layout=al, b_layout=bl, **SMALL))
    A, B = _operands(48, 72, 56)
    a = sim_gpu.array(A, order="C" if al == "row" else "F")
    b = sim_gpu.array(B, order="C" if bl == "row" else "F")
    c = kernel(a, b, out=sim_gpu.empty((48, 72), "float32"))
    _check(c, _ref(A, B), A, B)


@pytest.mark.parametrize("split", [dict(split_k=2, **SMALL), dict(stream_k=True, **WGMMA)])
def test_two_kernel_specs_sum_in_the_streams_scratch(sim_gpu, split):
    """Split-K and stream-K: partial sums in the stream's scratch workspace, then the second
    kernel; the same arrays again launch both remembered launches."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **split))
    A, B = _operands(70, 64, 160)
    a, b, c = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.empty((70, 64), "float32")
    kernel(a, b, out=c)
    _check(c, _ref(A, B), A, B)
    names = [n for n, _, _ in sim_gpu.launches]
    assert len(names) == 2 and names[0] != names[1]
    c.write(np.full((70, 64), np.nan, np.float32))
    kernel(a, b, out=c)
    assert [n for n, _, _ in sim_gpu.launches] == names * 2
    _check(c, _ref(A, B), A, B)


@pytest.mark.parametrize("dtype, out", [("f16", "f16"), ("bf16", "f32")])
def test_the_warp_specialized_tma_kernel_from_gpu_arrays(sim_gpu, dtype, out):
    """The Hopper kernel's launch: tensor maps built from the arrays (the emulator's own format),
    the TMA-store epilogue; then new operands of the same shapes (new maps)."""
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype=out, **WGMMA)
    assert spec.store == "tma" and spec.warp_specialized
    kernel = tilegen.compile(spec)
    in_dt, out_dt = numpy_dtype(dtype), numpy_dtype(out)
    A, B = _operands(130, 200, 72, in_dt)
    c = sim_gpu.empty((130, 200), out_dt.name)
    kernel(sim_gpu.array(A), sim_gpu.array(B), out=c, alpha=0.5)
    _check(c, _ref(A, B, 0.5), A, B, dtype, out)
    A2, B2 = _operands(130, 200, 72, in_dt, "second")
    kernel(sim_gpu.array(A2), sim_gpu.array(B2), out=c)
    _check(c, _ref(A2, B2), A2, B2, dtype, out)


def test_an_out_tma_cannot_store_takes_the_direct_store_twin(sim_gpu):
    """C whose rows TMA cannot store (pitch not a multiple of 16 bytes): the kernel's twin that
    stores directly, C in place."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16", **WGMMA))
    A, B = _operands(70, 64, 64)
    c = sim_gpu.array(np.full((70, 64), np.nan, np.float16), pitch=67)
    kernel(sim_gpu.array(A), sim_gpu.array(B), out=c)
    assert sim_gpu.launches[-1][0] == kernel.direct_store_kernel().name != kernel.name
    _check(c, _ref(A, B), A, B, "f16", "f16")


def test_tilegen_matmul_remembers_its_choice(sim_gpu):
    """tilegen.matmul on GPU arrays: the first call chooses (explain) and launches through the
    fast path; the next ones find the kernel by the arrays' description; an output made per call
    has the inputs' dtype, or out_dtype's."""
    A, B = _operands(64, 48, 40)
    a, b = sim_gpu.array(A), sim_gpu.array(B)
    c = tilegen.matmul(a, b)
    assert c.dtype == np.float16 and c.shape == (64, 48)
    _check(c, _ref(A, B), A, B, "f16", "f16")
    chosen = dict(importlib.import_module("tilegen.gemm.matmul")._exact)
    assert len(chosen) == 1
    d = tilegen.matmul(a, b, out_dtype="f32")
    assert d.dtype == np.float32
    _check(d, _ref(A, B), A, B, "f16", "f32")
    e = sim_gpu.empty((64, 48), "float16")
    assert tilegen.matmul(a, b, out=e, alpha=2.0) is e
    _check(e, _ref(A, B, 2.0), A, B, "f16", "f16")
    assert len(sim_gpu.launches) == 3


def test_tilegen_matmul_with_bias_and_activation(sim_gpu):
    from tilegen.cli import _activation

    A, B = _operands(40, 72, 64)
    bias = np.random.default_rng(3).standard_normal(72).astype(np.float16)
    c = tilegen.matmul(sim_gpu.array(A), sim_gpu.array(B), bias=sim_gpu.array(bias), activation="gelu_tanh")
    ref = _activation("gelu_tanh", _ref(A, B) + bias.astype(np.float64))
    _check(c, ref, A, B, "f16", "f16")


def test_stacks_of_activations_fold_into_one_product(sim_gpu):
    """x (batch, tokens, features) @ W: one product of batch * tokens rows, on views."""
    rng = np.random.default_rng(8)
    X = rng.standard_normal((3, 20, 48)).astype(np.float16)
    W = rng.standard_normal((48, 40)).astype(np.float16)
    c = tilegen.matmul(sim_gpu.array(X), sim_gpu.array(W))
    assert c.shape == (3, 20, 40)
    ref = X.reshape(60, 48).astype(np.float64) @ W.astype(np.float64)
    _check(c.reshape(60, 40), ref, X.reshape(60, 48), W, "f16", "f16")


def test_a_beta_that_is_not_a_number_goes_to_the_general_path(sim_gpu):
    """Declined without a traceback (the general path then converts it or says what is wrong)."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(16, 16, 16)
    a, b, c = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.empty((16, 16), "float32")
    kernel(a, b, out=c)
    for beta in ("1", np.ones(2), np.float32(1.0), 1e-50):
        assert kernel.fast_call(a, b, c, None, None, 1.0, beta, False) is None
    assert len(sim_gpu.launches) == 1


@pytest.mark.parametrize("bias, residual", [("col", False), ("row", True)])
def test_epilogue_vectors_through_the_tma_store(sim_gpu, bias, residual):
    """A bias (per column or per row) and a residual on the warp-specialized kernel, staged
    through shared memory; the second call (same arrays) is not the remembered launch of a plain
    call (those carry no vectors) but runs again with the new bias contents."""
    from tilegen.cli import _activation

    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", epilogue=tilegen.Epilogue(bias, "relu", residual), **WGMMA)
    kernel = tilegen.compile(spec)
    bf = numpy_dtype("bf16")
    M, N, K = 130, 136, 64
    A, B = _operands(M, N, K, bf)
    rng = np.random.default_rng(seed(bias, residual))
    vec = rng.standard_normal(N if bias == "col" else M).astype(bf)
    R = rng.standard_normal((M, N)).astype(bf) if residual else None
    a, b, v = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.array(vec)
    r = sim_gpu.array(R) if residual else None
    c = sim_gpu.empty((M, N), "bfloat16")
    for step in range(2):
        kernel(a, b, out=c, bias=v, residual=r)
        shift = vec.astype(np.float64)[None, :] if bias == "col" else vec.astype(np.float64)[:, None]
        ref = _activation("relu", _ref(A, B) + shift) + (R.astype(np.float64) if residual else 0.0)
        _check(c, ref, A, B, "bf16", "bf16")
        vec = (vec * -1.0).astype(bf)
        v.write(vec)


@pytest.mark.parametrize("kind", ["vectors", "device scalars"])
def test_fp8_scales_where_they_are(sim_gpu, kind):
    """fp8 on wgmma with its scales as the kernel reads them: per row of A / per column of B
    (f32 vectors), or one f32 each in device memory (torch._scaled_mm's one-element tensors);
    new scale arrays of the same shapes on the next call take only new pointers."""
    import ml_dtypes

    vectors = kind == "vectors"
    epi = tilegen.Epilogue(scale_rows=vectors, scale_cols=vectors, device_scale_a=not vectors,
                           device_scale_b=not vectors)
    spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", b_layout="col", instruction="wgmma", tile=(64, 128, 128),
                            warps=(4, 1), stages=3, epilogue=epi)
    kernel = tilegen.compile(spec)
    M, N, K = 70, 136, 256
    rng = np.random.default_rng(seed(kind))
    A = rng.standard_normal((M, K)).astype(ml_dtypes.float8_e4m3fn)
    B = rng.standard_normal((K, N)).astype(ml_dtypes.float8_e4m3fn)
    a, b = sim_gpu.array(A), sim_gpu.array(B, order="F")
    c = sim_gpu.empty((M, N), "bfloat16")
    for step in range(2):
        if vectors:
            sa, sb = rng.uniform(0.5, 2, M).astype(np.float32), rng.uniform(0.5, 2, N).astype(np.float32)
            scale = sa.astype(np.float64)[:, None] * sb.astype(np.float64)[None, :]
        else:
            sa, sb = np.array([rng.uniform(0.5, 2)], np.float32), np.array([rng.uniform(0.5, 2)], np.float32)
            scale = float(sa[0]) * float(sb[0])
        kernel(a, b, out=c, scale_a=sim_gpu.array(sa), scale_b=sim_gpu.array(sb))
        ref = scale * (A.astype(np.float64) @ B.astype(np.float64))
        got = c.numpy().astype(np.float64)
        assert not np.isnan(got).any()
        assert np.linalg.norm(got - ref) <= 2.0 ** -7 * np.linalg.norm(ref)


def test_operands_prepared_by_first_kernels(sim_gpu):
    """tf32 with an MN-major operand copied K-major first (pretranspose): the first kernel's
    launch into the stream's scratch, then the GEMM reading it; twice (the plan remembered)."""
    spec = tilegen.GemmSpec(dtype="tf32", instruction="wgmma", a_layout="col", b_layout="row", pretranspose=True)
    kernel = tilegen.compile(spec)
    M, N, K = 72, 96, 40
    A, B = _operands(M, N, K, np.float32)
    a, b = sim_gpu.array(A, order="F"), sim_gpu.array(B)
    c = sim_gpu.empty((M, N), "float32")
    for step in range(2):
        kernel(a, b, out=c)
        _check(c, _ref(A, B), A, B, "tf32", "f32")
    assert len(sim_gpu.launches) >= 4 and sim_gpu.launches[-1][0] != sim_gpu.launches[-2][0]


def test_a_call_under_graph_capture_takes_memory_of_its_own(sim_gpu):
    """While the stream captures a CUDA graph, split-K's workspace is new memory of the caller's
    library (the graph's own), not the stream's scratch that replays of other graphs may share,
    and the call remembered before capture is not launched again as it was (its workspace is
    the stream's scratch)."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", split_k=2, **SMALL))
    A, B = _operands(40, 64, 96)
    a, b, c = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.empty((40, 64), "float32")
    kernel(a, b, out=c)
    scratch = sim_gpu.arguments[0]["W_ptr"]
    assert scratch == sim_gpu.scratch[sim_gpu.stream].work[0]
    sim_gpu.capturing = True
    c.write(np.full((40, 64), np.nan, np.float32))
    kernel(a, b, out=c)
    assert sim_gpu.arguments[2]["W_ptr"] != scratch
    _check(c, _ref(A, B), A, B)
    sim_gpu.capturing = False
    kernel(a, b, out=c)   # (not remembered under capture: the stream's scratch again)
    assert sim_gpu.arguments[-1]["W_ptr"] == scratch


def test_a_batched_kernel_on_stacks(sim_gpu):
    """A batched spec on stacks (count, M, K) @ (count, K, N), and a broadcast B (1, K, N); the
    output made by the call or given (out=)."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16", batched=True, **SMALL))
    rng = np.random.default_rng(11)
    A = rng.standard_normal((3, 40, 48)).astype(np.float16)
    for B in (rng.standard_normal((3, 48, 56)).astype(np.float16), rng.standard_normal((1, 48, 56)).astype(np.float16)):
        c = kernel(sim_gpu.array(A), sim_gpu.array(B))
        assert c.shape == (3, 40, 56)
        given = sim_gpu.empty((3, 40, 56), "float16")
        assert kernel(sim_gpu.array(A), sim_gpu.array(B), out=given) is given
        np.testing.assert_array_equal(given.numpy(), c.numpy())
        got = c.numpy()
        for i in range(3):
            _check(got[i], _ref(A[i], B[i % B.shape[0]]), A[i], B[i % B.shape[0]], "f16", "f16")


WALKS = {"mma.sync": dict(dtype="f16", **SMALL),
         "wgmma": dict(dtype="f16", out_dtype="f16", **WGMMA)}


@pytest.mark.parametrize("run, family", [(0, "mma.sync"), (1, "mma.sync"), (2, "wgmma")])
def test_a_random_walk_of_calls_matches_numpy(sim_gpu, run, family):
    """A sequence of calls as a training loop or a model makes them, drawn at random: the same
    arrays again (contents changed in place or not), other arrays of the same shapes, other
    shapes, views with an offset, outputs given or made (rows TMA cannot store among them),
    alpha and beta of either sign (and -0.0), rows re-pitched; through kernel(...) and
    tilegen.matmul alike. Every result against numpy: the remembered state of one call must
    never leak into the next."""
    rng = np.random.default_rng(seed("walk", run))
    spec = tilegen.GemmSpec(**WALKS[family])
    kernel = tilegen.compile(spec)
    kernel_out = str(numpy_dtype(spec.out_dtype))
    shapes = [(48, 64, 40), (33, 72, 24), (70, 40, 56)] if family == "mma.sync" else [(70, 136, 64), (130, 64, 72)]
    pool = {}

    def arrays(shape, fresh):
        M, N, K = shape
        if fresh or shape not in pool:
            A = rng.standard_normal((M, K)).astype(np.float16)
            B = rng.standard_normal((K, N)).astype(np.float16)
            offset = int(rng.choice([0, 8]))   # (elements: 16-byte aligned views that do not start their buffer)
            pool[shape] = [A, B, sim_gpu.array(A, offset=offset), sim_gpu.array(B)]
        return pool[shape]

    for step in range(12):
        shape = shapes[int(rng.integers(len(shapes)))]
        entry = arrays(shape, fresh=rng.random() < 0.3)
        A, B, a, b = entry
        if rng.random() < 0.3:   # new contents in place
            A = rng.standard_normal(A.shape).astype(np.float16)
            a.write(A)
            entry[0] = A
        M, N, K = shape
        alpha = float(rng.choice([1.0, -0.5, 2.0, -0.0, 0.0]))
        beta = float(rng.choice([0.0, 0.0, 1.0, -1.5]))
        front = rng.random() < 0.5   # tilegen.matmul, else the kernel
        out_dtype = "float16" if front else kernel_out
        C0 = rng.standard_normal((M, N)).astype(out_dtype)
        pitch = N + int(rng.choice([0, 0, 8, 1 if out_dtype == "float16" else 4]))   # (some rows TMA cannot store)
        c = sim_gpu.array(C0, pitch=pitch) if beta or rng.random() < 0.5 else None
        if front:
            got = tilegen.matmul(a, b, out=c, alpha=alpha, beta=beta)
        else:
            got = kernel(a, b, out=c, alpha=alpha, beta=beta)
        assert c is None or got is c
        ref = _ref(A, B, alpha, beta, C0)
        where = f"step {step}: {shape} alpha={alpha} beta={beta} {'matmul' if front else 'kernel'}"
        out = got.numpy()
        assert not np.isnan(out).any(), where
        assert gemm_error(out, ref, A, B) <= gemm_bound("f16", K, "f16" if out_dtype == "float16" else "f32"), where
        if alpha == 0.0 and beta == 0.0:   # zeros signed as alpha * A @ B's (C unread)
            assert np.all(np.signbit(out) == np.signbit(alpha * (A.astype(np.float32) @ B.astype(np.float32)))), where


def test_a_bias_of_one_row_or_one_column_on_gpu_arrays(sim_gpu):
    """The fast path takes a bias as numpy broadcasts it: 1 x N per column, M x 1 per row (also
    where M == N); the kernel reads it as a vector."""
    A, B = _operands(48, 48, 40)
    b = np.linspace(-2, 2, 48).astype(np.float16)
    a_, b_ = sim_gpu.array(A), sim_gpu.array(B)
    for bias in (b[None, :], b[:, None]):
        c = tilegen.matmul(a_, b_, bias=sim_gpu.array(bias))
        _check(c, _ref(A, B) + bias.astype(np.float64), A, B, "f16", "f16")
    # a column of a matrix (its M x 1 view strided): the kernel gets a packed copy of it
    table = sim_gpu.array(np.stack([b * 0.5, b, b * 2.0], axis=1))   # 48 x 3
    column = sim_device.SimArray(sim_gpu, table.ptr + 2, (48, 1), (3, 1), np.float16)   # table[:, 1:2]
    c = tilegen.matmul(a_, b_, bias=column)
    _check(c, _ref(A, B) + b.astype(np.float64)[:, None], A, B, "f16", "f16")


def test_stacks_through_matmul_remember_their_batched_kernel(sim_gpu):
    """A stack of products (B a stack too): the first call chooses and runs the batched kernel,
    the next ones go straight from the probes (matmul's _fast_stack); each result against numpy."""
    rng = np.random.default_rng(12)
    A = rng.standard_normal((3, 40, 48)).astype(np.float16)
    B = rng.standard_normal((3, 48, 56)).astype(np.float16)
    a, b = sim_gpu.array(A), sim_gpu.array(B)
    for step in range(3):
        if step == 2:
            A = rng.standard_normal(A.shape).astype(np.float16)
            for i in range(3):
                a[i].write(A[i])
        got = tilegen.matmul(a, b).numpy()
        for i in range(3):
            _check(got[i], _ref(A[i], B[i]), A[i], B[i], "f16", "f16")
    assert len({name for name, _, _ in sim_gpu.launches}) == 1 and len(sim_gpu.launches) == 3


def test_the_tma_stack_kernel_from_gpu_stacks(sim_gpu):
    """The warp-specialized kernel over a whole stack through 3-D tensor maps (any M, N, K), with
    a broadcast B (one matrix for every product)."""
    spec = tilegen.GemmSpec(dtype="f16", out_dtype="f16", batched=True, copy="tma", **WGMMA)
    assert spec.persistent and spec.copy == "tma"
    kernel = tilegen.compile(spec)
    rng = np.random.default_rng(13)
    A = rng.standard_normal((3, 70, 40)).astype(np.float16)
    for B in (rng.standard_normal((3, 40, 136)).astype(np.float16), rng.standard_normal((1, 40, 136)).astype(np.float16)):
        got = kernel(sim_gpu.array(A), sim_gpu.array(B)).numpy()
        assert sim_gpu.launches[-1][0] == kernel.name   # (one launch for the stack)
        for i in range(3):
            Bi = B[i % B.shape[0]]
            _check(got[i], _ref(A[i], Bi), A[i], Bi, "f16", "f16")


def test_out_dtype_alone_makes_the_output_through_the_remembered_kernel(sim_gpu):
    A, B = _operands(64, 48, 40)
    a, b = sim_gpu.array(A), sim_gpu.array(B)
    for step in range(2):
        c = tilegen.matmul(a, b, out_dtype="f32")
        assert c.dtype == np.float32
        _check(c, _ref(A, B), A, B, "f16", "f32")
    assert len(sim_gpu.launches) == 2


@pytest.mark.parametrize("kind", ["one element", "per row and column"])
def test_fp8_scales_through_matmul(sim_gpu, kind):
    """fp8 x W.T with its scales as torch._scaled_mm takes them: one-element f32 GPU arrays (read
    where they are) or vectors per row of A / per column of B; new scale arrays on the second call."""
    import ml_dtypes

    rng = np.random.default_rng(seed(kind))
    A = rng.standard_normal((40, 64)).astype(ml_dtypes.float8_e4m3fn)
    W = rng.standard_normal((48, 64)).astype(ml_dtypes.float8_e4m3fn)
    a, w = sim_gpu.array(A), sim_gpu.array(W)
    for step in range(2):
        if kind == "one element":
            sa, sb = (np.array([rng.uniform(0.5, 2)], np.float32) for _ in range(2))
            scale = float(sa[0]) * float(sb[0])
        else:
            sa, sb = rng.uniform(0.5, 2, 40).astype(np.float32), rng.uniform(0.5, 2, 48).astype(np.float32)
            scale = sa.astype(np.float64)[:, None] * sb.astype(np.float64)[None, :]
        c = tilegen.matmul(a, w.T, scale_a=sim_gpu.array(sa), scale_b=sim_gpu.array(sb), out_dtype="bf16")
        ref = scale * (A.astype(np.float64) @ W.T.astype(np.float64))
        got = c.numpy().astype(np.float64)
        assert not np.isnan(got).any() and np.linalg.norm(got - ref) <= 2.0 ** -7 * np.linalg.norm(ref)


def test_scalars_the_fast_path_cannot_take_are_refused_by_name(sim_gpu):
    """alpha or beta beyond float32's range on GPU arrays: declined by the fast path and refused by
    name (the stand-in's general path would fail: so it is the check before it that says so); a
    beta that is 0 in float32 likewise."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(16, 16, 16)
    a, b, c = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.empty((16, 16), "float32")
    for kw, said in ((dict(alpha=1e300), "alpha=1e+300 is beyond float32's range"),
                     (dict(beta=-1e39), "beta=-1e+39 is beyond float32's range"),
                     (dict(beta=1e-50), "is 0 in float32")):
        assert kernel.fast_call(a, b, c, None, None, kw.get("alpha", 1.0), kw.get("beta", 0.0), False) is None
        with pytest.raises(tilegen.LaunchError, match=re.escape(said)):
            kernel(a, b, out=c, **kw)
        with pytest.raises(tilegen.LaunchError, match=re.escape(said)):
            tilegen.matmul(a, b, out=sim_gpu.empty((16, 16), "float16"), **kw)
    assert not sim_gpu.launches
    kernel(a, b, out=c)   # remembered; then the same arrays with those scalars (the new-pointers branch's check)
    for kw, said in ((dict(alpha=1e300), "alpha=1e+300 is beyond"), (dict(beta=1e-50), "is 0 in float32")):
        with pytest.raises(tilegen.LaunchError, match=re.escape(said)):
            kernel(a, b, out=c, **kw)
    assert len(sim_gpu.launches) == 1


def test_a_prepared_launch_repeated_launches_the_same_values(monkeypatch):
    """kernel.launch with the arguments of the launch before: the Launcher gets the very values
    it packed (its buffer holds them); any argument or size changed, an alpha of the other zero
    sign, or values whose == is not a truth value, build the values anew."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    got = []

    class Recorder:
        sm_count = 132

        def __call__(self, grid, values, stream=0):
            got.append((grid, values, stream))

    recorder = Recorder()
    monkeypatch.setattr(kernel, "_launchers", {0: (module_generation(), recorder)})
    args = {n: 0x1000 * (i + 1) if n.endswith("_ptr") else 64 for i, (n, _) in enumerate(kernel.params)}
    args.update(alpha=1.0, beta=0.0)
    sizes = {"M": 64, "N": 64, "K": 64}
    kernel.launch(args, sizes, stream=5)
    kernel.launch(dict(args), dict(sizes), stream=5)
    assert got[1][1] is got[0][1] and got[1][0] is got[0][0] and got[1][2] == 5
    args["C_ptr"] += 0x100
    kernel.launch(args, sizes)
    assert got[2][1] is not got[1][1] and got[2][1][kernel._names.index("C_ptr")] == args["C_ptr"]
    # an object given (a buffer with .ptr) is not remembered: not kept alive, nor trusted to hold still
    buf = type("Buffer", (), {"ptr": 0x9000})()
    kernel.launch({**args, "A_ptr": buf}, sizes)
    assert kernel._last_launch is None
    kernel.launch(args, sizes)
    del got[3:5]   # (the buffer's launch and the one after it)
    kernel.launch(args, {**sizes, "M": 128})
    assert got[3][0] != got[2][0]
    args["beta"] = -0.0
    kernel.launch(args, {**sizes, "M": 128})
    assert str(got[4][1][kernel._names.index("beta")]) == "-0.0"
    kernel.launch({**args, "alpha": np.array([1.0, 2.0])}, {**sizes, "M": 128})
    assert len(got) == 6 and got[5][1] is not got[4][1]
    kernel.launch(args, {**sizes, "M": 128})
    kernel.launch(args, {**sizes, "M": 128})
    assert got[7][1] is got[6][1]
    # modules unloaded since: the remembered Launcher is stale, the launch goes to a new one
    monkeypatch.setattr(kernel, "_launchers", {0: (module_generation() - 1, recorder)})
    fresh = []
    # (setitem on the instance's dict: undone by deleting it, so the compiled kernel, which
    # compile() hands to later tests too, is left with its class's launcher)
    monkeypatch.setitem(kernel.__dict__, "launcher", lambda device=0: type("Fresh", (), {
        "sm_count": 132, "__call__": lambda self, grid, values, stream=0: fresh.append(values)})())
    kernel.launch(args, {**sizes, "M": 128})
    assert len(got) == 8 and len(fresh) == 1


def test_a_prepared_launch_by_name_runs_the_one_kernel(sim_gpu):
    """kernel.launch(args, sizes) of a one-kernel spec: Kernel.launch itself, decided once (no
    first kernels, no second kernel, no stack workspace), on the stream given."""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    A, B = _operands(70, 96, 48, np.float16, "launch")
    a, b, c = sim_gpu.array(A), sim_gpu.array(B), sim_gpu.empty((70, 96), "float32")
    args = {"M": 70, "N": 96, "K": 48, "A_ptr": a.ptr, "A_ld": 48, "B_ptr": b.ptr, "B_ld": 96, "C_ptr": c.ptr,
            "C_ld": 96, "alpha": 1.0, "beta": 0.0, "bias_ptr": 0, "R_ptr": 0, "R_ld": 0}
    args = {n: args[n] for n, _ in kernel.params}
    kernel.launch(args, {"M": 70, "N": 96, "K": 48}, stream=sim_gpu.stream)
    assert kernel._one_launch is True
    _check(c, _ref(A, B), A, B)
    assert [(np.prod(g), s) for _, g, s in sim_gpu.launches] == [(4, sim_gpu.stream)]
    with pytest.raises(tilegen.LaunchError, match="kernel.launch of a GEMM runs on the GPU"):
        kernel.launch(args, {"M": 70, "N": 96, "K": 48}, device="sim")


def test_a_leading_dimension_below_the_columns_is_refused(sim_gpu, monkeypatch):
    """A_ld < K would make A's rows overlap: a silent wrong answer before; kernel.launch and
    the emulator's run_kernel both refuse it, naming the parameter and its least value."""
    from tilegen.sim import GlobalMemory, SimError, run_kernel

    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    args = {n: 0x1000 * (i + 1) if n.endswith("_ptr") else 64 for i, (n, _) in enumerate(kernel.params)}
    args.update(alpha=1.0, beta=0.0, A_ld=63)
    sizes = {"M": 64, "N": 64, "K": 64}
    says = r"A_ld = 63 is less than the 64 elements of each stored row of A \(K = 64\): its rows would overlap"
    with pytest.raises(tilegen.LaunchError, match=says):
        kernel.launch(args, sizes)
    with pytest.raises(SimError, match=says):
        run_kernel(kernel, args, sizes, GlobalMemory())
    args.update(A_ld=64, M=1)   # (one row: its ld is not read)
    assert kernel.leading_problem({**args, "A_ld": 1}, {**sizes, "M": 1}) == ""
