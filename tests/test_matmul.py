"""tilegen.matmul: the dispatcher's choices and its results on the emulator."""
import importlib
import re
import warnings

import numpy as np
import pytest

import ml_dtypes
import tilegen
from tilegen.gemm.matmul import FP8_FEW_ROWS


def _pair(M, N, K, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)


def test_f32_runs_3xtf32_unless_tf32_is_allowed(monkeypatch):
    A, B = _pair(100, 90, 80)
    monkeypatch.delenv("TILEGEN_ALLOW_TF32", raising=False)
    assert tilegen.matmul.explain(A, B).spec.dtype == "f32"
    assert tilegen.matmul.explain(A, B, allow_tf32=True).spec.dtype == "tf32"
    monkeypatch.setenv("TILEGEN_ALLOW_TF32", "1")
    choice = tilegen.matmul.explain(A, B)
    assert choice.spec.dtype == "tf32" and "tf32 allowed" in choice.reason
    assert tilegen.matmul.explain(A, B, allow_tf32=False).spec.dtype == "f32"


@pytest.mark.parametrize("value, tf32", [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False),
                                         ("false", False), ("no", False), ("", False)])
def test_the_tf32_switch_in_the_environment(monkeypatch, value, tf32):
    A, B = _pair(100, 90, 80)
    monkeypatch.setenv("TILEGEN_ALLOW_TF32", value)
    assert tilegen.matmul.explain(A, B).spec.dtype == ("tf32" if tf32 else "f32")


def test_a_tf32_switch_that_means_nothing_is_refused(monkeypatch):
    A, B = _pair(16, 16, 16)
    monkeypatch.setenv("TILEGEN_ALLOW_TF32", "maybe")
    with pytest.raises(tilegen.LaunchError, match="TILEGEN_ALLOW_TF32='maybe'; allowed: 1, true"):
        tilegen.matmul.explain(A, B)
    monkeypatch.delenv("TILEGEN_ALLOW_TF32")
    with pytest.raises(tilegen.LaunchError, match="allow_tf32='no'; allowed: True, False or None"):
        tilegen.matmul.explain(*_pair(16, 16, 16, np.float16), allow_tf32="no")   # (checked for f16 too)


def test_explain_takes_what_matmul_takes():
    """explain's answer is the spec matmul runs for the same call: out_dtype counts, alpha /
    beta / device are taken, and a misspelled keyword is an error, not a silent plain GEMM."""
    A, B = _pair(40, 24, 32, np.float16, seed=2)
    assert tilegen.matmul.explain(A, B, out_dtype=np.float32).spec.out_dtype == "f32"
    assert tilegen.matmul.explain(A, B, out_dtype="bf16", alpha=2.0, beta=0.0, device="sim").spec.out_dtype == "bf16"
    assert tilegen.matmul(A, B, out_dtype=np.float32, device="sim").dtype == np.float32
    assert tilegen.matmul.explain(A, B, out_dtype="BF16").spec.out_dtype == "bf16"   # (names in any case)
    with pytest.raises(tilegen.LaunchError, match=r"out_dtype='BF17'; allowed: bf16, f16, f32"):
        tilegen.matmul.explain(A, B, out_dtype="BF17")
    with pytest.raises(TypeError, match="bais"):
        tilegen.matmul.explain(A, B, bais=np.ones(24, np.float16))
    with pytest.raises(tilegen.LaunchError, match="out is float16 but out_dtype"):
        tilegen.matmul(A, B, out=np.empty((40, 24), np.float16), out_dtype=np.float32, device="sim")
    with pytest.raises(tilegen.LaunchError, match="beta != 0 reads C from out="):   # (not an uninitialised C)
        tilegen.matmul(A, B, beta=1.0, out_dtype="f32", device="sim")


def test_a_beta_that_is_zero_in_float32_is_refused():
    """A beta that rounds to 0 in float32 (the kernel's parameter) would leave C unread, where
    numpy's beta * C keeps C's NaNs and infinities: refused, by matmul and by a kernel, for 2-D
    products and stacks; the least float32 beta is taken and reads C (NaN and inf come through)."""
    A, B = _pair(20, 24, 32, np.float16, seed=3)
    C = np.full((20, 24), np.inf, np.float32)
    C[0, 0] = np.nan
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", out_dtype="f32", tile=(64, 64, 32), warps=(2, 2)))
    for tiny in (1e-50, -2.0 ** -151, 2.0 ** -150):
        with pytest.raises(tilegen.LaunchError, match=r"is 0 in float32"):
            tilegen.matmul(A, B, out=C.copy(), beta=tiny, device="sim")
        with pytest.raises(tilegen.LaunchError, match=r"is 0 in float32"):
            kernel(A, B, out=C.copy(), beta=tiny, device="sim")
        with pytest.raises(tilegen.LaunchError, match=r"is 0 in float32"):
            tilegen.matmul(np.stack([A, A]), np.stack([B, B]), out=np.stack([C, C]), beta=tiny, device="sim")
    got = tilegen.matmul(A, B, out=C.copy(), beta=2.0 ** -149, device="sim")
    assert np.isnan(got[0, 0]) and np.isposinf(got[1:]).all()


def test_an_activation_of_none_is_none_and_an_empty_name_is_refused():
    """activation=None means none for matmul and Epilogue alike (Epilogue had refused it); an empty
    name is no activation's (matmul had taken "" as none)."""
    A, B = _pair(8, 8, 8, np.float16, seed=8)
    assert tilegen.matmul.explain(A, B, activation=None).spec.epilogue.activation == "none"
    assert tilegen.Epilogue(activation=None) == tilegen.Epilogue()
    with pytest.raises(tilegen.SpecError, match=r"activation='' is invalid; allowed: none, relu"):
        tilegen.matmul.explain(A, B, activation="")


def test_a_kernel_says_how_to_convert_a_host_array_of_another_dtype():
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2)))
    A, B = _pair(4, 8, 8, np.float16, seed=9)
    for kw, said in ((dict(out=np.zeros((4, 8), ">f4")), "out is byte-swapped, pass an array in the machine's"),
                     (dict(A=A.astype(">f2")), r"A is byte-swapped, pass A.astype\(A.dtype.newbyteorder\('='\)\)"),
                     (dict(A=A.astype(np.float32)), r"pass A.astype\(np.float16\)")):
        args = {"A": A, "B": B, **kw}
        with pytest.raises(tilegen.LaunchError, match=said):
            kernel(args.pop("A"), args.pop("B"), device="sim", **args)


def test_an_out_that_is_no_array_is_refused_by_name():
    """out=[[...]] (a list), a number or a string: refused as not an array, on a 2-D product, a
    stack (an AttributeError traceback before) and a kernel (it had said device='sim' takes numpy
    arrays, or that out had dtype list)."""
    A, B = _pair(4, 8, 8, np.float16, seed=7)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2)))
    for out in ([[0.0] * 8] * 4, 3.0, "C"):
        kind = type(out).__name__
        with pytest.raises(tilegen.LaunchError, match=rf"^out must be an array .*not a {kind}$"):
            tilegen.matmul(A, B, out=out, device="sim")
        with pytest.raises(tilegen.LaunchError, match=rf"^out must be an array .*not a {kind}$"):
            tilegen.matmul(np.stack([A, A]), B, out=out, device="sim")
        with pytest.raises(tilegen.LaunchError, match=rf"^out must be an array .*not a {kind}$"):
            kernel(A, B, out=out, device="sim")


def test_alpha_and_beta_beyond_float32_are_refused_on_every_device():
    """The kernel's alpha and beta are float32 parameters: a finite value beyond float32's range
    is refused with a LaunchError naming it (the emulator had raised a SimError, a RuntimeError),
    and an infinite one is taken (numpy's inf * A @ B)."""
    A, B = _pair(16, 16, 16, np.float16, seed=6)
    kernel = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2)))
    for kw in (dict(alpha=1e300), dict(beta=-1e39, out=np.zeros((16, 16), np.float32)), dict(alpha=10 ** 40)):
        name = next(k for k in kw if k != "out")
        with pytest.raises(tilegen.LaunchError, match=rf"{name}=.* is beyond float32's range"):
            kernel(A, B, device="sim", **kw)
        with pytest.raises(tilegen.LaunchError, match=rf"{name}=.* is beyond float32's range"):
            tilegen.matmul(A, B, device="sim", **kw)
    got = kernel(A, B, alpha=float("inf"), device="sim")
    with np.errstate(invalid="ignore"):
        want = np.inf * (A.astype(np.float32) @ B.astype(np.float32))
    np.testing.assert_array_equal(got, want)
    # float32's largest as numpy prints it (a float64 just above it, which float32 rounds down to it)
    # is taken; the first value float32 rounds to infinity is not
    top = np.finfo(np.float32).max
    got = kernel(A, B, alpha=3.4028235e38, device="sim")
    with np.errstate(over="ignore"):   # (alpha * the accumulator, rounded as the kernel's mul.f32)
        np.testing.assert_array_equal(got, top * kernel(A, B, device="sim"))
    with pytest.raises(tilegen.LaunchError, match=r"largest 3.4028235e\+38"):
        kernel(A, B, alpha=2.0 ** 128 - 2.0 ** 103, device="sim")


def test_the_gpu_fast_paths_leave_a_beta_that_is_not_a_number_to_the_general_path():
    """The GPU arrays' fast paths (FastCall, BatchedCall) test beta before anything else: a beta
    that is not a Python number (a string, an array, a numpy scalar) or that is 0 in float32 goes
    to the general path, which converts it or says what is wrong; comparing it first raised a
    traceback (TypeError for a string, ValueError for an array)."""
    plain = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2)))
    stack = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32), warps=(2, 2), batched=True))
    for beta in ("0.5", np.ones(2, np.float32), np.float32(0.5), None, 1e-50):
        assert plain.fast_call.run(None, None, None, None, None, None, None, 1.0, beta, False) is None
        assert stack.batched_call.run(None, None, None, None, None, 2, None, None, 1.0, beta) is None


def test_explain_makes_no_output_for_an_out_dtype(monkeypatch):
    """explain runs nothing: an out_dtype alone names the output's dtype, no M x N array is made
    (it could be GPU memory)."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_empty_out", lambda *a: pytest.fail("explain allocated an output"))
    A, B = _pair(40, 24, 32, np.float16)
    assert mm.explain(A, B, out_dtype="f32").spec.out_dtype == "f32"
    assert mm.explain(A[:, :0], B[:0], out_dtype="bf16").spec.out_dtype == "bf16"   # (K = 0 too)


def test_f32_accuracy_on_the_emulator(monkeypatch):
    monkeypatch.delenv("TILEGEN_ALLOW_TF32", raising=False)
    A, B = _pair(70, 66, 130, seed=1)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    err = np.linalg.norm(tilegen.matmul(A, B, device="sim") - ref) / np.linalg.norm(ref)
    err_tf32 = np.linalg.norm(tilegen.matmul(A, B, allow_tf32=True, device="sim") - ref) / np.linalg.norm(ref)
    assert err < 1e-6 < err_tf32


def test_dtypes_layouts_and_outputs_follow_the_arrays():
    A, B = _pair(200, 300, 100, ml_dtypes.bfloat16)
    spec = tilegen.matmul.explain(A, np.asfortranarray(B)).spec
    assert (spec.dtype, spec.out_dtype, spec.a_layout, spec.b_layout) == ("bf16", "bf16", "row", "col")
    assert tilegen.matmul.explain(A, B, out=np.empty((200, 300), np.float32)).spec.out_dtype == "f32"


def test_small_dimensions_get_small_tiles():
    A, B = _pair(16, 4096, 512, np.float16)
    choice = tilegen.matmul.explain(A, B)
    assert choice.spec.tile.m == 64 and "small M" in choice.reason
    big = tilegen.matmul.explain(*_pair(1024, 1024, 512, np.float16))
    assert big.spec.tile.m == 128 and "default tile" in big.reason


def test_bias_axis_from_its_length_and_the_fused_result():
    A, B = _pair(40, 24, 32, np.float16, seed=2)
    bias_col = np.linspace(-1, 1, 24).astype(np.float32)
    bias_row = np.linspace(-1, 1, 40).astype(np.float32)
    assert tilegen.matmul.explain(A, B, bias=bias_col).spec.epilogue.bias == "col"
    assert tilegen.matmul.explain(A, B, bias=bias_row).spec.epilogue.bias == "row"
    out = tilegen.matmul(A, B, bias=bias_col.astype(np.float16), activation="relu", device="sim")
    ref = np.maximum(A.astype(np.float64) @ B.astype(np.float64) + bias_col.astype(np.float16), 0)
    assert out.dtype == np.float16
    assert np.abs(out.astype(np.float64) - ref).max() <= 2e-3 * max(1, np.abs(ref).max())


@pytest.mark.parametrize("cc, target", [((9, 0), "sm_90"), ((8, 9), "sm_89"), ((8, 7), "sm_86"), ((10, 0), "sm_89"),
                                        ((12, 0), "sm_89")])
def test_matmul_chooses_for_gpus_it_has_no_target_of_their_own_for(monkeypatch, cc, target):
    """The target matmul's choices are made for, by the GPU's compute capability: a GPU newer than
    Hopper (sm_100, sm_120) takes sm_89's mma.sync kernels (sm_90a's wgmma code does not load
    there); before, its 'sm_100' was no target and every call was refused."""
    from tilegen import runtime
    from tilegen.runtime.driver import DeviceInfo

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(runtime, "device_info", lambda device=0: DeviceInfo("GPU", cc, 132, 232448, "13.0"))
    assert mm._target() == target
    spec = tilegen.matmul.explain(*_pair(256, 256, 256, np.float16)).spec
    assert spec.target == target or (target == "sm_90" and spec.target == "sm_90a")
    if cc[0] >= 10:
        assert spec.instruction == "mma.sync"


def test_a_bias_runs_along_the_axis_numpy_broadcasts_it_on():
    """A square product: a 1-D bias, or a 1 x N one, is per column (as A @ B + b in numpy); an
    M x 1 one per row, which a 1-D bias of M == N values cannot say (it had been read per column
    whatever the user meant, and a 2-D bias refused). Other shapes are refused with the forms
    allowed."""
    A, B = _pair(24, 24, 32, np.float16, seed=4)
    b = np.linspace(-2, 2, 24).astype(np.float16)
    prod = A.astype(np.float64) @ B.astype(np.float64)
    for bias, ref in ((b, prod + b), (b[None, :], prod + b[None, :]), (b[:, None], prod + b[:, None])):
        axis = "row" if bias.shape == (24, 1) else "col"
        assert tilegen.matmul.explain(A, B, bias=bias).spec.epilogue.bias == axis
        out = tilegen.matmul(A, B, bias=bias, device="sim")
        assert np.abs(out.astype(np.float64) - ref).max() <= 2e-3 * np.abs(ref).max(), axis
    rect = _pair(40, 24, 32, np.float16, seed=5)
    row = np.linspace(-1, 1, 40).astype(np.float16)
    got = tilegen.matmul(*rect, bias=row[:, None], device="sim")   # M x 1 with M != N, as the 1-D form
    assert np.abs(got.astype(np.float64) - (rect[0].astype(np.float64) @ rect[1] + row[:, None])).max() < 0.05
    for bad in (np.zeros((24, 24), np.float16), np.zeros((2, 24), np.float16), np.zeros((1, 1, 24), np.float16)):
        with pytest.raises(tilegen.LaunchError, match=r"one per column \(shape \(24,\) or \(1, 24\)\)"):
            tilegen.matmul(A, B, bias=bad, device="sim")
    # N = 1: numpy spreads a 1-D bias of M values across an M x M result; refused (it had been read per row)
    col = _pair(6, 1, 32, np.float16, seed=6)
    with pytest.raises(tilegen.LaunchError, match=r"with N = 1, numpy would spread a 1-D bias of 6 values over a "
                                                  r"result of 6 x 6: pass it as \(6, 1\)"):
        tilegen.matmul(*col, bias=np.ones(6, np.float16), device="sim")
    got = tilegen.matmul(*col, bias=np.ones((6, 1), np.float16), device="sim")
    assert got.shape == (6, 1)


@pytest.mark.parametrize("call,message", [
    (lambda: tilegen.matmul(*_pair(4, 4, 4, np.float64)), "float16, bfloat16, float32, float8_e4m3fn or float8_e5m2"),
    (lambda: tilegen.matmul(_pair(4, 4, 4)[0], _pair(4, 4, 4, np.float16)[1]), "one dtype"),
    (lambda: tilegen.matmul(*_pair(4, 5, 6), bias=np.zeros(7, np.float32)), "N=5 .* M=4"),
    (lambda: tilegen.matmul(np.zeros((4, 5), np.float32), np.zeros((6, 7), np.float32)), "inner dimensions"),
    (lambda: tilegen.matmul(np.ones((4, 4), ">f2"), np.ones((4, 4), ">f2")), "not >f2 \\(byte-swapped: pass A.astype"),
    (lambda: tilegen.matmul(*_pair(4, 4, 4), device=-1), "device=-1; allowed: None, 'gpu' \\(or 'cuda'\\), 'sim'"),
    (lambda: tilegen.matmul(np.ma.masked_array(_pair(4, 4, 4)[0], mask=np.eye(4, dtype=bool)), _pair(4, 4, 4)[1]),
     "A is a numpy masked array: .*A.filled\\(0\\)"),
    (lambda: tilegen.compile(tilegen.GemmSpec(dtype="f16"))(*_pair(16, 16, 16, np.float16), out=np.zeros((2, 16, 16),
                                                           np.float32), device="sim"), "must be 2-D.*batched=True"),
])
def test_bad_arguments_are_explained(call, message):
    with pytest.raises(tilegen.LaunchError, match=message):
        call()


def test_numpy_operands_ask_explain_once_per_choice_key(monkeypatch):
    """matmul on numpy arrays remembers explain's spec per choice key (explain took milliseconds a
    call on the H200): a second call like the first asks nothing; another shape bucket, layout or
    dtype asks again; and what explain refuses is still refused on a remembered key."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    asked = []
    real = mm.explain
    monkeypatch.setattr(mm, "explain", lambda *a, **k: asked.append(1) or real(*a, **k))
    A, B = _pair(40, 24, 32, np.float16, seed=3)
    bias = np.linspace(-1, 1, 24).astype(np.float16)
    ref = np.maximum(A.astype(np.float64) @ B.astype(np.float64) + bias, 0)
    for _ in range(2):
        out = tilegen.matmul(A, B, bias=bias, activation="relu", device="sim")
        assert np.abs(out.astype(np.float64) - ref).max() <= 2e-3 * max(1, np.abs(ref).max())
    assert len(asked) == 1
    A2, B2 = _pair(41, 23, 31, np.float16, seed=4)   # (the same bucket and bias axis)
    tilegen.matmul(A2, B2, bias=bias[:23], activation="relu", device="sim")
    assert len(asked) == 1
    tilegen.matmul(A, np.asfortranarray(B), bias=bias, activation="relu", device="sim")   # another layout
    tilegen.matmul(*_pair(200, 24, 32, np.float16), bias=bias, activation="relu", device="sim")   # another bucket
    assert len(asked) == 3
    with pytest.raises(tilegen.LaunchError, match="N=23 .* M=41"):
        tilegen.matmul(A2, B2, bias=bias, activation="relu", device="sim")   # (a bias of neither length)
    # what explain refuses stays refused on a remembered key (f16: allow_tf32 is not part of the key)
    with pytest.raises(tilegen.LaunchError, match="allow_tf32='yes'; allowed: True, False or None"):
        tilegen.matmul(A, B, bias=bias, activation="relu", allow_tf32="yes", device="sim")
    with pytest.raises(tilegen.LaunchError, match="N=23 .* M=40"):   # (the bias's fit is part of the key)
        tilegen.matmul(A, B[:, :23], bias=bias, activation="relu", device="sim")
    before = len(asked)
    A3, B3 = _pair(40, 24, 32, np.float32, seed=5)    # another dtype asks again, once
    tilegen.matmul(A3, B3, bias=bias, activation="relu", device="sim")
    assert len(asked) > before
    before = len(asked)
    tilegen.matmul(A3, B3, bias=bias, activation="relu", device="sim")
    assert len(asked) == before


def test_matmul_fused_is_the_same_function():
    assert tilegen.matmul_fused is tilegen.matmul


def test_large_16bit_problems_on_hopper_take_the_wgmma_kernel(monkeypatch):
    """On an sm_90 GPU without a tuning cache: wgmma (sm_90a) for large f16/bf16 problems in
    every layout, mma.sync for small ones (large f32: test_large_f32_problems_on_hopper_split_into_tf32_parts)."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")

    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    A = np.zeros((4096, 2048), np.float16)
    B = np.asfortranarray(np.zeros((2048, 4096), np.float16))
    spec = mm.explain(A, B).spec
    assert (spec.instruction, spec.target, spec.b_layout) == ("wgmma", "sm_90a", "col")
    assert "wgmma" in mm.explain(A, B).reason
    # a short side of 1024 with the area of 2048^2 fills the GPU with the preset's tiles
    assert tuple(mm.explain(A[:1024], B).spec.tile) == (128, 256, 64)
    assert tuple(mm.explain(A[:1023], B).spec.tile) == (128, 128, 64)
    assert mm.explain(A[:128, :512].astype(np.float32), B[:512, :512].astype(np.float32)).spec.instruction == "mma.sync"


def test_hopper_presets_walk_blocks_in_groups_of_16_rows_but_not_the_tf32_register_kernels(monkeypatch):
    """GROUP_M block rows per group for the 128x256 presets (less DRAM traffic: faster at the
    power cap); the tf32 register kernels (256-row blocks) and ping-pong keep 8, as measured."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: True)
    z = lambda r, c, dt: np.zeros((r, c), dt)  # noqa: E731
    f = np.asfortranarray
    for dt in (np.float16, ml_dtypes.bfloat16):
        for B in (z(4096, 4096, dt), f(z(4096, 4096, dt))):
            assert mm.explain(z(4096, 4096, dt), B).spec.group_m == mm.GROUP_M == 16
    tf32 = lambda A, B: mm.explain(A, B, allow_tf32=True).spec  # noqa: E731
    A, B = z(4096, 4096, np.float32), z(4096, 4096, np.float32)
    assert tf32(A, f(B)).group_m == 16                                   # K-major
    assert (tf32(A, B).copy, tf32(A, B).group_m) == ("tma", 8)          # B's k-steps through registers
    assert (tf32(f(A), B).pretranspose, tf32(f(A), B).group_m) == ("A", 8)
    assert (tf32(f(A), f(B)).store, tf32(f(A), f(B)).group_m) == ("direct", 8)
    bias = np.zeros(4096, np.float16)
    fused = mm.explain(z(4096, 1024, np.float16), z(1024, 4096, np.float16), bias=bias, activation="gelu_tanh").spec
    assert fused.pingpong and fused.group_m == 8


def test_medium_16bit_problems_on_hopper_take_smaller_wgmma_tiles(monkeypatch):
    """Below the preset's size: the warp-specialized wgmma kernel with 128x128 tiles while they
    give MEDIUM_BLOCKS blocks, 64x128 below; a side of SMALL or less keeps mma.sync's 64x64."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    z = lambda r, c: np.zeros((r, c), np.float16)  # noqa: E731
    for (M, N), tile, stages in (((1024, 2048), (128, 128, 64), 4), ((1536, 1024), (128, 128, 64), 4),
                                 ((1024, 1024), (64, 128, 64), 6), ((512, 512), (64, 128, 64), 6),
                                 ((96, 96), (64, 128, 64), 6)):
        K = min(512, M)   # (a K of twice the longer side is the long-K rule's, below)
        choice = mm.explain(z(M, K), np.asfortranarray(z(K, N)))
        s = choice.spec
        assert (s.instruction, s.target, tuple(s.tile), s.stages, s.warp_specialized, s.b_layout) == \
            ("wgmma", "sm_90a", tile, stages, True, "col"), (M, N)
        assert "medium problem" in choice.reason and f"{-(-M // 128) * -(-N // 128)} blocks" in choice.reason
    assert (1024 * 1536 // 128 ** 2) == mm.MEDIUM_BLOCKS  # the boundary the measurements put here
    assert tuple(mm.explain(z(1024, 512), z(512, 1408)).spec.tile) == (64, 128, 64)   # 88 blocks
    small = mm.explain(z(64, 512), z(512, 300)).spec
    assert (small.instruction, tuple(small.tile)) == ("mma.sync", (64, 64, 64))
    assert mm.explain(z(128, 512).astype(np.float32), z(512, 512).astype(np.float32)).spec.instruction == "mma.sync"
    # a long K over few blocks: one CTA per 64x128 block, 128-deep k-tiles
    long = mm.explain(z(1024, 4096), z(4096, 1024))
    assert (tuple(long.spec.tile), long.spec.stages, long.spec.persistent) == ((64, 128, 128), 4, False)
    assert "long K" in long.reason
    assert tuple(mm.explain(z(1024, 2047), z(2047, 1024)).spec.tile) == (64, 128, 64)   # K < 2 max(M, N)
    assert tuple(mm.explain(z(2048, 8192), z(8192, 1024)).spec.tile) == (128, 128, 64)  # 128 blocks: enough
    monkeypatch.setattr(mm, "_target", lambda: "sm_80")
    assert mm.explain(z(1024, 512), z(512, 1024)).spec.instruction == "mma.sync"


def test_large_tf32_problems_on_hopper_take_wgmma(monkeypatch):
    """tf32 (allow_tf32) takes the wgmma kernel in every layout; its reason names the
    truncation and which operand is rounded instead."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    A = np.zeros((1024, 2048), np.float32)   # (below PRETRANSPOSE_MIN rows: B row-major goes through registers)
    B = np.zeros((2048, 4096), np.float32)
    choice = mm.explain(A, B, allow_tf32=True)
    assert (choice.spec.dtype, choice.spec.instruction, tuple(choice.spec.tile)) == ("tf32", "wgmma", (256, 128, 32))
    assert choice.spec.swaps_operands and "truncates" in choice.reason and "B is rounded" in choice.reason
    assert not choice.spec.pretranspose
    rc = mm.explain(A, np.asfortranarray(B), allow_tf32=True)
    assert rc.spec.tile.n == 256 and "2.6x" in rc.reason
    assert mm.explain(np.asfortranarray(A), B, allow_tf32=True).spec.instruction == "wgmma"
    assert mm.explain(A, B).spec.dtype == "f32"       # 3xTF32 without allow_tf32


def test_tf32_mn_major_operands_are_copied_k_major_first_where_the_product_is_long(monkeypatch):
    """B row-major with M >= PRETRANSPOSE_MIN, A column-major with N >= PRETRANSPOSE_MIN: a
    transposing first kernel, then the K-major kernel (measured faster on the H200); below, the
    one-kernel paths. Each side's own threshold, and the choice memo keys on both."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    z = lambda r, c, col=False: np.asfortranarray(np.zeros((r, c), np.float32)) if col else np.zeros((r, c), np.float32)  # noqa: E731
    edge = mm.PRETRANSPOSE_MIN
    rr = mm.explain(z(edge, 1024), z(1024, 4096), allow_tf32=True)
    assert rr.spec.pretranspose and rr.spec.transposed_operands == ("B",) and "copies it K-major" in rr.reason
    assert rr.spec.kernel_spec.copy == "tma" and "2.6x" in rr.reason    # the K-major kernel truncates both
    assert not mm.explain(z(edge - 1, 1024), z(1024, 4096), allow_tf32=True).spec.pretranspose
    cc = mm.explain(z(4096, 1024, True), z(1024, edge, True), allow_tf32=True)
    assert cc.spec.transposed_operands == ("A",)
    assert not mm.explain(z(4096, 1024, True), z(1024, edge - 1, True), allow_tf32=True).spec.pretranspose
    cr = mm.explain(z(edge, 1024, True), z(1024, edge), allow_tf32=True)
    assert cr.spec.transposed_operands == ("A", "B")
    assert not mm.explain(z(4096, 1024), z(1024, 4096, True), allow_tf32=True).spec.pretranspose  # K-major already
    assert not mm.explain(z(4096, 1024), z(1024, 4096)).spec.pretranspose                         # 3xTF32: mma.sync
    monkeypatch.setattr(mm, "_target", lambda: "sm_80")
    assert not mm.explain(z(4096, 1024), z(1024, 4096), allow_tf32=True).spec.pretranspose
    assert mm.size_class(edge, 4096, 64) != mm.size_class(edge - 1, 4096, 64)


def test_tf32_row_major_b_goes_through_registers_where_that_kernel_loads_without_spills(monkeypatch):
    """A and B row-major on Hopper where the register kernel loads without spills (a GPU with
    ptxas): the kernel that loads B's k-steps into registers from TMA stages (copy="tma", one
    launch, B rounded) at every large size; A column-major with B row-major: A copied first, then
    that kernel; both column-major: A through registers, direct stores. Without such a GPU
    (loads_without_spills False) the K-major copies first from PRETRANSPOSE_MIN rows stay."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    asked = []
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: asked.append(spec) or True)
    z = lambda r, c: np.zeros((r, c), np.float32)  # noqa: E731
    for M in (1024, mm.PRETRANSPOSE_MIN, 8192):
        rr = mm.explain(z(M, 1024), z(1024, 4096), allow_tf32=True)
        assert not rr.spec.pretranspose and rr.spec.register_operand == "B" and rr.spec.copy == "tma", (M, rr.spec)
        assert rr.spec.warp_specialized and "into registers and rounded" in rr.reason and "B is rounded" in rr.reason
    assert asked and all(s.copy == "tma" and s.register_operand == "B" for s in asked)
    col = mm.explain(z(4096, 1024), np.asfortranarray(z(1024, 4096)), allow_tf32=True)   # K-major already
    assert col.spec.register_operand is None and not col.spec.pretranspose
    cc = mm.explain(np.asfortranarray(z(4096, 1024)), np.asfortranarray(z(1024, 4096)), allow_tf32=True)
    assert (cc.spec.transposed_operands, cc.spec.register_operand, cc.spec.copy, cc.spec.store) == \
        ((), "A", "tma", "direct") and "A's k-steps loaded from its TMA stages into registers" in cc.reason
    for M in (1024, 4096):   # A column-major, B row-major: A copied K-major, then the register kernel
        cr = mm.explain(np.asfortranarray(z(M, 1024)), z(1024, 4096), allow_tf32=True)
        assert (cr.spec.pretranspose, cr.spec.transposed_operands, cr.spec.register_operand) == ("A", ("A",), "B")
        assert "copies A K-major, then the kernel of A and B row-major" in cr.reason
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: False)
    assert mm.explain(z(mm.PRETRANSPOSE_MIN, 1024), z(1024, 4096), allow_tf32=True).spec.pretranspose
    assert mm.explain(np.asfortranarray(z(4096, 1024)), z(1024, 4096), allow_tf32=True).spec.transposed_operands == \
        ("A", "B")
    cc = mm.explain(np.asfortranarray(z(4096, 1024)), np.asfortranarray(z(1024, 4096)), allow_tf32=True)
    assert cc.spec.transposed_operands == ("A",) and cc.spec.register_operand is None   # (copied, then K-major)


def test_tf32_with_65_to_128_rows_takes_wgmma_on_hopper(monkeypatch):
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    z = lambda r, c, col=False: np.asfortranarray(np.zeros((r, c), np.float32)) if col else np.zeros((r, c), np.float32)  # noqa: E731
    for (M, N, col), key in (((128, 8192, False), ("row", False, False)), ((65, 28672, False), ("row", True, False)),
                             ((128, 8192, True), ("col", False, False)), ((96, 28672, True), ("col", True, False)),
                             ((64, 28672, False), ("row", True, True)), ((33, 8192, True), ("col", False, True)),
                             ((40, 28672, True), ("col", True, True)), ((64, 8192, False), ("row", False, True))):
        want = mm.TF32_MID_ROWS[key]
        spec = mm.explain(z(M, 1024), z(1024, N, col), allow_tf32=True).spec
        assert (spec.instruction, tuple(spec.tile), spec.stages) == ("wgmma", want["tile"], want["stages"]), (M, N, col)
        # B row-major: the register kernel on TMA stages (C^T = B^T A^T, B's k-steps rounded into registers)
        assert col or (spec.copy == "tma" and spec.register_operand == "B" and spec.warp_specialized), spec
    assert mm.explain(z(32, 1024), z(1024, 8192, True), allow_tf32=True).spec.instruction == "mma.sync"   # SKINNY_SHORT
    assert mm.explain(z(129, 1024), z(1024, 8192), allow_tf32=True).spec.tile.m == 128               # past SKINNY
    assert mm.explain(z(128, 1024), z(1024, 8192)).spec.dtype == "f32"                                # not tf32


def test_large_f32_problems_on_hopper_split_into_tf32_parts(monkeypatch):
    """f32 without TF32 on Hopper, large: the operands' tf32 parts in one promoted wgmma product;
    smaller and older GPUs keep mma.sync's 3xTF32."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    z = lambda r, c: np.zeros((r, c), np.float32)  # noqa: E731
    choice = mm.explain(z(4096, 1024), np.asfortranarray(z(1024, 4096)))
    assert choice.spec.splits_operands and choice.spec.dtype == "f32" and "tf32 parts" in choice.reason
    assert "truncates" not in choice.reason and "fp8" not in choice.reason
    medium = mm.explain(z(1024, 1024), z(1024, 1024)).spec    # 64 blocks: the small tiles, promoted every 4
    assert medium.splits_operands and (tuple(medium.tile), medium.promote) == ((64, 128, 32), 4)
    assert tuple(mm.explain(z(2048, 1024), z(1024, 1024)).spec.tile) == (128, 128, 32)    # 128 blocks
    edge = mm.F32_PARTS_MIN
    assert mm.explain(z(edge, 1024), z(1024, 4096)).spec.splits_operands
    assert mm.explain(z(edge - 1, 1024), z(1024, 4096)).spec.instruction == "mma.sync"
    assert mm.explain(z(4096, 1024), z(1024, edge - 1)).spec.instruction == "mma.sync"
    assert mm.explain(z(512, 512), z(512, 512)).spec.instruction == "mma.sync"   # the host cost outweighs it
    assert mm.explain(z(2048, 64), z(64, 2048)).spec.instruction == "mma.sync"   # K < F32_PARTS_MIN, large preset
    assert mm.explain(z(8192, 1), z(1, 8192)).spec.instruction == "mma.sync"
    assert mm.size_class(1024, 1024, 1024) != mm.size_class(1024, 1024, 1023)
    assert mm.size_class(edge, 4096, 64) != mm.size_class(edge - 1, 4096, 64)
    monkeypatch.setattr(mm, "_target", lambda: "sm_80")
    assert mm.explain(z(4096, 1024), z(1024, 4096)).spec.instruction == "mma.sync"


def test_a_tuned_mma_sync_spec_does_not_replace_the_faster_wgmma_preset(monkeypatch):
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: tilegen.GemmSpec(dtype="f16", tile=(128, 256, 32), warps=(2, 4)))
    A = np.zeros((4096, 4096), np.float16)
    choice = mm.explain(A, A)
    assert choice.spec.instruction == "wgmma" and "autotuner's mma.sync spec skipped" in choice.reason
    medium = mm.explain(A[:512], A[:, :512])
    assert medium.spec.instruction == "wgmma" and "autotuner's mma.sync spec skipped" in medium.reason
    assert mm.explain(A[:64], A).spec.tile.n == 256      # a side of SMALL keeps the tuned spec
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: tilegen.GemmSpec(dtype="f32", tile=(128, 128, 32), warps=(2, 2)))
    F = np.zeros((1024, 1024), np.float32)                # f32's tf32 parts on wgmma, medium
    assert mm.explain(F, F).spec.splits_operands and "autotuner's mma.sync spec skipped" in mm.explain(F, F).reason
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: tilegen.GemmSpec(dtype="tf32", instruction="wgmma", stages=3))
    T = np.zeros((4096, 4096), np.float32)                # a tuned tf32 spec that feeds B through registers
    chosen = mm.explain(T, T, allow_tf32=True)
    assert chosen.spec.pretranspose and "K-major copy first" in chosen.reason


def test_a_tuned_wgmma_spec_is_used_on_hopper(monkeypatch):
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    tuned = tilegen.GemmSpec(dtype="f16", out_dtype="f16", instruction="wgmma", tile=(128, 128, 64), warps=(8, 1),
                             stages=5, group_m=16)
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: tuned)
    A = np.zeros((4096, 4096), np.float16)
    choice = mm.explain(A, A)
    assert choice.spec == tuned and "autotuner's cache" in choice.reason
    fused = mm.explain(A, A, bias=np.zeros(4096, np.float16), activation="relu").spec
    assert fused.tile == tuned.tile and fused.epilogue.activation == "relu" and fused.store == "tma"


def test_skinny_products_on_hopper_keep_more_in_flight(monkeypatch):
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    W = np.zeros((8192, 8192), np.float16)
    for m, rows in ((1, 16), (16, 16), (17, 32), (32, 32)):
        s = mm.explain(np.zeros((m, 8192), np.float16), W).spec
        assert (s.instruction, tuple(s.tile), tuple(s.warps), s.stages, s.target) == \
            ("mma.sync", (rows, 64, 128), (1, 4), 6, "sm_90"), m
        # ... and against W.T (B column-major) the swapped TMA kernel, 128-deep k-tiles, 8 stages (run 329);
        # with a bias per row of A still the mma.sync tiles
        c = mm.explain(np.zeros((m, 8192), np.float16), W.T)
        assert (c.spec.instruction, tuple(c.spec.tile), tuple(c.spec.warps), c.spec.stages, c.spec.swap_ab,
                c.spec.warp_specialized) == ("wgmma", (rows, 64, 128), (1, 4), 8, True, True), m
        assert "C^T = B^T A^T" in c.reason
        s = mm.explain(np.zeros((m, 8192), np.float16), W.T, bias=np.zeros(m, np.float16)).spec
        assert (s.instruction, tuple(s.tile), s.stages) == ("mma.sync", (rows, 64, 128), 6), m
    # f32 (3xTF32) and tf32 up to 32 rows: the same rows, 64-deep k-tiles; 128 columns where N is wide
    W32 = np.zeros((8192, 8192), np.float32)
    for m, n, tf32, want in ((1, 8192, None, ("f32", (16, 64, 64), 6)), (32, 8192, True, ("tf32", (32, 64, 64), 6)),
                             (16, 28672, True, ("tf32", (16, 128, 64), 4))):
        s = mm.explain(np.zeros((m, 8192), np.float32), np.zeros((8192, n), np.float32), allow_tf32=tf32).spec
        assert (s.dtype, tuple(s.tile), s.stages) == want and tuple(s.warps) == (1, 4), (m, n)
    assert tuple(mm.explain(np.zeros((33, 8192), np.float32), W32).spec.tile) != (32, 64, 64)
    for m in (33, 64):   # tf32 up to 64 rows, B row-major: the register kernel's 32x128 tiles (TF32_MID_ROWS)
        s = mm.explain(np.zeros((m, 8192), np.float32), W32, allow_tf32=True).spec
        assert (tuple(s.tile), tuple(s.warps), s.stages, s.copy) == ((32, 128, 32), (1, 8), 8, "tma"), m
    c = mm.explain(np.zeros((128, 8192), np.float16), W)
    assert (c.spec.instruction, tuple(c.spec.tile), c.spec.stages, c.spec.persistent) == ("wgmma", (64, 128, 128), 4, False)
    assert "skinny product" in c.reason and "M = 128 rows" in c.reason
    wide = mm.explain(np.zeros((64, 8192), np.float16), np.zeros((8192, 28672), np.float16)).spec
    assert (tuple(wide.tile), wide.stages) == ((64, 256, 64), 5)
    for m in (1, 16):   # many blocks: 64x128 tiles, 3 stages, two CTAs per SM
        few = mm.explain(np.zeros((m, 8192), np.float16), np.zeros((8192, 28672), np.float16)).spec
        assert (few.instruction, tuple(few.tile), few.stages) == ("mma.sync", (64, 128, 64), 3), m
        # ... but against W.T the swapped persistent TMA kernel (C^T = B^T A^T, 16 stages; run 228)
        c = mm.explain(np.zeros((m, 8192), np.float16), np.zeros((28672, 8192), np.float16).T)
        assert (c.spec.instruction, tuple(c.spec.tile), c.spec.stages, c.spec.swap_ab, c.spec.copy) == \
            ("wgmma", (16, 64, 64), 16, True, "tma") and "C^T = B^T A^T" in c.reason, m
    # past M = 64 one 128-row tile holds M: 128x256 tiles where N gives 96 of them, else 128x128 ones
    for m in (65, 96, 128):
        big = mm.explain(np.zeros((m, 8192), np.float16), np.zeros((8192, 28672), np.float16)).spec
        assert (tuple(big.tile), big.warp_specialized) == ((128, 256, 64), True), m
    mid = mm.explain(np.zeros((100, 8192), np.float16), np.zeros((8192, 16384), np.float16)).spec
    assert (tuple(mid.tile), mid.stages, mid.warp_specialized) == ((128, 128, 64), 4, True)
    # a short N, another GPU, or tf32: as before
    assert mm.explain(W, np.zeros((8192, 16), np.float16)).spec.stages == 3
    monkeypatch.setattr(mm, "_target", lambda: "sm_80")
    assert mm.explain(np.zeros((16, 8192), np.float16), W).spec.stages == 3


def test_fp8_decoding_products_on_hopper_stream_the_weight(monkeypatch):
    """fp8 with a few rows against a wide W.T on Hopper: up to SKINNY_SHORT rows (and up to SMALL
    against at most FP8_SWAP_MAX_N columns, 32-row tiles) the swapped warp-specialized kernel
    (C^T = B^T A^T, 16x64x128; 12 stages where K and N are large, else 8) promoted every k-tile with
    two accumulators, whether or not ptxas is there (its registers fit the JIT's); up to SKINNY rows the
    warp-specialized kernel's 64-row tiles (64x128 where they make SKINNY_WIDE_BLOCKS blocks, else
    64x64) promoted every k-tile with two accumulators where that loads without spills (else every
    2 k-tiles, and explain says why); past SKINNY rows, or a narrow N, as before."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_sm_count", lambda: 132)
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: True)
    f8 = ml_dtypes.float8_e4m3fn

    def choice(m, n, k=8192):
        return mm.explain(np.zeros((m, k), f8), np.zeros((n, k), f8).T)

    for spills in (False, True):
        monkeypatch.setattr(mm, "loads_without_spills", lambda spec: not spills)
        for m, n, k, stages in ((1, 8192, 8192, 12), (16, 4096, 4096, 8), (17, 28672, 8192, 12), (32, 4096, 14336, 12),
                                (1, 512, 4096, 8), (1, 4096, 8191, 8), (1, 4095, 8192, 8), (16, 2048, 8192, 8),
                                (33, 4096, 4096, 8), (64, 4096, 14336, 12), (64, 2048, 8192, 8)):
            c = choice(m, n, k)
            s = c.spec
            rows = 16 if m <= 32 else 32
            assert (s.instruction, tuple(s.tile), tuple(s.warps), s.stages, s.swap_ab, s.warp_specialized, s.promote,
                    s.frag_buffers, s.split_k) == ("wgmma", (rows, 64, 128), (1, 4), stages, True, True, 1, 2, 1), (m, n, k)
            assert "decoding's product" in c.reason and "C^T = B^T A^T" in c.reason and "two accumulators" in c.reason
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: True)
    for m, n, k, tile in ((33, 14336, 4096, (64, 128, 128)), (128, 8192, 8192, (64, 128, 128)),
                          (64, 8192, 8192, (64, 64, 128)), (128, 4096, 4096, (64, 64, 128)), (65, 4096, 14336, (64, 64, 128)),
                          (64, 4097, 4096, (64, 64, 128))):
        c = choice(m, n, k)
        s = c.spec
        assert (s.instruction, tuple(s.tile), s.stages, s.warp_specialized, s.promote, s.frag_buffers) == \
            ("wgmma", tile, 8 if tile[1] == 128 else 12, True, 1, 2), (m, n, k)
        assert "decoding's product" in c.reason and "two accumulators" in c.reason
    assert tuple(choice(129, 8192).spec.tile) == (128, 128, 128)   # past SKINNY rows: the preset
    assert choice(16, 256, 4096).spec.tile.m == 64                 # a narrow N: the small tile
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: False)
    c = choice(64, 28672)
    assert (tuple(c.spec.tile), c.spec.promote, c.spec.frag_buffers) == ((64, 128, 128), 2, 1)
    assert "promoted every 2 k-tiles" in c.reason


@pytest.mark.parametrize("spec", [dict(instruction="wgmma", b_layout="col", stages=8, **FP8_FEW_ROWS),
                                  dict(instruction="wgmma", b_layout="col", stages=12, **FP8_FEW_ROWS),
                                  dict(instruction="wgmma", b_layout="col", stages=8,
                                       **{**FP8_FEW_ROWS, "tile": (32, 64, 128)}),
                                  dict(instruction="wgmma", tile=(64, 128, 128), warps=(4, 1), stages=8, promote=1,
                                       frag_buffers=2),
                                  dict(instruction="wgmma", tile=(64, 64, 128), warps=(4, 1), stages=12, promote=1,
                                       frag_buffers=2)], ids=["swapped-s8", "swapped-s12", "swapped32", "wgmma64x128",
                                                              "wgmma64x64"])
def test_fp8_decoding_kernels_on_the_emulator(spec):
    """The fp8 decoding kernels on ragged shapes: a few rows (past 16: two blocks of the swapped
    kernel's rows; 40: two of the 32-row tile's), several blocks along N, K over 2 to 5 k-tiles of 128
    (odd and even counts for the two accumulators taking turns), per-tensor scales as alpha."""
    from bounds import fp8_wgmma_bound, gemm_bound

    k = tilegen.compile(tilegen.GemmSpec(dtype="e4m3", out_dtype="f32", **spec))
    rng = np.random.default_rng(8)
    for M, N, K in ((5, 300, 3 * 128 + 40), (17, 140, 512), (9, 70, 300), (3, 100, 640), (40, 130, 384)):
        A = rng.standard_normal((M, K)).astype(ml_dtypes.float8_e4m3fn)
        B = np.asfortranarray(rng.standard_normal((K, N)).astype(ml_dtypes.float8_e4m3fn))
        C = k(A, B, out=np.full((M, N), np.nan, np.float32), alpha=0.75, device="sim")
        ref = 0.75 * (A.astype(np.float64) @ B.astype(np.float64))
        scale = 0.75 * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)))
        bound = fp8_wgmma_bound(K, "f32", 128) if spec["instruction"] == "wgmma" else gemm_bound("f16", K, "f32")
        assert (np.abs(C - ref) <= bound * scale + 1e-6).all(), (M, N, K)


def test_the_choice_reads_the_shape_only_through_size_class(monkeypatch):
    """matmul remembers its choice per size_class, so two shapes of one class must get one spec.
    Every threshold of the rules sits at a small number or a multiple of 128: walking one
    dimension through those (and their neighbours) with the other fixed crosses each of them."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    walk = sorted(set(range(1, 131)) | {128 * k + d for k in range(1, 260) for d in (-1, 0, 1)})
    fixed = [1, 16, 17, 64, 65, 100, 128, 129, 512, 1000, 1024, 1536, 2048, 4096, 8192]
    arr = lambda r, c: np.broadcast_to(np.float16(0), (r, c))  # noqa: E731  (no memory)
    K = 512
    for target in ("sm_90", "sm_80"):
        monkeypatch.setattr(mm, "_target", lambda: target)
        for f in fixed:
            for shape in (lambda x: (f, x, K), lambda x: (x, f, K), lambda x: (f, f, x)):   # K walks too
                last_class = last_spec = None
                for x in walk:
                    M, N, k = shape(x)
                    cls = mm.size_class(M, N, k)
                    spec = mm.explain(arr(M, k), arr(k, N)).spec
                    if cls == last_class:
                        assert spec == last_spec, f"{target}: {M}x{N}x{k} and its neighbour share a class, not a spec"
                    last_class, last_spec = cls, spec


def test_fp8_choice_reads_the_shape_only_through_size_class(monkeypatch):
    """As the test above, for fp8 on Hopper, whose decoding rules count 64x128 blocks against
    SKINNY_WIDE_BLOCKS and K and N against the swapped kernel's deep thresholds: N walks every
    multiple of 32 and its neighbours, with M across the row thresholds; then K every multiple of
    128 and its neighbours; then M from 1 to 139 at N and K around the thresholds."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_sm_count", lambda: 132)
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: True)
    f8 = ml_dtypes.float8_e4m3fn
    arr = lambda r, c: np.broadcast_to(f8(0), (r, c))  # noqa: E731  (no memory)
    walk = sorted({32 * k + d for k in range(1, 900) for d in (-1, 0, 1)})
    shapes = [[(M, N, K) for N in walk] for M, K in ((1, 8192), (16, 8191), (17, 8192), (32, 4096), (33, 8192),
                                                     (65, 8192), (129, 8192))]
    shapes += [[(M, N, 128 * k + d) for k in range(1, 130) for d in (-1, 0, 1)] for M, N in ((1, 4096), (32, 8192),
                                                                                              (40, 4096))]
    shapes += [[(M, N, K) for M in range(1, 140)] for N in (4095, 4096, 4097, 8192) for K in (8191, 8192)]
    for line in shapes:   # (N walks, then K, then M)
        last_class = last_spec = None
        for M, N, K in line:
            cls = mm.size_class(M, N, K)
            spec = mm.explain(arr(M, K), arr(N, K).T).spec
            if cls == last_class:
                assert spec == last_spec, f"{M}x{N}x{K} and its neighbour share a class, not a spec"
            last_class, last_spec = cls, spec


def test_fp8_front_door_on_the_emulator():
    """fp8 arrays as torch._scaled_mm takes them (A row-major, B = W.T), per-tensor scales as
    numbers or one-element arrays multiplying alpha, the output dtype by name; clear refusals."""
    rng = np.random.default_rng(1)
    A = rng.standard_normal((70, 200)).astype(ml_dtypes.float8_e4m3fn)
    W = rng.standard_normal((90, 200)).astype(ml_dtypes.float8_e4m3fn)
    ref = A.astype(np.float64) @ W.T.astype(np.float64)
    C = tilegen.matmul(A, W.T, scale_a=0.5, scale_b=np.float32(4.0), out_dtype="f32", device="sim")
    assert C.dtype == np.float32 and np.max(np.abs(C - 2.0 * ref)) <= 1e-5 * np.max(np.abs(2.0 * ref))
    C2 = tilegen.matmul(A, W.T, scale_a=np.array([0.25], np.float32), device="sim")
    assert C2.dtype == ml_dtypes.bfloat16
    assert np.max(np.abs(C2.astype(np.float64) - 0.25 * ref)) <= 2 ** -8 * np.max(np.abs(0.25 * ref))
    assert "e4m3 operands" in tilegen.matmul.explain(A, W.T).reason
    sa, sb = rng.uniform(0.5, 2, 70).astype(np.float32), rng.uniform(0.5, 2, 90).astype(np.float32)
    C3 = tilegen.matmul(A, W.T, scale_a=sa, scale_b=sb, out_dtype="f32", device="sim")   # per row / per column
    want = ref * sa[:, None] * sb[None, :]
    assert np.max(np.abs(C3 - want)) <= 1e-5 * np.max(np.abs(want))
    c = tilegen.matmul.explain(A, W.T, scale_a=sa, scale_b=sb)
    assert c.spec.epilogue.scale_rows and c.spec.epilogue.scale_cols
    C4 = tilegen.matmul(A, W.T, scale_a=2.0, scale_b=sb, out_dtype="f32", device="sim")   # mixed kinds
    assert np.max(np.abs(C4 - 2.0 * ref * sb[None, :])) <= 1e-5 * np.max(np.abs(2.0 * ref * sb[None, :]))
    # torch._scaled_mm's row-wise shapes: scale_a M x 1, scale_b 1 x N
    C5 = tilegen.matmul(A, W.T, scale_a=sa[:, None], scale_b=sb[None, :], out_dtype="f32", device="sim")
    assert np.max(np.abs(C5 - want)) <= 1e-5 * np.max(np.abs(want))
    for bad in (dict(scale_a=sa[None, :]), dict(scale_b=sb[:, None]), dict(scale_a=np.ones((70, 2), np.float32))):
        with pytest.raises(tilegen.LaunchError, match="as torch._scaled_mm takes it|must be a number"):
            tilegen.matmul(A, W.T, out_dtype="f32", device="sim", **bad)
    with pytest.raises(tilegen.LaunchError, match="scale_a has 3 elements"):
        tilegen.matmul(A, W.T, scale_a=np.ones(3, np.float32), device="sim")
    with pytest.raises(tilegen.LaunchError, match="out_dtype='int8'"):
        tilegen.matmul(A, W.T, out_dtype="int8", device="sim")
    with pytest.raises(tilegen.LaunchError, match="pass W.T"):
        tilegen.matmul(A, np.ascontiguousarray(W.T), device="sim")
    # K-major by their strides: a K-sliced W.T, a reversed one, one column, K = 1
    a, w = A[:16, :48], W[:24, :48]
    for x, y in ((a[:, :32], w[:, :32].T), (a, w[::-1].T), (a, w[:1].T), (a[:, :1], w[:, :1].T)):
        got = tilegen.matmul(x, y, out_dtype=np.float32, device="sim")   # (a numpy scalar type names the dtype)
        want = x.astype(np.float64) @ y.astype(np.float64)
        assert got.dtype == np.float32 and np.max(np.abs(got - want)) <= 1e-5 * max(1.0, np.max(np.abs(want)))


def test_per_tensor_scales_in_device_memory_on_the_emulator():
    """Epilogue(device_scale_a=, device_scale_b=): the kernel reads each per-tensor scale (one f32)
    from memory and multiplies it into alpha, beside a vector of the other operand's; a kernel
    that reads them refuses calls without them, or with more than one element."""
    rng = np.random.default_rng(3)
    A = rng.standard_normal((40, 96)).astype(ml_dtypes.float8_e4m3fn)
    W = rng.standard_normal((56, 96)).astype(ml_dtypes.float8_e4m3fn)
    ref = A.astype(np.float64) @ W.T.astype(np.float64)
    spec = tilegen.GemmSpec(dtype="e4m3", tile=(32, 32, 64), warps=(1, 1),
                            epilogue=tilegen.Epilogue(device_scale_a=True, device_scale_b=True))
    k = tilegen.compile(spec)
    C = k(A, W.T, scale_a=np.array([0.5], np.float32), scale_b=np.array([[4.0]], np.float32), alpha=-1.5,
          device="sim")
    assert np.max(np.abs(C - (-3.0) * ref)) <= 1e-5 * np.max(np.abs(3.0 * ref))
    sb = rng.uniform(0.5, 2, 56).astype(np.float32)
    k2 = tilegen.compile(spec.replace(epilogue=tilegen.Epilogue(device_scale_a=True, scale_cols=True)))
    C2 = k2(A, W.T, scale_a=np.float32(0.25).reshape(()), scale_b=sb, device="sim")
    assert np.max(np.abs(C2 - 0.25 * ref * sb[None, :])) <= 1e-5 * np.max(np.abs(ref * sb[None, :]))
    with pytest.raises(tilegen.LaunchError, match="reads scale_b from device memory: pass scale_b="):
        k(A, W.T, scale_a=np.array([0.5], np.float32), device="sim")
    with pytest.raises(tilegen.LaunchError, match=r"scale_a has shape \(2,\): this kernel reads scale_a as one f32"):
        k(A, W.T, scale_a=np.ones(2, np.float32), scale_b=np.ones(1, np.float32), device="sim")
    with pytest.raises(tilegen.SpecError, match="one scale per operand"):
        tilegen.Epilogue(scale_rows=True, device_scale_a=True)
    with pytest.raises(tilegen.SpecError, match="scales per row or column or in device memory"):
        tilegen.GemmSpec(dtype="bf16", instruction="wgmma", batched=True, copy="tma",
                         epilogue=tilegen.Epilogue(device_scale_a=True))


def test_numbers_and_arrays_that_are_not_real_are_refused():
    """alpha, beta and scales must be real numbers, bias and residual arrays of real numbers:
    complex or string values are refused instead of losing their imaginary part or being
    parsed, lists instead of being taken for GPU arrays; allow_tf32 and device are checked."""
    A, B = np.ones((4, 8), np.float16), np.ones((8, 6), np.float16)
    for kw, says in ((dict(alpha=np.complex64(1 + 1j)), "alpha must be a real number"),
                     (dict(alpha="3"), "alpha must be a real number"),
                     (dict(alpha=10 ** 400), "within float64's range"),
                     (dict(bias=np.full(6, 1 + 5j, np.complex64)), "bias has dtype complex64"),
                     (dict(bias=np.array(["1e3"] * 6)), "bias has dtype <U3"),
                     (dict(residual=np.full((4, 6), 2j)), "residual has dtype complex128"),
                     (dict(residual=np.ones((4, 6)).tolist()), "residual must be an array (numpy, torch or CuPy), "
                                                               "not a list"),
                     (dict(bias=[1.0] * 6), "bias must be an array")):
        with pytest.raises(tilegen.LaunchError, match=re.escape(says)):
            tilegen.matmul(A, B, device="sim", **kw)
    with pytest.raises(tilegen.LaunchError, match="out has dtype >f2; matmul writes float16, bfloat16 or float32"):
        tilegen.matmul(A, B, out=np.zeros((4, 6), ">f2"), device="sim")
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(6, np.float32), (4, 6), (0, 4))
    with pytest.raises(tilegen.LaunchError, match="its elements overlap"):
        tilegen.matmul(A, B, out=overlapping, device="sim")
    with pytest.raises(tilegen.LaunchError, match="device=True; allowed"):
        tilegen.matmul(A, B, device=True)
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(32, 32, 32), warps=(1, 1)))
    with pytest.raises(tilegen.LaunchError, match="a per-tensor scale goes into alpha"):
        k(A, B, scale_a=2.0, device="sim")     # a kernel's scales are vectors
    with pytest.raises(tilegen.LaunchError, match="beta must be a real number"):
        k(A, B, out=np.zeros((4, 6), np.float32), beta=np.complex128(0.5 + 1j), device="sim")
    with pytest.raises(tilegen.LaunchError, match="allow_tf32='no'; allowed: True, False or None"):
        tilegen.matmul(A.astype(np.float32), B.astype(np.float32), allow_tf32="no", device="sim")
    A8 = np.ones((16, 32)).astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(tilegen.LaunchError, match="scale_a must be a real number"):
        tilegen.matmul(A8, A8.T, scale_a=np.complex64(1), device="sim")


def test_fp8_on_hopper_takes_the_wgmma_kernel(monkeypatch):
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    f8 = lambda r, c: np.broadcast_to(ml_dtypes.float8_e4m3fn(0), (r, c))  # noqa: E731
    c = mm.explain(f8(1000, 4096), np.asfortranarray(f8(4096, 1000)))
    assert (c.spec.instruction, c.spec.promote, tuple(c.spec.tile)) == ("wgmma", 2, (128, 128, 128))
    assert "promoted to an f32 total every 2 k-tiles" in c.reason and c.spec.out_dtype == "bf16"
    assert "0.4-0.5% above cuBLASLt's error" in c.reason and "ptxas" in c.reason     # why not every k-tile
    assert mm.explain(f8(32, 4096), np.asfortranarray(f8(4096, 256))).spec.instruction == "mma.sync"   # (small)
    # promoted every k-tile (cuBLASLt's error) where that kernel keeps its registers (ptxas assembled it)
    asked = []
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: asked.append(spec) or True)
    c = mm.explain(f8(1000, 4096), np.asfortranarray(f8(4096, 1000)))
    assert (c.spec.promote, c.spec.frag_buffers, tuple(c.spec.tile)) == (1, 2, (128, 128, 128)) and asked == [c.spec]
    assert "promoted to an f32 total every k-tile" in c.reason and "as cuBLASLt does" in c.reason
    assert "two accumulators taking turns" in c.reason and "above cuBLASLt" not in c.reason


def test_wide_fp8_tiles_only_where_the_kernel_keeps_its_registers(monkeypatch):
    """fp8 over 6144^2 outputs with K >= 1024: 128x192 tiles promoted every k-tile (the warpgroups
    staggered by half a k-tile) where the loaded kernel does not spill (loads_without_spills, asked
    about that spec itself), else 128x128 promoted every k-tile (two accumulators taking turns)
    where that one does not, else the 128x128 preset; smaller areas or K never ask about 128x192."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    asked = []
    fits = {"answer": True}

    def loads(spec):
        asked.append(spec)
        return fits["answer"]

    monkeypatch.setattr(mm, "loads_without_spills", loads)
    f8 = lambda r, c: np.broadcast_to(ml_dtypes.float8_e4m3fn(0), (r, c))  # noqa: E731
    wide = mm.explain(f8(6144, 1024), np.asfortranarray(f8(1024, 6144)))
    assert tuple(wide.spec.tile) == (128, 192, 128) and "128x192 tiles" in wide.reason and "ptxas" in wide.reason
    assert [(tuple(s.tile), s.promote, s.frag_buffers) for s in asked] == [((128, 192, 128), 1, 1)]
    assert asked[0] == wide.spec and wide.spec.warp_specialized and "staggered by half a k-tile" in wide.reason
    asked.clear()
    for M, N, K in ((6143, 6144, 4096), (6144, 6144, 1023), (4096, 4096, 8192), (8192, 8192, 512)):
        c = mm.explain(f8(M, K), np.asfortranarray(f8(K, N)))
        assert tuple(c.spec.tile) == (128, 128, 128) and "128x192" not in c.reason, (M, N, K)
    assert [(tuple(s.tile), s.promote, s.frag_buffers) for s in asked] == [((128, 128, 128), 1, 2)] * 4
    fits["answer"] = False   # a kernel that would spill (no ptxas, or ptxas spills too): the preset
    asked.clear()
    c = mm.explain(f8(8192, 8192), np.asfortranarray(f8(8192, 8192)))
    assert (tuple(c.spec.tile), c.spec.promote, c.spec.frag_buffers) == ((128, 128, 128), 2, 1)
    assert "128x192" not in c.reason and len(asked) == 2
    # the thresholds are in the choice key: the fast path's memo cannot hand one side's kernel to the other
    assert mm.size_class(6144, 6144, 4096) != mm.size_class(6143, 6144, 4096)
    assert mm.size_class(6144, 6144, 1024) != mm.size_class(6144, 6144, 1023)


def test_loads_without_spills_needs_a_gpu_and_ptxas(monkeypatch):
    """Without a GPU, or with no ptxas to assemble it, the wide spec is not loaded (the driver's JIT
    is known to spill it) and the answer is no; the answer is remembered per spec."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", instruction="wgmma", b_layout="col", tile=(128, 192, 128))
    monkeypatch.setattr(mm, "_NO_SPILLS", {})
    monkeypatch.setattr(mm, "compile_gemm", lambda s: pytest.fail("loaded without a GPU or ptxas"))
    monkeypatch.setattr(mm.runtime, "gpu_available", lambda: False)
    assert mm.loads_without_spills(spec) is False
    monkeypatch.setattr(mm, "_NO_SPILLS", {})
    monkeypatch.setattr(mm.runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(mm, "find_ptxas", lambda: None)
    assert mm.loads_without_spills(spec) is False

    class Loaded:
        def __init__(self, local):
            self.local = local

        def function(self, device):
            import warnings
            warnings.warn("spills", tilegen.PerformanceWarning)   # (the probe keeps it quiet)
            return type("F", (), {"local_bytes": self.local})()

    monkeypatch.setattr(mm, "find_ptxas", lambda: "ptxas")
    for local, answer in ((0, True), (548, False)):
        monkeypatch.setattr(mm, "_NO_SPILLS", {})
        monkeypatch.setattr(mm, "compile_gemm", lambda s, local=local: Loaded(local))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert mm.loads_without_spills(spec) is answer
        monkeypatch.setattr(mm, "compile_gemm", lambda s: pytest.fail("asked twice"))
        assert mm.loads_without_spills(spec) is answer


def test_prepared_arguments_name_what_they_take():
    """FastCall.arguments takes the canonical tuple, scale pointers included; a short tuple (the
    bench and tools once passed 14 values) is refused with the list of what it takes, not an
    IndexError from inside."""
    spec = tilegen.GemmSpec(dtype="e4m3", out_dtype="bf16", target="sm_89",
                            epilogue=tilegen.Epilogue(scale_rows=True, scale_cols=True))
    fc = tilegen.compile(spec).fast_call
    values = (64, 64, 64, 4096, 64, 8192, 64, 12288, 64, 1.0, 0.0, 0, 0, 0)
    with pytest.raises(ValueError, match=r"takes 16 values \(M, N, K, .*scale_a_ptr, scale_b_ptr\), got 14"):
        fc.arguments(values)
    args = fc.arguments(values + (16384, 20480))
    names = [n for n, _ in tilegen.compile(spec).params]
    assert args[names.index("scale_a_ptr")] == 16384 and args[names.index("scale_b_ptr")] == 20480


def test_an_empty_inner_dimension(monkeypatch):
    """K = 0: C = act(beta * C + bias) of a zero product, as numpy's A @ B is zeros. TMA
    describes no empty matrix: matmul multiplies 16 columns of zeros instead (any kernel takes
    them), and a TMA kernel called directly refuses with what to do."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    A, B = np.zeros((300, 0), np.float16), np.zeros((0, 260), np.float16)
    bias = np.arange(260, dtype=np.float16) - 100
    C = tilegen.matmul(A, B, bias=bias, activation="relu", device="sim")
    assert C.shape == (300, 260) and (C == np.maximum(bias.astype(np.float32), 0)[None, :]).all()
    C0 = np.full((300, 260), 2.0, np.float32)
    assert (tilegen.matmul(A, B, out=C0, beta=0.5, device="sim") == 1.0).all()
    a, b = mm.zero_operands(A, B)
    assert a.shape == (300, 16) and b.shape == (16, 260) and not a.any() and not b.any()
    _, b8 = mm.zero_operands(A.astype(ml_dtypes.float8_e4m3fn), B.astype(ml_dtypes.float8_e4m3fn))
    assert b8.flags.f_contiguous and not b8.flags.c_contiguous   # fp8's B K-major
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    choice = mm.explain(np.zeros((4096, 0), np.float16), np.zeros((0, 4096), np.float16))
    assert choice.spec.copy == "tma" and choice.reason.startswith("K = 0: A @ B is all zeros")
    fp8 = mm.explain(np.zeros((4096, 0), ml_dtypes.float8_e4m3fn), np.zeros((0, 4096), ml_dtypes.float8_e4m3fn))
    assert fp8.spec.dtype == "e4m3" and fp8.spec.b_layout == "col"   # an empty B has no layout: K-major
    tma = tilegen.compile(tilegen.GemmSpec(dtype="f16", instruction="wgmma"))
    with pytest.raises(tilegen.LaunchError, match=r"K = 0.*tilegen.matmul computes it.*copy='cp.async'"):
        tma(A, B, device="sim")
    pp = tilegen.compile(tilegen.GemmSpec(dtype="f16", instruction="wgmma", pingpong=True, tile=(64, 256, 64),
                                          warps=(4, 1)))
    with pytest.raises(tilegen.LaunchError, match=r"K = 0.*as in numpy\)$"):   # no cp.async advice it cannot take
        pp(A, B, device="sim")
    torch = pytest.importorskip("torch")
    with pytest.raises(tilegen.LaunchError, match="two arrays of one library"):
        mm.zero_operands(A, torch.zeros((0, 260), dtype=torch.float16))


@pytest.mark.parametrize("dtype, tile", [("bf16", (16, 64, 128)), ("f16", (32, 64, 128)), ("f32", (16, 64, 64)),
                                         ("tf32", (32, 128, 64))])
def test_skinny_tiles_on_the_emulator(dtype, tile):
    """The skinny products' 16- and 32-row tiles (four warps along N) on ragged shapes."""
    from bounds import gemm_bound

    from tilegen.arch.dtypes import numpy_dtype

    spec = tilegen.GemmSpec(dtype=dtype, out_dtype="f32", tile=tile, warps=(1, 4), stages=4, target="sm_90")
    rng = np.random.default_rng(5)
    M, N, K = tile[0] - 3, 2 * tile[1] + 5, 2 * tile[2] + 9
    A = rng.standard_normal((M, K)).astype(numpy_dtype(dtype))
    B = rng.standard_normal((K, N)).astype(numpy_dtype(dtype))
    C = tilegen.compile(spec)(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    assert (np.abs(C - ref) <= gemm_bound("f16" if dtype in ("f16", "bf16") else dtype, K, "f32") * scale + 1e-6).all()


@pytest.mark.parametrize("dtype, rows", [("bf16", 16), ("f16", 32)])
def test_swapped_skinny_tiles_on_the_emulator(dtype, rows):
    """The swapped 16-bit kernel with 128-deep k-tiles (matmul's up to SKINNY_SHORT rows against a
    narrower W.T) on ragged shapes: rows of A short of the tile, N past whole 64-column blocks, K past
    whole k-tiles (odd and even counts), a poisoned output."""
    from bounds import gemm_bound

    from tilegen.arch.dtypes import numpy_dtype
    from tilegen.gemm.matmul import SKINNY_SWAPPED_NARROW

    spec = tilegen.GemmSpec(dtype=dtype, out_dtype="f32", instruction="wgmma", b_layout="col", tile=(rows, 64, 128),
                            **SKINNY_SWAPPED_NARROW)
    kernel = tilegen.compile(spec)
    rng = np.random.default_rng(9)
    for M, N, K in ((rows - 3, 2 * 64 + 5, 2 * 128 + 9), (rows, 70, 3 * 128)):
        A = rng.standard_normal((M, K)).astype(numpy_dtype(dtype))
        B = np.asfortranarray(rng.standard_normal((K, N)).astype(numpy_dtype(dtype)))
        C = kernel(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
        ref = A.astype(np.float64) @ B.astype(np.float64)
        scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
        assert (np.abs(C - ref) <= gemm_bound("f16", K, "f32") * scale + 1e-6).all(), (M, N, K)


def test_swapped_kernels_take_a_column_major_a(monkeypatch):
    """swap_ab with A column-major (A's stage keeps its memory order: only tf32's register path
    copies it transposed): matmul picks the swapped kernel for a skinny A^T view against a wide
    W.T, and the kernel multiplies it right on the emulator, by TMA and by cp.async; a stack of such
    products with K under STACK_SWAP_MIN_K takes an unswapped batched kernel."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_sm_count", lambda: 132)
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    W = np.zeros((24576, 520), np.float16)
    spec = mm.explain(np.zeros((520, 16), np.float16).T, W.T).spec
    assert spec.swap_ab and spec.a_layout == "col"
    tilegen.compile(spec)
    stack = mm.explain(np.zeros((2, 16, 512), np.float16), np.zeros((2, 24576, 512), np.float16).transpose(0, 2, 1))
    assert stack.spec.batched and not stack.spec.swap_ab
    rng = np.random.default_rng(4)
    A = rng.standard_normal((300, 13)).astype(ml_dtypes.bfloat16).T
    Wt = rng.standard_normal((200, 300)).astype(ml_dtypes.bfloat16).T
    ref = A.astype(np.float64) @ Wt.astype(np.float64)
    for copy, persistent in (("tma", True), ("cp.async", False)):
        k = tilegen.compile(tilegen.GemmSpec(dtype="bf16", out_dtype="f32", instruction="wgmma", swap_ab=True,
                                             a_layout="col", b_layout="col", copy=copy, persistent=persistent,
                                             tile=(16, 64, 64), warps=(1, 4), stages=8))
        C = k(A, Wt, device="sim")
        assert np.abs(C - ref).max() <= 2 ** -20 * np.abs(ref).max() + 1e-6, copy


def test_swapped_skinny_products_on_the_emulator():
    """matmul's SKINNY_SWAPPED kernel (C^T = B^T A^T on the persistent TMA kernel) against W.T, with
    the epilogue it stores directly, transposed: alpha, beta (C read), a bias per column, GELU and a
    residual; ragged rows, columns and K over several blocks per CTA."""
    import importlib

    from bounds import gemm_bound

    mm = importlib.import_module("tilegen.gemm.matmul")
    spec = tilegen.GemmSpec(dtype="bf16", out_dtype="f32", instruction="wgmma", b_layout="col",
                            epilogue=tilegen.Epilogue("col", "gelu_tanh", True), **mm.SKINNY_SWAPPED)
    k = tilegen.compile(spec)
    assert spec.warp_specialized and spec.store == "direct"
    rng = np.random.default_rng(9)
    M, N, K = 11, 333, 1100
    A = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    W = rng.standard_normal((N, K)).astype(ml_dtypes.bfloat16)
    bias, R, C0 = (rng.standard_normal(s).astype(np.float32) for s in (N, (M, N), (M, N)))
    out = C0.copy()
    C = k(A, W.T, out=out, alpha=1.5, beta=0.25, bias=bias, residual=R, device="sim")
    prod = A.astype(np.float64) @ W.T.astype(np.float64)
    x = 1.5 * prod + 0.25 * C0 + bias
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))) + R
    scale = 1.5 * np.abs(A.astype(np.float64)) @ np.abs(W.T.astype(np.float64)) + np.abs(x) + np.abs(want)
    assert C is out and (np.abs(C - want) <= gemm_bound("f16", K, "f32") * scale + 1e-6).all()


@pytest.mark.parametrize("key", [k for k in __import__("tilegen.gemm.matmul", fromlist=["x"]).TF32_MID_ROWS
                                 if k[0] == "row"])
def test_tf32_mid_rows_register_tiles_on_the_emulator(key):
    """Each tile TF32_MID_ROWS gives a row-major B (the register kernel on TMA stages) on the emulator,
    ragged in every dimension, within tf32's bound (B rounded, A^T truncated)."""
    from bounds import gemm_bound
    from seeds import seed
    from tilegen.gemm.matmul import TF32_MID_ROWS

    spec = tilegen.GemmSpec(dtype="tf32", out_dtype="f32", instruction="wgmma", target="sm_90a", **TF32_MID_ROWS[key])
    assert spec.register_operand == "B" and spec.warp_specialized
    rng = np.random.default_rng(seed(*key))
    M, N, K = spec.tile.m + 7, spec.tile.n + 21, 3 * spec.tile.k + 5
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = tilegen.compile(spec)(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A).astype(np.float64) @ np.abs(B).astype(np.float64)
    assert np.all(np.abs(C - ref) <= gemm_bound("tf32", K, truncated=True) * scale)


def test_medium_tf32_takes_the_largest_tile_that_keeps_half_the_sms_busy(monkeypatch):
    """tf32 below the large preset on Hopper (A row-major, past the skinny rules): warp-specialized
    wgmma (B row-major: the register kernel), the largest of TF32_MEDIUM_TILES whose blocks fill half
    the SMs, else the smallest; the 256-row register tile only where it loads without spills."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    monkeypatch.setattr(mm, "_sm_count", lambda: 132)
    spills = [False]
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: not spills[0])
    z = lambda r, c, col=False: np.asfortranarray(np.zeros((r, c), np.float32)) if col else np.zeros((r, c), np.float32)  # noqa: E731
    for (M, N, col), want in (((512, 512, False), (64, 128)), ((1024, 2048, False), (128, 128)),
                              ((1536, 1536, False), (256, 128)), ((256, 8192, False), (128, 128)),
                              ((768, 4096, False), (256, 128)), ((1024, 1024, True), (64, 128)),
                              ((512, 8192, True), (128, 256)), ((256, 8192, True), (128, 128))):
        c = mm.explain(z(M, 1024), z(1024, N, col), allow_tf32=True)
        s = c.spec
        assert (s.instruction, s.warp_specialized, (s.tile.m, s.tile.n)) == ("wgmma", True, want), (M, N, col, s)
        assert (s.register_operand == "B") != col and "medium tf32 product" in c.reason, c.reason
    spills[0] = True   # (no ptxas: the 256-row register tile would spill under the driver's JIT)
    assert tuple(mm.explain(z(1536, 1024), z(1024, 1536), allow_tf32=True).spec.tile)[:2] == (128, 128)
    assert mm.explain(z(1024, 1024, True), z(1024, 1024), allow_tf32=True).spec.instruction == "mma.sync"  # A col
    assert mm.explain(z(1024, 1024), z(1024, 1024)).spec.dtype == "f32"                                   # no tf32


@pytest.mark.parametrize("fields", [f for f in __import__("tilegen.gemm.matmul", fromlist=["x"]).TF32_MEDIUM_TILES["col"]
                                    if f])
def test_medium_tf32_k_major_tiles_on_the_emulator(fields):
    """The K-major medium tf32 tiles (TF32_MEDIUM_TILES) on the emulator, ragged, within tf32's bound."""
    from bounds import gemm_bound

    spec = tilegen.GemmSpec(dtype="tf32", out_dtype="f32", b_layout="col", instruction="wgmma", target="sm_90a",
                            **fields)
    rng = np.random.default_rng(spec.tile.m)
    M, N, K = spec.tile.m + 9, spec.tile.n + 3, 2 * spec.tile.k + 7
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = np.asfortranarray(rng.standard_normal((K, N)).astype(np.float32))
    C = tilegen.compile(spec)(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A).astype(np.float64) @ np.abs(B).astype(np.float64)
    assert np.all(np.abs(C - ref) <= gemm_bound("tf32", K, truncated=True) * scale)


def test_pretranspose_a_copies_a_alone_then_takes_b_through_registers():
    """GemmSpec(pretranspose="A") (A column-major, B row-major): a first kernel copies A K-major, then
    the register kernel of A and B row-major runs; on the emulator, ragged, within tf32's bound; the
    spec refuses other layouts and says why."""
    from bounds import gemm_bound

    spec = tilegen.GemmSpec(dtype="tf32", out_dtype="f32", a_layout="col", b_layout="row", instruction="wgmma",
                            target="sm_90a", pretranspose="A")
    assert spec.transposed_operands == ("A",) and spec.kernel_spec.register_operand == "B"
    assert (spec.kernel_spec.a_layout, spec.kernel_spec.b_layout, spec.kernel_spec.copy) == ("row", "row", "tma")
    rng = np.random.default_rng(31)
    k = tilegen.compile(spec)
    for M, N, K in ((70, 150, 100), (200, 300, 97)):
        A = np.asfortranarray(rng.standard_normal((M, K)).astype(np.float32))
        B = rng.standard_normal((K, N)).astype(np.float32)
        C = k(A, B, out=np.full((M, N), np.nan, np.float32), device="sim")
        ref = A.astype(np.float64) @ B.astype(np.float64)
        scale = np.abs(A).astype(np.float64) @ np.abs(B).astype(np.float64)
        assert np.all(np.abs(C - ref) <= gemm_bound("tf32", K, truncated=True) * scale), (M, N, K)
    for a, b in (("row", "row"), ("col", "col")):
        with pytest.raises(tilegen.SpecError, match="built for A column-major with B row-major"):
            tilegen.GemmSpec(dtype="tf32", a_layout=a, b_layout=b, instruction="wgmma", pretranspose="A")
    with pytest.raises(tilegen.SpecError, match="True, False or 'A'"):
        tilegen.GemmSpec(dtype="tf32", a_layout="col", instruction="wgmma", pretranspose="B")


def test_swap_ab_alone_takes_the_swapped_kernels_defaults():
    """GemmSpec(swap_ab=True) and nothing else about the tile: the defaults are the swapped
    kernel's (16 rows of A by 64 columns of B, one warpgroup: what matmul runs decoding with),
    not the unswapped kernel's, whose warps the swapped kernel refuses."""
    spec = tilegen.GemmSpec(dtype="bf16", instruction="wgmma", swap_ab=True)
    assert (tuple(spec.tile), tuple(spec.warps)) == ((16, 64, 64), (1, 4))
    rng = np.random.default_rng(6)
    A = rng.standard_normal((5, 72)).astype(ml_dtypes.bfloat16)
    B = rng.standard_normal((72, 70)).astype(ml_dtypes.bfloat16)
    C = tilegen.compile(spec)(A, B, device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C.astype(np.float64) - ref).max() <= 2 ** -20 * np.abs(ref).max() + 1e-6


def test_host_scale_vectors_of_other_reals_are_taken_as_float32():
    """A float64 (or integer) scale per row on the host is converted to the float32 the kernel
    reads, as a bias is; one of booleans is refused, saying what a scale is."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 32)).astype(ml_dtypes.float8_e4m3fn)
    B = np.asfortranarray(rng.standard_normal((32, 24)).astype(ml_dtypes.float8_e4m3fn))
    sa = rng.random(16) + 0.5
    ref = sa[:, None] * (A.astype(np.float64) @ B.astype(np.float64))
    for scale in (sa, sa.astype(np.float32)):
        C = tilegen.matmul(A, B, scale_a=scale, device="sim")
        assert np.abs(C.astype(np.float64) - ref).max() <= 2 ** -8 * np.abs(ref).max()
    with pytest.raises(tilegen.LaunchError, match="scale_a is a bool vector; scales per row / column are float32"):
        tilegen.matmul(A, B, scale_a=np.ones(16, bool), device="sim")


def test_numpy_operands_with_16_byte_rows_are_not_copied_on_the_host():
    """Host arrays whose rows are whole multiples of 16 bytes, back to back, go to the device as they
    are (no padded copy), and such an out receives C directly; other rows are padded; both right."""
    from tilegen.gemm import call

    a = np.ones((5, 8), np.float16)
    assert call._pitched(a)[0] is a and call._pitched(a)[1] == 8
    for bad in (np.ones((5, 6), np.float16), np.asfortranarray(np.ones((5, 8), np.float16)), np.ones((5, 16), np.float16)[:, :8]):
        copy, ld = call._pitched(bad)
        assert copy is not bad and ld % 8 == 0 and (copy[:, :bad.shape[1]] == bad).all()
    rng = np.random.default_rng(11)
    for N in (24, 20):   # (48-byte rows as they are; 40-byte rows padded)
        A = rng.standard_normal((40, 32)).astype(np.float16)
        B = rng.standard_normal((32, N)).astype(np.float16)
        C0 = rng.standard_normal((40, N)).astype(np.float16)
        out = C0.copy()
        got = tilegen.matmul(A, B, alpha=0.5, beta=-1.0, out=out, device="sim")
        ref = 0.5 * (A.astype(np.float64) @ B.astype(np.float64)) - C0
        assert got is out and np.abs(out - ref).max() <= 2e-3 * (1 + np.abs(ref).max()), N


def test_explain_refuses_a_device_matmul_refuses():
    A, B = _pair(5, 7, 9, np.float16)
    with pytest.raises(tilegen.LaunchError, match=r"device='xyz'; allowed: None, 'gpu'"):
        tilegen.matmul.explain(A, B, device="xyz")
    assert tilegen.matmul.explain(A, B, device="sim").spec.dtype == "f16"


def test_a_wider_bias_rounded_to_a_16_bit_output_is_said_once(monkeypatch):
    """The epilogue adds bias and residual in the output's dtype: an f32 bias with a bf16 output
    is rounded first (where it cancels the product, its low bits were the answer). Said once, at
    the caller's line; a bias that rounds exactly, or one given in the output's dtype, is not."""
    import importlib
    import warnings

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_narrowed", set())
    A, B = np.ones((1, 8), np.float32), np.full((8, 2), -125.0, np.float32)   # A @ B = -1000 (exact)
    bias = np.array([1000.3, 1001.7], np.float32)
    with pytest.warns(tilegen.PrecisionWarning, match=r"bias is float32 and is rounded to the bfloat16 output's") as said:
        C = tilegen.matmul(A, B, bias=bias, out_dtype="bf16", device="sim")
    assert said[0].filename == __file__
    assert (C.astype(np.float32) == (-1000 + bias.astype(ml_dtypes.bfloat16).astype(np.float32))).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tilegen.matmul(A, B, bias=bias, out_dtype="bf16", device="sim")                        # (once)
        tilegen.matmul(A, B, bias=np.array([3.0, -4.0], np.float32), out_dtype="bf16", device="sim")   # exact
        tilegen.matmul(A, B, bias=bias.astype(ml_dtypes.bfloat16), out_dtype="bf16", device="sim")
        C = tilegen.matmul(A, B, bias=bias, out_dtype="f32", device="sim")
    assert np.abs(C - (bias - 1000)).max() < 1e-3


def test_explain_says_why_k_is_not_split_where_blocks_leave_sms_idle(monkeypatch):
    """Short and skinny products on Hopper: explain says why split-K / stream-K were not taken
    where the chosen tiles give under two waves of blocks, and not for products that fill the GPU."""
    import importlib

    mm = importlib.import_module("tilegen.gemm.matmul")
    monkeypatch.setattr(mm, "_target", lambda: "sm_90")
    monkeypatch.setattr(mm, "_tuned", lambda *a, **k: None)
    monkeypatch.setattr(mm, "loads_without_spills", lambda spec: True)
    rng = np.random.default_rng(0)
    for m, n, k in ((1024, 1024, 4096), (1024, 4096, 4096), (16, 8192, 8192)):
        A, B = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)
        why = mm.explain(A, B).reason
        assert "K not split although" in why and "perf_notes.md sections 24, 26, 44" in why, why
    why = mm.explain(rng.standard_normal((1024, 4096)).astype(np.float16),
                     rng.standard_normal((4096, 4096)).astype(np.float16)).reason
    assert "128 blocks leave 4 of 132 SMs idle" in why, why   # 128x256 tiles
    A = rng.standard_normal((8192, 1024)).astype(np.float16)
    B = rng.standard_normal((1024, 8192)).astype(np.float16)
    assert "K not split" not in mm.explain(A, B).reason     # 8192^2 outputs: 1024 blocks of 128x256
    A, B = rng.standard_normal((1024, 16)).astype(np.float16), rng.standard_normal((16, 1024)).astype(np.float16)
    assert "K not split" not in mm.explain(A, B).reason     # one k-tile: nothing to split
