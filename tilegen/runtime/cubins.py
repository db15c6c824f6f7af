"""Driver-linked cubins in tilegen's disk store (tilegen/store.py), keyed by the PTX text,
the compute capability and cuDriverGetVersion(): a later process loads the stored cubin
and skips the JIT."""
from __future__ import annotations

import hashlib
from typing import Optional

from .. import store

KIND = "cubin"


def cubin_key(ptx: str, cc, driver: int) -> str:
    """Key of a cubin: the PTX text, the compute capability (major, minor), the driver version."""
    major, minor = (int(x) for x in cc)
    return store.digest("cubin", store.FORMAT, ptx, f"{major}.{minor}", int(driver))


def get_cubin_entry(ptx: str, cc, driver: int):
    """(cubin bytes, JIT info log) stored for this PTX, device and driver, or None."""
    entry = store.read(KIND, cubin_key(ptx, cc, driver))
    if entry is None:
        return None
    payload, meta = entry
    log = meta.get("info_log", "")
    return payload, (log if isinstance(log, str) else "")


def get_cubin(ptx: str, cc, driver: int) -> Optional[bytes]:
    """The cubin stored for this PTX, compute capability and driver version, or None."""
    entry = get_cubin_entry(ptx, cc, driver)
    return None if entry is None else entry[0]


def put_cubin(ptx: str, cc, driver: int, cubin: bytes, info_log: str = "") -> bool:
    """Store a cubin linked from `ptx` (with the JIT's info log, restored on a hit)."""
    major, minor = (int(x) for x in cc)
    meta = {"cc": f"{major}.{minor}", "driver": int(driver), "info_log": info_log,
            "ptx_sha256": hashlib.sha256(ptx.encode()).hexdigest()}
    return store.write(KIND, cubin_key(ptx, cc, driver), bytes(cubin), meta) is not None


def discard_cubin(ptx: str, cc, driver: int) -> None:
    """Delete a cubin entry the driver refused to load (it is rebuilt by the next load)."""
    store.discard(KIND, cubin_key(ptx, cc, driver))


__all__ = ["cubin_key", "get_cubin_entry", "get_cubin", "put_cubin", "discard_cubin"]
