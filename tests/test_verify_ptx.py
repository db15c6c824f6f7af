"""Every fragment probe's PTX assembles with ptxas for the targets it claims, and the
probes are built from the tables (spelling, header, register counts, inputs)."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from tilegen.arch import MMA_ATOMS, STMATRIX, ptx_version_for
from tilegen.verify.expect import gather, pack, to_values, unpack
from tilegen.verify.fragments import all_ops, build_probe, build_probes, matrix_inputs
from tilegen.verify.ptx import probe_target

PTXAS = shutil.which("ptxas")
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas not installed")
PROBES = build_probes()
ARCHS = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_90a": 90}


def assemble(ptx: str, arch: str) -> subprocess.CompletedProcess:
    return subprocess.run([PTXAS, f"-arch={arch}", "-o", "/dev/null", "-"], input=ptx,
                          capture_output=True, text=True)


CASES = [(p, a) for p in PROBES for a, sm in ARCHS.items()
         if sm >= p.min_sm and (p.target != "sm_90a" or a == "sm_90a")]  # wgmma: sm_90a only


@needs_ptxas
@pytest.mark.parametrize("probe,arch", CASES, ids=[f"{p.name}-{a}" for p, a in CASES])
def test_probe_assembles(probe, arch):
    r = assemble(probe.ptx, arch)
    assert r.returncode == 0, r.stderr


def test_each_target_is_covered():
    assert {p.target for p in PROBES} == {"sm_80", "sm_89", "sm_90", "sm_90a"}
    assert {a for _, a in CASES} >= {"sm_80", "sm_89", "sm_90", "sm_90a"}


@needs_ptxas
def test_wgmma_probe_is_refused_on_plain_sm_90():
    probe = next(p for p in PROBES if p.kind == "wgmma")
    r = assemble(probe.ptx.replace(".target sm_90a", ".target sm_90"), "sm_90")
    assert r.returncode != 0 and "sm_90" in r.stderr


@needs_ptxas
def test_fp8_probe_is_refused_below_sm_89():
    fp8 = next(p for p in PROBES if p.name == "mma.m16n8k32.e4m3.f32")
    r = assemble(fp8.ptx, "sm_80")
    assert r.returncode != 0 and "target" in r.stderr.lower()


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_probe_header_and_spelling(probe):
    lines = probe.ptx.splitlines()
    features = {"mma": ["mma.fp8" if probe.op.min_sm == 89 else "mma"], "wgmma": ["wgmma"],
                "ldmatrix": ["ldmatrix"], "stmatrix": ["stmatrix"]}[probe.kind]
    major, minor = ptx_version_for(probe.target, features)
    assert lines[:3] == [f".version {major}.{minor}", f".target {probe.target}", ".address_size 64"]
    if probe.kind == "wgmma":
        assert probe.target == "sm_90a" and probe.threads == 128
        assert probe.ptx.count(probe.op.instruction + " ") == probe.op.steps  # one per k-step
    else:
        assert probe.target == {80: "sm_80", 75: "sm_80", 89: "sm_89", 90: "sm_90"}[probe.op.min_sm]
        assert probe.ptx.count(probe.op.instruction + " ") == 1
    assert re.search(rf"\.visible \.entry {probe.entry}\(", probe.ptx)
    assert probe.ptx.isascii()


def test_probe_targets():
    assert probe_target(75) == "sm_80" and probe_target(89) == "sm_89" and probe_target(90) == "sm_90"
    with pytest.raises(ValueError):
        probe_target(70 + 30)


@pytest.mark.parametrize("name", ["m16n8k16.f16.f32", "m16n8k8.tf32.f32", "m16n8k16.f16.f16",
                                  "m16n8k32.e4m3.e5m2.f32"])
def test_mma_probe_register_counts(name):
    atom = MMA_ATOMS[name]
    p = build_probe("mma." + name, "mma", atom)
    line = next(x for x in p.ptx.splitlines() if "mma.sync" in x and not x.startswith("//"))
    counts = [g.count("%") for g in re.findall(r"\{[^}]*\}", line)]
    assert counts == [atom.c.regs, atom.a.regs, atom.b.regs, atom.c.regs]
    assert {k: v.shape for k, v in p.inputs.items()} == {
        "a": (32, atom.a.regs), "b": (32, atom.b.regs), "c": (32, atom.c.regs)}
    assert p.out_shape == (32, atom.c.regs)


def test_mma_inputs_are_small_integers_in_their_type():
    for p in PROBES:
        if p.kind != "mma":
            continue
        atom = p.op
        for key, frag, dt in (("a", atom.a, atom.a_type), ("b", atom.b, atom.b_type),
                              ("c", atom.c, atom.acc_type)):
            vals = to_values(unpack(p.inputs[key], dt.bits), dt)
            limit = 4 if dt.bits == 8 else 8
            assert np.all(vals == np.round(vals)) and np.abs(vals).max() <= limit
            assert len(np.unique(vals)) > 3  # random, not constant


def test_matrix_probe_inputs_put_each_row_at_one_slot():
    op = STMATRIX[(4, True)]
    inp = matrix_inputs(op, np.random.default_rng(1))
    offs = inp["offsets"]
    assert sorted(offs // 16) == list(range(32)) and (offs % 16 == 0).all()
    halves = unpack(inp["regs"], 16).ravel()
    assert len(set(halves.tolist())) == 256  # every 16-bit element distinct
    ld = build_probe("ldmatrix.x2", "ldmatrix", all_ops()["ldmatrix.x2"][1])
    assert sorted(ld.inputs["offsets"][:16] // 16) == list(range(16))
    assert (ld.inputs["offsets"][16:] == 0).all()


def test_pack_roundtrip():
    words = np.random.default_rng(0).integers(0, 2**32, size=(32, 4), dtype=np.uint64).astype(np.uint32)
    for bits in (8, 16, 32):
        assert (pack(unpack(words, bits), bits) == words).all()
    assert unpack(np.array([0x44332211], np.uint32), 8).tolist() == [[0x11, 0x22, 0x33, 0x44]]


def test_gather_follows_the_map():
    atom = MMA_ATOMS["m16n8k16.f16.f32"]
    m = np.arange(16 * 16).reshape(16, 16)
    g = gather(atom.a, m)
    # lane 5: g=1, t=1; register 2 holds row g, cols 2t+8, 2t+9 (ptx.md 2.4)
    assert g[5, 2].tolist() == [m[1, 10], m[1, 11]]


def test_ldmatrix_lanes_address_their_stack_rows_at_shuffled_slots():
    p = build_probe("ldmatrix.x4", "ldmatrix", all_ops()["ldmatrix.x4"][1])
    shared = unpack(p.inputs["shared"], 16).reshape(32, 8)
    slots = p.inputs["offsets"] // 16
    assert (slots != np.arange(32)).any()  # the row addresses really come from the lanes
    for lane in range(32):  # stack row i holds the f16 values 8i .. 8i+7
        want = np.arange(8 * lane, 8 * lane + 8).astype(np.float16).view(np.uint16)
        assert shared[slots[lane]].tolist() == want.tolist()
