"""examples/hopper_ladder: every step's kernel against float64 numpy on the emulator (ragged
shapes where the step takes them), its command line, and ptxas on each kernel; on the GPU
(marked gpu) each step at a larger ragged shape."""
import subprocess
import sys

import numpy as np
import pytest

import tilegen
from gpu_util import requires_gpu
from ladder_util import LADDER, common, load
from ptxas_util import assert_assembles, needs_ptxas

STEPS = {"step1_one_tile": "step1", "step2_k_loop": "step2", "step3_grid": "step3", "step4_tma": "step4",
         "step5_pipeline": "step5", "step6_warp_specialized": "step6", "step7_persistent": "step7",
         "step8_tma_store": "step8", "step9_cluster": "step9", "step10_pingpong": "step10"}
OUT = {"step8_tma_store": np.float16, "step10_pingpong": np.float16}   # C's dtype where it is not f32


KERNELS = {name: getattr(load(name), fn) for name, fn in STEPS.items()}
# (M, N, K) per step on the emulator: one tile for steps 1-2, ragged grids from step 3 on
SHAPES = {"step1_one_tile": [(64, 128, 64), (40, 100, 48)], "step2_k_loop": [(64, 128, 200), (17, 33, 65)],
          "step3_grid": [(130, 260, 70)], "step4_tma": [(130, 260, 200), (1, 1, 1)],
          "step5_pipeline": [(129, 257, 520), (64, 256, 64), (200, 100, 130)],
          "step6_warp_specialized": [(129, 257, 520), (64, 256, 64), (200, 100, 130), (1, 1, 1)],
          # 3 emulated SMs: each CTA walks several blocks, and the stage phases run on across them
          "step7_persistent": [(300, 520, 200), (700, 300, 64), (1, 1, 1), (129, 1000, 65)],
          "step8_tma_store": [(300, 520, 200), (1, 1, 1), (129, 1000, 65), (64, 24, 16)],
          "step9_cluster": [(300, 520, 200), (129, 1000, 65)],   # more in tests/test_cluster.py
          "step10_pingpong": [(300, 520, 200), (1, 1, 1), (129, 1000, 65), (700, 300, 64)]}


@pytest.fixture(scope="module")
def compiled():
    return {name: tilegen.compile(fn, target="sm_90a") for name, fn in KERNELS.items()}


@pytest.mark.parametrize("name, shape", [(n, s) for n, shapes in SHAPES.items() for s in shapes])
def test_each_step_on_the_emulator(compiled, name, shape):
    err, bound, _ = common.check(compiled[name], *shape, device="sim", seed=1, out=OUT.get(name, np.float32))
    assert err <= bound, f"{name} {shape}: error {err} over {bound}"


def test_a_pipeline_of_two_stages(compiled):
    k = tilegen.compile(KERNELS["step5_pipeline"], stages=2, target="sm_90a")
    err, bound, _ = common.check(k, 70, 256, 64 * 9 + 5, device="sim")
    assert err <= bound


def test_more_stages_than_shared_memory_holds_are_refused():
    """At the declaration that takes the kernel past the limit, with the user's line (the
    allocation pass had said it later, as an IRError naming no line)."""
    with pytest.raises(tilegen.DSLError, match=r"step5_pipeline\.py:\d+: shared sB: with it the kernel's shared "
                                               r"memory is 295936 bytes, more than the 232448 a block may use on "
                                               r"sm_90a \(sA 6 x 16384 B, sB 6 x 32768 B\)"):
        tilegen.compile(KERNELS["step5_pipeline"], stages=6, target="sm_90a")


@needs_ptxas
def test_each_step_assembles(compiled):
    for k in compiled.values():
        assert_assembles(k.ptx, "sm_90a")


def test_a_step_runs_from_the_command_line():
    out = subprocess.run([sys.executable, str(LADDER / "step4_tma.py"), "--device", "sim", "--m", "70", "--n", "50",
                          "--k", "90"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "step 4, TMA + mbarrier: 70x50x90 on the emulator" in out.stdout and "PASS" in out.stdout


def test_a_step_the_emulator_would_take_minutes_over_is_refused_without_a_gpu():
    """docs/hopper_gemm.md's first command on a machine without a GPU: refused at once with the
    way to run it anyway (it had run silently for minutes). (The CPU test runs have no GPU.)"""
    import tilegen.runtime

    if tilegen.runtime.gpu_available():
        pytest.skip("a GPU runs it")
    out = subprocess.run([sys.executable, str(LADDER / "step8_tma_store.py"), "--m", "4096", "--n", "4096", "--k",
                          "4096"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "pass --device sim to run it there anyway" in out.stderr


def test_a_one_tile_step_refuses_larger_sizes():
    out = subprocess.run([sys.executable, str(LADDER / "step1_one_tile.py"), "--device", "sim", "--m", "65"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "--m at most 64" in out.stderr


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("name", ["step3_grid", "step4_tma", "step5_pipeline", "step6_warp_specialized",
                                  "step7_persistent", "step8_tma_store", "step9_cluster", "step10_pingpong"])
def test_each_step_on_the_gpu(compiled, name):
    for shape in [(1000, 1030, 999), (4096, 4096, 256)]:
        err, bound, _ = common.check(compiled[name], *shape, device="gpu", seed=2, out=OUT.get(name, np.float32))
        assert err <= bound, f"{name} {shape}: error {err} over {bound}"


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("name", ["step1_one_tile", "step2_k_loop"])
def test_the_one_tile_steps_on_the_gpu(compiled, name):
    """Steps 1 and 2 compute one 64 x 128 block (step 1 from one k-tile of 64): full and ragged."""
    for shape in SHAPES[name] + ([(64, 128, 4096)] if name == "step2_k_loop" else []):
        err, bound, _ = common.check(compiled[name], *shape, device="gpu", seed=2, out=OUT.get(name, np.float32))
        assert err <= bound, f"{name} {shape}: error {err} over {bound}"
