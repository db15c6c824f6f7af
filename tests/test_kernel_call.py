"""A DSL kernel called on arrays (compiler/call.py): kernel(A, B, C=c, alpha=...) by the names the
kernel declared. On numpy arrays on the emulator (device="sim"), through the GPU path with the
emulator standing in for the GPU (the sim_gpu fixture: arrays in its memory taken as PyTorch
tensors are), and numpy through device buffers; every kind of array (matrices in either layout,
stacks, vectors, counters, f32 scalars in memory); and the refusals, each naming what was wrong."""
import warnings

import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from test_dsl import one_tile   # (the docs' first kernel: C = A @ B, one 16 x 16 block, cp.async copies)
from tilegen.compiler.arrays import ArrayParam

ATOM = "m16n8k16.f16.f32"


@tg.kernel
def scaled_stack(y_layout="col"):
    """Y[b] = s * X[b] + bias (per column) for a stack of matrices: a stack read, a stack written
    in `y_layout` order, a vector, and an f32 scalar in memory; the grid's z from the stack's count."""
    tg.launch(threads=32, grid=(tg.cdiv("M", 16), tg.cdiv("N", 8), "BATCH"))
    X = tg.batched_tensor("X", "f32", ("M", "N"))
    Y = tg.batched_tensor("Y", "f32", ("M", "N"), layout=y_layout)
    bias = tg.vector("bias", "f32", "N")
    s = tg.device_scalar("s")
    b = tg.program_id("z")
    r0, c0 = tg.program_id("x") * 16, tg.program_id("y") * 8
    x = tg.fragment(ATOM, "C", (1, 1))
    tg.accumulate(x, X.batch(b).block(r0, c0))
    tg.store(Y.batch(b).block(r0, c0), x * s, bias=bias)


@tg.kernel
def scale_grid():
    """Y = alpha * X over a grid of G CTAs that each store the same block (G only the grid reads)."""
    tg.launch(threads=32, grid=("G", 1, 1))
    X = tg.tensor("X", "f32", ("M", "N"))
    Y = tg.tensor("Y", "f32", ("M", "N"))
    alpha = tg.scalar("alpha")
    x = tg.fragment(ATOM, "C", (1, 1))
    tg.accumulate(x, X.block(0, 0))
    tg.store(Y.block(0, 0), x * alpha)


def _f16(rng, shape):
    return rng.integers(-3, 4, shape).astype(np.float16)   # (small integers: every product exact in f32)


def _stack_inputs(seed=5, count=3, M=21, N=13):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((count, M, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    return X, bias, np.float32(rng.uniform(0.5, 2.0))


def _stack_want(X, bias, s):
    return X.astype(np.float64) * np.float64(s) + bias.astype(np.float64)


def test_the_table_of_arrays_says_what_each_parameter_takes():
    """cp.async's 16-byte copies make A and B need 16-byte rows; C is written; a stack names its
    stride and count; a vector its length; the scalar its pointer alone."""
    k = tilegen.compile(one_tile)
    assert k.arrays == (
        ArrayParam("A", "matrix", "f16", "A_ptr", "A_ld", "M", "K", "row", align=16),
        ArrayParam("B", "matrix", "f16", "B_ptr", "B_ld", "K", "N", "row", align=16),
        ArrayParam("C", "matrix", "f32", "C_ptr", "C_ld", "M", "N", "row", align=0, written=True))
    s = tilegen.compile(scaled_stack)
    assert [(a.name, a.kind, a.shape, a.written) for a in s.arrays] == [
        ("X", "stack", ("BATCH", "M", "N"), False), ("Y", "stack", ("BATCH", "M", "N"), True),
        ("bias", "vector", ("N",), False), ("s", "scalar", (), False)]
    y = s.arrays[1]
    assert (y.stride, y.count, y.rows, y.cols, y.logical) == ("Y_batch_stride", "BATCH", "N", "M", "col")


@pytest.mark.parametrize("M, K, N", [(16, 32, 16), (13, 20, 11), (1, 7, 3)])
def test_numpy_arrays_on_the_emulator(M, K, N):
    """Rows of 20 f16 (40 bytes) are padded to what cp.async needs; A, B by position, C by name; C
    holds the product afterwards (poisoned before), A and B are left as they were."""
    rng = np.random.default_rng(M * K * N)
    A, B = _f16(rng, (M, K)), _f16(rng, (K, N))
    A0, B0 = A.copy(), B.copy()
    C = np.full((M, N), np.nan, np.float32)
    tilegen.compile(one_tile)(A, B, C=C, device="sim")
    assert np.array_equal(C, A.astype(np.float32) @ B.astype(np.float32))
    assert np.array_equal(A, A0) and np.array_equal(B, B0)


def test_read_only_inputs_are_taken():
    """Arrays the kernel only reads are not written back: read-only ones are fine."""
    rng = np.random.default_rng(3)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    A.flags.writeable = B.flags.writeable = False
    C = np.full((16, 16), np.nan, np.float32)
    tilegen.compile(one_tile)(A=A, B=B, C=C, device="sim")
    assert np.array_equal(C, A.astype(np.float32) @ B.astype(np.float32))


@pytest.mark.parametrize("y_layout", ["row", "col"])
def test_stacks_vectors_and_scalars_on_the_emulator(y_layout):
    """A stack read and one written (column-major: stored transposed, and copied back so), a bias
    vector, the scalar given as a number; BATCH, which only the grid reads, from the stacks."""
    X, bias, s = _stack_inputs()
    Y = np.full_like(X, np.nan)
    tilegen.compile(scaled_stack, y_layout=y_layout)(X, Y, bias, float(s), device="sim")
    want = _stack_want(X, bias, s)
    assert np.abs(Y - want).max() <= 4 * 2.0 ** -24 * np.abs(want).max()


def test_counters_and_grid_sizes_by_name():
    """Arrival counters as a uint32 (or int32) array of zeros, put back to 0 by the kernel; G, a size
    no array gives, by name; the last CTA's sum in C."""
    from test_arrivals import make_kernel

    kernel = make_kernel()
    rng = np.random.default_rng(9)
    for G, dtype in ((3, np.uint32), (2, np.int32)):
        X = rng.standard_normal((32 * G, 8)).astype(np.float32)
        W, C, F = np.full_like(X, np.nan), np.full((32, 8), np.nan, np.float32), np.zeros(4, dtype)
        kernel(X, W, C, F, G=G, device="sim")
        want = np.zeros((32, 8), np.float32)
        for c in range(G):   # (in slot order, as the kernel adds)
            want += X[32 * c:32 * c + 32]
        assert np.array_equal(C, want) and not F.any()
        assert np.array_equal(W, X)


def _refusal(call, says):
    with pytest.raises(tilegen.LaunchError, match=says):
        call()


@pytest.mark.parametrize("make, says", [
    (lambda k, A, B, C: k(A.astype(np.float32), B, C), r"A has dtype float32; this kernel takes float16 \(f16\): pass A.astype\(np.float16\)"),
    (lambda k, A, B, C: k(A, B[:5], C), r"B gives K = 5, but A gives K = 32"),
    (lambda k, A, B, C: k(A, B),
     r"no array for C, a 2-D array \(numpy, PyTorch, CuPy\) \(its arrays, in order: A, B, C\)"),
    (lambda k, A, B, C: k(A, B, C, C), r"takes 3 arrays by position \(A, B, C\), got 4"),
    (lambda k, A, B, C: k(A, B, C, B=B), r"B is given twice, by position and by name"),
    (lambda k, A, B, C: k(A, B, Cc=C), r"Cc is neither an array nor a parameter of this kernel \(C\?\)"),
    (lambda k, A, B, C: k(A, B, C, C_ld=16), r"C_ld comes from C's array: pass C="),
    (lambda k, A, B, C: k(A, B, C, M=15), r"M = 15 given, but A gives M = 16"),
    (lambda k, A, B, C: k(A, B, C[None]), r"C takes a 2-D array \(numpy, PyTorch, CuPy\), not a 3-D array"),
    (lambda k, A, B, C: k(A, B, np.zeros((16, 0), np.float32)), r"C is empty"),
    (lambda k, A, B, C: k(A, B, C, device="tpu"), r"device='tpu'; allowed"),
    (lambda k, A, B, C: k(A, B, _read_only(C)), r"C is read-only, but the kernel writes it"),
])
def test_what_does_not_fit_is_said(make, says):
    rng = np.random.default_rng(0)
    A, B, C = _f16(rng, (16, 32)), _f16(rng, (32, 16)), np.zeros((16, 16), np.float32)
    kernel = tilegen.compile(one_tile)
    _refusal(lambda: make(lambda *a, **kw: kernel(*a, **{"device": "sim", **kw}), A, B, C), says)


def _read_only(x):
    x = x.copy()
    x.flags.writeable = False
    return x


def test_a_missing_scalar_and_a_parameter_named_device_are_said():
    @tg.kernel
    def scale(called="alpha"):
        tg.launch(threads=32, grid=(1, 1, 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        alpha = tg.scalar(called)
        x = tg.fragment(ATOM, "C", (1, 1))
        tg.accumulate(x, X.block(0, 0))
        tg.store(X.block(0, 0), x * alpha)

    X = np.ones((16, 8), np.float32)
    _refusal(lambda: tilegen.compile(scale)(X, alhpa=2.0, device="sim"),
             r"alhpa is neither an array nor a parameter of this kernel \(alpha\?\)")
    _refusal(lambda: tilegen.compile(scale)(X, device="sim"), r"missing arguments alpha \(give them by name")
    _refusal(lambda: tilegen.compile(scale, called="device")(X, device="sim"),
             r"has a parameter named 'device', which kernel\(...\) takes as where to run")
    tilegen.compile(scale)(X, alpha=-2.0, device="sim")
    assert np.array_equal(X, np.full((16, 8), -2.0, np.float32))


# -- the GPU path, the emulator standing in for the GPU ---------------------------------------
def test_gpu_arrays_in_place_on_the_librarys_stream(sim_gpu):
    rng = np.random.default_rng(21)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    c = sim_gpu.empty((16, 16), "float32")
    kernel = tilegen.compile(one_tile)
    kernel(sim_gpu.array(A), sim_gpu.array(B), c)
    assert np.array_equal(c.numpy(), A.astype(np.float32) @ B.astype(np.float32))
    assert sim_gpu.launches[-1] == (kernel.name, (1, 1, 1), sim_gpu.stream)
    kernel(sim_gpu.array(A), sim_gpu.array(B), c, stream=7)
    assert sim_gpu.launches[-1][2] == 7


def test_gpu_arrays_of_other_layouts_and_pitches(sim_gpu):
    """A column-major B where the kernel declares it row-major is refused with what to pass; rows
    whose pitch cp.async cannot take are refused (numpy arrays are padded instead); a pitched
    A (rows 40 elements apart) is read in place."""
    rng = np.random.default_rng(22)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    kernel = tilegen.compile(one_tile)
    c = sim_gpu.empty((16, 16), "float32")
    _refusal(lambda: kernel(sim_gpu.array(A), sim_gpu.array(B, order="F"), c),
             r"B is column-major .* this kernel takes B row-major")
    _refusal(lambda: kernel(sim_gpu.array(A[:, :20]), sim_gpu.array(B[:20]), c),
             r"A's leading dimension is 20 elements \(40 bytes\), not a multiple of 16 bytes")
    _refusal(lambda: kernel(sim_gpu.array(A), B, c), r"B is a ndarray on the host while other arrays of the call are on")
    kernel(sim_gpu.array(A, pitch=40), sim_gpu.array(B), c)
    assert np.array_equal(c.numpy(), A.astype(np.float32) @ B.astype(np.float32))
    assert sim_gpu.arguments[-1]["A_ld"] == 40


def test_gpu_stacks_vectors_and_scalars(sim_gpu):
    """A stack's stride from its array; the column-major output stack given as a transposed view
    of a row-major one; the scalar a one-element GPU array (a Python number is refused there)."""
    X, bias, s = _stack_inputs(seed=8)
    count, M, N = X.shape
    y = sim_gpu.empty((count, N, M), "float32")   # stored (N, M) per matrix: Y's logical (M, N) column-major
    y_logical = type(y)(sim_gpu, y.ptr, (count, M, N), (N * M, 1, M), y.dtype)
    kernel = tilegen.compile(scaled_stack)
    args = (sim_gpu.array(X), y_logical, sim_gpu.array(bias))
    _refusal(lambda: kernel(*args, float(s)), r"s is one f32 in memory: pass a one-element float32 array on the GPU")
    kernel(*args, sim_gpu.array(np.array([s], np.float32)))
    got = np.swapaxes(y.numpy(), 1, 2)
    want = _stack_want(X, bias, s)
    assert np.abs(got - want).max() <= 4 * 2.0 ** -24 * np.abs(want).max()
    assert sim_gpu.arguments[-1]["X_batch_stride"] == M * N and sim_gpu.launches[-1][1] == (2, 2, count)


def test_numpy_arrays_through_device_buffers(sim_gpu, monkeypatch):
    """With a GPU, numpy arrays go through device buffers (copied in, launched, copied back): the
    buffers here are the emulator's, and only C, which the kernel writes, is copied back."""
    from tilegen import runtime

    got_back = []

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes, self.ptr = nbytes, sim_gpu.alloc(nbytes)

        def copy_from_host(self, host):
            sim_gpu.memory.write(self.ptr, np.ascontiguousarray(host).reshape(-1).view(np.uint8))

        def copy_to_host(self, host):
            got_back.append(host.shape)
            host[...] = sim_gpu.memory.read(self.ptr, host.nbytes).view(host.dtype).reshape(host.shape)

    monkeypatch.setattr(runtime.HostCallBuffers, "take", classmethod(lambda cls, n, device: Buffer(n)))
    monkeypatch.setattr(runtime.HostCallBuffers, "give", classmethod(lambda cls, buf: None))
    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    rng = np.random.default_rng(23)
    A, B = _f16(rng, (13, 20)), _f16(rng, (20, 11))
    C = np.full((13, 11), np.nan, np.float32)
    tilegen.compile(one_tile)(A, B, C)
    assert np.array_equal(C, A.astype(np.float32) @ B.astype(np.float32))
    assert got_back == [(13, 11)]
    assert sim_gpu.arguments[-1]["A_ld"] == 24 and sim_gpu.launches[-1][2] is None


def test_numpy_without_a_gpu_runs_on_the_emulator_and_says_so(monkeypatch):
    from tilegen import errors, runtime

    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    monkeypatch.setattr(errors, "_said", set())
    rng = np.random.default_rng(24)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    C = np.full((16, 16), np.nan, np.float32)
    with pytest.warns(tilegen.EmulatorWarning, match="no GPU found; kernels of your own on numpy arrays run on the CPU emulator"):
        tilegen.compile(one_tile)(A, B, C)
    assert np.array_equal(C, A.astype(np.float32) @ B.astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # said once a process
        tilegen.compile(one_tile)(A, B, C)


def test_a_call_like_one_before_launches_what_that_one_derived(sim_gpu, monkeypatch):
    """The memo (compiler/call.py): the same arrays' probes and other arguments launch the
    arguments derived before, without describing the arrays again, on the library's stream as it is
    at this call; other pointers, another sign of zero in a scalar or another stream derive anew;
    at most MEMO calls are kept."""
    from tilegen.compiler import call as call_module

    kernel = tilegen.compile(scale_grid)
    derived = []
    real = call_module._device_arguments
    monkeypatch.setattr(call_module, "_device_arguments", lambda *a: derived.append(1) or real(*a))
    X = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    x, y = sim_gpu.array(X), sim_gpu.empty((16, 8), "float32")
    kernel(x, y, alpha=2.0, G=1)
    kernel(x, Y=y, alpha=2.0, G=1)   # (Y by name: the same call)
    assert len(derived) == 1 and np.array_equal(y.numpy(), 2 * X)
    monkeypatch.setattr(sim_gpu, "stream", 0x77)
    kernel(x, y, alpha=2.0, G=1)
    assert len(derived) == 1 and sim_gpu.launches[-1][2] == 0x77
    kernel(x, y, alpha=-0.0, G=1)
    kernel(x, y, alpha=0.0, G=1)
    assert len(derived) == 3
    assert np.array_equal(np.signbit(y.numpy()), np.signbit(X * 0.0))
    kernel(x, y, alpha=-0.0, G=1)
    assert len(derived) == 3 and np.array_equal(np.signbit(y.numpy()), np.signbit(X * -0.0))
    y2 = sim_gpu.empty((16, 8), "float32")
    kernel(x, y2, alpha=3.0, G=1)
    assert len(derived) == 4 and np.array_equal(y2.numpy(), 3 * X)
    kernel(x, y2, alpha=3.0, G=1, stream=5)
    assert len(derived) == 5 and sim_gpu.launches[-1][2] == 5
    for i in range(call_module.MEMO + 1):
        kernel(x, y2, alpha=float(i), G=1)
    assert len(kernel._calls) <= call_module.MEMO


def test_a_gemm_kernel_called_as_a_dsl_kernel(sim_gpu):
    """kernel.call_arrays: a GEMM kernel's own A, B, C by position, alpha and beta by name (what
    `tilegen bench --host` times beside kernel(A, B, out=C))."""
    from test_fast_path_sim import SMALL

    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", **SMALL))
    rng = np.random.default_rng(25)
    A, B = _f16(rng, (40, 48)), _f16(rng, (48, 24))
    C = rng.standard_normal((40, 24)).astype(np.float32)
    c = sim_gpu.array(C)
    kernel.call_arrays(sim_gpu.array(A), sim_gpu.array(B), c, alpha=2.0, beta=-1.0)
    want = 2.0 * (A.astype(np.float64) @ B.astype(np.float64)) - C
    assert np.abs(c.numpy() - want).max() <= 1e-5 * np.abs(want).max()


_GEMM_GENERAL_PATH = __import__("tilegen.gemm.call", fromlist=["_run_device"])._run_device   # (before sim_gpu swaps it)


@pytest.mark.parametrize("host", ["A", "B", "out", "bias"])
def test_a_numpy_array_among_gpu_arrays_is_refused(sim_gpu, monkeypatch, host):
    """tilegen.matmul and a GEMM kernel's call with one numpy array among GPU ones: the general path
    had launched the kernel on the numpy array's host address (an illegal address on the GPU, which
    spoils the context); now refused, naming it. A DSL kernel's call likewise."""
    from tilegen.gemm import call as gemm_call

    monkeypatch.setattr(gemm_call, "_run_device", _GEMM_GENERAL_PATH)
    launched = []
    monkeypatch.setattr(tilegen.GemmKernel, "launch", lambda *a, **kw: launched.append(a))
    rng = np.random.default_rng(26)
    arrays = {"A": _f16(rng, (64, 32)), "B": _f16(rng, (32, 48)), "out": np.zeros((64, 48), np.float16),
              "bias": rng.standard_normal(48).astype(np.float16)}
    given = {name: x if name == host else sim_gpu.array(x) for name, x in arrays.items()}
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16", epilogue=tilegen.Epilogue(bias="col")))
    with pytest.raises(tilegen.LaunchError, match=rf"{host} is a ndarray on the host while other arrays of the call "
                                                  r"are on the GPU: pass every array on the GPU"):
        kernel(given["A"], given["B"], out=given["out"], bias=given["bias"])
    assert not launched


def test_a_numpy_array_among_gpu_arrays_of_a_dsl_kernel_is_refused(sim_gpu):
    rng = np.random.default_rng(27)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    with pytest.raises(tilegen.LaunchError, match=r"C is a ndarray on the host while other arrays of the call are on "
                                                  r"the GPU"):
        tilegen.compile(one_tile)(sim_gpu.array(A), sim_gpu.array(B), np.zeros((16, 16), np.float32))
    assert not sim_gpu.launches


# -- what a demanding user tries (a review's findings, each refused or taken as said) ---------
class _DLPackCPU:
    """A CPU DLPack array that is no numpy array (as a PyTorch CPU tensor is)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


class _CAIOnly:
    """A GPU array with __cuda_array_interface__ alone (no reshape, no library tilegen knows)."""

    def __init__(self, a):
        self.a = a

    @property
    def __cuda_array_interface__(self):
        return self.a.__cuda_array_interface__


@pytest.mark.parametrize("make, says", [
    (lambda k, X, Y: k(X, None, alpha=1.0), r"scale_grid: Y is None; it takes a 2-D array \(numpy, PyTorch, CuPy\)"),
    (lambda k, X, Y: k(X, list(Y), alpha=1.0), r"Y is a list; it takes a 2-D array"),
    (lambda k, X, Y: k(X, 3.0, alpha=1.0), r"Y is a float; it takes a 2-D array"),
    (lambda k, X, Y: k(X, Y, alpha="3", G=1), r"alpha = '3': '3' \(str\) is not a real number"),
    (lambda k, X, Y: k(X, Y, alpha=True, G=1), r"alpha = True: True \(bool\) is not a real number"),
    (lambda k, X, Y: k(X, Y, alpha=1.0, G="3"), r"G = '3': a size is a whole number from 0 to 2\^31 - 1"),
    (lambda k, X, Y: k(X, Y, alpha=1.0, G=2.5), r"G = 2.5: a size is a whole number"),
    (lambda k, X, Y: k(X, Y, alpha=1.0, G=None), r"G = None: a size is a whole number"),
    (lambda k, X, Y: k(X, Y, alpha=1.0, G=2 ** 33), r"G = 8589934592: a size is a whole number"),
    (lambda k, X, Y: k(X, Y, alpha=1.0, G=1, M=16.0), r"M = 16.0: a size is a whole number"),
    (lambda k, X, Y: k(X, Y, alpha=1.0, Gx=1), r"Gx is neither an array nor a parameter of this kernel \(G\?\); "
                                                r"it takes the arrays X, Y and M, N, alpha, G"),
    (lambda k, X, Y: k(X, Y, alpha=1.0, G=1, stream=3), r"stream= is for GPU arrays"),
])
def test_arguments_that_are_no_arrays_or_no_sizes_are_named(make, says):
    X = np.ones((16, 8), np.float32)
    kernel = tilegen.compile(scale_grid)
    _refusal(lambda: make(lambda *a, **kw: kernel(*a, **{"device": "sim", **kw}), X, X.copy()), says)


def test_without_a_gpu_a_bad_argument_is_named_not_a_gpu(monkeypatch):
    """(A None, a list or a bool had taken the GPU path and blamed a good numpy array.)"""
    from tilegen import runtime

    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    X = np.ones((16, 8), np.float32)
    _refusal(lambda: tilegen.compile(scale_grid)(X, None, alpha=1.0, G=1), r"Y is None; it takes a 2-D array")
    X, bias, s = _stack_inputs()
    _refusal(lambda: tilegen.compile(scaled_stack)(X, np.zeros_like(X), bias, True),
             r"s is a bool; it takes a number or a one-element float32 array")
    _refusal(lambda: tilegen.compile(scaled_stack)(X, np.zeros_like(X), bias, np.array([1 + 2j]), device="sim"),
             r"s is one f32 in memory: pass a number or a one-element float32 array, not complex128")


def test_cpu_dlpack_arrays_are_host_arrays():
    """A CPU DLPack array (a PyTorch CPU tensor) runs as numpy does, its results written into it."""
    rng = np.random.default_rng(28)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    C = np.full((16, 16), np.nan, np.float32)
    tilegen.compile(one_tile)(_DLPackCPU(A), _DLPackCPU(B), _DLPackCPU(C), device="sim")
    assert np.array_equal(C, A.astype(np.float32) @ B.astype(np.float32))


def test_counters_that_are_not_zero_or_empty_are_refused():
    """(A non-zero counter had left C unwritten without a word; an empty array ran out of bounds.)"""
    from test_arrivals import make_kernel

    X = np.ones((64, 8), np.float32)
    W, C = np.zeros_like(X), np.zeros((32, 8), np.float32)
    kernel = make_kernel()
    _refusal(lambda: kernel(X, W, C, np.array([5, 0, 0, 0], np.uint32), G=2, device="sim"),
             r"F holds counters that must be 0 before the launch")
    _refusal(lambda: kernel(X, W, C, np.zeros(0, np.uint32), G=2, device="sim"), r"F is empty")


def test_a_stack_refused_is_named_with_a_fix_for_the_stack(sim_gpu):
    X, bias, s = _stack_inputs(count=2, M=16, N=8)
    kernel = tilegen.compile(scaled_stack)   # Y column-major
    y_rows = sim_gpu.empty(X.shape, "float32")   # row-major matrices
    _refusal(lambda: kernel(sim_gpu.array(X), y_rows, sim_gpu.array(bias), sim_gpu.array(np.array([s]))),
             r"Y is row-major .* pass the row-major stack of its transposes Yt \(count, columns, rows\) as "
             r"Yt.transpose\(0, 2, 1\)")


def test_gpu_path_refusals(sim_gpu):
    """A tensor map is the launch's to build; a stream must be a stream; an array given twice is refused
    also once a call like it was remembered."""
    X = np.ones((16, 8), np.float32)
    x, y = sim_gpu.array(X), sim_gpu.empty((16, 8), "float32")
    kernel = tilegen.compile(scale_grid)
    _refusal(lambda: kernel(x, y, alpha=1.0, G=1, stream="junk"), r"stream='junk': pass a PyTorch, CuPy or tilegen")
    _refusal(lambda: kernel(x, y, alpha=np.array([1.0, 2.0]), G=1), r"alpha = array\(\[1\., 2\.\]\): .* is not a real "
                                                                   r"number")   # (unhashable: past the memo)
    kernel(x, y, alpha=1.0, G=1)
    _refusal(lambda: kernel(x, y, X=sim_gpu.array(X), alpha=1.0, G=1), r"X is given twice, by position and by name")
    step4 = _ladder_step("step4_tma", "step4")
    _refusal(lambda: step4(x, x, y, A_tmap=b"\0" * 128), r"A_tmap is the tensor map the launch builds from A's array")


def _ladder_step(module: str, fn: str):
    from ladder_util import load

    return tilegen.compile(getattr(load(module), fn), target="sm_90a")


def test_tma_kernels_and_scalars_of_any_cuda_array_on_the_gpu_path(sim_gpu):
    """The ladder's TMA step on GPU arrays (its tensor maps built by the launch from the arrays),
    ragged; a scalar in memory given as an object with __cuda_array_interface__ alone."""
    rng = np.random.default_rng(29)
    M, N, K = 70, 40, 72
    A, B = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
    c = sim_gpu.empty((M, N), "float32")
    _ladder_step("step4_tma", "step4")(sim_gpu.array(A), sim_gpu.array(B), c)
    want = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    assert np.all(np.abs(c.numpy() - want) <= K * 2.0 ** -23 * scale)   # (f16 products exact; K f32 additions)
    X, bias, s = _stack_inputs(seed=30, count=2)
    y = sim_gpu.empty((2, X.shape[2], X.shape[1]), "float32")
    y_logical = type(y)(sim_gpu, y.ptr, X.shape, (X.shape[1] * X.shape[2], 1, X.shape[1]), y.dtype)
    tilegen.compile(scaled_stack)(_CAIOnly(sim_gpu.array(X)), y_logical, sim_gpu.array(bias),
                                  _CAIOnly(sim_gpu.array(np.array([[s]], np.float32))))
    want = _stack_want(X, bias, s)
    assert np.abs(np.swapaxes(y.numpy(), 1, 2) - want).max() <= 4 * 2.0 ** -24 * np.abs(want).max()


@pytest.mark.parametrize("call, says", [
    (lambda k, A, B, C: k(A, B, C=C), r"kernel\(\.\.\.\) of a GEMM takes no C= \(C is out= here\)"),
    (lambda k, A, B, C: k(A), r"takes the GEMM's operands A \(M x K\) and B \(K x N\); B was not given"),
    (lambda k, A, B, C: k(), r"A and B were not given"),
    (lambda k, A, B, C: k(B=B), r"A was not given"),
    (lambda k, A, B, C: k(A, B, outt=C), r"takes no outt= \(out\?\); it takes A, B and out=, alpha="),
])
def test_a_gemm_kernel_called_with_what_it_does_not_take(call, says):
    """(Python's own TypeErrors had answered these.)"""
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16"))
    A, B = np.ones((16, 16), np.float16), np.ones((16, 16), np.float16)
    _refusal(lambda: call(kernel, A, B, np.zeros((16, 16), np.float32)), says)


def test_store_with_alpha_alone_does_not_read_c():
    """tg.store(..., alpha=) alone: beta is 0 and C (NaN-poisoned here) is not read; beta= alone:
    alpha is 1. (Either alone had been refused.)"""
    @tg.kernel
    def scaled(which="alpha"):
        tg.launch(threads=32, grid=(1, 1, 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        Y = tg.tensor("Y", "f32", ("M", "N"))
        x = tg.fragment(ATOM, "C", (1, 1))
        tg.accumulate(x, X.block(0, 0))
        tg.store(Y.block(0, 0), x, **{which: 2.0})

    X = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    Y = np.full_like(X, np.nan)
    tilegen.compile(scaled)(X, Y, device="sim")
    assert np.array_equal(Y, 2 * X)
    Y = np.ones_like(X)
    tilegen.compile(scaled, which="beta")(X, Y, device="sim")
    assert np.array_equal(Y, X + 2)


class _RaisingCAI:
    """A GPU array whose __cuda_array_interface__ raises, as a PyTorch tensor's does when it
    requires grad or is fp8, and whose DLPack says where it lives."""

    def __init__(self, a, error=RuntimeError):
        self.a, self.error = a, error

    @property
    def __cuda_array_interface__(self):
        raise self.error("Can't get __cuda_array_interface__ on Variable that requires grad")

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kw):
        raise self.error("Cannot export a tensor that requires grad")


@pytest.mark.parametrize("error", [RuntimeError, KeyError])
def test_a_gpu_array_whose_interface_raises_is_answered_in_tilegens_words(sim_gpu, error):
    """(Its property had escaped as the library's own error from the first call on.)"""
    X = np.ones((16, 8), np.float32)
    with pytest.raises(tilegen.LaunchError, match=r"X: DLPack export failed"):
        tilegen.compile(scale_grid)(_RaisingCAI(sim_gpu.array(X), error), sim_gpu.empty((16, 8), "float32"),
                                    alpha=1.0, G=1)


def test_host_arrays_the_gemm_path_refuses_are_refused_here_too():
    """A masked array (its mask would be ignored) and an output whose rows overlap (stride 0: every
    row written over the last) had been taken by kernel(...) while kernel(A, B) refused them."""
    X = np.ones((16, 8), np.float32)
    kernel = tilegen.compile(scale_grid)
    _refusal(lambda: kernel(np.ma.masked_array(X, X > 0), X.copy(), alpha=1.0, G=1, device="sim"),
             r"X is a numpy masked array: the kernel would read every element")
    rows = np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), (16, 8), (0, 4), writeable=True)
    _refusal(lambda: kernel(X, rows, alpha=1.0, G=1, device="sim"), r"Y has strides \(0, 4\) .* its elements overlap")
    _refusal(lambda: kernel(X.byteswap().view(X.dtype.newbyteorder()), X.copy(), alpha=1.0, G=1, device="sim"),
             r"X is byte-swapped")


def test_bf16_gpu_arrays_are_described_by_their_librarys_probe(sim_gpu):
    """A bf16 array of a library tilegen knows is described from its adapter's probe, which names
    the dtype (its __cuda_array_interface__ typestr '|V2' does not: the call had been refused for want
    of DLPack)."""
    import ml_dtypes
    from test_fast_path_sim import SMALL

    kernel = tilegen.compile(tilegen.GemmSpec(dtype="bf16", **SMALL))
    rng = np.random.default_rng(31)
    A = rng.integers(-3, 4, (32, 48)).astype(ml_dtypes.bfloat16)
    B = rng.integers(-3, 4, (48, 40)).astype(ml_dtypes.bfloat16)
    c = sim_gpu.empty((32, 40), "float32")
    kernel.call_arrays(sim_gpu.array(A), sim_gpu.array(B), c, alpha=1.0, beta=0.0)
    assert np.array_equal(c.numpy(), A.astype(np.float32) @ B.astype(np.float32))


def test_without_a_gpu_a_long_emulation_is_refused_at_once(monkeypatch):
    """As a GEMM's: a launch the emulator would need more than EMULATOR_LIMIT_S for (its PTX's work
    outside loops, per CTA) is refused with the estimate unless device='sim' asks for it."""
    import time

    from tilegen import errors, runtime

    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    monkeypatch.setattr(errors, "_said", set())
    X = np.ones((16, 8), np.float32)
    t0 = time.perf_counter()
    with pytest.warns(tilegen.EmulatorWarning), \
            pytest.raises(tilegen.LaunchError, match=r"no GPU found, and scale_grid over 1000000 CTAs would take at "
                                                     r"least about \d+ (min|h) on the CPU emulator .* device='sim'"):
        tilegen.compile(scale_grid)(X, X.copy(), alpha=1.0, G=10 ** 6)
    assert time.perf_counter() - t0 < 5


def test_a_remembered_call_launches_through_the_current_launcher_only(sim_gpu, monkeypatch):
    """A remembered call hands its Launcher the grid and values kernel.launch packed, while that
    Launcher is the kernel's current one; once modules were unloaded (a new generation) it goes
    through kernel.launch again, which loads anew."""
    from tilegen.compiler import call as call_module

    kernel = tilegen.compile(scale_grid)
    X = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    x, y = sim_gpu.array(X), sim_gpu.empty((16, 8), "float32")
    kernel(x, y, alpha=3.0, G=1)
    through = []
    real_launch = type(kernel).launch
    monkeypatch.setattr(type(kernel), "launch", lambda self, *a, **kw: through.append(1) or real_launch(self, *a, **kw))
    kernel(x, y, alpha=3.0, G=1)
    assert not through and len(sim_gpu.launches) == 2 and np.array_equal(y.numpy(), 3 * X)
    generation = call_module.module_generation()
    monkeypatch.setattr(call_module, "module_generation", lambda: generation + 1)
    kernel(x, y, alpha=3.0, G=1)
    assert through == [1] and len(sim_gpu.launches) == 3


def test_a_broadcast_stack_is_read_for_every_matrix_and_refused_where_written(sim_gpu):
    """A stack of stride 0 (one matrix for every index, as torch's expand gives) is read as such;
    as the stack the kernel writes it is refused (every matrix would land in one place)."""
    X, bias, s = _stack_inputs(seed=12, count=3, M=16, N=8)
    x0 = sim_gpu.array(X[0])
    broadcast = type(x0)(sim_gpu, x0.ptr, X.shape, (0, X.shape[2], 1), x0.dtype)
    y = sim_gpu.empty((3, 8, 16), "float32")
    y_logical = type(y)(sim_gpu, y.ptr, X.shape, (8 * 16, 1, 16), y.dtype)
    kernel = tilegen.compile(scaled_stack)
    scalar = sim_gpu.array(np.array([s], np.float32))
    kernel(broadcast, y_logical, sim_gpu.array(bias), scalar)
    want = _stack_want(np.broadcast_to(X[:1], X.shape), bias, s)
    assert np.abs(np.swapaxes(y.numpy(), 1, 2) - want).max() <= 4 * 2.0 ** -24 * np.abs(want).max()
    y_broadcast = type(y)(sim_gpu, y.ptr, X.shape, (0, 1, 16), y.dtype)
    _refusal(lambda: kernel(sim_gpu.array(X), y_broadcast, sim_gpu.array(bias), scalar),
             r"Y holds the same matrix \(stride 0, a broadcast view\), but the kernel writes it")
