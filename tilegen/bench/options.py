"""Parsing the bench's command-line values: sizes, layouts and GemmSpec overrides.

Pure functions (no GPU, no tilegen compile), so the CPU tests cover them."""
from __future__ import annotations

from dataclasses import fields

from ..arch.dtypes import FP8
from ..errors import SpecError
from ..gemm.spec import GemmSpec

DTYPES = ("tf32", "f16", "bf16", "f32", "e4m3", "e5m2")   # fp8: --layout rc (K-major operands), the torch backend
# (f32: TF32 off on both sides, cuBLAS's f32 GEMM against tilegen's f32 accuracy: 3xTF32)
LAYOUTS = {"rr": ("row", "row"), "rc": ("row", "col"), "cr": ("col", "row"), "cc": ("col", "col")}

DEFAULT_DTYPES = ["tf32", "f16", "bf16"]
DEFAULT_LAYOUTS = ["rr"]
DEFAULT_SIZES = ["2048", "4096", "8192", "4096x4096x1024", "1024x4096x4096"]

MAX_DIM = 1 << 20


class OptionError(ValueError):
    """A bad command-line value; the message says what is allowed."""


def parse_size(text: str) -> tuple[int, int, int]:
    """"4096" -> (4096, 4096, 4096); "4096x4096x1024" -> (M, N, K)."""
    s = str(text).strip().lower()
    parts = s.split("x")
    if len(parts) not in (1, 3) or not all(p.strip().isdigit() for p in parts):
        raise OptionError(f"size {text!r}: give one number for a cube (4096) or MxNxK (4096x4096x1024)")
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 or d > MAX_DIM for d in dims):
        raise OptionError(f"size {text!r}: every dimension must be in 1..{MAX_DIM}")
    return dims * 3 if len(dims) == 1 else dims


def size_label(m: int, n: int, k: int) -> str:
    """The short name of a size: "4096" for a cube, "4096x4096x1024" otherwise."""
    return str(m) if m == n == k else f"{m}x{n}x{k}"


def parse_layout(text: str) -> tuple[str, str]:
    """"rc" -> ("row", "col"): A's layout then B's (r = row-major, c = column-major)."""
    key = str(text).strip().lower()
    if key not in LAYOUTS:
        raise OptionError(f"layout {text!r}: allowed {', '.join(LAYOUTS)} (A then B; r = row-major, c = column-major)")
    return LAYOUTS[key]


def layout_code(a_layout: str, b_layout: str) -> str:
    return a_layout[0] + b_layout[0]


# GemmSpec fields the bench lets --spec set, and how to read each value. dtype and the
# layouts come from --dtype and --layout; epilogues are benchmarked elsewhere.
_INT_FIELDS = ("stages", "group_m", "frag_buffers", "split_k", "promote")
_STR_FIELDS = ("acc_dtype", "out_dtype", "atom", "swizzle", "target", "instruction", "copy", "store")
_TUPLE_FIELDS = {"tile": 3, "warps": 2, "cluster": 2}
_BOOL_FIELDS = ("persistent", "stream_k", "pingpong")
_OWN_OPTION = {"dtype": "--dtype", "a_layout": "--layout", "b_layout": "--layout"}


def spec_keys() -> list[str]:
    return sorted((*_INT_FIELDS, *_STR_FIELDS, *_TUPLE_FIELDS, *_BOOL_FIELDS))


def _int(key: str, value: str) -> int:
    try:
        v = int(value, 10)
    except ValueError:
        raise OptionError(f"--spec {key}={value!r}: {key} takes an integer") from None
    if v <= 0:
        raise OptionError(f"--spec {key}={value!r}: {key} must be positive")
    return v


def _ints(key: str, value: str, n: int) -> tuple:
    parts = [p for p in value.replace("x", ",").split(",")]
    if len(parts) != n or not all(p.strip().isdigit() for p in parts):
        example = ",".join(["128", "256", "32"][:n] if n == 3 else ["2", "4"])
        raise OptionError(f"--spec {key}={value!r}: {key} takes {n} positive integers, e.g. {key}={example}")
    out = tuple(int(p) for p in parts)
    if any(v <= 0 for v in out):
        raise OptionError(f"--spec {key}={value!r}: {key} takes positive integers")
    return out


def parse_spec_overrides(items) -> dict:
    """["tile=128,256,32", "stages=4"] -> {"tile": (128, 256, 32), "stages": 4}.

    Unknown keys, malformed values and repeated keys raise OptionError naming the legal set;
    whether the values make a valid kernel is GemmSpec's to say (check_overrides)."""
    known = {f.name for f in fields(GemmSpec)}
    out: dict = {}
    for item in items or ():
        if "=" not in item:
            raise OptionError(f"--spec {item!r}: write KEY=VALUE, e.g. stages=4; keys: {', '.join(spec_keys())}")
        key, value = (s.strip() for s in item.split("=", 1))
        key = key.replace("-", "_")
        if key in _OWN_OPTION:
            raise OptionError(f"--spec {key}=...: use {_OWN_OPTION[key]} for {key}")
        if key not in spec_keys():
            why = " (fused epilogues are benchmarked by python3 -m tilegen.bench.fused)" if key == "epilogue" else ""
            hint = "" if key in known else " is not a GemmSpec field"
            raise OptionError(f"--spec {key!r}{hint}{why}; keys: {', '.join(spec_keys())}")
        if key in out:
            raise OptionError(f"--spec {key} is given twice")
        if value == "":
            raise OptionError(f"--spec {key}=: empty value")
        if key in _INT_FIELDS:
            out[key] = _int(key, value)
        elif key in _TUPLE_FIELDS:
            out[key] = _ints(key, value, _TUPLE_FIELDS[key])
        elif key in _BOOL_FIELDS:
            if value.lower() not in ("true", "false", "1", "0"):
                raise OptionError(f"--spec {key}={value!r}: {key} takes true or false")
            out[key] = value.lower() in ("true", "1")
        else:
            out[key] = value
    return out


def make_spec(dtype: str, a_layout: str, b_layout: str, target: str, overrides: dict):
    """The GemmSpec of one bench row; overrides win over the device's target and over the
    output dtype, which is cuBLAS's (the operands' dtype; f32 for tf32) unless given."""
    out = "f32" if dtype in ("tf32", "f32") else "bf16" if dtype in FP8 else dtype
    kw = {"target": target, "out_dtype": out, **overrides}
    if overrides.get("instruction") == "wgmma" and "target" not in overrides and target == "sm_90":
        kw["target"] = "sm_90a"  # wgmma exists on the arch-specific Hopper target only
    return GemmSpec(dtype=dtype, a_layout=a_layout, b_layout=b_layout, **kw)


def check_overrides(dtypes, layouts, target: str, overrides: dict) -> None:
    """Build every spec up front so a bad override fails before any measurement.
    Raises OptionError carrying the SpecError's message (field, value, legal set)."""
    for dt in dtypes:
        for a, b in layouts:
            try:
                make_spec(dt, a, b, target, overrides)
            except SpecError as e:
                raise OptionError(f"--spec for {dt} {layout_code(a, b)}: {e}") from None
