"""verify_fragments / the script entry, driven on the CPU: the GPU is replaced by the
ISA model of test_verify_record, so the report, skips, record and exit codes are checked."""
import json

import numpy as np
import pytest

import tilegen.runtime
from tilegen.errors import DeviceError
from tilegen.runtime.driver import DeviceInfo
from tilegen.verify import fragments

from test_verify_record import HW


def fake_gpu(monkeypatch, cc=(9, 0), broken=None, failing=None):
    monkeypatch.setattr(tilegen.runtime, "device_info",
                        lambda device=0: DeviceInfo("Model GPU", cc, 132, 232448, "13.0"))

    def run(probe, device=0):
        if probe.name == failing:
            raise DeviceError("the CUDA driver could not JIT-compile the PTX: boom\nlog")
        out = np.array(HW[probe.kind](probe.op, {k: v.tolist() for k, v in probe.inputs.items()}),
                       dtype=np.uint32)
        if probe.name == broken:
            out[[0, 5]] = out[[5, 0]]
        return out
    monkeypatch.setattr(fragments, "run_probe", run)


def test_all_probes_pass_and_record_is_written(monkeypatch, tmp_path):
    fake_gpu(monkeypatch)
    path = tmp_path / "rec.json"
    report = fragments.verify_fragments(record_path=str(path))
    assert report.passed and not report.failures
    assert [r.status for r in report.results] == ["pass"] * (23 + len(fragments.WGMMA_CASES))
    rec = json.loads(path.read_text())
    assert (rec["gpu"], rec["cc"], rec["driver_version"]) == ("Model GPU", [9, 0], "13.0")
    assert all(p["passed"] and "out" in p for p in rec["probes"])
    assert fragments.compare_with_record(rec) == []
    assert f"{23 + len(fragments.WGMMA_CASES)} passed, 0 failed, 0 skipped on Model GPU (cc 9.0, CUDA driver 13.0)" in report.table()


def test_wgmma_probes_run_on_sm_90_only(monkeypatch):
    """sm_90a code loads on compute capability 9.0 only: a newer GPU skips the wgmma probes."""
    fake_gpu(monkeypatch, cc=(10, 0))
    report = fragments.verify_fragments()
    skipped = {r.name for r in report.results if r.status == "skip"}
    assert skipped == set(fragments.WGMMA_CASES) and report.passed
    assert all("sm_90 only" in r.note for r in report.results if r.status == "skip")


def test_older_gpu_skips_what_it_lacks(monkeypatch):
    fake_gpu(monkeypatch, cc=(8, 0))
    report = fragments.verify_fragments()
    skipped = {r.name for r in report.results if r.status == "skip"}
    assert skipped == {n for n, (_, op) in fragments.all_ops().items() if op.min_sm > 80}
    assert len(skipped) == 4 + 6 + len(fragments.WGMMA_CASES) and report.passed
    assert {p["name"] for p in report.record["probes"]}.isdisjoint(skipped)


def test_failures_are_reported(monkeypatch):
    fake_gpu(monkeypatch, broken="mma.m16n8k16.bf16.f32", failing="ldmatrix.x1")
    report = fragments.verify_fragments(["m16n8k16.bf16.f32", "ldmatrix.x1", "ldmatrix.x2"])
    status = {r.name: r.status for r in report.results}
    assert status == {"mma.m16n8k16.bf16.f32": "fail", "ldmatrix.x1": "error", "ldmatrix.x2": "pass"}
    assert not report.passed
    table = report.table()
    assert "mma.m16n8k16.bf16.f32: lane 0 reg" in table and "boom" in table
    found = fragments.compare_with_record(report.record)
    assert {m.probe for m in found} == {"mma.m16n8k16.bf16.f32", "ldmatrix.x1"}


def test_unknown_probe_name():
    with pytest.raises(ValueError, match="unknown probe 'm8n8k4'; allowed: mma.m16n8k8.tf32.f32"):
        fragments.verify_fragments(["m8n8k4"])


def test_script_exit_codes(monkeypatch, tmp_path, capsys):
    fake_gpu(monkeypatch)
    out = tmp_path / "f.json"
    assert fragments.main(["--out", str(out)]) == 0
    assert "ldmatrix.x4.trans" in capsys.readouterr().out and out.exists()
    fake_gpu(monkeypatch, broken="stmatrix.x2")
    assert fragments.main(["--atoms", "stmatrix.x2"]) == 1


def test_script_without_gpu(monkeypatch, capsys):
    def no_gpu(device=0):
        raise DeviceError("no GPU found: ...; pass device='sim' to run the CPU emulator instead")
    monkeypatch.setattr(tilegen.runtime, "device_info", no_gpu)
    assert fragments.main([]) == 2
    assert "no GPU found" in capsys.readouterr().err


def test_bad_options_are_refused_before_any_probe_runs(monkeypatch, tmp_path, capsys):
    """An --out that cannot be written, a negative seed or device: said at once (exit 2), before
    the probes' GPU work (a record path in a missing folder had failed only at the end, naming
    its temporary file)."""
    ran = []
    monkeypatch.setattr(fragments, "run_probe", lambda probe, device=0: ran.append(probe))
    for argv, said in ((["--out", str(tmp_path / "none" / "f.json")], "no folder"),
                       (["--out", str(tmp_path)], "is a folder"),
                       (["--seed", "-3"], "--seed -3: the seed is a non-negative integer"),
                       (["--device", "-1"], "--device -1")):
        assert fragments.main(argv) == 2
        assert said in capsys.readouterr().err
    assert not ran
