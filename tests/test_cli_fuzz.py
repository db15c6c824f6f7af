"""The command line never prints a traceback: every verb and option fuzzed with negative,
zero, huge and malformed values, unwritable outputs and a closed standard output; each run
ends with exit 0, 1 or 2, and a failure says what went wrong in one line."""
import io
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilegen.cli import main
from tilegen.gemm import call

VALUES = ["-1", "0", "1", "3", "7", "-5", "99999999999999999999", "abc", "", "1e9", "nan", "3x3", "2x2",
          "128x128x64", "64x64x32", "32x32x32", "1x1", "f16", "bf16", "tf32", "e4m3", "f64", "sm_80", "sm_90a",
          "sm_75", "wgmma", "mma.sync", "row", "col", "none", "true", "bias=col activation=gelu", "bias=diag",
          "{", "[1, [2, [3]]]", "x" * 300, "128B", "pad", "-", "ldmatrix.x4.trans", "m16n8k16.f16.f32", "A"]
OPTIONS = {
    "compile": ["--emit", "--minimal", "-o", "--dtype", "--tile", "--warps", "--stages", "--swizzle", "--epilogue",
                "--target", "--instruction", "--persistent", "--atom", "--group-m", "--frag-buffers", "--out-dtype",
                "--a-layout", "--b-layout", "--acc-dtype"],
    "run": ["--m", "--n", "--k", "--device", "--seed", "--dtype", "--tile", "--warps", "--stages", "--epilogue",
            "--target", "--out-dtype"],
    "show": ["--operand", "--png"],
    "demo": ["--dtype", "--size"],
    "bench": ["--dtype", "--layout", "--sizes", "--spec", "--load", "--markdown", "--compare", "--save", "--plot",
              "--host", "--peak", "--tolerance", "--reps"],
    "tune": ["--dtype", "--layout", "--sizes", "--list", "--budget-s", "--save", "--out-dtype"],
    "verify-fragments": ["--atoms", "--out", "--seed", "--device"],
    "frobnicate": ["--x"],
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return _inputs(tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def fuzz_paths(tmp_path_factory):
    """The fuzz's own inputs: a fuzzed `-o` may write over any of them."""
    return _inputs(tmp_path_factory.mktemp("fuzz"))


def _inputs(d):
    (d / "ok.tg").write_text("gemm { dtype = f16  tile = 32 x 32 x 32  warps = 1 x 1 }\n")
    (d / "bad.tg").write_text("gemm { tile = 3 x }\n")
    (d / "deep.tg").write_text("gemm " + "{ x " * 5000 + "}" * 5000 + "\n")
    (d / "result.json").write_text('{"rows": [{"dtype": "f16", "layout": "rr", "m": 1, "n": 1, "k": 1}]}\n')
    return [str(d / "ok.tg"), str(d / "bad.tg"), str(d / "deep.tg"), str(d / "result.json"), str(d),
            str(d / "out.txt"), "/nonexistent/dir/out.png", "/"]


@st.composite
def argvs(draw, paths):
    verb = draw(st.sampled_from(sorted(OPTIONS) + ["--help", ""]))
    argv = [verb] if verb else []
    if verb in OPTIONS:
        if verb in ("compile", "run") and draw(st.booleans()):
            argv.append(draw(st.sampled_from(paths + ["-"])))
        if verb == "show":
            argv.append(draw(st.sampled_from(VALUES)))
        for _ in range(draw(st.integers(0, 4))):
            opt = draw(st.sampled_from(OPTIONS[verb]))
            argv.append(opt)
            if draw(st.integers(0, 5)):  # mostly with a value, sometimes none
                argv.append(draw(st.sampled_from(VALUES + paths)))
    return argv


def _run(argv, monkeypatch, capsys, stdout=None):
    monkeypatch.setattr(sys, "stdin", io.StringIO("gemm { dtype = bf16 }\n"))
    if stdout is not None:
        monkeypatch.setattr(sys, "stdout", stdout)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if code != 0:
        assert err.strip(), f"{argv}: exit {code} with nothing on stderr"
    return code, err


class ClosedPipe(io.StringIO):
    """A standard output whose reader went away (`tilegen ... | head`)."""

    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        raise io.UnsupportedOperation("fileno")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_no_traceback_over_fuzzed_command_lines(data, fuzz_paths, monkeypatch, capsys, tmp_path):
    # no GPU here; anything the emulator would take long over is refused at once
    monkeypatch.setattr(call, "EMULATOR_LIMIT_S", 1.0)
    monkeypatch.chdir(tmp_path)
    argv = data.draw(argvs(fuzz_paths))
    _run(argv, monkeypatch, capsys)


@pytest.mark.parametrize("argv", [
    ["compile"], ["compile", "--emit", "ir"], ["show", "f16"], ["--help"], ["compile", "--help"],
    ["bench", "--load", "RESULT", "--markdown"], ["tune", "--list"],
])
def test_a_closed_standard_output_is_not_an_error(argv, paths, monkeypatch, capsys):
    argv = [paths[3] if a == "RESULT" else a for a in argv]
    code, err = _run(argv, monkeypatch, capsys, stdout=ClosedPipe())
    assert code == 0 and err == ""


@pytest.mark.parametrize("argv, status, words", [
    (["show", "f16", "--png", "/nonexistent/dir/x.png"], 2, "/nonexistent/dir"),
    (["run", "--seed", "-1"], 2, "--seed -1"),
    (["demo", "--size", "-5"], 2, "--size -5"),
    (["demo", "--size", "0"], 2, "--size 0"),
    (["compile", "DEEP"], 2, "nested at most 16 deep"),
    (["compile", "DIR"], 2, "is a directory"),
    (["compile", "--warps", "3x3"], 2, "the default tile 128x128x64 does not fit these warps"),
    (["run", "--m", "4096", "--n", "4096", "--k", "4096"], 2, "would take at least"),
    (["verify-fragments"], 2, "the probes need an NVIDIA GPU"),
])
def test_the_cases_that_printed_tracebacks(argv, status, words, paths, monkeypatch, capsys):
    argv = [paths[2] if a == "DEEP" else paths[4] if a == "DIR" else a for a in argv]
    code, err = _run(argv, monkeypatch, capsys)
    assert code == status and words in err and len(err.splitlines()) <= 3, err
