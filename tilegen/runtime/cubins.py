"""Driver-linked cubins in tilegen's disk store (tilegen/store.py), keyed by the PTX text,
the compute capability and cuDriverGetVersion(): a later process loads the stored cubin
and skips the JIT."""
from __future__ import annotations

import hashlib
from typing import Optional

from .. import store

KIND = "cubin"


def cubin_key(ptx: str, cc, driver: int, maker: str = "driver") -> str:
    """Key of a cubin: the PTX text, the compute capability (major, minor), the driver version,
    and who made it: the driver's linker, or "ptxas" (runtime/module.py: where the driver's
    spilled), so a process told to use no ptxas never loads one of its cubins."""
    major, minor = (int(x) for x in cc)
    made = () if maker == "driver" else (maker,)
    return store.digest("cubin", store.FORMAT, ptx, f"{major}.{minor}", int(driver), *made)


def get_cubin_entry(ptx: str, cc, driver: int, maker: str = "driver"):
    """(cubin bytes, JIT info log) stored for this PTX, device and driver, or None."""
    entry = store.read(KIND, cubin_key(ptx, cc, driver, maker))
    if entry is None:
        return None
    payload, meta = entry
    log = meta.get("info_log", "")
    return payload, (log if isinstance(log, str) else "")


def get_cubin(ptx: str, cc, driver: int, maker: str = "driver") -> Optional[bytes]:
    """The cubin stored for this PTX, compute capability and driver version, or None."""
    entry = get_cubin_entry(ptx, cc, driver, maker)
    return None if entry is None else entry[0]


def put_cubin(ptx: str, cc, driver: int, cubin: bytes, info_log: str = "", maker: str = "driver") -> bool:
    """Store a cubin made from `ptx` (with the compile's info log, restored on a hit)."""
    major, minor = (int(x) for x in cc)
    meta = {"cc": f"{major}.{minor}", "driver": int(driver), "info_log": info_log, "maker": maker,
            "ptx_sha256": hashlib.sha256(ptx.encode()).hexdigest()}
    return store.write(KIND, cubin_key(ptx, cc, driver, maker), bytes(cubin), meta) is not None


def discard_cubin(ptx: str, cc, driver: int, maker: str = "driver") -> None:
    """Delete a cubin entry the driver refused to load (it is rebuilt by the next load)."""
    store.discard(KIND, cubin_key(ptx, cc, driver, maker))


__all__ = ["cubin_key", "get_cubin_entry", "get_cubin", "put_cubin", "discard_cubin"]
