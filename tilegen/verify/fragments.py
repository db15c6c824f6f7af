"""Hardware verification of the fragment maps (`tilegen verify-fragments`).

One probe per mma atom and per ldmatrix/stmatrix variant in tilegen.arch, and one per
wgmma case below. The host packs random inputs into 32-bit words per (lane, register)
with the tables, a one-warp kernel runs the instruction and dumps every register (or the
shared tile), and the host checks the words against the tables (tilegen.verify.expect).
A wgmma probe instead places A and B in a shared-memory image where tilegen.arch.wgmma's
descriptor model says the hardware reads each element, passes the descriptors encoded by
that module, and one warpgroup dumps the accumulator registers. The record keeps the exact
words fed and returned, so `compare_with_record` re-checks the tables on any machine.

Limit: an mma probe cannot see a relabelling of k applied identically to A and B (the
product is unchanged); the ldmatrix/stmatrix probes check element positions directly.

    python3 -m tilegen.verify.fragments --out fragments.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from .. import runtime
from ..arch import LDMATRIX, MMA_ATOMS, STMATRIX, MatrixLoad, MmaAtom, dtype
from ..arch.swizzle import SWIZZLE_MODES
from ..arch.wgmma import Descriptor, WgmmaShape, descriptor_strides, encode_descriptor
from ..errors import DeviceError
from ..version import __version__
from . import ptx as probe_ptx
from .expect import CHECKS, Mismatch, from_values, gather, pack

RECORD_FORMAT = "tilegen-fragment-record/1"
SEED = 2024


# ---- which probes exist ----------------------------------------------------------------

@dataclass(frozen=True)
class WgmmaCase:
    """One wgmma probe: a shape, the swizzle of both operand tiles and their major-ness.

    K spans one swizzle row (128B: 64 f16 / 32 tf32 / 128 fp8 elements), so the probe
    issues K / k wgmmas that advance the descriptors' start addresses as a GEMM does.
    """

    shape: WgmmaShape
    mode: str                 # "128B", "64B" or "32B"
    a_k_major: bool = True
    b_k_major: bool = True
    min_sm = 90

    @property
    def name(self) -> str:
        s = self.shape
        types = s.dtype + (f".{s.b_dtype}" if s.b_dtype and s.b_dtype != s.dtype else "")
        major = "".join("k" if km else "m" for km in (self.a_k_major, self.b_k_major))
        return f"wgmma.m64n{s.n}k{s.k}.{types}.{self.mode}.{major}"

    @property
    def instruction(self) -> str:
        return self.shape.instruction()

    @property
    def esize(self) -> int:
        return dtype(self.shape.dtype).bytes   # fp8 pairs: both one byte

    @property
    def k_extent(self) -> int:
        return SWIZZLE_MODES[self.mode].span // self.esize

    @property
    def steps(self) -> int:
        return self.k_extent // self.shape.k

    def operands(self):
        """(name, rows, k_major, dtype, region start) of A and B in the shared image."""
        s = self.shape
        a_bytes = 64 * self.k_extent * self.esize
        return (("a", 64, self.a_k_major, s.dtype, 0),
                ("b", s.n, self.b_k_major, s.b_dtype or s.dtype, -(-a_bytes // 1024) * 1024))

    @property
    def image_bytes(self) -> int:
        _, rows, _, _, start = self.operands()[1]
        return start + -(-rows * self.k_extent * self.esize // 1024) * 1024

    def descriptors(self) -> np.ndarray:
        """(steps, 2 operands) 64-bit descriptors, start addresses relative to the image."""
        out = np.zeros((self.steps, 2), dtype=np.uint64)
        for j, (_, _, k_major, _, start) in enumerate(self.operands()):
            leading, stride = descriptor_strides(self.mode, self.k_extent, k_major)
            for s in range(self.steps):
                k0 = s * self.shape.k
                step = k0 * self.esize if k_major else (k0 // 8) * stride
                out[s, j] = encode_descriptor(start + step, self.mode, leading, stride)
        return out


def _wgmma_cases() -> list:
    def case(dtype, n, mode, major="kk", b_dtype=""):
        return WgmmaCase(WgmmaShape(dtype, n, b_dtype), mode, major[0] == "k", major[1] == "k")
    cases = [case("f16", 32, mode) for mode in ("128B", "64B", "32B")]
    cases += [case("f16", 64, "128B", major) for major in ("km", "mk", "mm")]
    cases += [case("f16", 32, "64B", "mm"), case("f16", 16, "32B", "mm")]
    cases += [case("bf16", 32, "128B"), case("bf16", 64, "128B", "mm"), case("bf16", 256, "128B")]
    cases += [case("tf32", 32, mode) for mode in ("128B", "64B", "32B")]
    cases += [case("e4m3", 32, "128B"), case("e4m3", 32, "32B"), case("e5m2", 32, "128B"),
              case("e4m3", 32, "128B", b_dtype="e5m2"), case("e5m2", 32, "128B", b_dtype="e4m3")]
    return cases


WGMMA_CASES = {c.name: c for c in _wgmma_cases()}


def all_ops() -> dict:
    """probe name -> (kind, op) for every mma atom, ldmatrix/stmatrix variant and wgmma case."""
    ops = {f"mma.{name}": ("mma", atom) for name, atom in MMA_ATOMS.items()}
    for table in (LDMATRIX, STMATRIX):
        for op in table.values():
            ops[op.fragment.name] = (op.op, op)
    ops.update((name, ("wgmma", case)) for name, case in WGMMA_CASES.items())
    return ops


def _select(atoms) -> dict:
    ops = all_ops()
    if atoms is None:
        return ops
    if isinstance(atoms, (str, MmaAtom, MatrixLoad)):
        atoms = [atoms]
    chosen = {}
    for a in atoms:
        if isinstance(a, MmaAtom):
            name = f"mma.{a.name}"
        elif isinstance(a, MatrixLoad):
            name = a.fragment.name
        elif isinstance(a, WgmmaCase):
            name = a.name
        else:
            name = a if a in ops else f"mma.{a}"
        if name not in ops:
            raise ValueError(f"unknown probe {a!r}; allowed: {', '.join(ops)}")
        chosen[name] = ops[name]
    return chosen


# ---- inputs ----------------------------------------------------------------------------

def _ints(rng, dt, shape) -> np.ndarray:
    limit = 4 if dt.bits == 8 else 8  # fp8 holds -4..4 exactly; the wider types -8..8
    return rng.integers(-limit, limit + 1, size=shape).astype(np.float64)


def mma_inputs(atom, rng) -> dict:
    """Random small integers (exact in every type), packed per lane and register."""
    a = _ints(rng, atom.a_type, (atom.m, atom.k))
    b = _ints(rng, atom.b_type, (atom.k, atom.n))
    c = _ints(rng, atom.acc_type, (atom.m, atom.n))
    operands = (("a", atom.a, a, atom.a_type), ("b", atom.b, b, atom.b_type),
                ("c", atom.c, c, atom.acc_type))
    return {name: pack(from_values(gather(frag, mat), dt), dt.bits)
            for name, frag, mat, dt in operands}


def _row_offsets(op, slot_of_row) -> np.ndarray:
    """Byte offset each lane gives: the slot of the stack row the table says it addresses."""
    offsets = np.zeros(32, dtype=np.uint32)  # lanes that address nothing point at slot 0
    for i, slot in enumerate(slot_of_row):
        offsets[op.row_address_lane(i // 8, i % 8)] = 16 * slot
    return offsets


def matrix_inputs(op, rng) -> dict:
    """Distinct 16-bit values; stack rows placed at shuffled 16-byte slots of the tile."""
    rows = 8 * op.num
    values = np.arange(rows * 8).astype(np.float16).view(np.uint16)
    slot_of_row = rng.permutation(rows)
    offsets = _row_offsets(op, slot_of_row)
    if op.op == "ldmatrix":
        stack = values.reshape(rows, 8)
        shared = np.empty_like(stack)
        shared[slot_of_row] = stack
        return {"shared": pack(shared.reshape(rows, 4, 2), 16), "offsets": offsets}
    regs = rng.permutation(values).reshape(32, op.num, 2)
    return {"regs": pack(regs, 16), "offsets": offsets}


def wgmma_inputs(case: WgmmaCase, rng) -> dict:
    """Random small integers for A (64 x K) and B (N x K), each element stored in the image
    at the byte the descriptor model gives; the descriptors as (steps, 4) words."""
    image = np.zeros(case.image_bytes, dtype=np.uint8)
    desc = case.descriptors()
    for j, (_, rows, k_major, name, _) in enumerate(case.operands()):
        d = Descriptor.decode(int(desc[0, j]))
        addr = d.address(np.arange(rows)[:, None], np.arange(case.k_extent)[None, :], case.esize, k_major)
        raw = from_values(_ints(rng, dtype(name), (rows, case.k_extent)), name)
        image.reshape(-1)[(addr[..., None] + np.arange(case.esize)).ravel()] = raw.view(np.uint8).ravel()
    return {"shared": image.view(np.uint32), "desc": desc.view(np.uint32).reshape(case.steps, 4)}


# ---- probes ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    name: str
    kind: str                 # "mma" | "ldmatrix" | "stmatrix" | "wgmma"
    op: object                # MmaAtom, MatrixLoad or WgmmaCase
    target: str
    ptx: str
    entry: str
    inputs: dict              # kernel arguments in order: name -> uint32 array
    out_shape: tuple

    @property
    def threads(self) -> int:
        return 128 if self.kind == "wgmma" else 32

    @property
    def min_sm(self) -> int:
        return self.op.min_sm

    @property
    def instruction(self) -> str:
        return self.op.instruction

    def check(self, out) -> list:
        return CHECKS[self.kind](self.name, self.op, self.inputs, out)


def build_probe(name: str, kind: str, op, seed: int = SEED) -> Probe:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])  # independent of selection
    if kind == "mma":
        text, inputs, out_shape = probe_ptx.mma_ptx(op, name), mma_inputs(op, rng), (32, op.c.regs)
    elif kind == "ldmatrix":
        text, inputs, out_shape = probe_ptx.ldmatrix_ptx(op, name), matrix_inputs(op, rng), (32, op.num)
    elif kind == "wgmma":  # the output is the accumulator, per thread of the warpgroup
        text, inputs, out_shape = probe_ptx.wgmma_ptx(op, name), wgmma_inputs(op, rng), (128, op.shape.acc_regs)
    else:  # stmatrix: the output is the shared tile, 4 words per 16-byte row
        text, inputs = probe_ptx.stmatrix_ptx(op, name), matrix_inputs(op, rng)
        out_shape = (8 * op.num, 4)
    target = "sm_90a" if kind == "wgmma" else probe_ptx.probe_target(op.min_sm)
    return Probe(name, kind, op, target, text, probe_ptx.entry_name(name), inputs, out_shape)


def build_probes(atoms=None, seed: int = SEED) -> list:
    """Probes for `atoms` (names, MmaAtom or MatrixLoad objects; None = all)."""
    return [build_probe(name, kind, op, seed) for name, (kind, op) in _select(atoms).items()]


def run_probe(probe: Probe, device: int = 0) -> np.ndarray:
    """Run one probe on the GPU; returns the raw output words."""
    fn = runtime.load_module(probe.ptx, probe.entry, device)
    bufs = [runtime.DeviceBuffer.from_host(np.ascontiguousarray(v, dtype=np.uint32), device)
            for v in probe.inputs.values()]
    out = np.empty(probe.out_shape, dtype=np.uint32)
    out_buf = runtime.DeviceBuffer(out.nbytes, device)
    try:
        out_buf.fill_bytes(0xAB)  # poison: a register never stored reads 0xabababab
        fn.launch((1, 1, 1), (probe.threads, 1, 1), [(b, "ptr") for b in bufs] + [(out_buf, "ptr")])
        runtime.synchronize(device)
        return out_buf.copy_to_host(out)
    finally:
        for b in bufs + [out_buf]:
            b.close()


# ---- report and record -----------------------------------------------------------------

@dataclass
class ProbeResult:
    name: str
    kind: str
    instruction: str
    target: str
    status: str                       # "pass" | "fail" | "skip" | "error"
    mismatches: list = field(default_factory=list)
    note: str = ""


@dataclass
class Report:
    device: object                    # runtime.DeviceInfo
    results: list
    record: dict

    @property
    def passed(self) -> bool:
        return (all(r.status in ("pass", "skip") for r in self.results)
                and any(r.status == "pass" for r in self.results))

    @property
    def failures(self) -> list:
        return [r for r in self.results if r.status in ("fail", "error")]

    def table(self, details: int = 4) -> str:
        width = max([len(r.name) for r in self.results] + [5])
        lines = [f"{'probe':<{width}}  target  result  detail"]
        for r in self.results:
            lines.append(f"{r.name:<{width}}  {r.target:<6}  {r.status:<6}  {r.note}".rstrip())
            lines += [f"    {m}" for m in r.mismatches[:details]]
        n = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "error", "skip")}
        d = self.device
        lines.append(f"{n['pass']} passed, {n['fail'] + n['error']} failed, {n['skip']} skipped"
                     + (f" on {d.name} (cc {d.cc[0]}.{d.cc[1]}, CUDA driver {d.driver_version})"
                        if d else ""))
        return "\n".join(lines)


def _record_entry(probe: Probe) -> dict:
    version = re.search(r"^\.version (\S+)", probe.ptx, re.M).group(1)
    return {"name": probe.name, "kind": probe.kind, "instruction": probe.instruction,
            "target": probe.target, "ptx_version": version,
            "inputs": {k: np.asarray(a).tolist() for k, a in probe.inputs.items()}}


def verify_fragments(atoms=None, record_path=None, *, device: int = 0, seed: int = SEED) -> Report:
    """Run every probe the GPU supports; write the record to `record_path` when given."""
    probes = build_probes(atoms, seed)  # unknown names fail before the GPU is touched
    info = runtime.device_info(device)  # DeviceError, in plain words, without a GPU
    results, entries = [], []
    for probe in probes:
        res = ProbeResult(probe.name, probe.kind, probe.instruction, probe.target, "pass")
        results.append(res)
        if probe.min_sm > info.sm:
            res.status, res.note = "skip", f"needs sm_{probe.min_sm}; this GPU is sm_{info.sm}"
            continue
        if probe.target == "sm_90a" and info.sm != 90:   # arch-specific code loads on cc 9.0 only
            res.status, res.note = "skip", f"sm_90a code (wgmma) runs on sm_90 only; this GPU is sm_{info.sm}"
            continue
        entry = _record_entry(probe)
        entries.append(entry)
        try:
            out = run_probe(probe, device)
        except DeviceError as e:
            res.status, res.note = "error", str(e).splitlines()[0]
            entry["error"], entry["passed"] = str(e), False
            continue
        res.mismatches = probe.check(out)
        if res.mismatches:
            res.status, res.note = "fail", f"{len(res.mismatches)} mismatching words"
        entry["out"], entry["passed"] = out.tolist(), not res.mismatches

    record = {"format": RECORD_FORMAT, "gpu": info.name, "cc": list(info.cc),
              "driver_version": info.driver_version,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "tilegen": __version__, "seed": seed, "probes": entries}
    if record_path is not None:
        write_record(record, record_path)
    return Report(info, results, record)


def write_record(record: dict, path) -> None:
    """JSON with one line per row of words, written atomically."""
    text = json.dumps(record, indent=1)
    def one_line(m):
        return "[" + ", ".join(x.strip() for x in m.group(1).split(",") if x.strip()) + "]"

    text = re.sub(r"\[([\d,\s-]*)\]", one_line, text)  # lists of numbers on one line
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def load_record(path) -> dict:
    with open(path) as f:
        return json.load(f)


def compare_with_record(record) -> list:
    """Mismatches between tilegen.arch's tables and a recorded GPU dump (a dict or a path)."""
    if not isinstance(record, dict):
        record = load_record(record)
    if record.get("format") != RECORD_FORMAT:
        return [Mismatch("record", "format", note=f"format {record.get('format')!r}; "
                         f"expected {RECORD_FORMAT!r}")]
    ops = all_ops()
    found = []
    for p in record.get("probes", []):
        name = p.get("name")
        if name not in ops:
            found.append(Mismatch(str(name), "record", note="no such probe in tilegen.arch"))
            continue
        kind, op = ops[name]
        if p.get("kind") != kind:
            found.append(Mismatch(name, "record",
                                  note=f"kind {p.get('kind')!r}; tilegen says {kind!r}"))
        elif "out" not in p:
            error = str(p.get("error") or "no error recorded").splitlines()[0]
            found.append(Mismatch(name, "record", note=f"no output recorded ({error})"))
        else:
            try:
                found += CHECKS[kind](name, op, p["inputs"], p["out"])
            except (KeyError, ValueError, TypeError) as e:
                found.append(Mismatch(name, "record", note=f"malformed probe entry: {e!r}"))
    return found


def _argument_problem(args) -> str:
    """What is wrong with verify-fragments' options, or ""."""
    if args.seed < 0:
        return f"--seed {args.seed}: the seed is a non-negative integer"
    if args.device < 0:
        return f"--device {args.device}: a GPU's index is 0, 1, ..."
    if args.out:
        folder = os.path.dirname(os.path.abspath(args.out))
        if os.path.isdir(args.out):
            return f"--out {args.out} is a folder: name the record's file (FILE.json)"
        if not os.path.isdir(folder):
            return f"--out {args.out}: no folder {folder} to write the record in"
        if not os.access(folder, os.W_OK):
            return f"--out {args.out}: the folder {folder} is not writable"
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tilegen verify-fragments",
                                 description="Check tilegen's fragment maps on the GPU: probe kernels dump "
                                             "every lane's registers, compared with the tables of tilegen.arch.")
    ap.add_argument("--out", metavar="FILE.json", help="write the record (inputs and raw outputs)")
    ap.add_argument("--atoms", nargs="*", metavar="NAME",
                    help="probes to run (default: all), e.g. m16n8k16.f16.f32 ldmatrix.x4.trans")
    ap.add_argument("--device", type=int, default=0, help="the GPU's index (default 0)")
    ap.add_argument("--seed", type=int, default=SEED, help=f"the probes' random inputs (default {SEED})")
    args = ap.parse_args(argv)
    problem = _argument_problem(args)
    if problem:   # (said before any probe runs: a record that cannot be written wastes the GPU's work)
        print(f"tilegen verify-fragments: error: {problem}", file=sys.stderr)
        return 2
    try:
        report = verify_fragments(args.atoms or None, args.out, device=args.device, seed=args.seed)
    except DeviceError as e:  # the probes run on a GPU only: no emulator fallback here
        message = str(e).split("; pass device='sim'")[0].split("; install the NVIDIA driver, or pass")[0]
        print(f"tilegen verify-fragments: error: {message}: the probes need an NVIDIA GPU (the CPU "
              f"emulator's own tables are checked against tilegen.arch by the test suite)", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"tilegen verify-fragments: error: {e}", file=sys.stderr)
        return 2
    print(report.table())
    if args.out:
        print(f"record written to {args.out}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
