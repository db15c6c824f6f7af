"""The `tilegen` command line: `demo` and the help text."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilegen import GemmSpec
from tilegen.cli import main

REPO = Path(__file__).resolve().parents[1]
WARP = 32


# The ISA layouts of the three default atoms (ptx.md 2.1, 2.2, 2.4), as the demo's lane grid
# writes them: cell (row, col) -> "T<lane>:<register>[.<element>]".

def _expected_grids(dt: str) -> dict[str, dict]:
    a, b, c = {}, {}, {}
    for lane in range(WARP):
        g, t = lane >> 2, lane & 3
        for i in range(4):   # C/D f32: c_i at (g + 8(i>>1), 2t + (i&1)), one per register
            c[(g + 8 * (i >> 1), 2 * t + (i & 1))] = f"T{lane}:{i}"
        if dt == "tf32":     # m16n8k8: a_i at (g + 8(i&1), t + 4(i>>1)); b_i at (t + 4i, g)
            for i in range(4):
                a[(g + 8 * (i & 1), t + 4 * (i >> 1))] = f"T{lane}:{i}"
            for i in range(2):
                b[(t + 4 * i, g)] = f"T{lane}:{i}"
        else:                # m16n8k16: two elements per register, a(2j) low, a(2j+1) high
            for i in range(8):
                a[(g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2))] = f"T{lane}:{i // 2}.{i % 2}"
            for i in range(4):
                b[(2 * t + (i & 1) + 8 * (i >> 1), g)] = f"T{lane}:{i // 2}.{i % 2}"
    return {"A": a, "B": b, "C": c}


def _parse_grids(text: str) -> dict[str, dict]:
    """Find each '<atom>.<X> (RxC; ...)' block and read its cells."""
    grids = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\S+\.([ABC]) \((\d+)x(\d+);", line)
        if not m:
            continue
        op, rows, cols = m.group(1), int(m.group(2)), int(m.group(3))
        header = lines[i + 1].split()
        assert header == [str(x) for x in range(cols)]
        cells = {}
        for r in range(rows):
            parts = lines[i + 2 + r].split()
            assert parts[0] == str(r) and len(parts) == cols + 1
            for col, cell in enumerate(parts[1:]):
                cells[(r, col)] = cell
        grids[op] = cells
    return grids


ATOM = {"tf32": ("m16n8k8.tf32.f32", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
        "f16": ("m16n8k16.f16.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
        "bf16": ("m16n8k16.bf16.f32", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")}


def _check_demo_output(out: str, dt: str):
    assert str(GemmSpec(dtype=dt)) in out          # the spec
    name, instr = ATOM[dt]
    assert name in out and instr in out            # its atom and spelling
    grids = _parse_grids(out)
    assert set(grids) == {"A", "B", "C"}
    want = _expected_grids(dt)
    for op in "ABC":
        assert grids[op] == want[op], f"lane grid {op} differs from the ISA"


def test_demo_default(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    _check_demo_output(out, "f16")
    assert "dtype=f16" in out.splitlines()[0]


@pytest.mark.parametrize("dt", ["tf32", "bf16"])
def test_demo_dtypes(capsys, dt):
    assert main(["demo", "--dtype", dt]) == 0
    _check_demo_output(capsys.readouterr().out, dt)


def test_no_command_prints_help(capsys):
    rc = main([])
    err = capsys.readouterr().err   # a usage error: the help goes to stderr, with exit 2
    assert "usage" in err.lower() and "demo" in err and "give a COMMAND" in err
    assert rc == 2


def test_help_flag_exits_zero(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out


def test_a_misspelled_option_is_named_with_the_nearest_one(capsys):
    assert main(["compile", "--stagez", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilegen compile: error: unrecognized arguments: --stagez (did you mean --stages?)")
    assert "`tilegen compile --help` lists the options" in err
    assert main(["compile", "--emit", "tg", "--zzz"]) == 2
    assert "unrecognized arguments: --zzz;" in capsys.readouterr().err   # nothing near: no guess


def test_ptxas_failing_says_what_ptxas_said(capsys, monkeypatch, tmp_path):
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'ptxas fatal: planted failure' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TILEGEN_PTXAS", str(fake))
    assert main(["compile", "--emit", "resources"]) == 1
    err = capsys.readouterr().err
    assert "ptxas could not assemble" in err and "ptxas fatal: planted failure" in err


def test_ptxas_settings_are_said_in_one_line(capsys, monkeypatch, tmp_path):
    """TILEGEN_PTXAS naming no file warns in one line (not Python's file:line and source line),
    and TILEGEN_PTXAS=off, asked for resources, says that it is what turned ptxas off."""
    from tilegen.codegen import ptxas

    monkeypatch.setattr(ptxas, "_WARNED", set())
    monkeypatch.setenv("TILEGEN_PTXAS", str(tmp_path / "none"))
    main(["compile", "--emit", "resources"])
    warned = [line for line in capsys.readouterr().err.splitlines() if "is not a file" in line]
    assert warned and all(line.startswith("tilegen: warning: TILEGEN_PTXAS=") for line in warned)
    monkeypatch.setenv("TILEGEN_PTXAS", "off")
    assert main(["compile", "--emit", "resources"]) == 2
    assert "TILEGEN_PTXAS=off says to use none" in capsys.readouterr().err


def test_version(capsys):
    from tilegen.version import __version__

    with pytest.raises(SystemExit) as e:
        from tilegen.cli import build_parser
        build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tilegen {__version__}"
    assert main(["--version"]) == 0


def test_demo_rejects_unknown_dtype(capsys):
    assert main(["demo", "--dtype", "f64"]) != 0
    err = capsys.readouterr().err
    assert "f64" in err and "tf32" in err


def test_module_entry_point_subprocess():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tilegen.cli", "demo", "--dtype", "tf32"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    _check_demo_output(p.stdout, "tf32")


def test_demo_runs_the_gemm_and_checks_it(capsys):
    from tilegen.cli import main

    assert main(["demo", "--dtype", "bf16", "--size", "96"]) == 0
    out = capsys.readouterr().out
    assert "96x96x96" in out and "relative error" in out and "(ok)" in out


@pytest.mark.parametrize("dt, spec_has, error", [("f32", "dtype=f32", 1e-5), ("e4m3", "b_layout=col", 1e-2)])
def test_demo_runs_f32_and_fp8_too(capsys, dt, spec_has, error):
    """f32 (3xTF32) and fp8 (B column-major, bf16 out, as torch._scaled_mm) run and check."""
    assert main(["demo", "--dtype", dt, "--size", "64"]) == 0
    out = capsys.readouterr().out
    assert spec_has in out.splitlines()[0]
    rel = float(out.rsplit("relative error ", 1)[1].split()[0])
    assert rel < error and out.rstrip().endswith("(ok)")
