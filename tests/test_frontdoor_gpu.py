"""The front door on the GPU (marker `gpu`): tilegen.matmul and kernel(...) on PyTorch tensors
through the fast path, inside CUDA graph capture (replayed after the inputs change), on
misaligned operands (re-pitched in stream order), on the caller's stream, and the prepared
launch's argument checks."""
import math

import numpy as np
import pytest

import tilegen
from bounds import fp8_wgmma_bound
from gpu_util import record, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]
torch = pytest.importorskip("torch")

U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _bound(dtype, K):
    return 4 * U[dtype] + K * 2.0 ** -24 + 1e-6


def _rel(C, A, B):
    ref = A.double() @ B.double()
    return float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref))


@pytest.mark.parametrize("dtype, kw", [(torch.float16, dict(tile=(64, 64, 32))),
                                       (torch.bfloat16, dict(tile=(64, 64, 32))),
                                       (torch.bfloat16, dict(instruction="wgmma", stream_k=True))])
def test_matmul_and_kernel_replay_in_a_cuda_graph(dtype, kw):
    """(stream-K: two kernels and a workspace from the stream-ordered allocator, captured)"""
    if kw.get("instruction") == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper (sm_90) GPU")
    M, N, K = 384, 320, 256
    A = torch.randn(M, K, device="cuda", dtype=dtype)
    B = torch.randn(K, N, device="cuda", dtype=dtype)
    C1 = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    C2 = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16" if dtype == torch.float16 else "bf16", **kw))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's graph docs ask
        tilegen.matmul(A, B, out=C1)
        kernel(A, B, out=C2)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilegen.matmul(A, B, out=C1)
        kernel(A, B, out=C2)
    for trial in range(3):  # the graph reads whatever A and B hold when it is replayed
        A.copy_(torch.randn(M, K, device="cuda", dtype=dtype))
        B.copy_(torch.randn(K, N, device="cuda", dtype=dtype))
        C1.fill_(float("nan"))
        C2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager1, eager2 = torch.empty_like(C1), torch.empty_like(C2)
        tilegen.matmul(A, B, out=eager1)
        kernel(A, B, out=eager2)
        torch.cuda.synchronize()
        assert torch.equal(C1, eager1) and torch.equal(C2, eager2), f"replay {trial} differs from eager"
        assert _rel(C1, A, B) <= _bound(dtype, K) and _rel(C2, A, B) <= _bound(torch.float32, K)


def test_repeated_calls_replay_graphs_of_their_own_and_read_new_contents():
    """The default launch route: one kernel called for each of three layers, round after round,
    with new contents and poisoned outputs each round; every layer's launch becomes a graph replay
    of its own, and each round's results are that round's product. A capture of the user's own
    in between takes the kernel's launches (not tilegen's graphs) and replays correctly."""
    from tilegen import runtime

    M, N, K = 192, 160, 96
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f16", tile=(64, 64, 32)))
    layers = [(torch.empty(M, K, device="cuda", dtype=torch.float16),
               torch.randn(K, N, device="cuda", dtype=torch.float16),
               torch.empty(M, N, device="cuda", dtype=torch.float16)) for _ in range(3)]

    def check(round_):
        torch.cuda.synchronize()
        for i, (A, B, C) in enumerate(layers):
            assert _rel(C, A, B) <= _bound(torch.float16, K), f"round {round_}, layer {i}"

    for round_ in range(5):
        for A, B, C in layers:
            A.copy_(torch.randn(M, K, device="cuda", dtype=torch.float16))
            C.fill_(float("nan"))
            kernel(A, B, out=C)
        check(round_)
    replay = kernel.launcher()._replay
    if runtime.launch_route() == "graph":
        assert replay is not None and sum(g.executable is not None for g in replay.graphs.values()) == 3
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            for A, B, C in layers:
                kernel(A, B, out=C)
    torch.cuda.current_stream().wait_stream(side)
    for round_ in range(2):
        for A, B, C in layers:
            A.copy_(torch.randn(M, K, device="cuda", dtype=torch.float16))
            C.fill_(float("nan"))
        graph.replay()
        check(f"user graph {round_}")
        for A, B, C in layers:
            C.fill_(float("nan"))
            kernel(A, B, out=C)
        check(f"eager after user graph {round_}")


def test_the_first_call_may_be_inside_a_capture():
    """Compiling and loading the module while a capture is open: the load runs in relaxed
    capture mode, the launch is captured."""
    M, N, K = 200, 136, 72
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(K, N, device="cuda", dtype=torch.float16)
    C = torch.empty(M, N, device="cuda", dtype=torch.float32)
    spec = tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), group_m=7)  # compiled nowhere else
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilegen.compile(spec)(A, B, out=C)
    C.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(C, A, B) <= _bound(torch.float32, K)


def test_buffers_the_garbage_collector_frees_during_a_capture_leave_it_valid():
    """tilegen buffers left in reference cycles are freed whenever Python's garbage collector
    runs, which may be inside another part of the program's graph capture (PyTorch does not
    collect before capturing by default): their finalisers' frees must not invalidate it."""
    import gc

    from tilegen import runtime

    A = torch.randn(256, 192, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(192, 320, device="cuda", dtype=torch.bfloat16)
    C = torch.empty(256, 320, device="cuda", dtype=torch.bfloat16)
    tilegen.matmul(A, B, out=C)   # (warm: nothing to load inside the capture)
    side = torch.cuda.Stream()
    gc.collect()
    gc.disable()
    try:
        for buf in (runtime.DeviceBuffer(1 << 20), runtime.StreamBuffer(1 << 20, side.cuda_stream),
                    runtime.StreamBuffer(1 << 20, 0)):
            cycle = [buf]
            cycle.append(cycle)   # (only the collector frees it)
        del buf, cycle
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            assert gc.collect() >= 3   # (the three finalisers run here, mid-capture)
            tilegen.matmul(A, B, out=C)
    finally:
        gc.enable()
    C.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(C, A, B) <= _bound(torch.bfloat16, 192)


@pytest.mark.parametrize("shape", [(4095, 4095, 4095), (4097, 4096, 4095), (1000, 999, 37)])
def test_misaligned_operands_in_stream_order(shape):
    """Rows whose pitch is not a multiple of 16 bytes go through an aligned copy, enqueued on
    the caller's stream: no synchronisation, right results, also on a side stream."""
    M, N, K = shape
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        C = tilegen.matmul(A, B)
    side.synchronize()
    assert C.dtype == torch.bfloat16 and C.shape == (M, N)
    assert _rel(C, A, B) <= _bound(torch.bfloat16, K)


def test_offset_views_and_transposed_views():
    base = torch.randn(600, 520, device="cuda", dtype=torch.float16)
    A = base[1:301, 3:259]           # misaligned base address and odd offset
    B = torch.randn(300, 256, device="cuda", dtype=torch.float16).T   # column-major 256 x 300
    C = tilegen.matmul(A, B)
    torch.cuda.synchronize()
    assert _rel(C, A, B) <= _bound(torch.float16, 256)


def test_fast_path_refuses_what_it_cannot_take_with_the_general_message():
    A = torch.randn(64, 32, device="cuda", dtype=torch.float16)
    B = torch.randn(32, 48, device="cuda", dtype=torch.float16)
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32)))
    with pytest.raises(tilegen.LaunchError, match="out has shape"):
        k(A, B, out=torch.empty(64, 40, device="cuda", dtype=torch.float32))
    with pytest.raises(tilegen.LaunchError, match="dtype"):
        k(A, B, out=torch.empty(64, 48, device="cuda", dtype=torch.float16))
    with pytest.raises(tilegen.LaunchError, match="inner dimensions"):
        k(A, torch.randn(31, 48, device="cuda", dtype=torch.float16))
    with pytest.raises(tilegen.LaunchError, match=r"alpha=1e\+39 is beyond float32's range"):
        k(A, B, alpha=1e39)
    C = k(A, B, alpha=0.5)
    torch.cuda.synchronize()
    ref = 0.5 * (A.double() @ B.double())
    assert float((C.double() - ref).abs().max()) <= 1e-2


@pytest.mark.parametrize("kw", [dict(tile=(64, 64, 32)), dict(instruction="wgmma"),
                                dict(instruction="wgmma", split_k=2, persistent=False),      # two launches
                                dict(dtype="tf32", instruction="wgmma", pretranspose=True),  # B copied K-major first
                                dict(dtype="f32", instruction="wgmma")])                     # tf32 parts first
def test_repeated_calls_follow_every_change(kw):
    """The fast path's repeat records (the same arrays launch the arguments they gave last
    time, every launch of the call: first kernels, the GEMM, split-K's sum; a launcher does not
    repack values it holds): every change of pointer, scalar or stream between calls shows in
    the result, checked call by call against float64. A call whose launches use a stream's
    scratch is remembered with that stream."""
    if kw.get("instruction") == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper (sm_90) GPU")
    kw = {"dtype": "bf16", **kw}
    kw.setdefault("out_dtype", "bf16" if kw["dtype"] == "bf16" else "f32")
    k = tilegen.compile(tilegen.GemmSpec(**kw))
    dt = torch.bfloat16 if kw["dtype"] == "bf16" else torch.float32
    M, N, K = 256, 384, 192
    A, A2 = (torch.randn(M, K, device="cuda", dtype=dt) for _ in range(2))
    B = torch.randn(K, N, device="cuda", dtype=dt)
    out = torch.bfloat16 if kw["out_dtype"] == "bf16" else torch.float32
    C, C2 = (torch.empty(M, N, device="cuda", dtype=out) for _ in range(2))
    side = torch.cuda.Stream()
    bound = 2 * _bound(torch.bfloat16, K)   # (bf16 out, or tf32 products: 10-bit mantissas either way)

    def check(C, A, alpha):
        torch.cuda.synchronize()
        ref = alpha * (A.double() @ B.double())
        assert float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref)) <= bound

    for A_, C_, alpha in ((A, C, 1.0), (A, C, 1.0), (A2, C, 1.0), (A2, C2, 1.0), (A2, C2, 2.0), (A2, C2, 2.0),
                          (A, C, 1.0), (A, C, -0.5)):
        C_.fill_(float("nan"))
        k(A_, B, out=C_, alpha=alpha)
        check(C_, A_, alpha)
    signs = []
    for alpha in (0.0, -0.0, 0.0):   # C = alpha * A @ B: zeros whose signs follow alpha's (IEEE, as numpy)
        C.fill_(float("nan"))
        k(A, B, out=C, alpha=alpha)
        torch.cuda.synchronize()
        assert bool((C == 0).all())
        signs.append(torch.signbit(C))
    assert bool((signs[1] == ~signs[0]).all()) and bool((signs[2] == signs[0]).all())
    A.copy_(torch.randn_like(A))   # new contents, same pointer: launched again as it was
    C.fill_(float("nan"))
    k(A, B, out=C, alpha=-0.5)
    check(C, A, -0.5)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # the same call on a busy stream: launched there, after the fill
        torch.cuda._sleep(50_000_000)
        C.fill_(float("nan"))
        k(A, B, out=C, alpha=-0.5)
    check(C, A, -0.5)
    if k.spec.split_k > 1 or k.spec.prepared_operands:   # (remembered with the side stream's scratch)
        assert k.fast_call._last[5] == side.cuda_stream


def test_prepared_launch_checks_its_arguments():
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32)))
    A = torch.randn(64, 32, device="cuda", dtype=torch.float16)
    B = torch.randn(32, 64, device="cuda", dtype=torch.float16)
    C = torch.empty(64, 64, device="cuda", dtype=torch.float32)
    args = {"M": 64, "N": 64, "K": 32, "A_ptr": A.data_ptr(), "A_ld": 32, "B_ptr": B.data_ptr(), "B_ld": 64,
            "C_ptr": C.data_ptr(), "C_ld": 64, "alpha": 1.0, "beta": 0.0}
    with pytest.raises(tilegen.LaunchError, match="missing arguments beta"):
        k.launch({n: v for n, v in args.items() if n != "beta"}, {"M": 64, "N": 64})
    with pytest.raises(tilegen.LaunchError, match="out of range"):
        k.launch(dict(args, M=-1), {"M": 64, "N": 64})
    with pytest.raises(tilegen.LaunchError, match="not a device pointer"):
        k.launch(dict(args, A_ptr="x"), {"M": 64, "N": 64})
    k.launch(args, {"M": 64, "N": 64}, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert _rel(C, A, B) <= _bound(torch.float32, 32)


def test_relaunch_repeats_the_packed_launch():
    """The host benchmark's driver floor (Launcher.relaunch) launches what the last launch
    packed: C poisoned after a launch is written again."""
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32)))
    launcher = k.launcher()
    if launcher.route not in ("ex", "graph"):
        pytest.skip("relaunch repeats the cuLaunchKernelEx routes' buffer")
    A = torch.randn(64, 32, device="cuda", dtype=torch.float16)
    B = torch.randn(32, 64, device="cuda", dtype=torch.float16)
    C = torch.empty(64, 64, device="cuda", dtype=torch.float32)
    args = {"M": 64, "N": 64, "K": 32, "A_ptr": A.data_ptr(), "A_ld": 32, "B_ptr": B.data_ptr(), "B_ld": 64,
            "C_ptr": C.data_ptr(), "C_ld": 64, "alpha": 1.0, "beta": 0.0}
    k.launch(args, {"M": 64, "N": 64}, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    C.fill_(float("nan"))
    launcher.relaunch()
    torch.cuda.synchronize()
    assert _rel(C, A, B) <= _bound(torch.float32, 32)


@pytest.mark.parametrize("dtype", ["bf16", "tf32", "e4m3"])
def test_host_costs_are_measured(dtype):
    """The benchmark that reports the host times runs for every dtype `tilegen bench` takes
    (numbers are in the records, not here)."""
    from tilegen.bench.host import DSL, LAYERS, OWN, format_host, host_costs

    res = host_costs(dtype, size=256, calls=20, reps=3)
    rows = ("torch.matmul", "driver call", "kernel.launch", "kernel(A, B, out=C)", "tilegen.matmul", LAYERS, OWN)
    for name in rows + ((DSL,) if dtype != "e4m3" else ()):
        assert math.isfinite(res[name]["us"]) and res[name]["us"] > 0
    record(f"host_costs_smoke_{dtype}", **{k: v for k, v in res.items() if isinstance(v, dict)})
    assert "tilegen.matmul" in format_host(res)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_an_empty_inner_dimension(dtype):
    """K = 0 at a size where matmul would take the TMA kernel: C is the epilogue of zeros."""
    M, N = 4096, 2048
    A = torch.empty(M, 0, device="cuda", dtype=dtype)
    B = torch.empty(N, 0, device="cuda", dtype=dtype).t() if dtype == torch.float8_e4m3fn else \
        torch.empty(0, N, device="cuda", dtype=dtype)
    bias = torch.randn(N, device="cuda").bfloat16()
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    tilegen.matmul(A, B, bias=bias, activation="relu", out=C)
    torch.cuda.synchronize()
    assert torch.equal(C, torch.relu(bias)[None, :].expand(M, N))


class _Interface:
    """A GPU array known only by its __cuda_array_interface__ (the general call path)."""

    def __init__(self, t):
        self.__cuda_array_interface__ = t.__cuda_array_interface__
        self.shape = tuple(t.shape)


def _tf32_error(A, B):
    """err(C): C's normwise error as a tf32 product of A and B, against float64 (A and B read when called)."""
    def err(C):
        ref = A.double() @ B.double()
        return float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(A.double().abs() @ B.double().abs()))
    return err


def _called_again_after_a_change(A, B, changed, err, bound):
    """tilegen.matmul(A, B, out=C) (tf32), then again after `changed` (A or B) is scaled in place: within
    the bound both times (the second call reads the new contents). C."""
    C = torch.full((A.shape[0], B.shape[1]), float("nan"), device="cuda")
    tilegen.matmul(A, B, out=C, allow_tf32=True)
    assert err(C) <= bound
    changed.mul_(-2.0)
    tilegen.matmul(A, B, out=C, allow_tf32=True)
    assert err(C) <= bound
    return C


def _replayed_with_a_new_b(A, B, err, bound):
    """tilegen.matmul(A, B, out=G) (tf32) captured in a CUDA graph after a first call on a side stream
    (as torch's graph docs ask), B's contents changed in place, the graph replayed: G within the bound."""
    G = torch.full((A.shape[0], B.shape[1]), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tilegen.matmul(A, B, out=G, allow_tf32=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilegen.matmul(A, B, out=G, allow_tf32=True)
    B.copy_(torch.randn_like(B))
    G.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert err(G) <= bound
    return G


def test_tf32_with_both_operands_column_major_through_matmul_and_a_graph():
    """tilegen.matmul on Hopper takes A and B column-major for tf32 with A's k-steps through
    registers (no copy, direct stores) where that kernel loads without spills: within the bound,
    re-read after an in-place change, and replayed from a CUDA graph."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper (sm_90) GPU")
    from bounds import gemm_bound

    M, N, K = 2051, 2053, 304
    A = torch.randn(K, M + 1, device="cuda")[:, :M].t()   # column-major, columns 2052 floats apart (16-byte pitched)
    B = torch.randn(N, K, device="cuda").t()
    spec = tilegen.matmul.explain(A, B, allow_tf32=True).spec
    assert (spec.register_operand, spec.prepared_operands, spec.store) == ("A", (), "direct"), spec
    bound = gemm_bound("tf32", K, truncated=True)

    err = _tf32_error(A, B)
    _called_again_after_a_change(A, B, A, err, bound)
    _replayed_with_a_new_b(A, B, err, bound)


@pytest.mark.parametrize("copied, a_col", [(True, False), (False, False), (False, True)])
def test_tf32_with_a_row_major_b_through_matmul_kernel_and_a_graph(copied, a_col, monkeypatch):
    """tilegen.matmul on Hopper takes a row-major B for tf32 into registers in the GEMM itself (C^T
    = B^T A^T), or, where that kernel would spill (copied: loads_without_spills planted False), K-major
    through a first kernel's copy: each call reads B again (a B changed in place changes C), any
    pitch of B is taken (the copy reads single elements; the register kernel's TMA gets a
    re-pitched copy through matmul, and a direct call says how to pass it), and a captured graph
    replays the call."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper (sm_90) GPU")
    import importlib

    from bounds import gemm_bound
    from tilegen.gemm.matmul import PRETRANSPOSE_MIN

    mm = importlib.import_module("tilegen.gemm.matmul")
    for memo in ("_chosen", "_exact"):   # (choices of this test's own, forgotten after it)
        monkeypatch.setattr(mm, memo, {})
    if copied:
        monkeypatch.setattr(mm, "loads_without_spills", lambda spec: False)
    M, N, K = PRETRANSPOSE_MIN + 3, 2051, 304   # (a large product: the Hopper preset; A's rows 16-byte pitched)
    # (a_col: A column-major, copied K-major first, B through registers: pretranspose="A")
    A = torch.randn(K, M, device="cuda").t() if a_col else torch.randn(M, K, device="cuda")
    B = torch.randn(K, N + 3, device="cuda")[:, :N]     # rows of 2054 floats: not 16-byte pitched
    spec = tilegen.matmul.explain(A, B, allow_tf32=True).spec
    assert spec.pretranspose == ("A" if a_col else copied) and (spec.register_operand == "B") != copied, spec
    bound = gemm_bound("tf32", K, truncated=True)
    pitch = {} if copied else {"repitch": True}

    err = _tf32_error(A, B)
    C = _called_again_after_a_change(A, B, B, err, bound)   # same arrays, new contents: read (copied) again
    kernel = tilegen.compile(tilegen.matmul.explain(A, B, allow_tf32=True).spec)
    if not copied:
        with pytest.raises(tilegen.LaunchError, match="B's leading dimension is 2054 elements"):
            kernel(A, B, out=C)
    C.fill_(float("nan"))
    kernel(A, B, out=C, alpha=0.5, **pitch)
    assert err(2 * C) <= bound
    C.fill_(float("nan"))
    kernel(A, _Interface(B), out=C, **pitch)           # the general path (no fast path for this array type)
    assert err(C) <= bound
    G = _replayed_with_a_new_b(A, B, err, bound)
    record("pretranspose_matmul", shape=[M, N, K], error_over_bound=err(G) / bound)


def test_f32_as_tf32_parts_is_as_accurate_as_cublas_f32():
    """The promotion keeps the tf32 parts' product at f32 accuracy: its error against float64 is no
    worse than cuBLAS f32's (TF32 off) on the same data; without promotion it was 37x worse (run 114)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper (sm_90) GPU")
    gen = torch.Generator(device="cuda").manual_seed(21)
    A = torch.randn(2048, 4096, device="cuda", generator=gen)
    B = torch.randn(4096, 2048, device="cuda", generator=gen)
    assert tilegen.matmul.explain(A, B).spec.splits_operands
    ref = A.double() @ B.double()
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        cublas = float(torch.linalg.norm(torch.matmul(A, B).double() - ref) / torch.linalg.norm(ref))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    ours = float(torch.linalg.norm(tilegen.matmul(A, B).double() - ref) / torch.linalg.norm(ref))
    record("f32_parts_error", tilegen=ours, cublas_f32=cublas)
    assert ours <= cublas, (ours, cublas)


def test_stacks_of_matrices_as_torch_matmul_takes_them():
    """Activations (batch, tokens, features) @ W.T fold into one product on views (out written in
    place, the fast path's launch captured in a graph); a stack of B, a permuted A and fp8 tokens
    with a scale each run one product per matrix or fold, each against torch's float64 product."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    x = torch.randn(4, 96, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    W = torch.randn(320, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    bias = torch.randn(320, device="cuda", dtype=torch.bfloat16, generator=gen)

    def rel(C, ref):
        return float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref))

    ref = x.double() @ W.T.double() + bias.double()
    out = torch.full((4, 96, 320), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert tilegen.matmul(x, W.T, bias=bias, out=out) is out
    C = tilegen.matmul(x, W.T, bias=bias)
    torch.cuda.synchronize()
    assert C.shape == (4, 96, 320) and rel(out, ref) <= _bound(torch.bfloat16, 256) and rel(C, ref) <= _bound(torch.bfloat16, 256)
    assert "one 384 x 320 x 256 product" in tilegen.matmul.explain(x, W.T, bias=bias).reason
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilegen.matmul(x, W.T, bias=bias, out=out)
    x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=gen))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, x.double() @ W.T.double() + bias.double()) <= _bound(torch.bfloat16, 256)

    A = torch.randn(3, 2, 64, 128, device="cuda", dtype=torch.float16, generator=gen)
    B = torch.randn(2, 128, 80, device="cuda", dtype=torch.float16, generator=gen)
    C = tilegen.matmul(A, B)
    Ap = A.permute(1, 0, 2, 3)                       # (2, 3, 64, 128): its matrices apart in memory
    Cp = tilegen.matmul(Ap, W.T[:128, :80].to(torch.float16))
    torch.cuda.synchronize()
    assert C.shape == (3, 2, 64, 80) and rel(C, A.double() @ B.double()) <= _bound(torch.float16, 128)
    assert rel(Cp, Ap.double() @ W.T[:128, :80].double()) <= _bound(torch.float16, 128)
    assert "A's matrices do not lie" in tilegen.matmul.explain(Ap, W.T[:128, :80].to(torch.float16)).reason

    if torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "float8_e4m3fn"):
        x8 = torch.randn(2, 64, 128, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        W8 = torch.randn(96, 128, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        sa = torch.rand(2, 64, 1, device="cuda", generator=gen) + 0.5
        C8 = tilegen.matmul(x8, W8.T, scale_a=sa, out_dtype=torch.float32)
        torch.cuda.synchronize()
        scale = torch.linalg.norm((x8.double().abs() @ W8.T.double().abs()) * sa.double())
        err = float(torch.linalg.norm(C8.double() - (x8.double() @ W8.T.double()) * sa.double()) / scale)
        assert C8.shape == (2, 64, 96) and err <= fp8_wgmma_bound(128, "f32", 128), err


@pytest.mark.parametrize("shape", [(256, 256), (4, 64, 256)])
def test_calls_without_out_get_a_new_result_each_time(shape):
    """Without out= the fast path launches into a new array each call (its launch record reused
    with the new pointer): earlier results stay as they were."""
    gen = torch.Generator(device="cuda").manual_seed(41)
    W = torch.randn(256, 192, device="cuda", dtype=torch.bfloat16, generator=gen)
    xs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)]
    results = [tilegen.matmul(x, W) for x in xs for _ in range(2)]
    torch.cuda.synchronize()
    assert len({id(c) for c in results}) == len(results)
    for i, C in enumerate(results):
        x = xs[i // 2]
        assert C.shape == (*shape[:-1], 192) and _rel(C.reshape(-1, 192), x.reshape(-1, 256), W) <= _bound(torch.bfloat16, 256)


def test_a_stack_of_products_runs_as_one_batched_launch(monkeypatch):
    """torch stacks (attention-like, a broadcast A, column-major matrices, bias + residual, inside a
    CUDA graph) through one batched launch each, against torch's float64 products; a stack whose
    rows are not 16-byte aligned runs matrix by matrix instead, just as correctly."""
    import tilegen.gemm.batch as batch

    gen = torch.Generator(device="cuda").manual_seed(51)
    dt = torch.bfloat16

    def rel(C, ref):
        return float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref))

    q = torch.randn(2, 8, 128, 64, device="cuda", dtype=dt, generator=gen)     # (batch, heads, tokens, dim)
    k = torch.randn(2, 8, 128, 64, device="cuda", dtype=dt, generator=gen)
    W = torch.randn(64, 96, device="cuda", dtype=dt, generator=gen)
    Bs = torch.randn(5, 96, 64, device="cuda", dtype=dt, generator=gen).transpose(1, 2)   # (5, 64, 96) col-major
    bias = torch.randn(96, device="cuda", dtype=dt, generator=gen)
    res = torch.randn(5, 77, 96, device="cuda", dtype=dt, generator=gen)
    A1 = torch.randn(77, 64, device="cuda", dtype=dt, generator=gen)
    calls = []
    monkeypatch.setattr(batch, "run", lambda *a, **kw: calls.append(1) or pytest.fail("ran matrix by matrix"))
    bound = _bound(dt, 64)
    S = tilegen.matmul(q, k.transpose(-1, -2))
    torch.cuda.synchronize()
    assert S.shape == (2, 8, 128, 128) and rel(S, q.double() @ k.double().transpose(-1, -2)) <= bound
    assert "batched kernel" in tilegen.matmul.explain(q, k.transpose(-1, -2)).reason
    import importlib
    mm = importlib.import_module("tilegen.gemm.matmul")
    with monkeypatch.context() as m:   # the second call: straight from the probes, on new data
        m.setattr(mm, "_stacked", lambda *a, **kw: pytest.fail("the general path ran again"))
        q2 = torch.randn(q.shape, device="cuda", dtype=dt, generator=gen)
        S2 = tilegen.matmul(q2, k.transpose(-1, -2))
        torch.cuda.synchronize()
    assert rel(S2, q2.double() @ k.double().transpose(-1, -2)) <= bound
    Y = tilegen.matmul(A1, Bs, bias=bias, residual=res)
    graph, out = torch.cuda.CUDAGraph(), torch.full((2, 8, 128, 128), float("nan"), device="cuda", dtype=dt)
    tilegen.matmul(q, k.transpose(-1, -2), out=out)   # (warm: the kernel is compiled and loaded)
    with torch.cuda.graph(graph):
        tilegen.matmul(q, k.transpose(-1, -2), out=out)
    q.copy_(torch.randn(q.shape, device="cuda", dtype=dt, generator=gen))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, q.double() @ k.double().transpose(-1, -2)) <= bound
    assert rel(Y, A1.double() @ Bs.double() + bias.double() + res.double()) <= bound
    monkeypatch.undo()
    odd = torch.randn(3, 40, 37, device="cuda", dtype=torch.float16, generator=gen)   # 74-byte rows
    odd_b = torch.randn(3, 37, 24, device="cuda", dtype=torch.float16, generator=gen)
    C = tilegen.matmul(odd, odd_b)
    torch.cuda.synchronize()
    assert rel(C, odd.double() @ odd_b.double()) <= _bound(torch.float16, 37)


def test_stacks_refuse_what_numpy_would_and_split_long_batches(monkeypatch):
    """A bias of batch * M values is a 2-D call's row bias but not a stack's (also after the 2-D
    call was remembered); a stack longer than a launch's grid (GRID_Y, made 2) runs in pieces."""
    import tilegen.gemm.call as call

    gen = torch.Generator(device="cuda").manual_seed(61)
    x = torch.randn(3, 16, 64, device="cuda", dtype=torch.float16, generator=gen)
    W = torch.randn(64, 40, device="cuda", dtype=torch.float16, generator=gen)
    rows = torch.randn(48, device="cuda", dtype=torch.float16, generator=gen)
    tilegen.matmul(x.reshape(48, 64), W, bias=rows)   # a bias per row of the 2-D product (48 rows)
    with pytest.raises(tilegen.LaunchError):
        tilegen.matmul(x, W, bias=rows)               # 48 values: not a stack's bias (N = 40)
    monkeypatch.setattr(call, "GRID_Y", 2)
    A = torch.randn(5, 40, 64, device="cuda", dtype=torch.float16, generator=gen)
    B = torch.randn(5, 64, 24, device="cuda", dtype=torch.float16, generator=gen)
    C = tilegen.matmul(A, B)
    torch.cuda.synchronize()
    ref = A.double() @ B.double()
    assert float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref)) <= _bound(torch.float16, 64)


def test_a_stack_run_matrix_by_matrix_from_the_probes(monkeypatch):
    """A stack whose products run one by one (here every stack: no batched spec taken) launches
    them from the stack's probes after its first call: new data, with and without out=, each
    product against torch's float64 one."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_batched_spec", lambda *a: None)
    monkeypatch.setattr(mm, "_stacks", {})
    gen = torch.Generator(device="cuda").manual_seed(71)
    A = torch.randn(3, 256, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    B = torch.randn(3, 128, 192, device="cuda", dtype=torch.bfloat16, generator=gen)
    assert not tilegen.matmul.explain(A, B).spec.batched
    tilegen.matmul(A, B)                                     # the general path chooses
    out = torch.full((3, 256, 192), float("nan"), device="cuda", dtype=torch.bfloat16)
    tilegen.matmul(A, B, out=out)
    with monkeypatch.context() as m:
        m.setattr(mm, "_stacked", lambda *a, **kw: pytest.fail("the general path ran again"))
        A.copy_(torch.randn(A.shape, device="cuda", dtype=A.dtype, generator=gen))
        C = tilegen.matmul(A, B)
        out.fill_(float("nan"))
        assert tilegen.matmul(A, B, out=out) is out
        torch.cuda.synchronize()
    ref = A.double() @ B.double()
    for got in (C, out):
        assert got.shape == (3, 256, 192)
        assert float(torch.linalg.norm(got.double() - ref) / torch.linalg.norm(ref)) <= _bound(torch.bfloat16, 128)


def test_a_stack_whose_matrices_lie_apart_runs_on_the_tma_kernel():
    """A's matrices with gaps between them (a slice of a taller stack) on the warp-specialized
    kernel (template.TmaStack: a 3-D map takes any 16-byte stride), twice (the second call from
    the probes); an empty stack."""
    gen = torch.Generator(device="cuda").manual_seed(81)
    A = torch.randn(3, 256, 64, device="cuda", dtype=torch.bfloat16, generator=gen)[:, :128]
    B = torch.randn(3, 64, 192, device="cuda", dtype=torch.bfloat16, generator=gen)
    assert tilegen.matmul.explain(A, B).spec.persistent
    for _ in range(2):
        C = tilegen.matmul(A, B)
        torch.cuda.synchronize()
        ref = A.double() @ B.double()
        assert float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref)) <= _bound(torch.bfloat16, 64)
    empty = tilegen.matmul(A[:0], B[:0])
    assert empty.shape == (0, 128, 192)


@pytest.mark.parametrize("count, M, N, K, nb", [(6, 77, 200, 70, 6), (3, 130, 130, 64, 3), (5, 300, 96, 129, 1),
                                                (2, 1000, 1000, 1000, 2), (64, 77, 77, 64, 64), (4, 100, 136, 37, 4),
                                                (32, 1, 4096, 128, 32), (32, 16, 128, 4096, 32),
                                                (8, 100, 72, 9000, 1)])
def test_ragged_stacks_run_on_the_tma_stack_kernel(count, M, N, K, nb):
    """Stacks whose M, N and K are not multiples of any tile, B broadcast or not, on the
    warp-specialized kernel through 3-D tensor maps (template.TmaStack): beta = 0 with a NaN-
    poisoned out (the TMA-store epilogue writes each block into its own matrix only), and with
    bias + GELU(tanh) + residual, against float64. Rows of 77 or 37 elements (not 16-byte
    pitched) go through aligned copies, out's back into it after the launch."""
    gen = torch.Generator(device="cuda").manual_seed(count * 1000 + M)
    dt = torch.bfloat16
    A = torch.randn(count, M, K, device="cuda", dtype=dt, generator=gen)
    B = torch.randn(nb, K, N, device="cuda", dtype=dt, generator=gen)
    if nb == 1:
        B = B.expand(count, K, N)
    choice = tilegen.matmul.explain(A, B)
    assert choice.spec.batched and choice.spec.persistent and "3-D tensor map" in choice.reason, choice
    ref = A.double() @ B.double()
    for _ in range(2):   # (the second call from the probes)
        out = torch.full((count, M, N), float("nan"), device="cuda", dtype=dt)
        assert tilegen.matmul(A, B, out=out) is out
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)) <= _bound(dt, K)
    bias = torch.randn(N, device="cuda", dtype=dt, generator=gen)
    res = torch.randn(count, M, N, device="cuda", dtype=dt, generator=gen)
    Y = tilegen.matmul(A, B, bias=bias, activation="gelu_tanh", residual=res)
    torch.cuda.synchronize()
    want = torch.nn.functional.gelu(ref + bias.double(), approximate="tanh") + res.double()
    assert float(torch.linalg.norm(Y.double() - want) / torch.linalg.norm(want)) <= 2 * _bound(dt, K)


def test_split_k_stacks_replay_in_a_cuda_graph():
    """A long-context decode-like stack (8 x (16 x 16384 @ 16384 x 128)) on Hopper splits K (one
    launch; the workspace and arrival counters of the stream's scratch, runtime.StreamScratch):
    captured in a CUDA graph, replayed on new contents, equal to the eager call and to float64."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TMA stack kernel needs a Hopper (sm_90) GPU")
    dt = torch.bfloat16
    A = torch.randn(8, 16, 16384, device="cuda", dtype=dt)
    B = torch.randn(8, 16384, 128, device="cuda", dtype=dt)
    C = torch.full((8, 16, 128), float("nan"), device="cuda", dtype=dt)
    assert tilegen.matmul.explain(A, B, out=C).spec.split_k > 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tilegen.matmul(A, B, out=C)   # (side's scratch made here, eagerly)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        tilegen.matmul(A, B, out=C)
    # a larger split stack on the same stream outgrows the scratch the graph points to: kept allocated,
    # and zero between launches, so the replays below still find it
    big = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", instruction="wgmma", batched=True,
                                           copy="tma", tile=(64, 64, 64), warps=(4, 1), stages=8, split_k=3))
    A2 = torch.randn(20, 200, 1000, device="cuda", dtype=dt)
    B2 = torch.randn(20, 1000, 300, device="cuda", dtype=dt)
    with torch.cuda.stream(side):
        C2 = big(A2, B2)
    torch.cuda.synchronize()
    ref2 = A2.double() @ B2.double()
    assert float(torch.linalg.norm(C2.double() - ref2) / torch.linalg.norm(ref2)) <= _bound(dt, 1000)
    for trial in range(3):
        A.copy_(torch.randn_like(A))
        B.copy_(torch.randn_like(B))
        C.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = tilegen.matmul(A, B)
        torch.cuda.synchronize()
        assert torch.equal(C, eager), f"replay {trial} differs from eager"
        ref = A.double() @ B.double()
        assert float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref)) <= _bound(dt, 16384)
        with torch.cuda.stream(side):   # (between replays, the larger stack on the graph's stream)
            C2 = big(A2, B2)
        torch.cuda.synchronize()
        assert float(torch.linalg.norm(C2.double() - ref2) / torch.linalg.norm(ref2)) <= _bound(dt, 1000)
    # numpy stacks through the same kernel: its prepared launch (GemmKernel.launch) on the default stream
    An, Bn = A2[:3, :, :520].float().cpu().numpy(), B2[:3, :520].float().cpu().numpy()
    import ml_dtypes
    Cn = big(An.astype(ml_dtypes.bfloat16), Bn.astype(ml_dtypes.bfloat16))
    refn = An.astype(np.float64) @ Bn.astype(np.float64)
    assert np.linalg.norm(Cn.astype(np.float64) - refn) / np.linalg.norm(refn) <= _bound(dt, 520)
    D = torch.empty_like(C)
    for alpha in (1.0, 1.0, -0.5):   # eager calls on the same arrays (the second and third remembered, then not)
        A.copy_(torch.randn_like(A))
        D.fill_(float("nan"))
        tilegen.matmul(A, B, out=D, alpha=alpha)
        torch.cuda.synchronize()
        ref = alpha * (A.double() @ B.double())
        assert float(torch.linalg.norm(D.double() - ref) / torch.linalg.norm(ref)) <= _bound(dt, 16384)


def test_graphs_captured_on_one_stream_replay_at_once():
    """Two graphs captured on torch's one capture stream, each a split-K stack (arrival counters)
    and an f32 product (tf32 parts first) five times: their workspaces and counters are each
    graph's own, not the capture stream's scratch, so the two replayed at once on two streams
    both come out right, trial after trial, on new contents."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TMA stack kernel needs a Hopper (sm_90) GPU")
    dt = torch.bfloat16
    sets = [(torch.randn(8, 16, 16384, device="cuda", dtype=dt), torch.randn(8, 16384, 128, device="cuda", dtype=dt),
             torch.empty(8, 16, 128, device="cuda", dtype=dt), torch.randn(1024, 1024, device="cuda"),
             torch.randn(1024, 1024, device="cuda"), torch.empty(1024, 1024, device="cuda")) for _ in range(2)]
    A, B, _, X, Y, _ = sets[0]
    assert tilegen.matmul.explain(A, B).spec.split_k > 1 and tilegen.matmul.explain(X, Y).spec.splits_operands
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # (warm-up: eager calls, the side stream's scratch)
        for A, B, C, X, Y, Z in sets:
            tilegen.matmul(A, B, out=C)
            tilegen.matmul(X, Y, out=Z)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for A, B, C, X, Y, Z in sets:
        graphs.append(torch.cuda.CUDAGraph())
        with torch.cuda.graph(graphs[-1]):
            for _ in range(5):
                tilegen.matmul(A, B, out=C)
                tilegen.matmul(X, Y, out=Z)
    streams = [torch.cuda.Stream() for _ in graphs]
    for trial in range(3):
        for A, B, C, X, Y, Z in sets:
            A.copy_(torch.randn_like(A))
            X.copy_(torch.randn_like(X))
            C.fill_(float("nan"))
            Z.fill_(float("nan"))
        torch.cuda.synchronize()
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                graph.replay()
        torch.cuda.synchronize()
        for A, B, C, X, Y, Z in sets:
            assert _rel(C, A, B) <= _bound(dt, 16384), trial
            assert _rel(Z, X, Y) <= 1e-5, trial   # (f32 from tf32 parts: f32's accuracy)


@pytest.mark.parametrize("M, persistent", [(300, True), (16, True), (16, False)])
def test_a_stack_called_again_on_the_same_arrays(M, persistent):
    """The batched call's remembered launch (BatchedCall._last), on the TMA stack kernel (through
    tilegen.matmul) and on the cp.async one (a grid row per matrix, called as a kernel): the same
    arrays again read their new contents; another alpha, another B and an out made by the call are
    launches of their own."""
    gen = torch.Generator(device="cuda").manual_seed(91)
    dt = torch.bfloat16
    A = torch.randn(8, M, 128, device="cuda", dtype=dt, generator=gen)
    B = torch.randn(8, 128, 200, device="cuda", dtype=dt, generator=gen)
    out = torch.full((8, M, 200), float("nan"), device="cuda", dtype=dt)
    if persistent:
        spec = tilegen.matmul.explain(A, B, out=out).spec
        assert spec.batched and spec.persistent, spec
        matmul = tilegen.matmul
    else:
        matmul = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="bf16", batched=True, tile=(64, 64, 32)))
        assert not matmul.spec.persistent

    def check(C, scale=1.0, b=None):
        torch.cuda.synchronize()
        ref = scale * (A.double() @ (B if b is None else b).double())
        assert float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref)) <= _bound(dt, 128)

    for _ in range(2):
        assert matmul(A, B, out=out) is out
        check(out)
        A.copy_(torch.randn(A.shape, device="cuda", dtype=dt, generator=gen))
    matmul(A, B, out=out)
    check(out)
    matmul(A, B, out=out, alpha=0.5)
    check(out, 0.5)
    B2 = torch.randn(B.shape, device="cuda", dtype=dt, generator=gen)
    matmul(A, B2, out=out)
    check(out, b=B2)
    check(matmul(A, B))


def _replay_with_scales(graph, sa, sb, out, within, values=((0.25, 4.0), (3.0, 0.5))):
    """Replay a captured scaled call with the scale tensors set to new values (out poisoned
    first); within(a, b) says whether out is right for scales a and b."""
    for a, b in values:
        sa.fill_(a)
        sb.fill_(b)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert within(a, b), (a, b)


@pytest.mark.parametrize("M, N, K", [(512, 384, 256), (4096, 4096, 1024)])
def test_scaled_mm_scales_are_used_where_they_are(M, N, K):
    """torch._scaled_mm's scales as it takes them: per-tensor 0-d f32 GPU tensors are read by the
    kernel (no read-back), so the call is capturable and each replay multiplies by the scales'
    values at that time; row-wise scales as M x 1 and 1 x N tensors. Each result within the fp8
    bound of the float64 product of the same inputs."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs an sm_89 or newer GPU")
    gen = torch.Generator(device="cuda").manual_seed(7)
    A = torch.randn(M, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    B = torch.randn(N, K, device="cuda", generator=gen).to(torch.float8_e4m3fn).t()
    prod, scale = A.double() @ B.double(), torch.linalg.norm(A.double().abs() @ B.double().abs())
    bound = fp8_wgmma_bound(K, "bf16", 128)

    def err(C, want, factor):
        return float(torch.linalg.norm(C.double() - want) / (scale * factor))

    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(4.0, device="cuda")
    epi = tilegen.matmul.explain(A, B, scale_a=sa, scale_b=sb).spec.epilogue
    assert epi.device_scale_a and epi.device_scale_b
    C = tilegen.matmul(A, B, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    assert C.dtype == torch.bfloat16 and err(C, 2.0 * prod, 2.0) <= bound
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=out)   # (warm: nothing to load inside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=out, alpha=-1.0)
    _replay_with_scales(graph, sa, sb, out, lambda a, b: err(out, -a * b * prod, a * b) <= bound)
    ra = torch.rand(M, 1, device="cuda", generator=gen) + 0.5
    rb = torch.rand(1, N, device="cuda", generator=gen) + 0.5
    C2 = tilegen.matmul(A, B, scale_a=ra, scale_b=rb)
    want = prod * ra.double() * rb.double()
    torch.cuda.synchronize()
    assert err(C2, want, 2.25) <= bound
    C3 = tilegen.matmul(A, B, scale_a=ra, scale_b=sb)   # a vector for A, a GPU scalar for B
    torch.cuda.synchronize()
    assert err(C3, prod * ra.double() * sb.double(), 1.5 * 0.5) <= 2 * bound
    k = tilegen.compile(tilegen.matmul.explain(A, B, scale_a=ra, scale_b=rb).spec)
    for _ in range(2):   # (remembered) ... then a number where the kernel reads a vector: the clear refusal
        k(A, B, scale_a=ra.reshape(-1), scale_b=rb.reshape(-1), out=out)
    with pytest.raises(tilegen.LaunchError, match="scale_b"):
        k(A, B, scale_a=ra.reshape(-1), scale_b=2.0, out=out)
    # the same arrays again, then other scale vectors into the same out: the remembered launch names
    # the scales it was made with, so the second call must not replay it
    for r in (ra, ra.flip(0).contiguous() * 2, ra):
        out.fill_(float("nan"))
        tilegen.matmul(A, B, scale_a=r, scale_b=rb, out=out)
        torch.cuda.synchronize()
        assert err(out, prod * r.double() * rb.double(), 4.5) <= bound


def _fp8_256x384x512(seed):
    """(A, B, out, A @ B in float64, || |A| @ |B| ||, the error bound) of a 256x384x512 e4m3 product, B
    column-major, out bf16 (skips below sm_89)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs an sm_89 or newer GPU")
    M, N, K = 256, 384, 512
    gen = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(M, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    B = torch.randn(N, K, device="cuda", generator=gen).to(torch.float8_e4m3fn).t()
    prod, scale = A.double() @ B.double(), torch.linalg.norm(A.double().abs() @ B.double().abs())
    return A, B, torch.empty(M, N, device="cuda", dtype=torch.bfloat16), prod, scale, fp8_wgmma_bound(K, "bf16", 128)


def test_out_dtype_alone_through_the_remembered_kernel(monkeypatch):
    """out_dtype= without out: each call makes a new output of that dtype, the second and later
    through the remembered kernel (no explain), as do GPU scales made anew for each call (their
    values read each time); another out_dtype for the same operands is another kernel, and an out
    that contradicts out_dtype is refused there too."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    for memo in ("_chosen", "_exact"):
        monkeypatch.setattr(mm, memo, {})
    A, B, _, prod, scale, bound = _fp8_256x384x512(23)
    def gpu_scales(a):   # (new tensors each call, as an fp8 layer's dynamic scales would be)
        return dict(scale_a=torch.tensor(a, device="cuda"), scale_b=torch.tensor([2.0], device="cuda"))

    got = {name: [tilegen.matmul(A, B, scale_a=0.5, out_dtype=dt) for _ in range(3)]
           for name, dt in (("f32", torch.float32), ("bf16", "bf16"), ("f16", np.float16))}
    tilegen.matmul(A, B, out_dtype="f32", **gpu_scales(1.0))   # (chosen and remembered)
    torch.cuda.synchronize()
    explained = []
    monkeypatch.setattr(mm, "explain", lambda *a, **k: explained.append(k) or pytest.fail("explain called"))
    again = [(0.5, tilegen.matmul(A, B, scale_a=0.5, out_dtype=torch.float32))]
    again += [(2 * a, tilegen.matmul(A, B, out_dtype="f32", **gpu_scales(a))) for a in (0.25, -3.0, 0.125)]
    torch.cuda.synchronize()
    want = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    for name, results in [*((n, [(0.5, C) for C in r]) for n, r in got.items()), ("f32", again)]:
        for factor, C in results:
            assert C.dtype == want[name] and C.shape == prod.shape
            assert float(torch.linalg.norm(C.double() - factor * prod) / (abs(factor) * scale)) <= \
                fp8_wgmma_bound(512, name, 128), (name, factor)
    assert len({C.data_ptr() for results in got.values() for C in results}) == 9 and not explained
    with pytest.raises(tilegen.LaunchError, match="out is bfloat16 but out_dtype"):
        tilegen.matmul(A, B, out=torch.empty(256, 384, device="cuda", dtype=torch.bfloat16), out_dtype="f32")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_per_tensor_scales_of_other_float_dtypes_stay_on_the_gpu(dtype):
    """A one-element GPU scale of another float dtype than float32 is converted on the GPU for
    the kernel, not read back (a read-back waits for the GPU, and inside torch.cuda.graph it
    raises): the call is capturable and each replay multiplies by the scales' values then."""
    A, B, out, prod, scale, bound = _fp8_256x384x512(seed=11)
    sa, sb = torch.tensor(0.5, device="cuda", dtype=dtype), torch.tensor([2.0], device="cuda", dtype=dtype)
    tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=out)   # (warm: nothing to load inside the capture)
    torch.cuda.synchronize()
    assert float(torch.linalg.norm(out.double() - prod) / scale) <= bound
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=out)
    _replay_with_scales(graph, sa, sb, out,
                        lambda a, b: float(torch.linalg.norm(out.double() - a * b * prod) / (scale * a * b)) <= bound)


def test_per_tensor_integer_scales_stay_on_the_gpu():
    """One-element integer GPU scales are converted to float32 on the GPU too (no read-back): the
    call is capturable and each replay multiplies by the scales' values then."""
    A, B, out, prod, scale, bound = _fp8_256x384x512(seed=12)
    sa, sb = torch.tensor(2, device="cuda", dtype=torch.int32), torch.tensor([3], device="cuda", dtype=torch.int64)
    tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=out)   # (warm: nothing to load inside the capture)
    torch.cuda.synchronize()
    assert float(torch.linalg.norm(out.double() - 6 * prod) / (6 * scale)) <= bound
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tilegen.matmul(A, B, scale_a=sa, scale_b=sb, out=out)
    _replay_with_scales(graph, sa, sb, out,
                        lambda a, b: float(torch.linalg.norm(out.double() - a * b * prod) / (abs(a * b) * scale)) <= bound,
                        values=((5, 1), (-1, 7)))


@pytest.mark.parametrize("M, N, K", [(1, 24640, 520), (16, 24640, 520), (13, 4100, 1160), (29, 2000, 900)])
def test_skinny_products_against_a_wide_w_t_run_swapped(M, N, K):
    """x @ W.T with a few rows against a wide weight on Hopper: the swapped kernel (C^T = B^T A^T,
    SKINNY_SWAPPED; narrower weights SKINNY_SWAPPED_NARROW's 128-deep k-tiles, up to 32 rows), as
    called, with a bias and GELU, equal to float64 within the bf16 bound; and again on new contents
    (the remembered launch)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the swapped kernel is Hopper's")
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    W = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16, generator=gen)
    spec = tilegen.matmul.explain(x, W.T, bias=b, activation="gelu_tanh").spec
    assert spec.swap_ab and spec.tile.k == (64 if N >= 24576 else 128), spec
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for trial in range(2):
        x.copy_(torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen))
        out.fill_(float("nan"))
        tilegen.matmul(x, W.T, bias=b, activation="gelu_tanh", out=out)
        torch.cuda.synchronize()
        want = torch.nn.functional.gelu(x.double() @ W.T.double() + b.double(), approximate="tanh")
        err = float(torch.linalg.norm(out.double() - want) / torch.linalg.norm(want))
        assert err <= 2 * _bound(torch.bfloat16, K), (trial, err)
