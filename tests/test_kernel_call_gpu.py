"""A DSL kernel called on arrays on the GPU (compiler/call.py): torch tensors in place on torch's
current stream (a side stream too, and inside a CUDA graph capture), numpy arrays through device
buffers, CuPy arrays, stacks / vectors / scalars in memory, and a GPU array the kernel's copies cannot
read refused before any launch. The same kernels as tests/test_kernel_call.py, which runs them on the
emulator."""
import numpy as np
import pytest

import tilegen
from gpu_util import requires_gpu
from test_kernel_call import _f16, _stack_inputs, _stack_want, one_tile, scaled_stack

pytestmark = [pytest.mark.gpu, requires_gpu]
torch = pytest.importorskip("torch")


def _want(A, B):
    return A.astype(np.float32) @ B.astype(np.float32)


def test_torch_tensors_in_place_on_the_current_stream():
    rng = np.random.default_rng(31)
    kernel = tilegen.compile(one_tile)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    a, b = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
    c = torch.full((16, 16), float("nan"), device="cuda")
    kernel(a, b, c)
    torch.cuda.synchronize()
    assert np.array_equal(c.cpu().numpy(), _want(A, B))
    side = torch.cuda.Stream()
    for round_ in range(3):   # new contents each round, on a side stream: ordered with torch's own work there
        with torch.cuda.stream(side):
            A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
            a.copy_(torch.from_numpy(A).cuda(non_blocking=True))
            b.copy_(torch.from_numpy(B).cuda(non_blocking=True))
            c.fill_(float("nan"))
            kernel(a, b, c)
            got = c.cpu()
        assert np.array_equal(got.numpy(), _want(A, B)), round_


def test_a_capture_replays_with_new_contents():
    rng = np.random.default_rng(32)
    kernel = tilegen.compile(one_tile)
    a = torch.empty(16, 32, dtype=torch.float16, device="cuda")
    b = torch.empty(32, 16, dtype=torch.float16, device="cuda")
    c = torch.empty(16, 16, device="cuda")
    kernel(a, b, c)   # (loaded before the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(a, b, c)
    for _ in range(3):
        A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
        a.copy_(torch.from_numpy(A))
        b.copy_(torch.from_numpy(B))
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert np.array_equal(c.cpu().numpy(), _want(A, B))


@pytest.mark.parametrize("M, K, N", [(16, 32, 16), (13, 20, 11)])
def test_numpy_arrays_through_the_gpu(M, K, N):
    """K = 20 (40-byte rows) padded for cp.async on the way in; only C copied back."""
    rng = np.random.default_rng(M + K + N)
    A, B = _f16(rng, (M, K)), _f16(rng, (K, N))
    A.flags.writeable = False
    C = np.full((M, N), np.nan, np.float32)
    tilegen.compile(one_tile)(A, B, C)
    assert np.array_equal(C, _want(A, B))


@pytest.mark.parametrize("y_layout", ["row", "col"])
def test_stacks_vectors_and_scalars(y_layout):
    X, bias, s = _stack_inputs(seed=33)
    count, M, N = X.shape
    kernel = tilegen.compile(scaled_stack, y_layout=y_layout)
    Y = np.full_like(X, np.nan)
    kernel(X, Y, bias, float(s))                        # numpy, the scalar as a number
    want = _stack_want(X, bias, s)
    assert np.abs(Y - want).max() <= 4 * 2.0 ** -24 * np.abs(want).max()
    x, vec = torch.from_numpy(X).cuda(), torch.from_numpy(bias).cuda()
    y = torch.full((count, M, N) if y_layout == "row" else (count, N, M), float("nan"), device="cuda")
    kernel(x, y if y_layout == "row" else y.transpose(1, 2), vec, torch.tensor([float(s)], dtype=torch.float32, device="cuda"))
    got = (y if y_layout == "row" else y.transpose(1, 2)).cpu().numpy()
    assert np.abs(got - want).max() <= 4 * 2.0 ** -24 * np.abs(want).max()


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(34)
    A, B = _f16(rng, (16, 32)), _f16(rng, (32, 16))
    c = cupy.full((16, 16), cupy.nan, cupy.float32)
    tilegen.compile(one_tile)(cupy.asarray(A), cupy.asarray(B), c)
    assert np.array_equal(cupy.asnumpy(c), _want(A, B))


def test_rows_cp_async_cannot_read_are_refused_before_a_launch():
    kernel = tilegen.compile(one_tile)
    a = torch.zeros(16, 20, dtype=torch.float16, device="cuda")
    b = torch.zeros(20, 16, dtype=torch.float16, device="cuda")
    with pytest.raises(tilegen.LaunchError, match=r"A's leading dimension is 20 elements \(40 bytes\)"):
        kernel(a, b, torch.zeros(16, 16, device="cuda"))
    torch.cuda.synchronize()   # (the context is healthy: nothing was launched)
