"""The `tilegen` verbs: compile, run, show, the passthroughs, --help everywhere and the
documented exit codes (0 ok, 1 failure, 2 usage error / bad input / no GPU where needed)."""
import io
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import tilegen
from tilegen import Epilogue, GemmSpec
from tilegen.cli import error_bound, main
from tilegen.gemm import parse_spec_text, spec_to_text

REPO = Path(__file__).resolve().parents[1]
SMALL = "gemm {\n  dtype = bf16\n  tile = 64 x 64 x 32\n  stages = 2\n}\n"
SMALL_SPEC = GemmSpec(dtype="bf16", tile=(64, 64, 32), stages=2)


@pytest.fixture
def small_tg(tmp_path):
    p = tmp_path / "small.tg"
    p.write_text(SMALL)
    return p


@pytest.fixture
def no_gpu(monkeypatch):
    """Behave as on a machine without a GPU, also on one that has it (and in a process that
    has not said so yet)."""
    import tilegen.runtime
    from tilegen import errors

    monkeypatch.setattr(tilegen.runtime, "gpu_available", lambda: False)
    monkeypatch.setattr(errors, "_said", set())


# -- help and exit codes ---------------------------------------------------------------------

@pytest.mark.parametrize("verb", ["compile", "run", "show", "demo"])
def test_every_verb_has_help(capsys, verb):
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tilegen {verb}")
    assert "exit status" in out and "2  usage error" in out and "examples:" in out


def test_top_level_help_lists_the_verbs(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in ("compile", "run", "show", "demo", "bench", "tune", "verify-fragments"):
        assert verb in out


@pytest.mark.parametrize("verb", ["bench", "tune", "verify-fragments"])
def test_passthrough_verbs_take_their_own_help(capsys, verb):
    try:
        rc = main([verb, "--help"])
    except SystemExit as e:
        rc = e.code
    assert rc == 0
    assert "--help" in capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    for argv in (["compile", "--emit", "sass"], ["run", "--m"], ["frobnicate"], ["show"]):
        assert main(argv) == 2, argv   # main returns argparse's status: it never raises
    assert main([]) == 2


def test_spec_options_follow_the_dataclass_fields(capsys):
    import dataclasses

    assert main(["compile", "--help"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(GemmSpec):
        assert f"--{f.name.replace('_', '-')} VALUE" in out, f.name


# -- compile ---------------------------------------------------------------------------------

def test_compile_prints_the_ptx(capsys, small_tg):
    assert main(["compile", str(small_tg)]) == 0
    out = capsys.readouterr().out
    assert out == tilegen.compile(SMALL_SPEC).ptx.rstrip("\n") + "\n"
    assert ".entry tilegen_gemm_bf16_rr_f32_64x64x32" in out


def test_compile_names_the_first_kernels_of_a_prepared_spec(capsys):
    """f32 on wgmma: the PTX is the tf32 GEMM of the parts; stderr names the split kernel (both operands) before it."""
    assert main(["compile", "--dtype", "f32", "--instruction", "wgmma"]) == 0
    captured = capsys.readouterr()
    assert ".entry tilegen_gemm_wgmma_tma_persistent_tmastore_promote2_tf32_rc" in captured.out
    assert "first kernels prepare its operands: tilegen_split3_ak_bmn (A and B)" in captured.err
    assert main(["compile", "--dtype", "tf32", "--instruction", "wgmma"]) == 0
    assert "first kernels" not in capsys.readouterr().err


@pytest.mark.parametrize("emit,what", [("ir", "ir"), ("banks", "bank_report")])
def test_compile_emits_ir_and_bank_report(capsys, small_tg, emit, what):
    assert main(["compile", str(small_tg), "--emit", emit]) == 0
    want = getattr(tilegen.compile(SMALL_SPEC), what)
    want = want() if callable(want) else want
    assert capsys.readouterr().out.strip() == want.strip()


def test_compile_emits_resources(capsys, small_tg):
    from tilegen.codegen.ptxas import find_ptxas

    if find_ptxas() is None:
        assert main(["compile", str(small_tg), "--emit", "resources"]) == 2
        assert "ptxas" in capsys.readouterr().err
        return
    assert main(["compile", str(small_tg), "--emit", "resources"]) == 0
    spec_line, report = capsys.readouterr().out.split("\n", 1)
    assert "registers" in report and "spill" in report and report.startswith("sm_80")
    assert spec_line.startswith("GemmSpec(") and "target=sm_80" in spec_line   # every field, resolved
    assert main(["compile", "--instruction", "wgmma", "--dtype", "f16", "--emit", "resources"]) == 0
    assert "target=sm_90a, instruction=wgmma" in capsys.readouterr().out  # the default wgmma implies


def test_compile_writes_a_file(capsys, small_tg, tmp_path):
    out = tmp_path / "k.ptx"
    assert main(["compile", str(small_tg), "-o", str(out)]) == 0
    assert out.read_text() == tilegen.compile(SMALL_SPEC).ptx.rstrip("\n") + "\n"
    cap = capsys.readouterr()
    assert cap.out == "" and str(out) in cap.err


def test_compile_reads_standard_input(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(SMALL))
    assert main(["compile", "-", "--emit", "tg"]) == 0
    assert parse_spec_text(capsys.readouterr().out) == SMALL_SPEC


def test_compile_without_a_file_takes_field_options(capsys):
    assert main(["compile", "--emit", "tg", "--dtype", "tf32", "--tile", "64x64x32", "--warps", "2 x 1",
                 "--acc-dtype", "f32", "--group_m", "4", "--epilogue", "bias=row activation=relu"]) == 0
    text = capsys.readouterr().out
    assert text == spec_to_text(GemmSpec(dtype="tf32", tile=(64, 64, 32), warps=(2, 1), group_m=4,
                                         epilogue=Epilogue(bias="row", activation="relu")))


def test_compile_emits_minimal_text(capsys):
    assert main(["compile", "--dtype", "tf32", "--stages", "4", "--emit", "tg", "--minimal"]) == 0
    assert capsys.readouterr().out == "gemm {\n  dtype = tf32\n  stages = 4\n}\n"


def test_field_options_override_the_file(capsys, small_tg):
    assert main(["compile", str(small_tg), "--emit", "tg", "--stages", "3"]) == 0
    assert parse_spec_text(capsys.readouterr().out) == SMALL_SPEC.replace(stages=3)


@pytest.mark.parametrize("text,err", [
    ("gemm {\n  dtype = bf16\n  tile = (64, 64, 32)\n}\n", "line 3, column 10: syntax error: found '('"),
    ("gemm {\n  dtype = bf16\n  stages = 9\n}\n", "line 3: stages=9 is invalid"),
    ("gemm {\n  dtipe = bf16\n}\n", "line 2: dtipe='bf16' is invalid: GemmSpec has no field 'dtipe' (did you mean dtype?)"),
])
def test_bad_specs_exit_2_naming_the_line(capsys, tmp_path, text, err):
    p = tmp_path / "bad.tg"
    p.write_text(text)
    assert main(["compile", str(p)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert f"tilegen compile: error: {p}, {err}" in cap.err
    assert "Traceback" not in cap.err and "lark" not in cap.err


def test_bad_option_value_exits_2(capsys):
    assert main(["compile", "--stages", "9"]) == 2
    assert "--stages: stages=9 is invalid" in capsys.readouterr().err


def test_missing_spec_file_exits_2(capsys, tmp_path):
    assert main(["compile", str(tmp_path / "none.tg")]) == 2
    assert "no such spec file" in capsys.readouterr().err
    assert main(["compile", "/dev/null"]) == 2          # a device is read (as a pipe would be): empty
    assert "/dev/null, line 1, column 1: syntax error: found the end of the text" in capsys.readouterr().err


# -- run -------------------------------------------------------------------------------------

def _run_lines(out: str) -> dict:
    lines = out.splitlines()
    return {"error": next(x for x in lines if x.startswith("relative error")),
            "time": next(x for x in lines if x.startswith("time")),
            "what": next(x for x in lines if x.startswith("C = "))}


def test_run_on_the_emulator_checks_the_result(capsys, small_tg):
    assert main(["run", str(small_tg), "--m", "70", "--n", "40", "--k", "48", "--device", "sim"]) == 0
    cap = capsys.readouterr()
    got = _run_lines(cap.out)
    assert got["error"].endswith(": ok")
    assert f"(bound {error_bound(SMALL_SPEC, 48):.3e})" in got["error"]
    assert "70x40x48, bf16 -> f32, on the CPU emulator (seed 0)" in got["what"]
    assert got["time"].startswith("time ") and "CPU emulator" in got["time"]
    assert "running 70x40x48 on the CPU emulator: 2 CTAs of 128 threads" in cap.err  # progress on stderr


def test_run_a_batched_spec_on_a_stack(capsys, small_tg):
    """A batched spec multiplies a stack (--batch products, default 2), checked against numpy.matmul;
    --batch on a spec that is not batched is bad input."""
    argv = ["run", str(small_tg), "--batched", "true", "--m", "24", "--n", "40", "--k", "48", "--device", "sim"]
    assert main(argv + ["--batch", "3"]) == 0
    cap = capsys.readouterr()
    assert _run_lines(cap.out)["error"].endswith(": ok") and "3 x 24x40x48" in _run_lines(cap.out)["what"]
    assert main(argv) == 0
    assert "2 x 24x40x48" in _run_lines(capsys.readouterr().out)["what"]
    assert main(["run", str(small_tg), "--batch", "3", "--device", "sim"]) == 2
    assert "needs a batched spec" in capsys.readouterr().err
    assert main(argv + ["--batch", "0"]) == 2           # not the default of 2
    assert "--batch 0: a size from 1" in capsys.readouterr().err


def test_run_without_a_gpu_uses_the_emulator_and_says_so(capsys, small_tg, no_gpu):
    assert main(["run", str(small_tg), "--m", "16", "--n", "16", "--k", "16"]) == 0
    cap = capsys.readouterr()
    assert "no GPU found; GEMMs on numpy arrays run on the CPU emulator" in cap.err
    assert _run_lines(cap.out)["error"].endswith(": ok")


def test_run_on_a_gpu_that_is_not_there_exits_2(capsys, small_tg, no_gpu):
    assert main(["run", str(small_tg), "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "no GPU found" in err and "--device sim" in err


@pytest.mark.parametrize("argv", [["demo", "--size", "4096"], ["run", "--m", "4096", "--n", "4096", "--k", "4096"]])
def test_no_gpu_refuses_long_emulations_before_compiling(capsys, no_gpu, monkeypatch, argv):
    import tilegen.cli

    def no_compile(*a, **k):
        raise AssertionError("compiled a problem it was going to refuse")

    monkeypatch.setattr(tilegen.cli, "compile_spec", no_compile)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no GPU found" in err and "would take at least" in err and "--device sim" in err


@pytest.mark.parametrize("argv", [["demo", "--size", "60000"], ["run", "--m", "300000", "--n", "300000", "--k", "8", "--device", "sim"]])
def test_sizes_beyond_host_memory_are_refused_before_allocating(capsys, monkeypatch, argv):
    import tilegen.cli

    monkeypatch.setattr(tilegen.cli, "_host_memory_bytes", lambda: 16 * 2**30)
    monkeypatch.setattr(tilegen.cli, "compile_spec", lambda *a, **k: pytest.fail("compiled"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "GiB of host memory" in err and "of this machine's 16.0 GiB" in err and "choose smaller sizes" in err


def test_run_reports_a_wrong_result_with_exit_1(capsys, small_tg, monkeypatch):
    from tilegen import GemmKernel

    real = GemmKernel.__call__

    def off_by_a_little(self, A, B, **kw):
        C = real(self, A, B, **kw)
        C[3, 5] += 0.5  # one element: far over the f32 bound
        return C

    monkeypatch.setattr(GemmKernel, "__call__", off_by_a_little)
    assert main(["run", str(small_tg), "--m", "32", "--n", "32", "--k", "32", "--device", "sim"]) == 1
    assert _run_lines(capsys.readouterr().out)["error"].endswith(": WRONG")


def test_run_checks_the_fused_epilogue(capsys):
    assert main(["run", "--dtype", "f16", "--tile", "32x32x32", "--warps", "1x1", "--out-dtype", "bf16",
                 "--epilogue", "bias=col activation=gelu_tanh residual=true",
                 "--m", "40", "--n", "24", "--k", "32", "--device", "sim", "--seed", "3"]) == 0
    got = _run_lines(capsys.readouterr().out)
    assert got["error"].endswith(": ok")
    assert "gelu_tanh(A @ B + bias (per col)) + residual" in got["what"] and "(seed 3)" in got["what"]


def test_run_checks_scale_vectors(capsys, monkeypatch):
    """Row and column scales (fp8 and 16-bit specs): run makes them and checks against them
    (planted: the kernel called without the scales' effect on one element -> WRONG)."""
    argv = ["run", "--dtype", "e4m3", "--out-dtype", "f32", "--epilogue", "scale_rows=true scale_cols=true bias=col",
            "--m", "40", "--n", "36", "--k", "64", "--device", "sim"]
    assert main(argv) == 0
    got = _run_lines(capsys.readouterr().out)
    assert got["error"].endswith(": ok")
    assert "A @ B * scale_a (per row) * scale_b (per column) + bias (per col)" in got["what"]
    assert main(["run", "--dtype", "f16", "--tile", "32x32x32", "--warps", "1x1", "--epilogue", "scale_rows=true",
                 "--m", "40", "--n", "24", "--k", "32", "--device", "sim"]) == 0
    assert _run_lines(capsys.readouterr().out)["error"].endswith(": ok")
    assert main(["run", "--dtype", "e4m3", "--out-dtype", "f32", "--tile", "32x32x64", "--warps", "1x1", "--epilogue",
                 "device_scale_a=true scale_cols=true", "--m", "40", "--n", "24", "--k", "64", "--device", "sim"]) == 0
    got = _run_lines(capsys.readouterr().out)
    assert got["error"].endswith(": ok") and "A @ B * scale_b (per column) * scale_a (in device memory)" in got["what"]
    from tilegen import GemmKernel

    real = GemmKernel.__call__

    def unscaled_row(self, A, B, **kw):
        C = real(self, A, B, **kw)
        C[3] /= kw["scale_a"][3]   # row 3 as if scale_a were 1 there
        return C

    monkeypatch.setattr(GemmKernel, "__call__", unscaled_row)
    assert main(argv) == 1
    assert _run_lines(capsys.readouterr().out)["error"].endswith(": WRONG")


def test_run_seed_changes_the_inputs(capsys, small_tg):
    errors = []
    for seed in ("1", "2"):
        assert main(["run", str(small_tg), "--m", "16", "--n", "16", "--k", "64", "--device", "sim",
                     "--seed", seed]) == 0
        errors.append(_run_lines(capsys.readouterr().out)["error"])
    assert errors[0] != errors[1]


def test_run_rejects_empty_sizes(capsys, small_tg):
    assert main(["run", str(small_tg), "--m", "0", "--device", "sim"]) == 2
    assert "--m 0" in capsys.readouterr().err


def test_error_bound_by_dtype():
    f32 = error_bound(GemmSpec(dtype="f16"), 1024)
    assert 1024 * 2.0 ** -24 <= f32 < 1e-4
    assert error_bound(GemmSpec(dtype="tf32"), 1024) > 2 * 2.0 ** -11            # tf32 rounds its inputs
    assert error_bound(GemmSpec(dtype="f16", out_dtype="bf16"), 64) >= 2.0 ** -8  # bf16 output rounding
    assert error_bound(GemmSpec(dtype="f16", acc_dtype="f16"), 256) > error_bound(GemmSpec(dtype="f16"), 256)


# -- show ------------------------------------------------------------------------------------

def test_show_prints_the_grids(capsys):
    from tilegen.show import fragment_text

    assert main(["show", "m16n8k16.f16.f32"]) == 0
    assert capsys.readouterr().out == fragment_text("m16n8k16.f16.f32")
    assert main(["show", "tf32", "--operand", "C"]) == 0
    out = capsys.readouterr().out
    assert "operand C: 16 x 8 (M x N)" in out and "operand A" not in out


def test_show_unknown_atom_exits_2(capsys):
    assert main(["show", "m16n8k99"]) == 2
    err = capsys.readouterr().err
    assert "atom='m16n8k99' is invalid" in err and "m16n8k16.f16.f32" in err


def test_show_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from tilegen.show import png_size

    path = tmp_path / "f.png"
    assert main(["show", "bf16", "--png", str(path)]) == 0
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == png_size("bf16")
    assert str(path) in capsys.readouterr().err


def test_show_png_without_matplotlib_exits_2(capsys, tmp_path, monkeypatch):
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, mod, None)
    assert main(["show", "f16", "--png", str(tmp_path / "f.png")]) == 2
    assert "pip install 'tilegen[plot]'" in capsys.readouterr().err


# -- the installed entry point ---------------------------------------------------------------

def test_entry_point_runs_compile_from_stdin():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tilegen.cli", "compile", "-", "--emit", "tg"], input=SMALL,
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert parse_spec_text(p.stdout) == SMALL_SPEC
    bad = subprocess.run([sys.executable, "-m", "tilegen.cli", "compile", "-"], input="gemm { stages = 9 }",
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "<stdin>, line 1: stages=9 is invalid" in bad.stderr
    assert "Traceback" not in bad.stderr
