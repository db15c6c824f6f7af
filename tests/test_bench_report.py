"""tilegen bench: result files, the baseline comparison, the tables, --load on a CPU."""
import json

import pytest

from tilegen.bench import cli, report


def _row(dtype="f16", layout="rr", m=4096, n=4096, k=4096, tilegen_ms=0.25, cublas_ms=0.2, triton_ms=0.3,
         check="ok", peak=None, **extra):
    row = {"dtype": dtype, "layout": layout, "m": m, "n": n, "k": k, "tilegen_ms": tilegen_ms,
           "cublas_ms": cublas_ms, "triton_ms": triton_ms, "check": check, "rel_err": 1e-6,
           "err_bound": 2e-4, "errors": {}, **extra}
    return report.finish_row(row, peak)


def _result(rows, **extra):
    return {"format": report.FORMAT, "gpu": "NVIDIA H200", "driver": "580.159.04", "tilegen_commit": "abc123def456",
            "date": "2026-11-22T10:00:00+00:00", "versions": {"torch": "2.9.0", "triton": "3.5.0"},
            "rows": rows, **extra}


def test_derived_columns():
    r = _row(m=4096, n=4096, k=4096, tilegen_ms=0.25, cublas_ms=0.2, triton_ms=0.5, peak={"f16": 600.0})
    assert r["tilegen_tflops"] == pytest.approx(2 * 4096 ** 3 / 0.25e-3 / 1e12)
    assert r["vs_cublas"] == pytest.approx(0.8)
    assert r["vs_triton"] == pytest.approx(2.0)
    assert r["pct_peak"] == pytest.approx(100 * r["tilegen_tflops"] / 600.0)


def test_missing_measurements_give_none():
    r = _row(cublas_ms=None, triton_ms=None)
    assert r["cublas_tflops"] is None and r["vs_cublas"] is None and r["vs_triton"] is None
    assert r["pct_peak"] is None


def test_save_and_load_round_trip(tmp_path):
    res = _result([_row(), _row(dtype="bf16", layout="rc", m=1024, n=4096, k=4096)], peak={"f16": {"tflops": 600.0}})
    res["rows"][0]["rel_err"] = float("nan")  # not JSON: saved as null
    path = tmp_path / "r.json"
    report.save(res, str(path))
    text = path.read_text()
    assert "NaN" not in text
    back = report.load(str(path))
    assert back["rows"][1]["layout"] == "rc" and back["rows"][0]["rel_err"] is None
    assert back["gpu"] == "NVIDIA H200" and back["tilegen_commit"] == "abc123def456"


@pytest.mark.parametrize("content, match", [
    ("not json", "is not JSON"),
    ('{"rows": 3}', "no 'rows' list"),
    ('{"rows": [{"dtype": "f16"}]}', "row 0 lacks layout, m, n, k"),
    # (these had printed "internal error ... please report it", or nothing and exit 0)
    ('{"rows": [1]}', "row 0 is a int, not a result row"),
    ('{"rows": [], "peak": 5}', "its peak is a int"),
    ('{"rows": [{"dtype": "f16", "layout": "rr", "m": 1, "n": 1, "k": 1, "tilegen_tflops": "fast"}]}',
     "row 0's tilegen_tflops is 'fast', not a number"),
    ('{"rows": []}', "holds no results"),
])
def test_bad_result_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(report.ResultFileError, match=match):
        report.load(str(path))


def test_missing_file():
    with pytest.raises(report.ResultFileError, match="cannot read"):
        report.load("/nonexistent/dir/base.json")


# ---- comparison ---------------------------------------------------------------------------

BASE = [_row("f16", tilegen_ms=0.25), _row("bf16", tilegen_ms=0.25), _row("tf32", tilegen_ms=0.5),
        _row("f16", m=2048, n=2048, k=2048, tilegen_ms=0.05)]


def test_no_regression_within_tolerance():
    now = [_row("f16", tilegen_ms=0.26), _row("bf16", tilegen_ms=0.24), _row("tf32", tilegen_ms=0.5),
           _row("f16", m=2048, n=2048, k=2048, tilegen_ms=0.05)]
    comps = report.compare(now, BASE, 0.05)
    assert not any(c.regression for c in comps)
    assert [c.status for c in comps] == ["ok", "ok", "ok", "ok"]
    assert comps[0].change == pytest.approx(0.25 / 0.26 - 1)


def test_regression_beyond_tolerance_is_detected():
    now = [_row("f16", tilegen_ms=0.30), _row("bf16", tilegen_ms=0.20), _row("tf32", tilegen_ms=0.5)]
    comps = {c.key[0] + str(c.key[2]): c for c in report.compare(now, BASE, 0.05)}
    assert comps["f164096"].regression and comps["f164096"].status == "REGRESSION"
    assert comps["bf164096"].status == "faster" and not comps["bf164096"].regression
    assert comps["f162048"].status == "missing" and not comps["f162048"].regression
    # the same 20% drop passes a 25% tolerance
    assert not any(c.regression for c in report.compare(now, BASE, 0.25))


def test_wrong_or_failed_rows_count_as_regressions():
    now = [_row("f16", check="WRONG", tilegen_ms=None), _row("bf16", tilegen_ms=None, check="error"),
           _row("tf32", tilegen_ms=0.5)]
    comps = report.compare(now, BASE, 0.05)
    assert [c.status for c in comps[:3]] == ["REGRESSION (wrong result)", "REGRESSION (wrong result)", "ok"]


def test_new_rows_and_rows_without_baseline_are_not_regressions():
    base = [_row("f16", tilegen_ms=None, check="WRONG")]
    now = [_row("f16"), _row("f16", layout="cc")]
    comps = report.compare(now, base, 0.05)
    assert [c.status for c in comps] == ["no baseline", "new"]


def test_comparison_table_text():
    now = [_row("f16", tilegen_ms=0.30)]
    text = report.format_comparison(report.compare(now, BASE[:1], 0.05), 0.05)
    assert "REGRESSION" in text and "-16.7%" in text and "1 regression(s) beyond 5%" in text
    text = report.format_comparison(report.compare(BASE[:1], BASE[:1], 0.05), 0.05)
    assert "no regression beyond 5%" in text


# ---- tables -------------------------------------------------------------------------------

def test_markdown_table():
    res = _result([_row("f16", peak={"f16": 618.0}, front_ms=0.258, cublas_front_ms=0.203),
                   _row("tf32", m=4096, n=4096, k=1024, cublas_ms=None)],
                  peak={"f16": {"tflops": 618.0, "reference": 618.0, "config": "tilegen_mma_peak_f16_2x4_w8_u4"}},
                  compile_speed={"specs": [{"spec": "f16 rr", "compile_ms": 120.0, "jit_ms": 80.0,
                                            "first_launch_ms": 210.0, "second_object_ms": 110.0}]})
    md = report.markdown(res)
    lines = md.splitlines()
    assert lines[0].startswith("Measured on NVIDIA H200, driver 580.159.04, tilegen abc123def4")
    header = next(i for i, l in enumerate(lines) if l.startswith("| dtype | A/B |"))
    assert lines[header + 1].startswith("| --- | --- |")
    cells = [c.strip() for c in lines[header + 2].strip("|").split("|")]
    assert cells[:4] == ["f16", "rr", "4096^3", "0.250"]
    assert cells[4] == "549.8" and cells[5] == "687.2" and cells[7] == "0.80x" and cells[9] == "89%"
    # what users get: tilegen.matmul as called, against the kernel alone and torch.matmul as called
    assert cells[10] == "532.7" and cells[11] == "0.97x" and cells[12] == "0.79x"
    assert cells[13].startswith("ok")
    row2 = [c.strip() for c in lines[header + 3].strip("|").split("|")]
    assert row2[2] == "4096x4096x1024" and row2[5] == "--" and row2[7] == "--" and row2[10:13] == ["--"] * 3
    assert any("| f16 | m16n8k16 | 618.0 | 618 |" in l for l in lines)
    assert any(l.startswith("| f16 rr | 120.0 | 80.0 | 210.0 | 110.0 |") for l in lines)
    # every table line has the same number of cells as its header
    for block_start in [i for i, l in enumerate(lines[:-1]) if l.startswith("| ") and lines[i + 1].startswith("| ---")]:
        n = lines[block_start].count("|")
        i = block_start
        while i < len(lines) and lines[i].startswith("|"):
            assert lines[i].count("|") == n
            i += 1


def test_wrong_rows_are_flagged_loudly_and_not_reported_as_speed():
    wrong = _row("f16", tilegen_ms=None, check="WRONG", rel_err=0.7, err_bound=2e-4)
    text = report.format_table(_result([wrong, _row("bf16")]))
    line = next(l for l in text.splitlines() if l.startswith("f16"))
    assert "WRONG" in line and "rel=7.0e-01 > 2.0e-04" in line
    assert "FAILED: tilegen gave a wrong result or an error: f16 rr 4096" in text
    md = report.markdown(_result([wrong]))
    assert "| WRONG | WRONG |" in md


def test_errors_are_listed_under_the_table():
    r = _row("f16", triton_ms=None, errors={"triton": "OutOfResources: shared memory"})
    text = report.format_table(_result([r]))
    assert "f16 rr 4096 triton: OutOfResources: shared memory" in text


def test_peak_table():
    text = report.format_peak({"tf32": {"tflops": 300.0, "reference": 311.0, "config": "cfg"},
                               "f16": {"tflops": None, "reference": 618.0, "configs": [{"error": "boom"}]}})
    assert "96%" in text and "boom" in text


# ---- the command line on saved results (no GPU needed) --------------------------------------

def _write(tmp_path, name, rows):
    path = tmp_path / name
    report.save(_result(rows), str(path))
    return str(path)


def test_cli_compare_fails_on_regression(tmp_path, capsys):
    base = _write(tmp_path, "base.json", BASE)
    now = _write(tmp_path, "now.json", [_row("f16", tilegen_ms=0.30)] + BASE[1:])
    assert cli.main(["--load", now, "--compare", base, "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "comparison with the baseline" in out
    assert cli.main(["--load", now, "--compare", base]) == 0          # reported, not failed
    assert cli.main(["--load", now, "--compare", base, "--fail-on-regression", "--tolerance", "0.2"]) == 0


def test_cli_compare_passes_without_regression(tmp_path, capsys):
    base = _write(tmp_path, "base.json", BASE)
    assert cli.main(["--load", base, "--compare", base, "--fail-on-regression", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| dtype | A/B |" in out and "no regression beyond 5%" in out


def test_cli_wrong_rows_exit_1(tmp_path, capsys):
    path = _write(tmp_path, "w.json", [_row("f16", tilegen_ms=None, check="WRONG", rel_err=1.0)])
    assert cli.main(["--load", path]) == 1
    assert "FAILED: tilegen gave a wrong result" in capsys.readouterr().out


def test_cli_load_and_save_again(tmp_path):
    src = _write(tmp_path, "a.json", BASE)
    dst = tmp_path / "b.json"
    assert cli.main(["--load", src, "--save", str(dst), "--quiet"]) == 0
    assert json.loads(dst.read_text())["rows"] == json.loads(open(src).read())["rows"]


def test_cli_missing_baseline_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["--compare", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_plot_without_matplotlib_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(report, "have_matplotlib", lambda: False)
    src = _write(tmp_path, "a.json", BASE)
    assert cli.main(["--load", src, "--plot", str(tmp_path / "p.png")]) == 2
    assert "--plot needs matplotlib: pip install matplotlib" in capsys.readouterr().err


def test_plot_without_matplotlib_raises_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert not report.have_matplotlib()
    with pytest.raises(report.PlotUnavailable, match="pip install matplotlib"):
        report.plot(_result(BASE), "x.png")


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "p.png"
    rows = BASE + [_row("f16", layout="cc"), _row("bf16", tilegen_ms=None, check="WRONG")]
    report.plot(_result(rows, peak={"f16": {"tflops": 618.0}}), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
