"""tilegen.tune's search loop on the CPU: the compiler, ptxas and the GPU are fakes, the clock is
simulated, so the budget, the failure handling, the screening, the final check and the cache
round trip are tested without a GPU."""
import io
import json
import math

import pytest

from tilegen import GemmSpec
from tilegen.tune import lookup, tune
from tilegen.tune import space as S
from tilegen.gemm import tuned as store
from tilegen.tune.search import SCREEN_FACTOR, KernelPool, Gate, format_table, tflops

M = N = K = 4096
GPU = ("Fake GPU 9000", "13.0")
SMALL = S.SearchSpace(tile_mn=(64, 128, 256), warp_counts=(4, 8), stages=(3, 4), swizzles=("auto", "pad"),
                      group_m=(4, 8), frag_buffers=(1, 2))


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class FakeKernel:
    def __init__(self, spec):
        self.spec = spec


class FakeResources:
    def __init__(self, registers=200, spills=0):
        self.registers = registers
        self.spill_stores = spills
        self.spill_loads = spills
        self.stack_frame = 0


def model_ms(spec):
    """A deterministic 'GPU': the prior, so that the search has a clear winner."""
    return S.prior_ms(spec, M, N, K)


class FakeMeasurer:
    target = "sm_90"
    gpu_key = GPU
    reference_name = "fake reference"

    def __init__(self, clock, *, prepare_fails=(), time_fails=(), wrong=(), ms=model_ms, final_wrong=(),
                 dies_on=None, cost=(0.6, 0.05, 0.2)):
        self.clock = clock
        self.prepare_fails = prepare_fails
        self.time_fails = time_fails
        self.wrong = wrong
        self.final_wrong = final_wrong
        self.ms = ms
        self.dies_on = dies_on
        self.dead = False
        self.cost = cost
        self.checks = []
        self.timed = []
        self.final = []

    def prepare(self, k):
        self.clock.t += self.cost[0]
        if self.dies_on is not None and self.dies_on(k.spec):
            self.dead = True
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
        if any(f(k.spec) for f in self.prepare_fails):
            raise RuntimeError("CUDA_ERROR_INVALID_PTX: fake JIT failure")

    def check(self, k):
        self.checks.append(k.spec)
        bad = any(f(k.spec) for f in self.wrong)
        if k.spec in self.final and any(f(k.spec) for f in self.final_wrong):
            bad = True
        return (not bad), (0.5 if bad else 1e-6), 1e-4

    def screen(self, k):
        self.clock.t += self.cost[1]
        return self.ms(k.spec)

    def time(self, k, final=False):
        self.clock.t += self.cost[2]
        if any(f(k.spec) for f in self.time_fails):
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED: fake launch failure")
        (self.final if final else self.timed).append(k.spec)
        return self.ms(k.spec)

    def healthy(self):
        return not self.dead


def fake_pool(compile_fails=(), spills=(), registers=200):
    def comp(spec):
        if any(f(spec) for f in compile_fails):
            raise ValueError("fake codegen bug")
        return FakeKernel(spec)

    def res(kernel):
        return FakeResources(registers, 8 if any(f(kernel.spec) for f in spills) else 0)

    return KernelPool(comp, res)


def run(meas=None, pool=None, budget=60, clock=None, **kw):
    clock = clock or (meas.clock if meas else Clock())
    meas = meas or FakeMeasurer(clock)
    out = io.StringIO()
    res = tune("f16", "row", "row", M, N, K, budget_s=budget, measurer=meas, pool=pool or fake_pool(),
               clock=clock, log_stream=out, workers=2, space=kw.pop("space", SMALL), store=kw.pop("store", False), **kw)
    return res, meas, out.getvalue()


def best_by_model():
    cands = S.enumerate_space("f16", "row", "row", "f32", "sm_90", SMALL).candidates
    return min(cands, key=lambda s: (model_ms(s), S.spec_text(s)))


def test_finds_the_fastest_and_compares_with_the_default():
    res, meas, log = run(budget=600)
    assert res.spec is not None
    assert model_ms(res.spec) == model_ms(best_by_model())
    default = S.default_spec("f16", "row", "row")
    assert res.default_spec == default
    assert res.candidates[0].spec == default and res.candidates[0].phase == "default"
    assert res.default_tflops == pytest.approx(tflops(M, N, K, model_ms(default)))
    assert res.tflops == pytest.approx(tflops(M, N, K, model_ms(res.spec)))
    assert res.speedup == pytest.approx(res.tflops / res.default_tflops)
    assert res.tried == len(res.candidates) > 10
    assert res.spec in meas.final and default in meas.final  # finalists re-timed, default among them
    assert meas.checks[-1] == res.spec                      # the winner is checked last, before acceptance
    assert "phase 2" in log and "best" in log
    assert res.table.splitlines()[2].split()[1] == "x".join(map(str, res.spec.tile))
    json.dumps(res.as_dict())  # JSON-able


def test_compile_errors_score_inf_and_do_not_stop_the_search():
    broken = lambda s: s.tile.k == 64  # noqa: E731  (the default's k-tile: the default breaks too)
    res, meas, _ = run(pool=fake_pool(compile_fails=[broken]), budget=600)
    failed = [t for t in res.candidates if t.status == "compile-error"]
    assert failed and all(broken(t.spec) for t in failed)
    assert all(math.isinf(t.score) and "fake codegen bug" in t.error for t in failed)
    assert res.spec is not None and not broken(res.spec)
    assert res.default_tflops == 0.0 and res.speedup is None
    assert "compile-error" in res.table and "inf" in res.table


def test_launch_failures_score_inf_and_do_not_stop_the_search():
    jit = lambda s: s.tile.m == 256  # noqa: E731
    launch = lambda s: s.tile.n == 256 and s.tile.m != 256  # noqa: E731
    clock = Clock()
    meas = FakeMeasurer(clock, prepare_fails=[jit], time_fails=[launch])
    res, _, log = run(meas, budget=600)
    errs = [t for t in res.candidates if t.status == "launch-error"]
    assert {bool(jit(t.spec)) for t in errs} == {True, False}
    assert all(math.isinf(t.score) for t in errs)
    assert any("fake JIT failure" in t.error for t in errs) and any("fake launch failure" in t.error for t in errs)
    assert res.spec is not None and not jit(res.spec) and not launch(res.spec)
    assert "launch-error" in log


def test_ptxas_spills_are_pruned_before_the_gpu():
    spill = lambda s: s.frag_buffers == 2  # noqa: E731
    clock = Clock()
    meas = FakeMeasurer(clock)
    res, _, _ = run(meas, pool=fake_pool(spills=[spill]), budget=600)
    pruned = [t for t in res.candidates if t.status == "pruned"]
    assert pruned and all(spill(t.spec) and t.error.startswith("spills (ptxas)") for t in pruned)
    assert not any(spill(s) for s in meas.timed + meas.checks)
    assert res.spec.frag_buffers == 1


def test_too_many_registers_for_the_threads_are_pruned():
    clock = Clock()
    space = S.SearchSpace(tile_mn=(128, 256), warp_counts=(4, 16), stages=(3,), swizzles=("auto",), group_m=(8,))
    res, meas, _ = run(FakeMeasurer(clock), pool=fake_pool(registers=160), budget=600, space=space)
    pruned = [t for t in res.candidates if t.status == "pruned"]
    assert pruned and all(t.spec.threads == 512 for t in pruned)
    assert all("registers (ptxas): 160 > 128" in t.error for t in pruned)


def test_a_wrong_result_never_wins():
    fastest = best_by_model()
    wrong = lambda s: S.shape_of(s) == S.shape_of(fastest)  # noqa: E731
    clock = Clock()
    res, meas, _ = run(FakeMeasurer(clock, wrong=[wrong]), budget=600)
    bad = [t for t in res.candidates if t.status == "wrong"]
    assert bad and all(wrong(t.spec) for t in bad) and all("relative error" in t.error for t in bad)
    assert res.spec is not None and not wrong(res.spec)
    assert not any(wrong(s) for s in meas.timed)


def test_final_check_failure_falls_back_to_the_next_finalist():
    fastest = best_by_model()
    clock = Clock()
    meas = FakeMeasurer(clock, final_wrong=[lambda s: s == fastest])
    res, _, _ = run(meas, budget=600)
    assert res.spec is not None and res.spec != fastest
    t = next(t for t in res.candidates if t.spec == fastest)
    assert t.status == "wrong" and t.error.startswith("final check")


def test_slow_candidates_are_screened_not_timed():
    clock = Clock()
    default = S.default_spec("f16", "row", "row")
    slow = lambda s: s != default and s.tile.m == 64  # noqa: E731
    ms = lambda s: model_ms(s) * (10 if slow(s) else 1)  # noqa: E731
    res, meas, _ = run(FakeMeasurer(clock, ms=ms), budget=600)
    screened = [t for t in res.candidates if t.status == "screened"]
    tried_slow = [t for t in res.candidates if slow(t.spec)]
    assert tried_slow and all(t.status == "screened" for t in tried_slow)
    assert not any(slow(s) for s in meas.timed)
    assert not {t.spec for t in screened} & set(meas.timed)
    assert all(t.ms > SCREEN_FACTOR * min(x.ms for x in res.candidates if x.status == "ok") for t in screened)


def test_the_budget_is_respected():
    clock = Clock()
    res, meas, _ = run(FakeMeasurer(clock), budget=20)
    # the search stops starting candidates at the budget minus its reserve; finishing adds a few calls
    assert res.elapsed_s <= 20 + 1.0
    assert 5 < res.tried < len(S.enumerate_space("f16", "row", "row", "f32", "sm_90", SMALL).candidates)
    assert res.spec is not None


def test_a_tiny_budget_still_times_the_default():
    clock = Clock()
    res, meas, _ = run(FakeMeasurer(clock), budget=0.5)
    assert res.candidates[0].phase == "default" and res.candidates[0].status == "ok"
    assert res.spec == S.default_spec("f16", "row", "row")


def test_a_dead_context_stops_the_search_without_raising():
    clock = Clock()
    meas = FakeMeasurer(clock, dies_on=lambda s: s.tile.m == 256)
    res, _, _ = run(meas, budget=600)
    assert res.spec is None
    assert "CUDA context is unusable" in res.error
    assert res.candidates[-1].status == "launch-error"


def test_nothing_runs():
    res, _, _ = run(pool=fake_pool(compile_fails=[lambda s: True]), budget=30)
    assert res.spec is None and res.tflops == 0.0
    assert "no candidate ran correctly" in res.error
    assert all(t.status == "compile-error" for t in res.candidates)


def test_bad_arguments_are_refused_before_any_work():
    for args, kw, match in [(("e4m3", "row", "col", 64, 64, 64), {}, "tf32, f16, bf16"),
                            (("f16", "diag", "row", 64, 64, 64), {}, "layout"),
                            (("f16", "row", "row", 0, 64, 64), {}, "M=0"),
                            (("f16", "row", "row", 64, 64, 64), {"out_dtype": "f64"}, "out_dtype"),
                            (("f16", "row", "row", 64, 64, 64), {"budget_s": 0}, "budget_s")]:
        with pytest.raises(ValueError, match=match):
            tune(*args, measurer=object(), **kw)


def test_the_best_is_cached_and_found_by_lookup(cdir):
    clock = Clock()
    res, _, _ = run(FakeMeasurer(clock), budget=600, store=True)
    assert res.stored and res.stored.startswith(str(cdir / "tune"))
    assert (res.gpu, res.driver) == GPU
    got = lookup("f16", "row", "row", 4096, 4096, 4096, "f32", *GPU)
    assert got == res.spec
    assert lookup("f16", "r", "r", 3000, 2049, 4096, "f32", GPU[0], 13000) == res.spec  # same bucket
    assert lookup("f16", "row", "row", 8192, 4096, 4096, "f32", *GPU) is None
    assert lookup("bf16", "row", "row", 4096, 4096, 4096, "f32", *GPU) is None
    assert lookup("f16", "row", "row", 4096, 4096, 4096, "f32", "Other GPU", GPU[1]) is None
    entry = store.load("f16", "row", "row", 4096, 4096, 4096, "f32", *GPU)
    assert entry["tflops"] == pytest.approx(res.tflops, abs=0.01)
    assert entry["default_tflops"] == pytest.approx(res.default_tflops, abs=0.01)


def test_the_cached_best_is_an_anchor_of_the_next_tuning(cdir):
    odd = GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2), stages=2, group_m=1, target="sm_90")
    store.store(odd, M, N, K, *GPU)
    clock = Clock()
    res, _, _ = run(FakeMeasurer(clock), budget=600, store=True)
    assert [t.phase for t in res.candidates[:2]] == ["default", "cached"]
    assert res.candidates[1].spec == odd
    assert lookup("f16", "row", "row", M, N, K, "f32", *GPU) == res.spec != odd


def test_kernel_pool_compiles_once_and_remembers_failures():
    calls = []

    def comp(spec):
        calls.append(spec)
        if spec.stages == 2:
            raise RuntimeError("no")
        return FakeKernel(spec)

    pool = KernelPool(comp, lambda k: None)  # no ptxas: no register numbers, nothing pruned
    a = S.default_spec("f16", "row", "row")
    b = a.replace(stages=2)
    assert pool.get(a) is pool.get(a)
    assert pool.get(a).registers is None and pool.get(a).problem is None
    assert pool.get(b).error.startswith("RuntimeError: no") and pool.get(b).kernel is None
    assert calls == [a, b]


def test_gate_blocks_new_work_while_quiet():
    import threading

    gate = Gate()
    entered = threading.Event()
    with gate.quiet():
        t = threading.Thread(target=lambda: gate.work().__enter__() and None or entered.set())
        t.start()
        t.join(0.2)
        assert not entered.is_set()
    t.join(2)
    assert entered.is_set()


def test_format_table_lists_failures_last():
    clock = Clock()
    res, _, _ = run(FakeMeasurer(clock, prepare_fails=[lambda s: s.tile.m == 64]), budget=600)
    lines = format_table(res.candidates, M, N, K).splitlines()
    statuses = [ln.split()[-1] if "error" not in ln else "error" for ln in lines[2:]]
    first_bad = next(i for i, s in enumerate(statuses) if s != "ok" and s != "screened")
    assert all(s not in ("ok", "screened") for s in statuses[first_bad:])
    assert len(format_table(res.candidates, M, N, K, limit=3).splitlines()) == 5


def test_real_compiler_in_threads_with_a_fake_gpu():
    """tilegen.compile and ptxas (when present) in the pool's threads; only the GPU is faked."""
    from tilegen.codegen.ptxas import find_ptxas

    space = S.SearchSpace(tile_mn=(64, 128), tile_k=(32,), warp_counts=(4,), stages=(2, 3), swizzles=("auto",),
                          group_m=(8,), frag_buffers=(1,))
    clock = Clock()
    meas = FakeMeasurer(clock)
    res = tune("bf16", "row", "col", 1024, 1024, 1024, budget_s=600, measurer=meas, pool=KernelPool(),
               clock=clock, log_stream=io.StringIO(), workers=4, space=space, store=False)
    assert res.spec is not None
    statuses = {t.status for t in res.candidates}
    assert statuses <= {"ok", "screened", "pruned"}
    for t in res.candidates:
        if find_ptxas() is not None:
            assert t.registers is not None and t.registers >= S.register_estimate(t.spec)
        if t.status != "pruned":
            assert "tilegen_gemm_bf16_rc" in meas_kernel_name(t.spec)


def meas_kernel_name(spec):
    import tilegen

    return tilegen.compile(spec).name


def test_pool_is_idle_while_measuring_and_prelinks_in_its_threads():
    """Compiles and driver links run in the pool's threads, never while a candidate is measured."""
    import threading
    import time as _time

    active = [0]
    lock = threading.Lock()
    seen_overlap = []
    prelinked_in = set()

    def busy(fn):
        with lock:
            active[0] += 1
        try:
            _time.sleep(0.002)
            return fn()
        finally:
            with lock:
                active[0] -= 1

    class PrelinkMeasurer(FakeMeasurer):
        def __init__(self, clock):
            super().__init__(clock, cost=(0.0, 0.05, 0.2))
            self.prepared_prelinked = 0

        def prelink(self, k):
            prelinked_in.add(threading.current_thread().name)
            return busy(lambda: True)

        def check(self, k):
            seen_overlap.append(active[0])
            return super().check(k)

        def time(self, k, final=False):
            seen_overlap.append(active[0])
            return super().time(k, final)

    pool = KernelPool(lambda spec: busy(lambda: FakeKernel(spec)), lambda k: FakeResources())
    clock = Clock()
    meas = PrelinkMeasurer(clock)
    res = tune("f16", "row", "row", M, N, K, budget_s=600, measurer=meas, pool=pool, clock=clock,
               log_stream=io.StringIO(), workers=4, space=SMALL, store=False)
    assert res.spec is not None and len(seen_overlap) > 20
    assert set(seen_overlap) == {0}
    assert prelinked_in and all(name.startswith("tilegen-tune") for name in prelinked_in)
    assert all(pool.get(t.spec).prelinked for t in res.candidates if t.status == "ok")


def test_prelink_failures_are_left_to_prepare():
    class BadPrelink(FakeMeasurer):
        def prelink(self, k):
            raise RuntimeError("link failed in the pool")

    clock = Clock()
    res = tune("f16", "row", "row", M, N, K, budget_s=600, measurer=BadPrelink(clock), pool=fake_pool(),
               clock=clock, log_stream=io.StringIO(), workers=2, space=SMALL, store=False)
    assert res.spec is not None
    assert all(t.status in ("ok", "screened") for t in res.candidates)


def test_the_hopper_space_is_searched_and_stored(cdir):
    clock = Clock()
    space = S.SearchSpace(instruction="wgmma", wgmma_tiles=((128, 256), (128, 128)), wgmma_stages=(3, 4),
                          wgmma_group_m=(8,))
    res, _, _ = run(pool=fake_pool(registers=150), clock=clock, space=space, store=True, out_dtype="f16")
    assert res.spec is not None and res.spec.instruction == "wgmma" and res.spec.target == "sm_90a"
    assert res.default_spec.instruction == "wgmma"
    found = lookup("f16", "row", "row", M, N, K, "f16", *GPU)
    assert found == res.spec


def test_tuning_without_a_gpu_says_it_needs_one(monkeypatch):
    """Without a GPU the tuner says it needs one (the runtime's advice to pass device='sim' had
    followed, which the tuner then refused with int('sim')'s ValueError); device='sim' is
    refused by name."""
    import tilegen.runtime
    from tilegen.errors import DeviceError

    def no_gpu(device=0):
        raise DeviceError("no GPU found: ...; pass device='sim' to run the CPU emulator instead")

    monkeypatch.setattr(tilegen.runtime, "ensure_context", no_gpu)
    with pytest.raises(DeviceError, match=r"tuning needs an NVIDIA GPU") as e:
        tune("f16", "row", "row", 256, 256, 256, budget_s=1, progress=False, store=False)
    assert "device='sim'" not in str(e.value)
    with pytest.raises(ValueError, match=r"device='sim': tuning times kernels on a GPU"):
        tune("f16", "row", "row", 256, 256, 256, budget_s=1, progress=False, store=False, device="sim")
