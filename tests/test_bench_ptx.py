"""tilegen bench: the mma.sync peak kernel (written in the DSL) and the benchmarked GEMMs
compile to PTX that ptxas assembles; the peak kernel is right on the CPU emulator; the
compile-speed and environment helpers."""
import re

import numpy as np
import pytest

import tilegen
from gpu_util import requires_gpu
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.bench import compile_speed, env
from tilegen.bench import options as O
from tilegen.bench.peak import (PEAK_CONFIGS, SPIN_CONFIG, PeakConfig, PeakProblem, compile_peak, mma_peak,
                                small_ints)

ALL_PEAK = [c for cs in PEAK_CONFIGS.values() for c in cs]


def _loop_body(ptx: str) -> list:
    """Instructions between a label and the branch back to it (the runtime loop)."""
    lines = [l.split("//")[0].strip() for l in ptx.splitlines()]
    for i, line in enumerate(lines):
        m = re.fullmatch(r"(\$?[\w.]+):", line)
        if not m:
            continue
        for j in range(i + 1, len(lines)):
            if re.search(r"\bbra(\.uni)?\s+" + re.escape(m.group(1)) + r"\s*;", lines[j]):
                return [l for l in lines[i + 1:j + 1] if l]
    raise AssertionError("no backward branch (runtime loop) in the PTX")


@pytest.mark.parametrize("cfg", ALL_PEAK, ids=lambda c: c.kernel_name())
def test_peak_kernel_loop_is_mma_only(cfg):
    k = compile_peak(cfg, "sm_90")
    instrs = _loop_body(k.ptx)
    mmas = [i for i in instrs if i.startswith("mma.sync")]
    assert len(mmas) == cfg.tiles_m * cfg.tiles_n * cfg.unroll
    shape = f"m{cfg.atom.m}n{cfg.atom.n}k{cfg.atom.k}"
    assert all(shape in i and f".{cfg.dtype}." in i for i in mmas)
    assert not any(i.startswith(("ld.", "st.", "ldmatrix", "cp.async", "bar.")) for i in instrs)
    assert len(instrs) - len(mmas) <= 4           # the loop counter: add, setp, bra
    assert "st.global" in k.ptx                   # (the emulator test checks every accumulator lands)
    assert k.threads == cfg.threads and k.name == cfg.kernel_name()


def test_peak_flops_and_shapes():
    cfg = PeakConfig("f16", 2, 4, 8, 4, 2)
    assert cfg.flops(iters=10, ctas=3) == 2 * 16 * 8 * 16 * 8 * 4 * 10 * 8 * 3
    assert cfg.out_shape(ctas=3) == (3 * 8 * 32, 32)
    tf = PeakConfig("tf32")
    assert (tf.atom.m, tf.atom.n, tf.atom.k) == (16, 8, 8)
    assert {c.dtype for c in ALL_PEAK} == {"tf32", "f16", "bf16"}


def test_peak_tiles_must_fit():
    with pytest.raises(ValueError, match="do not fit"):
        compile_peak(PeakConfig("f16", 8, 2, 1, 1, 1), "sm_90")


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_peak_kernels_assemble(arch):
    for cfg in ALL_PEAK + [SPIN_CONFIG]:
        k = compile_peak(cfg, arch)
        report = assert_assembles(k.ptx, arch)
        assert "spill" not in report or re.search(r"0 bytes spill stores, 0 bytes spill loads", report), report


@needs_ptxas
@pytest.mark.parametrize("dtype", O.DTYPES)
def test_benchmarked_gemms_assemble(dtype):
    for a, b in O.LAYOUTS.values() if dtype not in ("e4m3", "e5m2") else [("row", "col")]:   # fp8: K-major
        spec = O.make_spec(dtype, a, b, "sm_90", {})
        assert_assembles(tilegen.compile(spec).ptx, "sm_90")


@pytest.mark.parametrize("cfg", [PeakConfig("tf32", 2, 2, 2, 2, 1), PeakConfig("f16", 4, 4, 1, 1, 1),
                                 PeakConfig("bf16", 1, 2, 1, 3, 1)], ids=lambda c: c.kernel_name())
def test_peak_kernel_is_right_on_the_emulator(cfg):
    run_kernel = pytest.importorskip("tilegen.sim.runner").run_kernel
    from tilegen.sim.memory import GlobalMemory

    k = compile_peak(cfg, "sm_80")
    prob = PeakProblem(cfg, 2, small_ints(np.random.default_rng(0)))
    mem = GlobalMemory()
    pa, pb, pc = mem.alloc(prob.a.nbytes), mem.alloc(prob.b.nbytes), mem.alloc(prob.c_bytes)
    mem.write(pa, prob.a)
    mem.write(pb, prob.b)
    mem.write(pc, np.full(prob.c_bytes // 4, np.nan, np.float32))
    run_kernel(k, prob.args(pa, pb, pc, 3), prob.sizes(), mem)
    out = mem.read(pc, prob.c_bytes).view(np.float32).reshape(prob.rows, prob.n)
    assert prob.check(out, 3) == ""
    assert "differ from numpy" in prob.check(out, 4)     # a wrong iteration count is caught
    bad = out.copy()
    bad[-1, -1] += 1
    assert prob.check(bad, 3).startswith("1 of ")


def test_peak_kernel_is_a_dsl_kernel():
    assert isinstance(mma_peak, tilegen.dsl.KernelFunction)


# ---- compile speed, environment -------------------------------------------------------------

def test_spec_round_trips_through_the_worker_payload():
    import json

    for dt in O.DTYPES:
        spec = O.make_spec(dt, "row", "col", "sm_90", {"stages": 4})
        kw = json.loads(json.dumps(compile_speed._spec_kwargs(spec)))
        again = tilegen.GemmSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()})
        assert again == spec


def test_compile_speed_table():
    text = compile_speed.format_compile_speed({
        "import_ms": 300.0, "context_ms": 90.0, "driver_jit_cache": "disabled", "cache": "/x/cache.py",
        "specs": [{"spec": "f16 rr", "compile_ms": 150.0, "compile_first_ms": 400.0, "jit_ms": 95.5,
                   "first_launch_ms": 260.0, "second_object_ms": 151.0, "cache_cold_first_launch_ms": 300.0,
                   "cache_warm_compile_first_ms": 5.0, "cache_warm_first_launch_ms": 12.0}]})
    assert "spec->PTX" in text and "95.5" in text and "disk cache warm" in text and "12.0" in text
    assert "failed" in compile_speed.format_compile_speed({"error": "boom"})


@pytest.mark.parametrize("cc, target", [((9, 0), "sm_90"), ((8, 0), "sm_80"), ((8, 6), "sm_86"),
                                        ((8, 7), "sm_86"), ((10, 0), "sm_89"), ((12, 0), "sm_89")])
def test_device_target(cc, target):
    assert env.device_target(cc) == target


def test_device_target_too_old():
    with pytest.raises(ValueError, match="older than every tilegen target"):
        env.device_target((7, 5))


def test_versions_and_commit_do_not_need_a_gpu():
    v = env.versions()
    assert v["tilegen"] == tilegen.__version__ and "torch" in v and "triton" in v
    c = env.git_commit()
    assert set(c) == {"commit", "dirty"}


@pytest.mark.gpu   # torch and Triton come with the GPU machines' image, not with the test extra
@requires_gpu
def test_triton_kernel_module_imports_when_triton_does():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from tilegen.bench import triton_mm

    assert triton_mm.CONFIGS_16 and triton_mm.CONFIGS_32


def test_compile_speed_worker_times_compiles_without_a_gpu(monkeypatch):
    import json

    monkeypatch.setenv("TILEGEN_CACHE", "0")
    specs = [O.make_spec("f16", "row", "row", "sm_90", {}), O.make_spec("tf32", "row", "row", "sm_90", {})]
    payload = json.dumps([compile_speed._spec_kwargs(s) for s in specs])
    out = compile_speed.worker(payload, repeat=2, launch=False)
    assert [r["spec"] for r in out["specs"]] == ["f16 rr", "tf32 rr"]
    assert all(r["compile_ms"] > 0 and r["compile_first_ms"] > 0 for r in out["specs"])
    assert "first_launch_ms" not in out["specs"][0]


def test_compile_speed_child_process_plumbing():
    specs = [O.make_spec("bf16", "row", "row", "sm_90", {})]
    out = compile_speed._run_worker(specs, {"TILEGEN_BENCH_COMPILE_ONLY": "1", "TILEGEN_CACHE": "0"})
    assert out["import_ms"] > 0 and out["specs"][0]["spec"] == "bf16 rr" and out["specs"][0]["compile_ms"] > 0
