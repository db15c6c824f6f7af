"""The DSL examples (examples/*.py) on the emulator against float64 numpy, their command
lines, their argument checks, and ptxas on every kernel they compile."""
import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import tilegen
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.arch.dtypes import numpy_dtype

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # the examples import example_util
    spec = importlib.util.spec_from_file_location(f"tilegen_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bg = _load("batched_gemm")
gs = _load("gemm_softmax")
fa = _load("flash_attention")


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


# -- batched GEMM ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,shape", [("f16", (3, 40, 33, 50)), ("bf16", (2, 17, 70, 24)),
                                         ("f16", (2, 130, 136, 40))])
def test_batched_gemm_on_the_emulator(dtype, shape):
    batch, M, N, K = shape
    rng = np.random.default_rng(1)
    A, B = _normal(rng, (batch, M, K), dtype), _normal(rng, (batch, K, N), dtype)
    C = bg.batched_matmul(A, B, device="sim")
    assert not np.isnan(C).any()
    assert bg.error(C, A, B) <= bg.error_limit(K)


def test_batched_gemm_rejects_mismatched_shapes():
    A = np.zeros((2, 4, 8), np.float16)
    with pytest.raises(ValueError, match=r"A \(BATCH, M, K\) and B \(BATCH, K, N\)"):
        bg.batched_matmul(A, np.zeros((3, 8, 4), np.float16), device="sim")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        bg.batched_matmul(A.astype(np.float32), np.zeros((2, 8, 4), np.float32), device="sim")


# -- GEMM + softmax ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,shape", [("f16", (37, 100, 48)), ("bf16", (70, 256, 40)), ("f16", (20, 30, 7)),
                                         ("f16", (65, 64, 33))])
def test_gemm_softmax_on_the_emulator(dtype, shape):
    M, N, K = shape
    rng = np.random.default_rng(2)
    A, B = _normal(rng, (M, K), dtype), _normal(rng, (K, N), dtype)
    scale = 1.0 / math.sqrt(K)
    C = gs.gemm_softmax_call(A, B, scale=scale, device="sim")
    ref = gs.reference(A, B, scale)
    assert gs.error(C, ref) <= gs.error_limit(A, B, scale)
    np.testing.assert_allclose(C.sum(axis=1), 1.0, rtol=1e-5)


def test_gemm_softmax_rejects_rows_wider_than_a_cta():
    with pytest.raises(ValueError, match=r"N = 257 columns, but one CTA holds whole rows of at most 256"):
        gs.gemm_softmax_call(np.zeros((4, 8), np.float16), np.zeros((8, 257), np.float16), device="sim")
    assert [gs.block_n_for(n) for n in (1, 64, 65, 128, 129, 256)] == [64, 64, 128, 128, 256, 256]


# -- flash attention --------------------------------------------------------------------------------
ATTENTION = [  # (dtype, out_dtype, head_dim, causal, seq, batch*heads, kernel options)
    ("f16", "f16", 64, False, 64, 2, {}),
    ("f16", "f16", 128, True, 96, 1, {}),
    ("bf16", "f32", 64, True, 128, 2, {}),
    ("bf16", "bf16", 128, False, 80, 1, {}),
    ("f16", "f32", 64, True, 17, 1, {}),
    ("f16", "f16", 64, True, 150, 1, {"block_m": 128}),           # two m-atoms per warp
    ("f16", "f16", 64, False, 100, 1, {"block_m": 128, "warps": 8, "block_n": 32}),
]


@pytest.mark.parametrize("dtype,out_dtype,d,causal,seq,bh,opts", ATTENTION,
                         ids=lambda x: str(x) if not isinstance(x, dict) else "-".join(f"{k}{v}" for k, v in x.items()))
def test_flash_attention_on_the_emulator(dtype, out_dtype, d, causal, seq, bh, opts):
    rng = np.random.default_rng(seq * d + causal)
    q, k, v = (_normal(rng, (bh, seq, d), dtype) for _ in range(3))
    kernel = fa.compile_attention(d, dtype, out_dtype, causal, **opts)
    out = fa.attention(q, k, v, causal=causal, out_dtype=out_dtype, device="sim", kernel=kernel)
    ref, magnitude = fa.reference(q, k, v, causal=causal)
    assert not np.isnan(out.astype(np.float32)).any()
    assert fa.relative_error(out, ref, magnitude) <= fa.error_limit(dtype, out_dtype)
    rel = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert rel < (1e-2 if "bf16" not in (dtype, out_dtype) else 3e-2)


def test_flash_attention_scale_is_a_parameter():
    rng = np.random.default_rng(5)
    q, k, v = (_normal(rng, (1, 40, 64), "f16") for _ in range(3))
    out = fa.attention(q, k, v, scale=0.5, out_dtype="f32", device="sim")
    ref, magnitude = fa.reference(q, k, v, scale=0.5)
    assert fa.relative_error(out, ref, magnitude) <= fa.error_limit("f16", "f32")


def test_flash_attention_rejects_what_it_cannot_run():
    q = np.zeros((1, 8, 96), np.float16)
    with pytest.raises(ValueError, match="head dimension 96; this kernel takes 64 or 128"):
        fa.attention(q, q, q, device="sim")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        x = np.zeros((1, 8, 64), np.float32)
        fa.attention(x, x, x, device="sim")
    with pytest.raises(ValueError, match="head_dim=32; allowed: 64, 128"):
        fa.compile_attention(32)


# -- the command lines --------------------------------------------------------------------------------
@pytest.mark.parametrize("module,argv", [
    (bg, ["--device", "sim"]),
    (gs, ["--device", "sim"]),
    (fa, ["--device", "sim", "--causal", "--seq", "48"]),
])
def test_examples_run_from_the_command_line(module, argv, capsys):
    rc = module.main(argv)
    out = capsys.readouterr().out
    assert rc == 0 and "PASS" in out and "on sim" in out


@pytest.mark.parametrize("module,argv,says", [
    (gs, ["--device", "sim", "--n", "300"], "at most 256"),
    (fa, ["--device", "sim", "--seq", "33", "--block-m", "48", "--warps", "3", "--block-n", "16"], "--block-m 48"),
    (fa, ["--device", "sim", "--warps", "64", "--block-m", "1024"], "--warps 64"),
])
def test_examples_refuse_settings_they_cannot_run_as_usage_errors(module, argv, says, capsys):
    """Exit 2 with the message on stderr (a block layout the kernel cannot take had ended in a
    traceback; a too-wide N had exited 1 with its message on stdout)."""
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_example_functions_check_what_they_are_given(monkeypatch):
    """The host functions as a library: a kernel made for other arguments, a device name or a
    timing request they cannot honour are refused before any work (they had given a non-causal
    result for causal=True, read past the rows, normalised over part of a row, or exited)."""
    import tilegen.runtime

    rng = np.random.default_rng(5)
    q, k, v = (_normal(rng, (1, 20, 64), "f16") for _ in range(3))
    plain = fa.compile_attention(64, "f16", "f16", causal=False)
    with pytest.raises(ValueError, match="causal=False where these arguments need True"):
        fa.attention(q, k, v, causal=True, kernel=plain, device="sim")
    with pytest.raises(ValueError, match="head_dim=128 where these arguments need 64"):
        fa.attention(q, k, v, kernel=fa.compile_attention(128, "f16", "f16"), device="sim")
    with pytest.raises(ValueError, match="out_dtype='f16' where these arguments need 'f32'"):
        fa.attention(q, k, v, out_dtype="f32", kernel=plain, device="sim")
    with pytest.raises(ValueError, match="compile_attention returned"):
        fa.attention(q, k, v, kernel=tilegen.compile(fa.flash_attention, head_dim=64), device="sim")
    with pytest.raises(ValueError, match="out_dtype 'f16', 'bf16' or 'f32'"):
        fa.attention(q, k, v, out_dtype="float32", device="sim")
    A, B = _normal(rng, (9, 20), "f16"), _normal(rng, (20, 100), "f16")
    with pytest.raises(ValueError, match="at most 64 f16 columns; these arguments have 100"):
        gs.gemm_softmax_call(A, B, kernel=gs.compile_gemm_softmax(64), device="sim")
    with pytest.raises(ValueError, match="compile_gemm_softmax returned"):
        gs.gemm_softmax_call(A, B, kernel=tilegen.compile(gs.gemm_softmax, block_n=128), device="sim")
    with pytest.raises(ValueError, match="device='cpu'; allowed: 'auto'"):
        bg.batched_matmul(_normal(rng, (1, 4, 4), "f16"), _normal(rng, (1, 4, 4), "f16"), device="cpu")
    with pytest.raises(ValueError, match="stages=1; allowed: a whole number, 2 or more"):
        bg.batched_matmul(_normal(rng, (1, 4, 4), "f16"), _normal(rng, (1, 4, 4), "f16"), device="sim", stages=1)
    with pytest.raises(ValueError, match="time=True times launches on the GPU"):
        gs.gemm_softmax_call(A, B, device="sim", time=True)
    monkeypatch.setattr(tilegen.runtime, "gpu_available", lambda: False)
    with pytest.raises(ValueError, match="device='gpu': no GPU found"):
        fa.attention(q, k, v, device="gpu")


def test_example_functions_give_numpy_s_results_for_empty_inputs():
    """Empty K: zeros (batched GEMM) and uniform rows (softmax of zero logits); no heads or no
    positions: an empty O (each had failed inside the kernel call)."""
    rng = np.random.default_rng(6)
    C = bg.batched_matmul(_normal(rng, (2, 3, 0), "f16"), _normal(rng, (2, 0, 5), "f16"), device="sim")
    assert C.shape == (2, 3, 5) and not C.any()
    P = gs.gemm_softmax_call(_normal(rng, (3, 0), "f16"), _normal(rng, (0, 7), "f16"), device="sim")
    np.testing.assert_array_equal(P, np.full((3, 7), 1 / 7, np.float32))
    assert gs.gemm_softmax_call(_normal(rng, (0, 4), "f16"), _normal(rng, (4, 7), "f16"), device="sim").shape == (0, 7)
    for shape in ((0, 16, 64), (2, 0, 64)):
        x = _normal(rng, shape, "bf16")
        out = fa.attention(x, x, x, device="sim")
        assert out.shape == shape and out.dtype == numpy_dtype("bf16")   # (the inputs' type by default)


@pytest.mark.parametrize("module,argv", [
    (bg, ["--batch", "16", "--m", "1024", "--n", "1024", "--k", "1024"]),
    (fa, ["--seq", "2048", "--batch-heads", "16"]),
])
def test_examples_refuse_long_emulations_without_a_gpu(module, argv, capsys, monkeypatch):
    """Without a GPU and without --device sim, sizes the emulator would take minutes over are
    refused at once (exit 2) with the way to run them anyway (they had run for as long as that)."""
    import tilegen.runtime

    monkeypatch.setattr(tilegen.runtime, "gpu_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    assert e.value.code == 2 and "pass --device sim to run it there anyway" in capsys.readouterr().err


# -- ptxas ------------------------------------------------------------------------------------------
def _example_kernels(target):
    yield "batched_gemm f16", tilegen.compile(bg.batched_gemm, dtype="f16", target=target)
    yield "batched_gemm bf16", tilegen.compile(bg.batched_gemm, dtype="bf16", target=target)
    for bn in gs.BLOCK_N:
        yield f"gemm_softmax bn{bn}", tilegen.compile(gs.gemm_softmax, dtype="f16", block_n=bn, target=target)
    yield "gemm_softmax bf16", tilegen.compile(gs.gemm_softmax, dtype="bf16", block_n=256, target=target)
    for d in fa.HEAD_DIMS:
        for causal in (False, True):
            yield f"attention d{d} causal={causal}", fa.compile_attention(d, "f16", "f16", causal, target=target)
        yield f"attention d{d} bf16->f32", fa.compile_attention(d, "bf16", "f32", True, target=target)
    for d, opts in ((64, {"block_m": 128}), (64, {"block_m": 128, "warps": 8}), (128, {"block_m": 128, "warps": 8}),
                    (128, {"block_n": 128})):  # the variants test_examples_gpu.py runs
        yield f"attention d{d} {opts}", fa.compile_attention(d, "f16", "f16", True, target=target, **opts)


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
def test_every_example_kernel_assembles_without_spills(target):
    for what, kernel in _example_kernels(target):
        report = assert_assembles(kernel.ptx, target)
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", report)]
        assert spills and max(spills) == 0, f"{what} on {target} spills: {report}"
