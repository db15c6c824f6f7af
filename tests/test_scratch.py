"""The per-stream scratch (runtime.StreamScratch): kept per stream, said when many streams hold
one, and freed by tilegen.free_scratch (the GPU part: marker `gpu`)."""
import warnings

import numpy as np
import pytest

import tilegen
from tilegen import runtime
from gpu_util import requires_gpu


@pytest.fixture
def scratch_table(monkeypatch):
    """StreamScratch's table and warning as a fresh process would have them."""
    monkeypatch.setattr(runtime.StreamScratch, "_of", {})
    monkeypatch.setattr(runtime.StreamScratch, "_warned", False)
    monkeypatch.setattr(runtime.HostCallBuffers, "_free", {})
    return runtime.StreamScratch._of


def test_many_streams_with_scratch_are_said_once(scratch_table, monkeypatch):
    """A scratch per stream is never freed on its own: past MANY_STREAMS streams a warning says so
    and names free_scratch, once (no allocation here: a scratch allocates on first use)."""
    monkeypatch.setattr(runtime.StreamScratch, "MANY_STREAMS", 3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for handle in range(1000, 1003):
            runtime.StreamScratch.of(0, handle)
        assert not seen
        runtime.StreamScratch.of(0, 1000)           # (a stream seen before: no new scratch)
        assert not seen
        for handle in range(1003, 1010):
            runtime.StreamScratch.of(0, handle)
    assert len(seen) == 1 and issubclass(seen[0].category, RuntimeWarning)
    assert "4 streams" in str(seen[0].message) and "tilegen.free_scratch()" in str(seen[0].message)
    assert len(scratch_table) == 10


def test_free_scratch_with_nothing_kept_is_a_no_op(scratch_table):
    assert tilegen.free_scratch() == 0


class _FakeBuffer:
    """A DeviceBuffer's bookkeeping without a GPU."""
    made = []

    def __init__(self, nbytes, device=0):
        import os
        self.nbytes, self.device, self._dptr, self._pid = nbytes, device, object(), os.getpid()
        _FakeBuffer.made.append(self)

    def close(self):
        self._dptr = None


def test_numpy_calls_keep_their_device_buffers(scratch_table, monkeypatch):
    """HostCallBuffers: a buffer given back is taken again by a call of a size that rounds to it (powers
    of two from 256 bytes), per device; past KEEP_BYTES kept, or over MAX_BYTES, buffers are freed, not
    kept; free_scratch frees what is kept and says how many bytes."""
    from tilegen.runtime import memory

    monkeypatch.setattr(memory, "DeviceBuffer", _FakeBuffer)
    monkeypatch.setattr(_FakeBuffer, "made", [])
    pool = runtime.HostCallBuffers
    a = pool.take(1000, 0)
    assert a.nbytes == 1024 and pool.take(1, 0).nbytes == 256
    pool.give(a)
    assert pool.take(900, 1).nbytes == 1024 and pool.take(900, 1) is not a    # (another device's)
    assert pool.take(513, 0) is a and a._dptr is not None
    big = pool.take(pool.MAX_BYTES + 1, 0)
    assert big.nbytes == pool.MAX_BYTES + 1
    pool.give(big)
    assert big._dptr is None                                                   # freed, not kept
    kept = [pool.take(pool.MAX_BYTES, 0) for _ in range(pool.KEEP_BYTES // pool.MAX_BYTES + 1)]
    for b in kept:
        pool.give(b)
    assert [b._dptr is None for b in kept] == [False] * (len(kept) - 1) + [True]
    pool.give(a)
    assert a._dptr is None                                                     # (the device's share is full)
    assert tilegen.free_scratch() == pool.KEEP_BYTES and all(b._dptr is None for b in kept)
    assert tilegen.free_scratch() == 0


@pytest.mark.gpu
@requires_gpu
def test_free_scratch_frees_and_calls_go_on(scratch_table):
    """Calls whose launches use the stream's scratch (tf32 with A column-major: the operands' K-major
    copies; a split-K stack on Hopper): free_scratch frees it all (after the device's work), the
    remembered launches that named it are forgotten, and the same calls again allocate anew and come
    out right."""
    torch = pytest.importorskip("torch")
    hopper = torch.cuda.get_device_capability() == (9, 0)
    if not hopper:
        pytest.skip("tf32's K-major copy and split stacks are Hopper's")
    X = torch.randn(2048, 2048, device="cuda").t()      # column-major: copied K-major first
    Y = torch.randn(2048, 2048, device="cuda")
    Z = torch.empty(2048, 2048, device="cuda")
    A = torch.randn(8, 16, 16384, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(8, 16384, 128, device="cuda", dtype=torch.bfloat16)
    C = torch.empty(8, 16, 128, device="cuda", dtype=torch.bfloat16)
    assert tilegen.matmul.explain(X, Y, allow_tf32=True).spec.prepared_operands
    assert tilegen.matmul.explain(A, B, out=C).spec.split_k > 1

    def calls():
        for out in (Z, C):
            out.fill_(float("nan"))
        for _ in range(2):   # (the second call replays the remembered launches)
            tilegen.matmul(X, Y, out=Z, allow_tf32=True)
            tilegen.matmul(A, B, out=C)
        torch.cuda.synchronize()
        for (a, b, c, k, u) in ((X, Y, Z, 2048, 2.0 ** -10), (A, B, C, 16384, 2.0 ** -8)):
            ref = a.double() @ b.double()
            err = float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))
            assert err <= 4 * u + k * 2.0 ** -24, err

    calls()
    held = sum(s.nbytes for s in scratch_table.values())
    assert held >= 2048 * 2048 * 4      # (a K-major copy at least)
    assert tilegen.free_scratch() == held and not scratch_table
    calls()                             # nothing remembered names the freed memory
    assert scratch_table and tilegen.free_scratch() > 0


@pytest.mark.gpu
@requires_gpu
def test_numpy_calls_reuse_device_buffers_and_stay_right(scratch_table):
    """Calls on numpy arrays through kept device buffers: a later call of other sizes and values, C
    read (beta) from a reused buffer, comes out right; the buffers stay kept until free_scratch."""
    from bounds import gemm_bound

    rng = np.random.default_rng(7)
    for M, N, K in ((300, 200, 100), (250, 190, 90), (300, 200, 100), (64, 64, 2000)):
        A = rng.standard_normal((M, K)).astype(np.float16)
        B = rng.standard_normal((K, N)).astype(np.float16)
        C0 = rng.standard_normal((M, N)).astype(np.float16)
        out = C0.copy()
        tilegen.matmul(A, B, alpha=0.5, beta=2.0, out=out)
        ref = 0.5 * (A.astype(np.float64) @ B.astype(np.float64)) + 2.0 * C0.astype(np.float64)
        scale = 0.5 * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))) + 2.0 * np.abs(C0)
        assert (np.abs(out.astype(np.float64) - ref) <= gemm_bound("f16", K, "f16") * scale + 1e-3).all(), (M, N, K)
    assert runtime.HostCallBuffers._free and tilegen.free_scratch() > 0 and not runtime.HostCallBuffers._free
