"""The fragment record: a GPU dump re-checked on the CPU against tilegen.arch's tables.

The "hardware" here is a numpy model written from the PTX ISA formulas (ptx.md sections
2 and 3), using the ISA's element numbering, not tilegen's tables or code. A synthetic
record made with it must match the tables; a damaged record or a damaged table must not.
"""
import copy
import dataclasses
import json
import os

import ml_dtypes
import numpy as np
import pytest

from tilegen.arch import LDMATRIX, MMA_ATOMS, FragmentMap
from tilegen.arch import wgmma as arch_wgmma
from tilegen.verify import expect
from tilegen.verify.fragments import (RECORD_FORMAT, WGMMA_CASES, all_ops, build_probes, compare_with_record,
                                      load_record, write_record)

H200_RECORD = os.path.join(os.path.dirname(__file__), "data", "fragments_h200.json")

NP = {"tf32": np.float32, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
      "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
BITS = {"tf32": 32, "f32": 32, "f16": 16, "bf16": 16, "e4m3": 8, "e5m2": 8}


# ---- the ISA, element by element: (lane, element i) -> (row, col) ----------------------

def isa_a(k, bits, lane, i):
    g, t = lane >> 2, lane & 3
    if bits == 32 and k == 8:    # 2.2: a0 (g,t) a1 (g+8,t) a2 (g,t+4) a3 (g+8,t+4)
        return [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)][i]
    if bits == 32 and k == 4:    # 2.3
        return [(g, t), (g + 8, t)][i]
    if bits == 16 and k == 16:   # 2.4
        return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)
    if bits == 16 and k == 8:    # 2.2 note: a0,a1 (g, 2t+{0,1}); a2,a3 (g+8, ...)
        return g + 8 * (i >> 1), 2 * t + (i & 1)
    if bits == 8 and k == 32:    # 2.5
        return g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >> 3)
    raise AssertionError((k, bits))


def isa_b(k, bits, lane, i):
    g, t = lane >> 2, lane & 3
    if bits == 32 and k == 8:
        return [(t, g), (t + 4, g)][i]
    if bits == 32 and k == 4:
        return (t, g)
    if bits == 16 and k == 16:
        return 2 * t + (i & 1) + 8 * (i >> 1), g
    if bits == 16 and k == 8:
        return 2 * t + i, g
    if bits == 8 and k == 32:
        return 4 * t + (i & 3) + 16 * (i >> 2), g
    raise AssertionError((k, bits))


def isa_c(lane, i):              # 2.1: c0..c3
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def element(words, bits, lane, i):
    """Raw bits of element i: packed registers hold 32/bits elements, low bits first."""
    per = 32 // bits
    return (int(words[lane][i // per]) >> (bits * (i % per))) & ((1 << bits) - 1)


def value(raw, name):
    u = {8: np.uint8, 16: np.uint16, 32: np.uint32}[BITS[name]]
    return float(np.array([raw], dtype=u).view(NP[name])[0])


def bits_of(x, name):
    u = {8: np.uint8, 16: np.uint16, 32: np.uint32}[BITS[name]]
    return int(np.array([x], dtype=NP[name]).view(u)[0])


def hw_mma(atom, inp):
    a_t, b_t, c_t, k = atom.a_type.name, atom.b_type.name, atom.acc_type.name, atom.k
    A, B, C = np.zeros((16, k)), np.zeros((k, 8)), np.zeros((16, 8))
    for lane in range(32):
        for i in range(16 * k // 32):
            A[isa_a(k, BITS[a_t], lane, i)] = value(element(inp["a"], BITS[a_t], lane, i), a_t)
        for i in range(8 * k // 32):
            B[isa_b(k, BITS[b_t], lane, i)] = value(element(inp["b"], BITS[b_t], lane, i), b_t)
        for i in range(4):
            C[isa_c(lane, i)] = value(element(inp["c"], BITS[c_t], lane, i), c_t)
    D = A @ B + C
    cb = BITS[c_t]
    out = [[0] * (4 * cb // 32) for _ in range(32)]
    for lane in range(32):
        for i in range(4):
            per = 32 // cb
            out[lane][i // per] |= bits_of(D[isa_c(lane, i)], c_t) << (cb * (i % per))
    return out


def half(words_row, col):
    return (int(words_row[col // 2]) >> (16 * (col % 2))) & 0xFFFF


def hw_ldmatrix(op, inp):
    """3.1: lanes 8j..8j+7 address rows of matrix j; lane l gets (row l/4, cols 2(l%4)+{0,1})
    of matrix j, or with .trans (rows 2(l%4)+{0,1}, col l/4)."""
    shared, offs = inp["shared"], inp["offsets"]
    row = lambda j, r: shared[offs[8 * j + r] // 16]
    out = []
    for lane in range(32):
        regs = []
        for j in range(op.num):
            if op.trans:
                c = lane // 4
                lo, hi = half(row(j, 2 * (lane % 4)), c), half(row(j, 2 * (lane % 4) + 1), c)
            else:
                r = row(j, lane // 4)
                lo, hi = half(r, 2 * (lane % 4)), half(r, 2 * (lane % 4) + 1)
            regs.append(lo | hi << 16)
        out.append(regs)
    return out


def hw_stmatrix(op, inp):
    rows = 8 * op.num
    shared = [[0xFFFF] * 8 for _ in range(rows)]  # the probe poisons the tile
    offs = inp["offsets"]
    for lane in range(32):
        for j in range(op.num):
            w = int(inp["regs"][lane][j])
            lo, hi = w & 0xFFFF, w >> 16
            if op.trans:
                c = lane // 4
                shared[offs[8 * j + 2 * (lane % 4)] // 16][c] = lo
                shared[offs[8 * j + 2 * (lane % 4) + 1] // 16][c] = hi
            else:
                s = shared[offs[8 * j + lane // 4] // 16]
                s[2 * (lane % 4)], s[2 * (lane % 4) + 1] = lo, hi
    return [[r[2 * w] | r[2 * w + 1] << 16 for w in range(4)] for r in shared]


def hw_wgmma(case, inp):
    """6.3: descriptor fields by bit position; the canonical layouts in 16-byte units: a
    K-major row of 8 x 16 B chunks per 8-row atom, chunk ^= row-in-atom (128B), the low two
    (64B) or one (32B) bit of it; MN-major: panels of span bytes along MN, 8 K-rows per atom.
    6.2: thread 32w + l, register i holds D[16w + l/4 + 8((i>>1)&1), 8(i>>2) + 2(l%4) + (i&1)]."""
    image = np.asarray(inp["shared"], dtype=np.uint32).view(np.uint8)
    es = {"f16": 2, "bf16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1}[case.shape.dtype]
    span = {1: 128, 2: 64, 3: 32}
    n, k = case.shape.n, case.shape.k
    D = np.zeros((64, n))
    for step in inp["desc"]:
        mats = []
        for lo, hi, rows, k_major, name in ((step[0], step[1], 64, case.a_k_major, case.shape.dtype),
                                           (step[2], step[3], n, case.b_k_major,
                                            case.shape.b_dtype or case.shape.dtype)):
            start, lbo, sbo, sw = (lo & 0x3FFF) * 16, ((lo >> 16) & 0x3FFF) * 16, (hi & 0x3FFF) * 16, hi >> 30
            S = span[sw]
            M = np.zeros((rows, k))
            for r in range(rows):
                for c in range(k):
                    if k_major:
                        a = start + (r // 8) * sbo + (r % 8) * S + c * es
                    else:
                        per = S // es
                        a = start + (r // per) * lbo + (c // 8) * sbo + (c % 8) * S + (r % per) * es
                    chunk, atom_row = (a >> 4) & (S // 16 - 1), (a >> 7) & (S // 16 - 1)
                    a = (a & ~((S // 16 - 1) << 4)) | ((chunk ^ atom_row) << 4)
                    raw = int.from_bytes(bytes(image[a:a + es]), "little")
                    M[r, c] = value(raw, name)
            mats.append(M)
        D += mats[0] @ mats[1].T
    out = []
    for t in range(128):
        w, l = t // 32, t % 32
        out.append([bits_of(D[16 * w + l // 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (l % 4) + (i & 1)], "f32")
                    for i in range(n // 2)])
    return out


HW = {"mma": hw_mma, "ldmatrix": hw_ldmatrix, "stmatrix": hw_stmatrix, "wgmma": hw_wgmma}


def synthetic_record():
    probes = []
    for p in build_probes():
        inputs = {k: np.asarray(v).tolist() for k, v in p.inputs.items()}
        probes.append({"name": p.name, "kind": p.kind, "instruction": p.instruction,
                       "target": p.target, "inputs": inputs,
                       "out": HW[p.kind](p.op, inputs), "passed": True})
    return {"format": RECORD_FORMAT, "gpu": "numpy model of the PTX ISA", "cc": [9, 0],
            "driver_version": "none", "date": "synthetic", "probes": probes}


@pytest.fixture(scope="module")
def record():
    return synthetic_record()


def test_record_covers_every_probe(record):
    assert {p["name"] for p in record["probes"]} == set(all_ops())
    assert len(record["probes"]) == len(MMA_ATOMS) + 12 + len(WGMMA_CASES)
    wgmma = [p for p in record["probes"] if p["kind"] == "wgmma"]
    assert {p["instruction"].split(".")[-1] for p in wgmma} == {"f16", "bf16", "tf32", "e4m3", "e5m2"}
    assert {p["name"].split(".")[-2] for p in wgmma} == {"128B", "64B", "32B"}
    assert {p["name"].split(".")[-1] for p in wgmma} == {"kk", "km", "mk", "mm"}


def test_tables_match_the_isa_model(record):
    assert compare_with_record(record) == []


def test_record_survives_json(record, tmp_path):
    path = tmp_path / "rec.json"
    write_record(record, path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(record))
    assert compare_with_record(load_record(path)) == []
    assert compare_with_record(str(path)) == []


def test_swapped_lane_pair_is_caught(record):
    bad = copy.deepcopy(record)
    for p in bad["probes"]:
        out = p["out"]
        out[0], out[5] = out[5], out[0]  # lanes 0 and 5 (shared rows 0 and 5 for stmatrix)
    found = compare_with_record(bad)
    assert {m.probe for m in found} == set(all_ops())
    lanes = {m.where.split()[1] for m in found if m.probe.startswith(("mma", "ldmatrix"))}
    assert lanes == {"0", "5"}


def test_changed_input_word_is_caught(record):
    bad = copy.deepcopy(record)
    probe = next(p for p in bad["probes"] if p["name"] == "mma.m16n8k16.f16.f32")
    probe["inputs"]["a"][3][1] ^= 0x3C00  # f16 1.0 flipped into a low half
    assert {m.probe for m in compare_with_record(bad)} == {"mma.m16n8k16.f16.f32"}


def _swap_regs(frag: FragmentMap, r0: int, r1: int) -> FragmentMap:
    coords = tuple(tuple(regs[r1] if r == r0 else regs[r0] if r == r1 else regs[r]
                         for r in range(len(regs))) for regs in frag.coords)
    return dataclasses.replace(frag, coords=coords)


def test_wrong_mma_table_is_caught(record, monkeypatch):
    name = "m16n8k8.tf32.f32"
    atom = MMA_ATOMS[name]
    monkeypatch.setitem(MMA_ATOMS, name, dataclasses.replace(atom, a=_swap_regs(atom.a, 1, 2)))
    assert {m.probe for m in compare_with_record(record)} == {"mma." + name}


def test_wrong_ldmatrix_table_is_caught(record, monkeypatch):
    op = LDMATRIX[(4, True)]
    monkeypatch.setitem(LDMATRIX, (4, True), dataclasses.replace(op, fragment=LDMATRIX[(4, False)].fragment))
    assert {m.probe for m in compare_with_record(record)} == {"ldmatrix.x4.trans"}


WGMMA = set(WGMMA_CASES)


def test_wrong_wgmma_accumulator_map_is_caught(record, monkeypatch):
    right = arch_wgmma.accumulator_coord
    monkeypatch.setattr(expect, "accumulator_coord", lambda w, l, i: right(w, l ^ 1, i))
    assert {m.probe for m in compare_with_record(record)} == WGMMA


def test_wrong_swizzle_code_is_caught(record, monkeypatch):
    monkeypatch.setitem(arch_wgmma.SWIZZLE_CODE, "128B", 2)
    monkeypatch.setitem(arch_wgmma.SWIZZLE_CODE, "64B", 1)
    found = {m.probe for m in compare_with_record(record)}
    assert found == {n for n in WGMMA if ".128B." in n or ".64B." in n}


def test_wrong_mn_major_panel_offset_is_caught(record, monkeypatch):
    right = arch_wgmma.Descriptor.address

    def address(self, mn, k, esize, k_major):   # panels along MN read at the wrong distance
        if k_major:
            return right(self, mn, k, esize, k_major)
        return right(arch_wgmma.Descriptor(self.start, self.leading + 16 * (self.leading > 0), self.stride,
                                           self.mode), mn, k, esize, k_major)
    monkeypatch.setattr(arch_wgmma.Descriptor, "address", address)
    found = {m.probe for m in compare_with_record(record)}
    # one MN-major panel along MN in the 128B/64B probes whose MN fits one panel: unaffected
    assert found == {"wgmma.m64n16k16.f16.32B.mm", "wgmma.m64n32k16.f16.64B.mm"}


def test_changed_descriptor_word_is_caught(record):
    bad = copy.deepcopy(record)
    probe = next(p for p in bad["probes"] if p["name"] == "wgmma.m64n32k8.tf32.128B.kk")
    probe["inputs"]["desc"][1][2] += 2   # step 1: B's start address 32 bytes on
    assert {m.probe for m in compare_with_record(bad)} == {"wgmma.m64n32k8.tf32.128B.kk"}


def test_errored_or_unknown_probes_are_reported(record):
    bad = copy.deepcopy(record)
    del bad["probes"][0]["out"]
    bad["probes"][0]["error"] = "JIT failed\nmore"
    bad["probes"][1]["name"] = "mma.m99"
    found = compare_with_record(bad)
    assert len(found) == 2
    assert "no output recorded (JIT failed)" in str(found[0])
    assert "no such probe" in str(found[1])
    assert compare_with_record({"format": "other"})[0].where == "format"


@pytest.mark.skipif(not os.path.exists(H200_RECORD), reason="no recorded GPU dump yet")
def test_recorded_h200_dump_matches_tables():
    rec = load_record(H200_RECORD)
    sm = 10 * rec["cc"][0] + rec["cc"][1]
    expected = {n for n, (_, op) in all_ops().items() if op.min_sm <= sm}
    assert {p["name"] for p in rec["probes"]} >= expected
    mismatches = compare_with_record(rec)
    assert mismatches == [], "\n".join(map(str, mismatches[:20]))
