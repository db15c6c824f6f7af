"""Compiled kernels in tilegen's disk store (tilegen/store.py): a spec compiled before is
read back without tracing.

| kind | key: sha256 of                                    | value                                |
| ---- | ------------------------------------------------- | ------------------------------------ |
| ptx  | repr(spec), its target, tilegen's source hash     | JSON: everything a Kernel holds      |

tilegen's source hash covers every .py and .lark file of the imported package (computed
once per process), so editing tilegen invalidates every entry. An entry holds all that a
Kernel reads: name, threads, shared bytes, params, the launch grid as data, the PTX, the
tile-level and instruction-level IR text and the bank report rows. An entry whose content
does not hold together is deleted and rebuilt.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from .. import store
from ..arch.tma import TensorMapDecl
from ..ir.bank_report import BankRow
from ..ir.grid import LaunchGrid
from .arrays import ArrayParam
from .kernel import Kernel

KIND = "ptx"
PAYLOAD_FORMAT = 4              # bump when the payload's fields change
_source_hash: Optional[str] = None


def source_hash(root: Optional[Path] = None) -> str:
    """sha256 over the relative path and bytes of every .py and .lark file of tilegen
    (the imported package unless `root` is given). Computed once per process."""
    global _source_hash
    if root is None and _source_hash is not None:
        return _source_hash
    base = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    files = sorted(p for p in base.rglob("*") if p.suffix in (".py", ".lark") and p.is_file()
                   and "__pycache__" not in p.parts)
    h = hashlib.sha256()
    for p in files:
        rel = p.relative_to(base).as_posix().encode()
        data = p.read_bytes()
        h.update(b"%d:%s:%d:" % (len(rel), rel, len(data)))
        h.update(data)
    digest = h.hexdigest()
    if root is None:
        _source_hash = digest
    return digest


def spec_key(spec) -> str:
    """Key of a spec's entry: its repr, its target and tilegen's source hash."""
    return store.digest("ptx", PAYLOAD_FORMAT, repr(spec), spec.target, source_hash())


def kernel_payload(kernel: Kernel) -> dict:
    """What a Kernel needs to be rebuilt without tracing, as JSON-able data."""
    return {
        "name": kernel.name,
        "threads": kernel.threads,
        "smem_bytes": kernel.smem_bytes,
        "target": kernel.target,
        "params": [[n, t] for n, t in kernel.params],
        "tensor_maps": [m.to_data() for m in kernel.tensor_maps],
        "barriers": [list(b) for b in kernel.barriers],
        "arrays": [a.to_data() for a in kernel.arrays],
        "grid": kernel.launch_grid.to_data(),
        "ptx": kernel.ptx,
        "ir": kernel.ir,
        "instructions": kernel.instructions,
        "banks": [asdict(row) for row in kernel.bank_conflicts],
    }


def kernel_from_payload(payload: dict, spec, kernel_class=Kernel) -> Kernel:
    """A Kernel equal to the freshly compiled one the payload came from; KeyError,
    TypeError or ValueError when the payload does not hold together."""
    texts = [payload[k] for k in ("ptx", "ir", "instructions", "name", "target")]
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("ptx, ir, instructions, name and target must be text")
    return kernel_class(
        name=payload["name"], threads=int(payload["threads"]), target=payload["target"],
        smem_bytes=int(payload["smem_bytes"]), params=[(str(n), str(t)) for n, t in payload["params"]],
        grid=LaunchGrid.from_data(payload["grid"]), ptx=payload["ptx"], ir=payload["ir"],
        instructions=payload["instructions"], banks=[BankRow(**row) for row in payload["banks"]], spec=spec,
        tensor_maps=[TensorMapDecl.from_data(m) for m in payload["tensor_maps"]],
        barriers=[tuple(b) for b in payload["barriers"]], arrays=[ArrayParam.from_data(a) for a in payload["arrays"]])


def load_kernel(spec, kernel_class=Kernel) -> Optional[Kernel]:
    """The stored Kernel of a spec, or None (store off, a miss, or a damaged entry)."""
    key = spec_key(spec)
    entry = store.read(KIND, key)
    if entry is None:
        return None
    try:
        payload = json.loads(entry[0])
        if not isinstance(payload, dict) or payload.get("spec") != repr(spec):
            raise ValueError("another spec's entry")
        return kernel_from_payload(payload, spec, kernel_class)
    except (KeyError, TypeError, ValueError):
        store.discard(KIND, key, corrupt=True)
        return None


def store_kernel(spec, kernel: Kernel) -> bool:
    """Store a freshly compiled kernel of `spec`; False when not stored (store off)."""
    if not store.enabled():
        return False
    data = json.dumps(dict(kernel_payload(kernel), spec=repr(spec)), separators=(",", ":")).encode()
    return store.write(KIND, spec_key(spec), data, {"kernel": kernel.name, "target": spec.target}) is not None


def clear() -> int:
    """Delete every compiled-kernel and cubin entry; returns how many."""
    return store.clear(("ptx", "cubin"))


__all__ = ["source_hash", "spec_key", "kernel_payload", "kernel_from_payload", "load_kernel", "store_kernel",
           "clear"]
