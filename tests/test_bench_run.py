"""tilegen bench without a GPU: the timing loop with fake events, a GEMM row with fake and
emulated kernels (argument packing, rotation, the correctness gate), the rotation and error
bounds, and the "no GPU" exit."""
import contextlib

import numpy as np
import pytest

import tilegen
from tilegen.bench import cli, gemm, timing
from tilegen.bench.backends import Unsupported


class FakeClock:
    def __init__(self):
        self.now = 0.0


class FakeEvent:
    t = None


class FakeEvents:
    """EventPool with a fake GPU clock: a call advances it by the call's duration."""

    def __init__(self, clock):
        self.clock = clock
        self.stream = None
        self.recorded = 0

    def get(self, n):
        return [FakeEvent() for _ in range(n)]

    def record(self, e):
        e.t = self.clock.now
        self.recorded += 1

    def elapsed(self, a, b):
        return b.t - a.t


def test_time_calls_rotates_sets_and_takes_the_median():
    clock = FakeClock()
    used = []
    durations = {0: 1.0, 1: 1.0, 2: 5.0}   # set 2 is slow: the median ignores it

    def call(i):
        used.append(i)
        clock.now += durations[i]

    opts = timing.TimingOptions(warmup=4, reps=30)
    t = timing.time_calls(call, 3, FakeEvents(clock), opts)
    assert t.reps == 30 and t.ms == 1.0 and t.ms_max == 5.0 and t.ms_min == 1.0
    assert used[:6] == [0, 1, 2, 0, 1, 2]                      # rotation across every call
    assert len(used) == 5 + 4 + 30                             # estimate, warm-up, timed


def test_back_to_back_pairs_alternate_and_time_each_call():
    """tilegen.matmul as called against its kernel: batches alternate, and a call that gets
    slower over time (heat, clock drift) slows both alike."""
    clock = FakeClock()
    order = []

    def make(name, ms):
        def call(i):
            order.append(name)
            clock.now += ms * (1 + clock.now * 1e-4)   # slower as the run goes on
        return call

    a, b = timing.time_pair_back_to_back(make("a", 1.0), make("b", 2.0), 3, FakeEvents(clock),
                                         timing.TimingOptions(warmup=2, reps=6), batch=4)
    assert a.reps == b.reps == 6
    assert b.ms / a.ms == pytest.approx(2.0, rel=0.02)
    timed = order[-48:]
    assert timed == (["a"] * 4 + ["b"] * 4) * 6


def test_time_calls_counts_follow_the_time_budget():
    clock = FakeClock()

    def call(i):
        clock.now += 2.0   # 2 ms per call

    n = []
    t = timing.time_calls(lambda i: (n.append(i), call(i)), 2, FakeEvents(clock),
                          timing.TimingOptions(warmup_ms=10, rep_ms=100))
    assert t.reps == 50 and len(n) == 5 + 5 + 50
    opts = timing.TimingOptions(rep_ms=1, min_reps=10)
    assert opts.rep_count(2.0) == 10 and opts.rep_count(1e-6) == 1000


def test_delay_runs_before_each_batch():
    clock = FakeClock()
    spins = []

    def spin(units):
        spins.append(units)
        clock.now += units * 1e-3

    delay = timing.Delay(spin, "fake")
    delay.calibrate(FakeEvents(clock), units=1000)
    assert delay.ms_per_unit == pytest.approx(1e-3)
    spins.clear()
    timing.time_calls(lambda i: None, 2, FakeEvents(clock), timing.TimingOptions(warmup=0, reps=200), delay)
    assert len(spins) >= 2 and all(s >= 1 for s in spins)
    assert max(spins) * 1e-3 <= timing.MAX_DELAY_MS + 1e-9


def test_summaries():
    t = timing.summarize([3.0, 1.0, 2.0, 10.0])
    assert t.ms == 2.5 and t.as_dict() == {"ms": 2.5, "ms_min": 1.0, "ms_max": 10.0, "reps": 4}
    with pytest.raises(ValueError):
        timing.summarize([])


@pytest.mark.parametrize("set_mb, sets", [(512, 2), (32, 8), (1, 64), (100, 3)])
def test_rotation_spans_l2_several_times(set_mb, sets):
    assert gemm.rotation_sets(set_mb << 20, 60 << 20) == sets


def test_error_bounds_order():
    f16, bf16_out, tf32 = gemm.error_bound("f16", "f32", 4096), gemm.error_bound("f16", "bf16", 4096), \
        gemm.error_bound("tf32", "f32", 4096)
    assert f16 < 5e-4 < tf32 < 5e-3 and f16 < bf16_out
    assert gemm.error_bound("f16", "f32", 8192) > f16


def test_round_tf32_keeps_10_mantissa_bits():
    x = np.array([1.0 + 2 ** -10, 1.0 + 2 ** -11 + 2 ** -12, 1.0 + 2 ** -12], dtype=np.float32)
    assert list(gemm.round_tf32(x)) == [1.0 + 2 ** -10, 1.0 + 2 ** -10, 1.0]


# ---- a GEMM row on fake arrays (numpy) ------------------------------------------------------

class NumpyBackend:
    """A backend whose 'device' arrays are numpy arrays, addressed by a fake pointer."""
    name = "fake"
    cublas_name = "numpy matmul"
    stream = None

    def __init__(self, clock, cublas_ms=1.0, reference=True):
        self.clock, self.cublas_ms = clock, cublas_ms
        self.arrays = {}
        self.rng = np.random.default_rng(0)
        self.released = 0
        if not reference:
            self.reference = None

    def _keep(self, x):
        self.arrays[id(x) * 64] = x
        return x

    def random(self, rows, cols, dtype):
        dt = np.float32 if dtype == "tf32" else np.float16
        return self._keep(self.rng.standard_normal((rows, cols)).astype(dt))

    def empty(self, rows, cols, dtype):
        return self._keep(np.empty((rows, cols), dtype=np.float16 if dtype == "f16" else np.float32))

    def ptr(self, x):
        return id(x) * 64

    def t(self, x):
        return x.T

    def fill_nan(self, x):
        x.fill(np.nan)

    def synchronize(self):
        pass

    def tf32(self, enabled):
        return contextlib.nullcontext()

    def cublas(self, dtype, A, B, C):
        def run(A=A, B=B, C=C):
            C[...] = A.astype(np.float32) @ B.astype(np.float32)
            self.clock.now += self.cublas_ms
        return run

    def cublas_out_dtype(self, dtype):
        return "f32" if dtype == "tf32" else dtype

    def reference(self, A, B):
        return A.astype(np.float64) @ B.astype(np.float64)

    def rel_err(self, C, ref):
        return float(np.linalg.norm(C - ref) / np.linalg.norm(ref))

    def to_host(self, x):
        return np.asarray(x, dtype=np.float64)

    def release(self):
        self.released += 1


class NumpyKernel:
    """Stands for a tilegen Kernel: reads its operands through the launch arguments exactly as
    the GPU kernel would (pointer + leading dimension + layout)."""

    def __init__(self, spec, backend, clock, ms=2.0, broken=False):
        self.spec, self.backend, self.clock, self.ms, self.broken = spec, backend, clock, ms, broken
        self.name = "fake_gemm"
        self.launches = []

    def launch(self, args, sizes, stream=None):
        arrays = self.backend.arrays
        m, n, k = args["M"], args["N"], args["K"]
        assert sizes == {"M": m, "N": n, "K": k} and args["alpha"] == 1.0 and args["beta"] == 0.0
        a, b, c = arrays[args["A_ptr"]], arrays[args["B_ptr"]], arrays[args["C_ptr"]]
        assert args["A_ld"] == a.shape[1] and args["B_ld"] == b.shape[1] and args["C_ld"] == n == c.shape[1]
        A = a if self.spec.a_layout == "row" else a.T
        B = b if self.spec.b_layout == "row" else b.T
        assert A.shape == (m, k) and B.shape == (k, n)
        c[...] = A.astype(np.float32) @ B.astype(np.float32)
        if self.broken:
            c[-1, -1] += 1e3
        self.launches.append(args["C_ptr"])
        self.clock.now += self.ms


class FakeTriton:
    VERSION = "fake"

    def __init__(self, clock):
        self.clock = clock

    def matmul(self, a, b, c, f32=False):   # (f32 rows: three tf32 products, triton_mm.matmul's f32=True)
        c[...] = a.astype(np.float32) @ b.astype(np.float32)
        self.clock.now += 4.0

    def best_config(self, a, b):
        return "64x64x32"


def _bench(clock, backend, triton=None, l2_bytes=1 << 20):
    # tilegen.matmul as called needs a GPU: the front-door columns are measured on the H200
    return gemm.GemmBench(backend, FakeEvents(clock), timing.TimingOptions(warmup=1, reps=5), None,
                          l2_bytes=l2_bytes, triton=triton, front_door=False)


@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
def test_gemm_row_on_fake_arrays(a_layout, b_layout):
    clock = FakeClock()
    be = NumpyBackend(clock)
    be.name = "torch"  # lets the Triton stand-in run
    spec = tilegen.GemmSpec(dtype="f16", a_layout=a_layout, b_layout=b_layout, target="sm_90")
    kern = NumpyKernel(spec, be, clock)
    row = _bench(clock, be, FakeTriton(clock), l2_bytes=40000).run(kern, 96, 80, 64, peak={"f16": 1e-3})
    assert row["check"] == "ok" and row["rel_err"] < row["err_bound"]
    assert row["layout"] == a_layout[0] + b_layout[0] and row["sets"] == 4
    assert row["tilegen_ms"] == 2.0 and row["cublas_ms"] == 1.0 and row["triton_ms"] == 4.0
    assert row["vs_cublas"] == pytest.approx(0.5) and row["vs_triton"] == pytest.approx(2.0)
    assert row["pct_peak"] == pytest.approx(100 * row["tilegen_tflops"] / 1e-3)
    assert row["triton_config"] == "64x64x32" and row["errors"] == {}
    assert len(set(kern.launches)) == row["sets"]   # every buffer set was used
    assert be.released == 1


def test_wrong_kernel_is_flagged_and_not_timed():
    clock = FakeClock()
    be = NumpyBackend(clock)
    spec = tilegen.GemmSpec(dtype="f16", target="sm_90")
    kern = NumpyKernel(spec, be, clock, broken=True)
    logs = []
    bench = _bench(clock, be)
    bench.log = logs.append
    row = bench.run(kern, 64, 64, 64)
    assert row["check"] == "WRONG" and "tilegen_ms" not in row
    assert row.get("tilegen_tflops") is None and row["vs_cublas"] is None
    assert len(kern.launches) == 1                  # the check only
    assert row["cublas_ms"] == 1.0                  # the baselines still run
    assert any("WRONG result" in m for m in logs)


def test_kernel_that_leaves_c_unwritten_is_wrong():
    clock = FakeClock()
    be = NumpyBackend(clock)

    class Lazy(NumpyKernel):
        def launch(self, args, sizes, stream=None):
            self.clock.now += 1.0

    row = _bench(clock, be).run(Lazy(tilegen.GemmSpec(dtype="f16"), be, clock), 64, 64, 64)
    assert row["check"] == "WRONG" and row["rel_err"] != row["rel_err"]  # NaN


def test_failing_baselines_are_reported_not_fatal():
    clock = FakeClock()
    be = NumpyBackend(clock)

    def no_cublas(*a):
        raise Unsupported("CuPy has no bfloat16 GEMM")

    be.cublas = no_cublas
    row = _bench(clock, be).run(NumpyKernel(tilegen.GemmSpec(dtype="f16"), be, clock), 64, 64, 64)
    assert row["check"] == "ok" and row["tilegen_ms"] == 2.0
    assert row["errors"]["cublas"] == "Unsupported: CuPy has no bfloat16 GEMM"
    assert "cublas_ms" not in row and row["cublas_tflops"] is None


def test_host_check_without_a_gpu_reference():
    clock = FakeClock()
    be = NumpyBackend(clock, reference=False)
    spec = tilegen.GemmSpec(dtype="tf32", a_layout="col", b_layout="col", target="sm_90")
    row = _bench(clock, be).run(NumpyKernel(spec, be, clock), 300, 64, 48)
    assert row["check"] == "ok" and "numpy float64 on 128 random rows" in row["check_ref"]


# ---- a GEMM row with the real tilegen kernel on the CPU emulator ---------------------------

class SimArray:
    def __init__(self, mem, rows, cols, dtype):
        self.mem, self.rows, self.cols, self.dtype = mem, rows, cols, np.dtype(dtype)
        self.shape = (rows, cols)   # (what tilegen.matmul.explain reads; row-major)
        self.ptr = mem.alloc(rows * cols * self.dtype.itemsize)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                                         "strides": None, "version": 3}


class SimBackend:
    """Arrays in the emulator's global memory; no cuBLAS; results checked on the host."""
    name = "sim"
    cublas_name = None
    stream = None
    reference = None

    def __init__(self):
        from tilegen.sim.memory import GlobalMemory

        self.mem = GlobalMemory()
        self.rng = np.random.default_rng(0)

    def _np(self, dtype):
        from tilegen.arch.dtypes import numpy_dtype

        return numpy_dtype("f32" if dtype == "tf32" else dtype)

    def random(self, rows, cols, dtype):
        x = SimArray(self.mem, rows, cols, self._np(dtype))
        self.mem.write(x.ptr, self.rng.standard_normal((rows, cols)).astype(np.float32).astype(x.dtype))
        return x

    def empty(self, rows, cols, dtype):
        return SimArray(self.mem, rows, cols, self._np(dtype))

    def ptr(self, x):
        return x.ptr

    def t(self, x):
        raise Unsupported("no views")

    def fill_nan(self, x):
        self.mem.write(x.ptr, np.full(x.rows * x.cols * x.dtype.itemsize, 0xFF, np.uint8))

    def synchronize(self):
        pass

    def tf32(self, enabled):
        return contextlib.nullcontext()

    def to_host(self, x):
        raw = self.mem.read(x.ptr, x.rows * x.cols * x.dtype.itemsize)
        return raw.view(x.dtype).reshape(x.rows, x.cols).astype(np.float64)

    def release(self):
        pass


class SimKernel:
    """The real compiled kernel, run on the emulator for the check, then only 'timed'."""

    def __init__(self, kernel, mem, clock):
        self.kernel, self.mem, self.clock = kernel, mem, clock
        self.spec, self.name = kernel.spec, kernel.name
        self.runs = 0

    def launch(self, args, sizes, stream=None):
        if self.runs == 0:
            from tilegen.sim.runner import run_kernel

            run_kernel(self.kernel, args, sizes, self.mem)
        self.runs += 1
        self.clock.now += 1.0


@pytest.mark.parametrize("dtype, a_layout, b_layout", [("f16", "row", "col"), ("bf16", "col", "row"),
                                                       ("tf32", "col", "col")])
def test_gemm_row_with_the_real_kernel_on_the_emulator(dtype, a_layout, b_layout):
    pytest.importorskip("tilegen.sim.runner")
    clock = FakeClock()
    be = SimBackend()
    spec = tilegen.GemmSpec(dtype=dtype, a_layout=a_layout, b_layout=b_layout, target="sm_90")
    kern = SimKernel(tilegen.compile(spec), be.mem, clock)
    bench = gemm.GemmBench(be, FakeEvents(clock), timing.TimingOptions(warmup=0, reps=2), None, l2_bytes=1 << 10)
    row = bench.run(kern, 128, 128, 64)
    assert row["check"] == "ok", row
    assert row["rel_err"] < row["err_bound"] and row["tilegen_ms"] == 1.0
    assert "cublas_ms" not in row and row["errors"] == {}


# ---- no GPU -------------------------------------------------------------------------------

def test_no_gpu_says_so_and_exits_2(monkeypatch, capsys):
    from tilegen import runtime

    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "no GPU found" in err and "--load" in err
    assert cli.main(["--peak", "--no-gemm"]) == 2
    assert cli.main(["--compile-speed", "--dtype", "f16"]) == 2


def test_no_gpu_on_this_machine_in_a_subprocess():
    import subprocess
    import sys

    from tilegen.runtime import gpu_available

    if gpu_available():
        pytest.skip("this machine has a GPU")
    p = subprocess.run([sys.executable, "-m", "tilegen.bench", "--dtype", "f16", "--sizes", "256"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no GPU found" in p.stderr


# ---- the whole command, with the GPU parts stood in for ---------------------------------------

@pytest.fixture
def stand_ins(monkeypatch):
    """The GPU, its driver, torch and tilegen.compile replaced by numpy stand-ins."""
    from tilegen import runtime
    from tilegen.bench import backends, compile_speed, peak
    from tilegen.bench import env as benv
    from tilegen.runtime.driver import DeviceInfo

    clock = FakeClock()
    be = NumpyBackend(clock)
    compiled = []

    def fake_compile(spec):
        compiled.append(spec)
        return NumpyKernel(spec, be, clock)

    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(runtime, "ensure_context", lambda device=0: None)
    monkeypatch.setattr(runtime, "device_info", lambda device=0: DeviceInfo("NVIDIA H200", (9, 0), 132, 232448, "13.0"))
    monkeypatch.setattr(benv, "environment", lambda device=0: {"gpu": "NVIDIA H200", "driver": "580", "versions": {}})
    monkeypatch.setattr(benv, "l2_bytes", lambda device=0: 1 << 16)
    monkeypatch.setattr(backends, "pick_backend", lambda name="auto": be)
    monkeypatch.setattr(cli, "tg_compile", fake_compile)
    monkeypatch.setattr(timing, "EventPool", lambda stream=None: FakeEvents(clock))
    monkeypatch.setattr(timing, "make_delay", lambda *a: None)
    monkeypatch.setattr(peak, "run_peak", lambda dtypes, sms, target, events, log=None: {
        dt: {"tflops": 500.0, "reference": 600.0, "config": "cfg", "configs": []} for dt in dtypes})
    monkeypatch.setattr(compile_speed, "measure", lambda specs, log=None: {
        "specs": [{"spec": f"{s.dtype} rr", "compile_ms": 1.0} for s in specs]})
    return compiled


def test_full_run_orchestration_with_stand_ins(stand_ins, monkeypatch, tmp_path, capsys):
    import json

    compiled = stand_ins
    path = tmp_path / "run.json"
    argv = ["--dtype", "f16", "tf32", "--layout", "rr", "cc", "--sizes", "64", "96x80x64", "--spec", "stages=4",
            "--reps", "3", "--warmup", "1", "--peak", "--compile-speed", "--save", str(path), "--markdown"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "| dtype | A/B |" in out and "mma.sync peak" in out and "compile speed" in out

    data = json.loads(path.read_text())
    assert data["format"] == "tilegen-bench/1" and data["gpu"] == "NVIDIA H200"
    assert [(r["dtype"], r["layout"], r["m"], r["n"], r["k"]) for r in data["rows"]] == [
        ("f16", "rr", 64, 64, 64), ("f16", "rr", 96, 80, 64), ("f16", "cc", 64, 64, 64), ("f16", "cc", 96, 80, 64),
        ("tf32", "rr", 64, 64, 64), ("tf32", "rr", 96, 80, 64), ("tf32", "cc", 64, 64, 64),
        ("tf32", "cc", 96, 80, 64)]
    assert all(r["check"] == "ok" and r["tilegen_ms"] == 2.0 and r["cublas_ms"] == 1.0 for r in data["rows"])
    assert all(r["pct_peak"] == pytest.approx(100 * r["tilegen_tflops"] / 500.0) for r in data["rows"])
    assert data["peak_source"] == "the measured mma.sync peak"
    assert data["settings"]["spec_overrides"] == {"stages": 4} and data["settings"]["target"] == "sm_90"
    assert data["gemm"]["backend"] == "fake" and data["compile_speed"]["specs"][0]["spec"] == "f16 rr"
    assert len(compiled) == 4 and all(s.stages == 4 and s.target == "sm_90" for s in compiled)  # one per spec

    # the saved run is a baseline for the next one
    assert cli.main(argv[:-3] + ["--compare", str(path), "--fail-on-regression", "--quiet"]) == 0
    clock_slow = NumpyKernel.launch

    def slower(self, args, sizes, stream=None):
        clock_slow(self, args, sizes, stream)
        self.clock.now += 1.0

    monkeypatch.setattr(NumpyKernel, "launch", slower)
    assert cli.main(argv[:-3] + ["--compare", str(path), "--fail-on-regression", "--quiet"]) == 1


def test_bad_override_for_one_dtype_stops_before_measuring(monkeypatch, capsys):
    from tilegen import runtime
    from tilegen.runtime.driver import DeviceInfo

    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(runtime, "ensure_context", lambda device=0: None)
    monkeypatch.setattr(runtime, "device_info", lambda device=0: DeviceInfo("NVIDIA H200", (9, 0), 132, 232448, "13.0"))
    # 32 f16 elements are 64-byte rows: too narrow for the 128B swizzle (fine for tf32)
    assert cli.main(["--spec", "tile=128,256,32", "warps=2,4", "swizzle=128B"]) == 2
    err = capsys.readouterr().err
    assert "--spec for f16 rr: swizzle='128B' is invalid" in err


def test_a_row_that_raises_is_reported_and_the_run_goes_on(stand_ins, monkeypatch, tmp_path, capsys):
    import json

    launch = NumpyKernel.launch

    def oom_for_96(self, args, sizes, stream=None):
        if args["M"] == 96:
            raise MemoryError("CUDA out of memory")
        launch(self, args, sizes, stream)

    monkeypatch.setattr(NumpyKernel, "launch", oom_for_96)
    path = tmp_path / "partial.json"
    assert cli.main(["--dtype", "f16", "--sizes", "64", "96x80x64", "128", "--reps", "2", "--warmup", "0",
                     "--save", str(path)]) == 1
    rows = json.loads(path.read_text())["rows"]
    assert [r["check"] for r in rows] == ["ok", "error", "ok"]
    assert "MemoryError: CUDA out of memory" in rows[1]["errors"]["tilegen"]
    assert "FAILED: tilegen gave a wrong result or an error: f16 rr 96x80x64" in capsys.readouterr().out


def test_results_are_saved_after_every_row(stand_ins, monkeypatch, tmp_path):
    import json

    path = tmp_path / "progress.json"
    seen = []
    launch = NumpyKernel.launch

    def watch(self, args, sizes, stream=None):
        if path.exists():
            seen.append(len(json.loads(path.read_text())["rows"]))
        launch(self, args, sizes, stream)

    monkeypatch.setattr(NumpyKernel, "launch", watch)
    assert cli.main(["--dtype", "bf16", "--sizes", "64", "80", "--reps", "2", "--warmup", "0", "--save", str(path),
                     "--no-cublas"]) == 0
    assert seen and seen[-1] == 1          # while the second row ran, the first was on disk
    assert len(json.loads(path.read_text())["rows"]) == 2


def test_pick_backend_says_why_none_works(monkeypatch):
    from tilegen import runtime
    from tilegen.bench import backends

    if runtime.gpu_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match=r"no array backend works: .*cuda-python: DeviceError"):
        backends.pick_backend("cuda-python")


def test_host_costs_name_the_dtypes_they_take():
    pytest.importorskip("torch")
    from tilegen.bench.host import host_costs

    with pytest.raises(ValueError, match="host costs are measured for f16, bf16, tf32, f32, e4m3 and e5m2, not 'f64'"):
        host_costs("f64")


def test_rows_time_the_kernel_matmul_picks_unless_a_spec_is_given():
    """With kernel_for (tilegen bench without --spec) a row times tilegen.matmul's choice for
    its arrays; the kernel given to run() only names the dtype and the layouts."""
    pytest.importorskip("tilegen.sim.runner")
    from tilegen.gemm import matmul

    clock = FakeClock()
    be = SimBackend()
    given = tilegen.GemmSpec(dtype="f16", out_dtype="f16", tile=(128, 128, 32), target="sm_80")
    built = []

    def kernel_for(spec):
        built.append(spec)
        return SimKernel(tilegen.compile(spec), be.mem, clock)

    bench = gemm.GemmBench(be, FakeEvents(clock), timing.TimingOptions(warmup=0, reps=2), None, l2_bytes=1 << 10,
                           kernel_for=kernel_for)
    row = bench.run(SimKernel(tilegen.compile(given), be.mem, clock), 64, 96, 64)
    want = matmul.explain(np.zeros((64, 64), np.float16), np.zeros((64, 96), np.float16)).spec
    assert built == [want] and want != given and row["spec"] == gemm.spec_text(want)
    assert row["check"] == "ok" and row["kernel_choice"] == "tilegen.matmul's", row
    plain = gemm.GemmBench(be, FakeEvents(clock), timing.TimingOptions(warmup=0, reps=2), None, l2_bytes=1 << 10)
    assert plain.run(SimKernel(tilegen.compile(given), be.mem, clock), 64, 96, 64)["spec"] == gemm.spec_text(given)
