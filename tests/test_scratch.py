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
