"""The `tilegen` command line.

    tilegen compile SPEC.tg --emit ptx|ir|resources|banks|tg [-o FILE]
    tilegen run SPEC.tg --m M --n N --k K [--device gpu|sim] [--seed S]
    tilegen show ATOM [--operand A|B|C] [--png FILE]
    tilegen demo [--dtype f16] [--size 256]
    tilegen bench ...             (tilegen.bench's own options)
    tilegen tune ...              (tilegen.tune's own options)
    tilegen verify-fragments ...  (tilegen.verify.fragments's own options)

SPEC.tg may be `-` (standard input) or left out (GemmSpec's defaults); every GemmSpec field
is also an option (`--dtype bf16 --tile 128x256x64 --epilogue "bias=col"`) that overrides
the file's value. Exit status: 0 ok; 1 failure (a wrong result, a compile or emulator error);
2 usage error, bad input (a spec that does not parse or validate) or no GPU where one is
required. See docs/cli.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import sys
import threading
import time
import typing
import warnings
from pathlib import Path

import numpy as np

from . import runtime, show
from .version import __version__
from .arch.dtypes import numpy_dtype
from .codegen.ptxas import PtxasError, find_ptxas
from .codegen.ptxas import resources as ptxas_resources
from .errors import LaunchError, SpecError, TilegenError
from .frontend import compile as compile_spec
from .gemm.call import refuse_long_emulation
from .gemm.prepare import plan as first_kernels
from .gemm.spec import GemmSpec, parse_spec_text, spec_to_text
from .gemm.template import gemm_kernel_name
from .gemm.textspec import MAX_BYTES as MAX_SPEC_BYTES
from .gemm.textspec import SpecFileError, SpecSyntaxError, int_dataclass, type_options

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EMIT = ("ptx", "ir", "resources", "banks", "tg")


class UsageError(Exception):
    """Bad input the user can fix (exit 2)."""


def _progress(msg: str):
    print(f"tilegen: {msg}", file=sys.stderr, flush=True)


# -- specs from files and options ----------------------------------------------------------

def _spec_fields() -> list:
    return [f for f in dataclasses.fields(GemmSpec) if f.init]


def _field_help() -> dict:
    """field -> 'legal values (default ...)' from GemmSpec's docstring table (a row whose field
    cell is empty continues the row above)."""
    out, last = {}, None
    for line in (GemmSpec.__doc__ or "").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0].startswith("-") or cells[0] == "field":
            continue
        if cells[0]:
            last = cells[0]
            out[last] = [cells[1], cells[2]]
        elif last is not None:
            out[last] = [f"{out[last][0]} {cells[1]}".strip(), f"{out[last][1]} {cells[2]}".strip()]
    return {k: f"{legal} (default: {default})" for k, (legal, default) in out.items()}


def _add_spec_args(p: argparse.ArgumentParser, spec_help: str):
    """SPEC plus one option per GemmSpec field (skipping any that would clash with the verb's)."""
    p.add_argument("spec", nargs="?", metavar="SPEC.tg", help=spec_help)
    taken = {s for a in p._actions for s in a.option_strings}
    g = p.add_argument_group("spec fields (override SPEC.tg; values as in a .tg file)")
    helps = _field_help()
    for f in _spec_fields():
        extra = _value_hint(f)
        names = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        names = [n for n in names if n not in taken]
        if names:
            g.add_argument(*names, dest=f"field_{f.name}", metavar="VALUE", default=None,
                           help=helps.get(f.name, f"GemmSpec.{f.name}") + extra)


def _value_hint(f) -> str:
    """How to write a field's value on the command line, from its type."""
    opts = type_options(typing.get_type_hints(GemmSpec).get(f.name))
    for t in opts:
        if int_dataclass(t):
            names = [x.name for x in dataclasses.fields(t) if x.init]
            example = {2: "2x4", 3: "128x256x64"}.get(len(names), "x".join("1" * len(names)))
            return f"; write {'x'.join(n.upper() for n in names)}, e.g. {example}"
        if dataclasses.is_dataclass(t):
            names = [x.name for x in dataclasses.fields(t) if x.init]
            return f"; write its fields as 'NAME=VALUE ...' ({', '.join(names)})"
    return ""


def spec_from_args(args):
    """The GemmSpec a verb works on: SPEC.tg (a path, '-' for stdin, or none) plus the options."""
    overrides = {f.name: getattr(args, f"field_{f.name}") for f in _spec_fields()
                 if getattr(args, f"field_{f.name}", None) is not None}
    if args.spec is None:
        text, source = "gemm { }", "<defaults>"
    elif args.spec == "-":
        text, source = sys.stdin.read(MAX_SPEC_BYTES + 1), "<stdin>"  # more is refused by the parser
    else:
        path = Path(args.spec)
        if path.is_dir():
            raise UsageError(f"{args.spec} is a directory; give a .tg file (or '-' for standard input)")
        if not path.exists():
            raise UsageError(f"no such spec file: {args.spec}")
        if path.is_file() and path.stat().st_size > MAX_SPEC_BYTES:
            raise UsageError(f"{args.spec} has {path.stat().st_size} bytes; a spec file has at most {MAX_SPEC_BYTES}")
        try:   # (a pipe or a device, e.g. <(...), is read as far as the parser takes)
            with path.open() as f:
                text, source = f.read(MAX_SPEC_BYTES + 1), str(path)
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read {args.spec}: {e}") from None
    return parse_spec_text(text, overrides=overrides, source=source)


# -- compile -------------------------------------------------------------------------------

def _say_first_kernels(spec) -> None:
    """A spec whose operands first kernels prepare (gemm/prepare.py): what runs before the GEMM
    that --emit shows, and where their PTX is."""
    if not getattr(spec, "prepared_operands", ()):
        return
    names = ", ".join(f"{p.kernel.name} ({' and '.join(p.operands)})" for p in first_kernels(spec, 1, 1, 1)[0])
    _progress(f"before this GEMM, first kernels prepare its operands: {names}; their PTX: "
              f"tilegen.gemm.prepare.plan(spec, M, N, K)[0][i].kernel.ptx (docs/hopper_gemm.md)")


def _compile(args) -> int:
    spec = spec_from_args(args)
    if args.emit == "tg":
        text = _spec_text(spec, args.minimal)
    else:
        kernel = compile_spec(spec)
        _say_first_kernels(spec)
        if args.emit == "ptx":
            text = kernel.ptx
        elif args.emit == "ir":
            text = kernel.ir
        elif args.emit == "banks":
            text = kernel.bank_report()
        else:
            if find_ptxas() is None:
                off = os.environ.get("TILEGEN_PTXAS", "").strip().lower() == "off"
                raise UsageError("--emit resources needs ptxas (CUDA 12.8 or newer): " + (
                    "TILEGEN_PTXAS=off says to use none; unset it" if off else
                    "install the CUDA toolkit or `pip install nvidia-cuda-nvcc`"))
            try:
                report = ptxas_resources(kernel.ptx, kernel.target, kernel.smem_bytes)
            except PtxasError as e:   # (its message carries ptxas's own)
                raise TilegenError(f"ptxas could not assemble {kernel.name} for {kernel.target}: {e}") from None
            # every field as resolved: the defaults that depend on others (instruction -> target,
            # tile, warps, stages) included
            text = f"{spec}\n{report}"
    if not text.endswith("\n"):
        text += "\n"
    if args.output and args.output != "-":
        try:
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror or e}") from None
        _progress(f"wrote {args.emit} of {_kernel_name(spec)} to {args.output} ({len(text.splitlines())} lines)")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _spec_text(spec, minimal: bool = False) -> str:
    return spec_to_text(spec, minimal=minimal)


def _kernel_name(spec) -> str:
    return gemm_kernel_name(spec)


# -- run -----------------------------------------------------------------------------------

# Unit roundoffs: of an operand (what the kernel rounds inputs to) and of the output.
_UNIT_IN = {"tf32": 2.0 ** -11, "f32": 2.0 ** -20}  # f32 runs as 3xTF32: a few f32 ulps
_UNIT_OUT = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}


def error_bound(spec, K: int) -> float:
    """Largest ||C - ref||_F / ||scale||_F a correct kernel shows (scale = |A| @ |B| plus the
    epilogue's |bias| and |residual|): operand rounding (tf32; truncation on wgmma), accumulation over K (worst
    case for f32; for f16 accumulators the probabilistic 4 sqrt(K) u), output rounding, and
    the epilogue's ex2.approx (about 2^-22) with margin."""
    operand = 2 * _UNIT_IN.get(spec.dtype, 0.0) * (2 if spec.tf32_truncates else 1)  # truncation: twice rna's
    if spec.acc_dtype == "f32":
        accumulate = max(K, 1) * 2.0 ** -24
    else:
        accumulate = 4 * max(K, 1) ** 0.5 * 2.0 ** -11
    epilogue = 2.0 ** -18 if spec.epilogue.activation != "none" else 0.0
    return operand + accumulate + _UNIT_OUT[spec.out_dtype] + epilogue


def _activation(name: str, x):
    if name == "none":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "gelu_erf":
        return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    raise UsageError(f"tilegen run has no reference for activation {name!r}")


def _ticker(what: str, every: float = 5.0):
    """Print `what ... N s` on stderr every few seconds until the returned event is set."""
    done = threading.Event()
    start = time.perf_counter()

    def tick():
        while not done.wait(every):
            _progress(f"{what} ... {time.perf_counter() - start:.0f} s")

    threading.Thread(target=tick, daemon=True).start()
    return done


MAX_SIZE = 1 << 20   # --m/--n/--k (and demo --size): a dimension the kernels' 32-bit indices take


def _size(name: str, value: int) -> int:
    if not 1 <= value <= MAX_SIZE:
        raise UsageError(f"{name} {value}: a size from 1 to {MAX_SIZE}")
    return value


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0   # unknown: no check


def _check_host_work(M: int, N: int, K: int, device) -> None:
    """Refuse at once, before compiling or allocating, what cannot finish here: inputs and a
    float64 reference larger than this machine's memory, or (no GPU, no explicit --device
    sim) an emulation beyond the emulator's limit."""
    need = 8 * (2 * (M * K + K * N) + 4 * M * N)   # float64 copies of A, B; ref, scale, C, residual
    have = _host_memory_bytes()
    if have and need > have // 2:
        raise UsageError(f"{M}x{N}x{K} needs about {need / 2**30:.1f} GiB of host memory for its inputs and "
                         f"the float64 reference, more than half of this machine's {have / 2**30:.1f} GiB: "
                         f"choose smaller sizes")
    if device is None:
        refuse_long_emulation(M, N, K)


def _reference_ticker(M: int, N: int, K: int):
    """numpy's float64 products take seconds from about 2048^3 on: say so while they run."""
    if 4.0 * M * N * K < 4e10:
        return threading.Event()
    _progress(f"computing the float64 reference for {M}x{N}x{K} with numpy")
    return _ticker("still computing the float64 reference")


def _run(args) -> int:
    for name in ("m", "n", "k"):
        _size(f"--{name}", getattr(args, name))
    if not 0 <= args.seed < 2 ** 32:
        raise UsageError(f"--seed {args.seed}: a seed from 0 to 2^32 - 1")
    spec = spec_from_args(args)
    device = args.device
    if device is None:  # the GPU, else the emulator for what it can do in reasonable time
        device = "gpu" if runtime.gpu_available() else None
    elif device == "gpu" and not runtime.gpu_available():
        raise UsageError("--device gpu: no GPU found (no CUDA driver or no NVIDIA device); "
                         "use --device sim to run on the CPU emulator")
    M, N, K = args.m, args.n, args.k
    if args.batch is not None and not spec.batched:
        raise UsageError(f"--batch {args.batch}: a stack of products needs a batched spec (batched = true, or "
                         f"--batched true)")
    count = (2 if args.batch is None else args.batch) if spec.batched else None   # stacks of `count` products
    if count is not None:
        _size("--batch", count)
    lead = (count,) if count is not None else ()
    _check_host_work(M * (count or 1), N, K, device)
    print(spec)
    kernel = compile_spec(spec)
    print(f"{kernel.name}: {kernel.threads} threads, {kernel.smem_bytes} bytes of shared memory")

    rng = np.random.default_rng(args.seed)
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    A = rng.standard_normal(lead + (M, K)).astype(in_dt)
    B = rng.standard_normal(lead + (K, N)).astype(in_dt)
    epi = spec.epilogue
    extra = {}
    if epi.bias is not None:
        extra["bias"] = rng.standard_normal(N if epi.bias == "col" else M).astype(out_dt)
    if epi.residual:
        extra["residual"] = rng.standard_normal(lead + (M, N)).astype(out_dt)
    if epi.scale_rows:   # f32 scales of A's rows and B's columns, applied to the product
        extra["scale_a"] = rng.uniform(0.5, 2.0, M).astype(np.float32)
    if epi.scale_cols:
        extra["scale_b"] = rng.uniform(0.5, 2.0, N).astype(np.float32)
    for name, on in (("scale_a", epi.device_scale_a), ("scale_b", epi.device_scale_b)):
        if on:   # one f32 the kernel reads from device memory
            extra[name] = rng.uniform(0.5, 2.0, 1).astype(np.float32)

    done = _reference_ticker(M * (count or 1), N, K)
    try:
        A64, B64 = A.astype(np.float64), B.astype(np.float64)
        ref = np.matmul(A64, B64)
        scale = np.matmul(np.abs(A64), np.abs(B64))
    finally:
        done.set()
    for name, axis in (("scale_a", 0), ("scale_b", 1)):
        if name in extra:
            v = extra[name].astype(np.float64)
            v = v if v.size == 1 else v[:, None] if axis == 0 else v[None, :]
            ref, scale = ref * v, scale * v
    if "bias" in extra:
        b = extra["bias"].astype(np.float64)
        ref = ref + (b[None, :] if epi.bias == "col" else b[:, None])
        scale = scale + np.abs(b[None, :] if epi.bias == "col" else b[:, None])
    ref = _activation(epi.activation, ref)
    if "residual" in extra:
        r = extra["residual"].astype(np.float64)
        ref, scale = ref + r, scale + np.abs(r)

    where = "the GPU" if device == "gpu" else "the CPU emulator"
    shape = f"{count} x {M}x{N}x{K}" if count is not None else f"{M}x{N}x{K}"
    if device != "gpu":  # the emulator says how long it expects to take, and how far it is
        from .sim import EMULATOR_SM_COUNT

        x, y, z = kernel.grid({"M": M, "N": N, "K": K, "BATCH": count or 1}, EMULATOR_SM_COUNT)
        _progress(f"running {shape} on the CPU emulator: {x * y * z} CTA{'s' if x * y * z != 1 else ''} of "
                  f"{kernel.threads} threads, each PTX instruction interpreted")
        done = threading.Event()
    else:
        _progress(f"running {shape} on the GPU (the first call JIT-compiles the PTX)")
        done = _ticker(f"still running on {where}")
    try:
        start = time.perf_counter()
        C = kernel(A, B, device=device, **extra)
        seconds = time.perf_counter() - start
        first = seconds
        if device == "gpu":  # the first call included the driver's JIT: time a second one
            start = time.perf_counter()
            C = kernel(A, B, device=device, **extra)
            seconds = time.perf_counter() - start
    finally:
        done.set()

    C64 = C.astype(np.float64)
    denom = float(np.linalg.norm(scale)) or 1.0
    rel = float(np.linalg.norm(C64 - ref) / denom) if np.all(np.isfinite(C64)) else float("inf")
    bound = error_bound(spec, K)
    ok = rel <= bound
    print(f"C = {_formula(epi)}, {shape}, {spec.dtype} -> {spec.out_dtype}, on {where} "
          f"(seed {args.seed})")
    print(f"relative error {rel:.3e} against numpy float64 (bound {bound:.3e}): {'ok' if ok else 'WRONG'}")
    if device == "gpu":
        flops = 2.0 * M * N * K * (count or 1)
        print(f"time {seconds * 1e3:.3f} ms per call, host copies included ({flops / seconds / 1e12:.2f} TFLOP/s; "
              f"first call {first * 1e3:.1f} ms with the JIT); kernel-only timing: tilegen bench")
    else:
        print(f"time {seconds:.2f} s on the CPU emulator")
    return EXIT_OK if ok else EXIT_FAIL


def _formula(epi) -> str:
    scales = "".join(f" * {name}" for name, on in (("scale_a (per row)", epi.scale_rows),
                                                     ("scale_b (per column)", epi.scale_cols),
                                                     ("scale_a (in device memory)", epi.device_scale_a),
                                                     ("scale_b (in device memory)", epi.device_scale_b)) if on)
    x = "A @ B" + scales + (f" + bias (per {epi.bias})" if epi.bias else "")
    text = f"{epi.activation}({x})" if epi.activation != "none" else x
    return text + (" + residual" if epi.residual else "")


# -- show ----------------------------------------------------------------------------------

def _show(args) -> int:
    atom = show.resolve(args.atom)
    if args.png:
        w, h = show.fragment_png(atom, args.operand, args.png)
        _progress(f"wrote {args.png} ({w} x {h} pixels)")
    else:
        sys.stdout.write(show.fragment_text(atom, args.operand))
    return EXIT_OK


# -- demo ----------------------------------------------------------------------------------

def _demo(args) -> int:
    """Compile the default GEMM, run it (GPU, else the CPU emulator) and check it against numpy."""
    _size("--size", args.size)
    device = "gpu" if runtime.gpu_available() else None   # None: the emulator, within its limit
    _check_host_work(args.size, args.size, args.size, device)
    fp8 = args.dtype in ("e4m3", "e5m2")   # (both operands K-major, a 16-bit result: as torch._scaled_mm)
    spec = GemmSpec(dtype=args.dtype, **(dict(b_layout="col", out_dtype="bf16") if fp8 else {}))
    print(spec)
    atom = spec.mma
    print(f"\nmma atom {atom.name}: {atom.instruction}")
    for frag in (atom.a, atom.b, atom.c):
        print()
        print(frag.lane_grid())
    kernel = compile_spec(spec)
    print(f"\n{kernel.name}: {len(kernel.ptx.splitlines())} lines of PTX, {kernel.threads} threads, "
          f"{kernel.smem_bytes} bytes of shared memory")
    M, N, K = (args.size,) * 3
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K)).astype(numpy_dtype(spec.dtype))
    B = rng.standard_normal((K, N)).astype(numpy_dtype(spec.dtype))
    if fp8:
        B = np.asfortranarray(B)
    done = _ticker("still running on the GPU") if device == "gpu" else threading.Event()
    try:
        start = time.perf_counter()
        C = kernel(A, B, device=device)
        seconds = time.perf_counter() - start
    finally:
        done.set()
    done = _reference_ticker(M, N, K)
    try:
        ref = A.astype(np.float64) @ B.astype(np.float64)
    finally:
        done.set()
    rel = float(np.linalg.norm(C.astype(np.float64) - ref) / np.linalg.norm(ref))
    # the result's own rounding: f32 out for f16 / bf16 / tf32 / f32 operands, bf16 out for fp8
    limit = {"tf32": 2e-3, "f32": 1e-5, "e4m3": 1e-2, "e5m2": 1e-2}.get(spec.dtype, 1e-4)
    where = "GPU" if device == "gpu" else "CPU emulator"
    print(f"C = A @ B, {M}x{N}x{K}, on the {where} in {seconds:.2f} s: "
          f"relative error {rel:.2e} against numpy float64 ({'ok' if rel < limit else 'WRONG'})")
    return EXIT_OK if rel < limit else EXIT_FAIL


# -- passthrough verbs ---------------------------------------------------------------------

def _bench(argv) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


def _verify_fragments(argv) -> int:
    from .verify.fragments import main as verify_main

    return verify_main(argv)


# Commands whose own parser takes the rest of the command line.
def _tune(argv) -> int:
    from .tune import main as tune_main

    return tune_main(argv)


PASSTHROUGH = {"verify-fragments": _verify_fragments, "bench": _bench, "tune": _tune}

EXIT_CODES = """exit status:
  0  ok
  1  failure: a wrong result, a compile or emulator error
  2  usage error, bad input (a spec that does not parse or validate), or no GPU where one is required"""


def _sub(sub, name: str, help: str, description: str, examples: str, exits: str = EXIT_CODES):
    return sub.add_parser(name, help=help, description=description,
                          epilog=f"examples:\n{examples}\n\n{exits}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tilegen", description="A Python kernel DSL that generates PTX.",
        epilog=f"`tilegen COMMAND --help` describes each command; docs/cli.md has examples.\n\n{EXIT_CODES}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tilegen {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    spec_help = "the spec: a .tg file, '-' for standard input, or left out for GemmSpec's defaults"
    c = _sub(sub, "compile", "compile a spec and print its PTX, IR, resources or bank report",
             "Compile a GEMM spec (.tg file, see docs/dsl.md) and write what --emit names.",
             "  tilegen compile gemm.tg -o gemm.ptx\n"
             "  tilegen compile gemm.tg --emit resources\n"
             "  tilegen compile --dtype bf16 --tile 128x256x64 --warps 2x4 --target sm_90 --emit banks\n"
             "  tilegen compile --dtype tf32 --stages 4 --emit tg --minimal > tf32.tg")
    c.add_argument("--emit", choices=EMIT, default="ptx",
                   help="ptx (default); ir (the tile-level IR); resources (registers, shared memory, spills, "
                        "from ptxas); banks (shared-memory bank report); tg (the spec's canonical .tg text)")
    c.add_argument("--minimal", action="store_true",
                   help="with --emit tg: write only the fields that differ from the defaults")
    c.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of standard output")
    _add_spec_args(c, spec_help)
    c.set_defaults(run=_compile)

    r = _sub(sub, "run", "run a spec on random inputs (GPU or CPU emulator) and check it against numpy",
             "Compile a spec, run it on random normal inputs (on the GPU, or the CPU emulator when there is "
             "none or with --device sim) and check the result against numpy in float64: prints the "
             "relative error, its bound and the time.",
             "  tilegen run gemm.tg --m 512 --n 512 --k 1024\n"
             "  tilegen run --dtype tf32 --m 96 --n 80 --k 64 --device sim\n"
             "  tilegen run gemm.tg --epilogue 'bias=row activation=relu' --device sim --m 64 --n 64 --k 64",
             EXIT_CODES.replace("a wrong result", "a wrong result (error over the bound)"))
    r.add_argument("--m", type=int, default=256, help="rows of A and C (default 256)")
    r.add_argument("--n", type=int, default=256, help="columns of B and C (default 256)")
    r.add_argument("--k", type=int, default=256, help="columns of A, rows of B (default 256)")
    r.add_argument("--device", choices=("gpu", "sim"), default=None,
                   help="gpu, or sim for the CPU emulator (default: the GPU when there is one)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    r.add_argument("--batch", type=int, default=None,
                   help="products in the stack of a batched spec (batched = true; default 2)")
    _add_spec_args(r, spec_help)
    r.set_defaults(run=_run)

    s = _sub(sub, "show", "print or draw an mma atom's fragment maps (lane and register of each element)",
             "Print (or draw) which lane and register hold each element of an mma atom's A, B and C "
             "tiles. ATOM is an mma atom (m16n8k16.f16.f32), an operand dtype (f16: the atom a GemmSpec "
             "of that dtype uses) or an ldmatrix/stmatrix variant (ldmatrix.x4.trans).",
             "  tilegen show f16 --operand A\n"
             "  tilegen show m16n8k8.tf32.f32 --png tf32.png\n"
             "  tilegen show ldmatrix.x4.trans")
    s.add_argument("atom", metavar="ATOM", help="mma atom, operand dtype or ldmatrix/stmatrix variant")
    s.add_argument("--operand", choices=("A", "B", "C"), default=None, help="one operand (default: all three)")
    s.add_argument("--png", metavar="FILE", help="write a picture instead of text (needs matplotlib: "
                                                 "pip install 'tilegen[plot]')")
    s.set_defaults(run=_show)

    demo = _sub(sub, "demo", "compile the default GEMM, run it on the GPU (or the CPU emulator) "
                             "and check it against numpy",
                "Compile the default GEMM, show its atom's fragment maps, run it on the GPU (the CPU "
                "emulator without one) and check it against numpy.",
                "  tilegen demo\n  tilegen demo --dtype tf32 --size 128")
    demo.add_argument("--dtype", default="f16", choices=["f16", "bf16", "tf32", "f32", "e4m3", "e5m2"],
                      help="operand dtype (default f16; f32 runs 3xTF32, e4m3 / e5m2 take B column-major and "
                           "give bf16)")
    demo.add_argument("--size", type=int, default=256, help="M = N = K of the check (default 256)")
    demo.set_defaults(run=_demo)
    sub.add_parser("bench", add_help=False, help="benchmark GEMMs against cuBLAS and Triton (GPU; "
                                                 "tilegen bench --help)")
    sub.add_parser("tune", add_help=False, help="search the fastest GemmSpec for a problem on this GPU and "
                                                "cache it (GPU; tilegen tune --help)")
    sub.add_parser("verify-fragments", add_help=False,
                   help="run probe kernels on the GPU and compare every lane's registers with the tables "
                        "(tilegen verify-fragments --help)")
    return p


def _outcome(e: BaseException):
    """(exit status, one-line message) of an exception a command raised: 2 for input the user
    can fix, 1 for a failure; None for exceptions that are not failures."""
    if isinstance(e, (UsageError, SpecError, SpecSyntaxError, SpecFileError, LaunchError, show.PlotUnavailable)):
        return EXIT_USAGE, str(e)
    if isinstance(e, TilegenError):  # compile, driver or emulator failures
        return EXIT_FAIL, str(e)
    if isinstance(e, RecursionError):
        return EXIT_USAGE, "the input is nested too deeply"
    if isinstance(e, OSError):  # a path that cannot be read or written
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        return EXIT_USAGE, f"cannot use{where}: {e.strerror or e}"
    if isinstance(e, MemoryError):
        return EXIT_FAIL, "out of memory"
    # anything else is a bug of tilegen's: one line, and the way to the traceback
    return EXIT_FAIL, (f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                       f"(TILEGEN_TRACEBACK=1 shows where; please report it)")


def _quiet_stdout():
    """The reader of standard output went away (`tilegen ... | head`): later writes, Python's
    own flush at exit included, go nowhere instead of raising."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _unrecognized(parser: argparse.ArgumentParser, command: str, extra: list) -> str:
    """What argparse would say of arguments no option takes, with the command's nearest
    option for each one that looks like a misspelled option."""
    options = []
    for action in parser._actions:   # (the subcommands' parsers hang off the subparsers action)
        for name, sub in (getattr(action, "choices", None) or {}).items():
            if name == command and isinstance(sub, argparse.ArgumentParser):
                options = [o for a in sub._actions for o in a.option_strings]
    said = []
    for arg in extra:
        near = difflib.get_close_matches(arg.split("=")[0], options, n=1) if arg.startswith("--") else []
        said.append(f"{arg} (did you mean {near[0]}?)" if near else arg)
    return f"unrecognized arguments: {' '.join(said)}; `tilegen {command or 'COMMAND'} --help` lists the options"


def main(argv=None) -> int:
    """The `tilegen` command. Never a traceback: every exception becomes exit 1 or 2 with one
    line on stderr (TILEGEN_TRACEBACK=1 lets unexpected ones through); warnings are one line
    too (not Python's file, line and source)."""
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        return _main(argv)


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"tilegen: warning: {message}", file=file or sys.stderr)


def _main(argv) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    try:
        if argv and argv[0] in PASSTHROUGH:
            return PASSTHROUGH[argv[0]](argv[1:])
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(argv)  # --help exits 0
        except SystemExit as e:
            return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
        if extra:
            print(f"tilegen{' ' + command if command else ''}: error: {_unrecognized(parser, command, extra)}",
                  file=sys.stderr)
            return EXIT_USAGE
        if not getattr(args, "run", None):
            parser.print_help(sys.stderr)
            print("tilegen: error: give a COMMAND", file=sys.stderr)
            return EXIT_USAGE
        return args.run(args)
    except BrokenPipeError:  # `tilegen compile ... | head`: the reader left; not an error
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        print("tilegen: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # a verb's own argparse (bench, tune, verify-fragments)
        return int(e.code) if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_USAGE)
    except Exception as e:  # noqa: BLE001
        if os.environ.get("TILEGEN_TRACEBACK") == "1":
            raise
        status, message = _outcome(e)
        print(f"tilegen{' ' + command if command else ''}: error: {message}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
