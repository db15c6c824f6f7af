"""The tuned-config cache: the best GemmSpec per GPU, driver, problem kind and shape bucket.

Entries live in tilegen's disk store (tilegen/store.py: store.cache_dir()), kind `tune`,
one file per key, in the store's checksummed entry format. Writes are atomic (readers see
the old entry, the new one or none). An entry that fails its checksum, names another key,
or holds a spec GemmSpec refuses is deleted on read and counts as missing, so the next
tuning rewrites it. TILEGEN_CACHE=0 turns this store off too (no reads, no writes);
TILEGEN_CACHE_DIR moves it.

`lookup` reads an entry from disk once per process: later lookups of the same key are
answered from memory until the store changes on disk (`generation`, the folder's
modification time, which every write and delete moves).

Key (`key_fields`):

| field      | value                                                                  |
| ---------- | ---------------------------------------------------------------------- |
| gpu        | the device name, e.g. "NVIDIA H200"                                    |
| driver     | CUDA driver version as DeviceInfo.driver_version spells it ("13.0");   |
|            | cuDriverGetVersion()'s int (13000) is accepted and converted           |
| dtype      | operand dtype: tf32, f16, bf16                                         |
| layouts    | A's and B's layout, "rr", "rc", "cr", "cc"                             |
| out_dtype  | f32, f16, bf16                                                         |
| bucket     | M, N and K each rounded up to a power of two (`shape_bucket`)          |
| tilegen    | tilegen.__version__                                                    |
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from .. import store as _store
from .. import version
from ..errors import SpecError
from .spec import LAYOUTS, OUT_DTYPES, GemmSpec

KIND = "tune"
SUFFIX = _store.suffix(KIND)
FORMAT = 1
_lookups: dict = {}   # (generation, key) -> GemmSpec or None, read from disk once
_LAYOUT_SHORT = {"r": "row", "c": "col", "row": "row", "col": "col"}
SPEC_FIELDS = ("dtype", "acc_dtype", "out_dtype", "a_layout", "b_layout", "tile", "warps", "atom",
               "stages", "swizzle", "group_m", "frag_buffers", "target", "instruction", "persistent", "copy", "store")
# Fields entries written before the Hopper kernel was tuned lack: GemmSpec's defaults then.
LATER_FIELDS = ("instruction", "persistent", "copy", "store")


# ---- keys ------------------------------------------------------------------------------

def shape_bucket(m: int, n: int, k: int) -> tuple:
    """Each of M, N, K rounded up to a power of two: 4096 -> 4096, 4097 -> 8192, 3000 -> 4096.
    Every shape in a bucket is at most 2x smaller than the bucket's corner on each axis."""
    out = []
    for name, v in (("M", m), ("N", n), ("K", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}: a positive int")
        out.append(1 << (v - 1).bit_length())
    return tuple(out)


def normalize_layout(x: str) -> str:
    try:
        return _LAYOUT_SHORT[str(x).strip().lower()]
    except KeyError:
        raise ValueError(f"layout {x!r}: allowed {', '.join(LAYOUTS)} (or r, c)") from None


def normalize_driver(driver) -> str:
    """"13.0" stays "13.0"; 13000 (cuDriverGetVersion) becomes "13.0"."""
    if isinstance(driver, bool):
        raise ValueError(f"driver {driver!r}: a version such as '13.0' or 13000")
    if isinstance(driver, int):
        return f"{driver // 1000}.{driver % 1000 // 10}"
    text = str(driver).strip()
    if text.isdigit() and len(text) >= 4:
        return normalize_driver(int(text))
    if not text:
        raise ValueError("driver: an empty version")
    return text


def key_fields(dtype: str, a_layout: str, b_layout: str, m: int, n: int, k: int, out_dtype: str,
               gpu_name: str, driver) -> dict:
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype {out_dtype!r}: allowed {', '.join(OUT_DTYPES)}")
    a, b = normalize_layout(a_layout), normalize_layout(b_layout)
    return {"gpu": str(gpu_name).strip(), "driver": normalize_driver(driver), "dtype": str(dtype),
            "layouts": a[0] + b[0], "out_dtype": out_dtype, "bucket": list(shape_bucket(m, n, k)),
            "tilegen": version.__version__}


def cache_key(fields: dict) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"tilegen-tune/{FORMAT}:{text}".encode()).hexdigest()


# ---- specs as JSON ---------------------------------------------------------------------

def spec_to_dict(spec: GemmSpec) -> dict:
    if not spec.epilogue.is_plain:
        raise ValueError("only plain-epilogue specs are tuned and stored")
    out = {}
    for name in SPEC_FIELDS:
        v = getattr(spec, name)
        out[name] = list(v) if name in ("tile", "warps") else v
    return out


def spec_from_dict(d: dict) -> GemmSpec:
    """The GemmSpec a stored dict describes; SpecError / ValueError when it is not one."""
    if not isinstance(d, dict) or not (set(SPEC_FIELDS) - set(LATER_FIELDS) <= set(d) <= set(SPEC_FIELDS)):
        raise ValueError(f"a stored spec has the fields {', '.join(SPEC_FIELDS)}")
    kw = dict(d)
    for name in ("tile", "warps"):
        if not isinstance(kw[name], list):
            raise ValueError(f"{name} must be a list")
        kw[name] = tuple(kw[name])
    return GemmSpec(**kw)


# ---- files -----------------------------------------------------------------------------

def tune_dir() -> Path:
    return _store.cache_dir() / KIND


def generation() -> int:
    """Changes whenever an entry is written or deleted (the folder's mtime); 0 without one."""
    try:
        return os.stat(tune_dir()).st_mtime_ns
    except OSError:
        return 0


def read_entry(fields: dict) -> Optional[dict]:
    """The stored payload for these key fields, or None (missing, store off, or damaged:
    a damaged entry is deleted)."""
    key = cache_key(fields)
    entry = _store.read(KIND, key)
    if entry is None:
        return None
    try:
        payload = json.loads(entry[0])
    except ValueError:
        payload = None
    if (not isinstance(payload, dict) or payload.get("format") != FORMAT
            or payload.get("key") != fields or not isinstance(payload.get("spec"), dict)):
        _store.discard(KIND, key, corrupt=True)
        return None
    return payload


def write_entry(fields: dict, payload: dict) -> Optional[Path]:
    """Store a payload (JSON-able dict) under these key fields; the path, or None if not stored."""
    body = json.dumps(dict(payload, format=FORMAT, key=fields), sort_keys=True, indent=1).encode()
    return _store.write(KIND, cache_key(fields), body, {"gpu": fields["gpu"], "dtype": fields["dtype"],
                                                        "bucket": fields["bucket"]})


def store(spec: GemmSpec, m: int, n: int, k: int, gpu_name: str, driver, source: str = "", **info) -> Optional[Path]:
    """Record `spec` as the tuned config of its problem kind and (m, n, k)'s bucket.
    `info` (TFLOP/s, default TFLOP/s, budget, ...) and `source` (the hash of the tilegen
    source that measured it) are kept in the entry for people to read."""
    fields = key_fields(spec.dtype, spec.a_layout, spec.b_layout, m, n, k, spec.out_dtype, gpu_name, driver)
    payload = {"spec": spec_to_dict(spec), "spec_text": str(spec), "tuned_shape": [m, n, k],
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "tilegen_source": source, **info}
    return write_entry(fields, payload)


def load(dtype: str, a_layout: str, b_layout: str, m: int, n: int, k: int, out_dtype: str,
         gpu_name: str, driver) -> Optional[dict]:
    """The stored entry (payload dict with "spec" already a GemmSpec) or None."""
    fields = key_fields(dtype, a_layout, b_layout, m, n, k, out_dtype, gpu_name, driver)
    payload = read_entry(fields)
    if payload is None:
        return None
    try:
        spec = spec_from_dict(payload["spec"])
    except (SpecError, ValueError, TypeError, KeyError):
        spec = None
    if (spec is None or spec.dtype != fields["dtype"] or spec.out_dtype != fields["out_dtype"]
            or spec.a_layout[0] + spec.b_layout[0] != fields["layouts"]):
        _store.discard(KIND, cache_key(fields))
        return None
    return dict(payload, spec=spec)


def lookup(dtype: str, a_layout: str, b_layout: str, M: int, N: int, K: int, out_dtype: str = "f32",
           gpu_name: str = "", driver="") -> Optional[GemmSpec]:
    """The tuned GemmSpec for this problem on this GPU and driver, or None. No GPU needed.

    gpu_name and driver as tilegen.runtime.device_info(d) reports them (.name, .driver_version),
    or as `current_device_key()` returns them. Read from disk once per key until the store
    changes (see the module docstring)."""
    try:
        fields = key_fields(dtype, a_layout, b_layout, M, N, K, out_dtype, gpu_name, driver)
    except ValueError:
        return None
    memo = (generation(), _store.enabled(), str(_store.cache_dir()), json.dumps(fields, sort_keys=True))
    if memo not in _lookups:
        entry = load(dtype, a_layout, b_layout, M, N, K, out_dtype, gpu_name, driver)
        if len(_lookups) > 4096:
            _lookups.clear()
        _lookups[memo] = None if entry is None else entry["spec"]
    return _lookups[memo]


def entries() -> list:
    """Every intact stored entry's payload (key fields under "key"), for listing."""
    d = tune_dir()
    out = []
    if not _store.enabled() or not d.is_dir():
        return out
    for p in sorted(d.iterdir()):
        if not p.name.endswith(SUFFIX):
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        entry = _store.decode_entry(KIND, p.name[:-len(SUFFIX)], data)
        if entry is None:
            continue
        try:
            payload = json.loads(entry[0])
        except ValueError:
            continue
        if isinstance(payload, dict) and isinstance(payload.get("key"), dict):
            out.append(payload)
    return out


def clear() -> int:
    """Delete every tuned-config entry (and leftover temporary file); returns how many."""
    return _store.clear((KIND,))


__all__ = ["shape_bucket", "key_fields", "cache_key", "spec_to_dict", "spec_from_dict", "store", "load",
           "lookup", "entries", "clear", "tune_dir", "generation", "normalize_driver", "normalize_layout"]
