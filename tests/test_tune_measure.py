"""tilegen.tune.measure.GpuMeasurer's plumbing on the CPU: the runtime, the array backend, the
timer and the kernels are numpy fakes, so operand layouts, launch arguments, the reference check
(device and host paths) and tune() end to end through GpuMeasurer are tested without a GPU."""
import io

import numpy as np
import pytest

from tilegen.bench.timing import summarize
from tilegen.runtime import DeviceInfo
from tilegen.tune import measure
from tilegen.tune import space as S
from tilegen.tune.search import KernelPool, tune


class NumpyBackend:
    name = "numpy"
    stream = None
    cublas_name = None
    reference = None  # the host path; DeviceRefBackend below has the device path

    def __init__(self, device=0):
        self.rng = np.random.default_rng(0)
        self.arrays = {}
        self.released = False

    def _keep(self, x):
        self.arrays[id(x)] = x
        return x

    def random(self, rows, cols, dtype):
        np_dt = np.float32 if dtype == "tf32" else np.float16
        return self._keep(self.rng.standard_normal((rows, cols)).astype(np_dt))

    def empty(self, rows, cols, dtype):
        return self._keep(np.empty((rows, cols), np.float32))

    def ptr(self, x):
        return id(x)

    def t(self, x):
        return x.T

    def fill_nan(self, x):
        x.fill(np.nan)

    def synchronize(self):
        pass

    def to_host(self, x):
        return np.asarray(x, dtype=np.float64)

    def release(self):
        self.released = True

    def spin(self):
        return None


class DeviceRefBackend(NumpyBackend):
    def reference(self, A, B):
        return A.astype(np.float32) @ B.astype(np.float32)

    def rel_err(self, C, ref):
        d = np.linalg.norm(C.astype(np.float64) - ref)
        return float(d / np.linalg.norm(ref))


class NumpyKernel:
    """A 'GEMM kernel' that computes C = A @ B from the launch arguments, as the GPU one would."""

    def __init__(self, spec, backend_box, wrong=False):
        self.spec = spec
        self.box = backend_box
        self.wrong = wrong
        self.launches = 0
        self.loaded = False

    def function(self, device=0):
        self.loaded = True

    def launch(self, args, sizes, stream=None, device=0):
        be = self.box[0]
        m, n, k = sizes["M"], sizes["N"], sizes["K"]
        A, B, C = be.arrays[args["A_ptr"]], be.arrays[args["B_ptr"]], be.arrays[args["C_ptr"]]
        a = A if self.spec.a_layout == "row" else A.T
        b = B if self.spec.b_layout == "row" else B.T
        assert a.shape == (m, k) and b.shape == (k, n) and C.shape == (m, n)
        assert args["A_ld"] == A.shape[1] and args["B_ld"] == B.shape[1] and args["C_ld"] == n
        C[:] = 0.0 if self.wrong else a.astype(np.float32) @ b.astype(np.float32)
        self.launches += 1


@pytest.fixture
def fake_gpu(monkeypatch):
    import tilegen.bench.backends as backends
    import tilegen.bench.env as env
    import tilegen.runtime as runtime

    box = [None]

    def pick(name="auto", device=0):
        box[0] = box[1](device) if len(box) > 1 else NumpyBackend(device)
        return box[0]

    monkeypatch.setattr(runtime, "ensure_context", lambda device=0: None)
    monkeypatch.setattr(runtime, "device_info", lambda device=0: DeviceInfo("Fake H200", (9, 0), 132, 232448, "13.0"))
    monkeypatch.setattr(backends, "pick_backend", pick)
    monkeypatch.setattr(env, "l2_bytes", lambda device=0: 1 << 20)
    monkeypatch.setattr(measure.GpuMeasurer, "_make_delay", lambda self: None)
    calls = []

    def fake_time_calls(call, n_sets, events, opts, delay=None):
        for i in range(3):
            call(i % n_sets)
        calls.append(opts)
        return summarize([1.0, 1.0, 1.0])

    monkeypatch.setattr(measure, "time_calls", fake_time_calls)
    return box, calls


@pytest.mark.parametrize("layouts", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")])
@pytest.mark.parametrize("backend", [NumpyBackend, DeviceRefBackend])
def test_check_and_time_with_every_layout(fake_gpu, layouts, backend):
    box, calls = fake_gpu
    box.append(backend)
    m, n, k = 96, 80, 64
    meas = measure.GpuMeasurer("f16", *layouts, m, n, k)
    assert meas.target == "sm_90" and meas.n_sets >= 2
    spec = S.default_spec("f16", *layouts)
    good = NumpyKernel(spec, box)
    meas.prepare(good)
    assert good.loaded
    ok, rel, bound = meas.check(good)
    assert ok and rel < bound
    assert meas.reference_name.startswith("cuBLAS" if backend is DeviceRefBackend else "numpy float64")
    assert meas.screen(good) == 1.0 and meas.time(good) == 1.0 and meas.time(good, final=True) == 1.0
    assert calls == [measure.SCREEN_TIMING, measure.SEARCH_TIMING, measure.FINAL_TIMING]
    bad = NumpyKernel(spec, box, wrong=True)
    ok, rel, bound = meas.check(bad)
    assert not ok and rel > bound
    assert meas.healthy()
    meas.close()
    assert box[0].released and meas.A is None


def test_tune_end_to_end_through_gpu_measurer(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(tmp_path / "cache"))
    box, _ = fake_gpu
    wrong_tile = (64, 64)
    pool = KernelPool(lambda spec: NumpyKernel(spec, box, wrong=(spec.tile.m, spec.tile.n) == wrong_tile),
                      lambda k: None)
    space = S.SearchSpace(tile_mn=(64, 128), tile_k=(32, 64), warp_counts=(4,), stages=(3,), swizzles=("auto",),
                          group_m=(8,), frag_buffers=(2,))
    res = tune("bf16", "col", "row", 128, 128, 64, budget_s=60, pool=pool, space=space, log_stream=io.StringIO(),
               workers=2)
    assert res.spec is not None and (res.gpu, res.driver) == ("Fake H200", "13.0")
    assert any(t.status == "wrong" for t in res.candidates)
    assert all((t.spec.tile.m, t.spec.tile.n) != wrong_tile for t in res.candidates if t.status == "ok")
    assert res.stored and box[0].released
    from tilegen.tune import lookup

    assert lookup("bf16", "col", "row", 128, 128, 64, "f32", "Fake H200", "13.0") == res.spec


def test_device_key(fake_gpu):
    assert measure.device_key(0) == ("Fake H200", "13.0")
