"""`python3 -m tilegen.tune` / `tilegen tune` on the CPU: usage errors, the no-GPU exit, the
cache listing, the budget split, and the output with tune() replaced by a fake."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilegen import runtime
from tilegen.tune import cli
from tilegen.tune import space as S
from tilegen.gemm import tuned as store
from tilegen.tune.search import Trial, TuneResult

REPO = Path(__file__).resolve().parents[1]


def test_no_gpu_exits_2_with_a_clear_message(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    assert cli.main(["--dtype", "f16", "--layout", "rr", "--sizes", "4096"]) == 2
    err = capsys.readouterr().err
    assert "no GPU found" in err and "--list" in err


def test_no_gpu_exit_2_in_a_subprocess():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "tilegen.tune", "--dtype", "f16", "--layout", "rr", "--sizes",
                        "4096", "8192", "2048", "4096x4096x1024", "1024x4096x4096"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "no GPU found" in p.stderr
    assert "Traceback" not in p.stderr


def test_tilegen_tune_verb_passes_through(monkeypatch, capsys):
    from tilegen.cli import main as tilegen_main

    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    assert tilegen_main(["tune", "--dtype", "bf16"]) == 2
    assert "no GPU found" in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["--layout", "rx"], "layout 'rx'"),
    (["--sizes", "4096x4096"], "size '4096x4096'"),
    (["--budget-s", "0"], "--budget-s"),
    (["--total-budget-s", "-1"], "--total-budget-s"),
    (["--workers", "0"], "--workers"),
])
def test_usage_errors_exit_2(argv, match, capsys):
    assert cli.main(argv) == 2
    assert match in capsys.readouterr().err


def test_argparse_errors_exit_2(capsys):
    assert cli.main(["--dtype", "fp64"]) == 2
    assert cli.main(["--help"]) == 0
    assert "tilegen tune" in capsys.readouterr().out


def test_save_into_a_missing_directory_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["--save", str(tmp_path / "nope" / "x.json")]) == 2
    assert "no directory" in capsys.readouterr().err


def test_list_and_clear_need_no_gpu(cdir, monkeypatch, capsys):
    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    spec = S.default_spec("bf16", "row", "col")
    store.store(spec, 4096, 4096, 4096, "NVIDIA H200", "13.0", tflops=400.0, default_tflops=380.0)
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "1 entries" in out and "NVIDIA H200" in out and "bf16 rc" in out and "400.0 TFLOP/s" in out
    monkeypatch.setenv("TILEGEN_CACHE", "0")   # (the store off: said so, not "0 entries")
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "off (TILEGEN_CACHE=0)" in out and "entries" not in out
    monkeypatch.delenv("TILEGEN_CACHE")
    assert cli.main(["--clear-cache"]) == 0
    assert "deleted 1" in capsys.readouterr().out
    assert store.entries() == []


def test_share_splits_a_total_budget():
    assert cli.share(60, 420, 15, 15) == 60           # the first problems get their full budget ...
    assert cli.share(60, 240, 12, 15) == min(60, 240 - 15 * 11)
    assert cli.share(60, 100, 6, 15) == 25              # ... later ones what is left above the floor
    assert cli.share(60, 40, 3, 15) == 25               # only 2 of 3 fit: plan those
    assert cli.share(60, 10, 3, 15) == 0.0              # not even one fits: skipped
    assert cli.share(10, 1000, 5, 15) == 10             # the floor never exceeds the budget
    # a run under a total never plans past it
    total, spent = 420.0, 0.0
    for i in range(15):
        b = cli.share(60, total - spent, 15 - i, 15)
        spent += b
    assert spent <= total


def _fake_result(dt, lay, m, n, k, spec_ok=True):
    default = S.default_spec(dt, *lay, "f32", "sm_90")
    best = default.replace(tile=(128, 256, default.tile.k), warps=(2, 4))
    trials = [Trial(default, "default", status="ok", ms=1.0, final_ms=1.0, registers=230),
              Trial(best, "shape", status="ok", ms=0.8, final_ms=0.8, registers=240),
              Trial(default.replace(stages=5), "shape", status="compile-error", error="ValueError: boom")]
    from tilegen.tune.search import format_table, tflops

    return TuneResult(spec=best if spec_ok else None, tflops=tflops(m, n, k, 0.8) if spec_ok else 0.0,
                      candidates=trials, table=format_table(trials, m, n, k),
                      problem={"dtype": dt, "a_layout": lay[0], "b_layout": lay[1], "M": m, "N": n, "K": k,
                               "out_dtype": "f32"},
                      default_spec=default, default_tflops=tflops(m, n, k, 1.0), ms=0.8 if spec_ok else float("inf"),
                      rel_err=1e-6 if spec_ok else None, space_size=400, elapsed_s=12.0,
                      error="" if spec_ok else "no candidate ran correctly (see the table)")


def _fake_gpu(monkeypatch, calls, fail_on=()):
    import tilegen.tune.search as search
    import tilegen.bench.env as env

    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(runtime, "ensure_context", lambda device=0: None)
    monkeypatch.setattr(env, "environment", lambda device=0: {"gpu": "Fake GPU", "driver": "580.0"})

    def fake_tune(dtype, a, b, m, n, k, **kw):
        calls.append((dtype, a, b, m, n, k, kw["budget_s"]))
        lay = ("row" if a == "r" else "col", "row" if b == "r" else "col")
        return _fake_result(dtype, lay, m, n, k, spec_ok=(dtype, m) not in fail_on)

    monkeypatch.setattr(search, "tune", fake_tune)


def test_cli_prints_the_table_and_saves(monkeypatch, tmp_path, capsys):
    calls = []
    _fake_gpu(monkeypatch, calls)
    out_file = tmp_path / "tune.json"
    rc = cli.main(["--dtype", "f16", "bf16", "--layout", "rr", "--sizes", "4096", "4096x4096x1024",
                   "--budget-s", "30", "--save", str(out_file), "--quiet"])
    assert rc == 0
    # sizes first, then dtypes
    assert [(c[0], c[3], c[5]) for c in calls] == [("f16", 4096, 4096), ("bf16", 4096, 4096),
                                                   ("f16", 4096, 1024), ("bf16", 4096, 1024)]
    assert all(c[6] == 30 for c in calls)
    out = capsys.readouterr().out
    summary = out[out.index("best spec"):]
    assert "4096^3" in summary and "4096x4096x1024" in summary
    assert "128x256x64 w2x4 s3 128B g8 fb2" in summary and "1.25x" in summary
    assert "compile-error" in out  # the per-problem top table
    doc = json.loads(out_file.read_text())
    assert doc["environment"]["gpu"] == "Fake GPU"
    assert len(doc["results"]) == 4 and doc["results"][0]["speedup"] == 1.25
    assert doc["results"][0]["candidates"][2]["status"] == "compile-error"


def test_cli_exit_1_when_a_problem_found_nothing(monkeypatch, capsys):
    calls = []
    _fake_gpu(monkeypatch, calls, fail_on=[("tf32", 2048)])
    assert cli.main(["--dtype", "tf32", "--sizes", "2048", "1024", "--quiet", "--top", "0"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: no candidate ran correctly" in out
    assert len(calls) == 2  # the failure did not stop the next problem


def test_cli_total_budget_skips_what_does_not_fit(monkeypatch, capsys):
    calls = []
    _fake_gpu(monkeypatch, calls)

    t = [0.0]
    monkeypatch.setattr(cli, "_clock", lambda: t[0])

    import tilegen.tune.search as search
    inner = search.tune

    def slow_tune(*a, **kw):
        t[0] += kw["budget_s"]
        return inner(*a, **kw)

    monkeypatch.setattr(search, "tune", slow_tune)
    rc = cli.main(["--dtype", "f16", "--sizes", "1024", "2048", "4096", "--budget-s", "60",
                   "--total-budget-s", "100", "--min-budget-s", "20", "--quiet", "--top", "0"])
    assert rc == 0
    assert [c[6] for c in calls] == [60, 20, 20]
    calls.clear()
    t[0] = 0.0
    rc = cli.main(["--dtype", "f16", "--sizes", "1024", "2048", "4096", "--budget-s", "60",
                   "--total-budget-s", "50", "--min-budget-s", "20", "--quiet", "--top", "0"])
    assert [c[6] for c in calls] == [30, 20]  # the first problems run, the last is skipped
    out = capsys.readouterr().out
    last = [ln for ln in out.splitlines() if ln.startswith("f16")][-1]
    assert "4096^3" in last and "skipped" in last
