"""tilegen's content-addressed disk cache: compiled GEMM PTX and driver-linked cubins.

Two kinds of entries live under `cache_dir()`:

| kind  | key: sha256 of                                         | value                              |
| ----- | ------------------------------------------------------ | ---------------------------------- |
| ptx   | repr(GemmSpec), its target, tilegen's source hash      | JSON: PTX + what Kernel needs      |
| cubin | PTX text, compute capability, cuDriverGetVersion()     | cubin bytes (+ the JIT's info log) |

tilegen's source hash covers every .py and .lark file of the imported package (computed
once per process), so editing tilegen invalidates every PTX entry. A PTX entry holds all
that `tilegen.Kernel` reads (name, threads, shared bytes, params, tile-level IR text, bank
report rows); the grid function is not stored but recomputed from the spec
(`gemm_grid`), and an entry is only written when that recomputation agrees with the
freshly traced kernel's grid.

Every file is `MAGIC <json header>\\n<payload>`; the header carries the payload's size and
sha256. A read verifies both (and the key); an entry that fails is deleted and counts as
a miss, so it is rebuilt, never trusted. Writes go to a temporary file in the same
directory and are renamed over the entry (os.replace, atomic), so readers see an old
entry, a new one or none, and concurrent writers of one key are harmless (last wins; both
wrote the same content). Directories are created user-only (0700) and files are 0600; a
cache root owned by someone else or writable by group/others is not used.

Environment: TILEGEN_CACHE=0 disables the cache (no reads, no writes). TILEGEN_CACHE_DIR
picks the directory; otherwise $XDG_CACHE_HOME/tilegen, otherwise ~/.cache/tilegen.
A cache that cannot be read or written (read-only disk, full disk) only costs speed: the
compile or load goes ahead uncached, with one warning per process.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import warnings
from collections import namedtuple
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

FORMAT = 1                      # bump when the entry layout or the payload fields change
MAGIC = b"TILEGEN-CACHE/1 "
KINDS = {"ptx": ".ptx.entry", "cubin": ".cubin.entry"}
TMP_PREFIX = ".tmp-"
_DISABLED = ("0", "false", "no", "off")

stats = {"hits": 0, "misses": 0, "corrupt": 0, "stores": 0, "errors": 0}  # this process
_source_hash: Optional[str] = None
_checked_roots: dict = {}       # root -> None (usable) or the reason it is not
_warned: set = set()


# ---- where, and whether ----------------------------------------------------------------

def enabled() -> bool:
    """False when TILEGEN_CACHE is 0 / false / no / off."""
    return os.environ.get("TILEGEN_CACHE", "1").strip().lower() not in _DISABLED


def cache_dir() -> Path:
    """$TILEGEN_CACHE_DIR, else $XDG_CACHE_HOME/tilegen, else ~/.cache/tilegen (not created)."""
    explicit = os.environ.get("TILEGEN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "tilegen"
    return Path.home() / ".cache" / "tilegen"


def warn_once(what: str, detail: str) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"tilegen cache: {detail}; continuing without it", RuntimeWarning, stacklevel=3)


def _root_problem(root: Path) -> Optional[str]:
    """Why `root` must not be used (owned by someone else, writable by others), or None."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None  # created by us, 0700, on first write
    except OSError as e:  # a parent is a file, no permission, ...
        return f"{root} cannot be used ({e})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{root} is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{root} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); chmod 700 it"
    return None


def usable_root() -> Optional[Path]:
    root = cache_dir()
    key = str(root)
    if key not in _checked_roots or _checked_roots[key] is not None:
        _checked_roots[key] = _root_problem(root)  # re-checked until it is fine
    problem = _checked_roots[key]
    if problem is not None:
        warn_once("root:" + key, problem)
        return None
    return root


def ensure_dir(path: Path) -> None:
    """Create `path` and its tilegen parents user-only (0700); the umask can only narrow that."""
    root = cache_dir()
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.makedirs(path, mode=0o700, exist_ok=True)


# ---- keys ------------------------------------------------------------------------------

def source_hash(root: Optional[Path] = None) -> str:
    """sha256 over the relative path and bytes of every .py and .lark file of tilegen
    (the imported package unless `root` is given). Computed once per process."""
    global _source_hash
    if root is None and _source_hash is not None:
        return _source_hash
    base = Path(root) if root is not None else Path(__file__).resolve().parent
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


def _sha(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        b = part if isinstance(part, bytes) else str(part).encode()
        h.update(b"%d:" % len(b))
        h.update(b)
    return h.hexdigest()


def spec_key(spec) -> str:
    """Key of a GemmSpec's PTX entry: its repr, its target and tilegen's source hash."""
    return _sha("ptx", FORMAT, repr(spec), spec.target, source_hash())


def cubin_key(ptx: str, cc, driver: int) -> str:
    """Key of a cubin: the PTX text, the compute capability (major, minor), the driver version."""
    major, minor = (int(x) for x in cc)
    return _sha("cubin", FORMAT, ptx, f"{major}.{minor}", int(driver))


# ---- entries on disk -------------------------------------------------------------------

def _path(kind: str, key: str, root: Path) -> Path:
    return root / kind / (key + KINDS[kind])


def encode_entry(kind: str, key: str, payload: bytes, meta: dict) -> bytes:
    header = {"format": FORMAT, "kind": kind, "key": key, "size": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest(), "meta": meta}
    return MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def decode_entry(kind: str, key: str, data: bytes):
    """(payload, meta) when `data` is an intact entry for (kind, key); else None."""
    if not data.startswith(MAGIC):
        return None
    nl = data.find(b"\n")
    if nl < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC):nl])
    except ValueError:
        return None
    payload = data[nl + 1:]
    if (not isinstance(header, dict) or header.get("format") != FORMAT
            or header.get("kind") != kind or header.get("key") != key
            or header.get("size") != len(payload)
            or header.get("sha256") != hashlib.sha256(payload).hexdigest()):
        return None
    meta = header.get("meta")
    return payload, (meta if isinstance(meta, dict) else {})


def _discard(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _read(kind: str, key: str):
    """(payload, meta) of an intact entry, or None. A damaged entry is deleted."""
    if not enabled():
        return None
    root = usable_root()
    if root is None:
        return None
    path = _path(kind, key, root)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        stats["misses"] += 1
        return None
    except OSError as e:
        stats["errors"] += 1
        warn_once("read", f"cannot read {path} ({e})")
        return None
    entry = decode_entry(kind, key, data)
    if entry is None:
        stats["corrupt"] += 1
        stats["misses"] += 1
        try:
            _discard(path)
        except OSError:
            pass
        return None
    stats["hits"] += 1
    return entry


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one, never a part:
    a user-only temp file in the same directory, fsync, os.replace. Raises OSError."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=".part")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _write(kind: str, key: str, payload: bytes, meta: dict) -> bool:
    """Store an entry atomically. False if not stored."""
    if not enabled():
        return False
    root = usable_root()
    if root is None:
        return False
    path = _path(kind, key, root)
    try:
        write_atomic(path, encode_entry(kind, key, payload, meta))
    except OSError as e:
        stats["errors"] += 1
        warn_once("write", f"cannot write {path} ({e})")
        return False
    stats["stores"] += 1
    return True


# ---- PTX entries (GemmSpec -> Kernel) --------------------------------------------------

def get_ptx(spec) -> Optional[dict]:
    """The stored payload of a GemmSpec's kernel (see `kernel_payload`), or None."""
    entry = _read("ptx", spec_key(spec))
    if entry is None:
        return None
    try:
        payload = json.loads(entry[0])
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or payload.get("spec") != repr(spec):
        _drop("ptx", spec_key(spec))
        return None
    return payload


def put_ptx(spec, payload: dict) -> bool:
    """Store a GemmSpec's kernel payload (a JSON-able dict, see `kernel_payload`)."""
    data = json.dumps(dict(payload, spec=repr(spec)), separators=(",", ":")).encode()
    return _write("ptx", spec_key(spec), data, {"kernel": payload.get("name"), "target": spec.target})


def _drop(kind: str, key: str) -> None:
    """Delete an entry whose checksum held but whose content did not (counted as corrupt)."""
    root = usable_root()
    stats["corrupt"] += 1
    stats["hits"] -= 1
    stats["misses"] += 1
    if root is not None:
        try:
            _discard(_path(kind, key, root))
        except OSError:
            pass


def gemm_grid(spec) -> Callable:
    """The GEMM launch grid as a function of the sizes, from the spec alone (the template's)."""
    from .kernels.gemm import launch_grid

    return lambda sizes: launch_grid(spec, sizes)


def _grid_probes(spec) -> list:
    bm, bn, bk = spec.tile
    return [{"M": m, "N": n, "K": k} for m, n, k in
            [(1, 1, 1), (bm, bn, bk), (bm + 1, 2 * bn - 1, 3), (1000, 777, 333),
             (4096, 4096, 4096), (bm * 9 + 5, bn * 3, 1), (0, 5, 5), (5, 0, 5)]]


def grid_matches(spec, kernel) -> bool:
    """Whether `gemm_grid(spec)` gives the traced kernel's grid on a set of probe sizes."""
    mine = gemm_grid(spec)
    try:
        return all(tuple(kernel.grid(s)) == tuple(mine(s)) for s in _grid_probes(spec))
    except Exception:
        return False


def kernel_payload(kernel) -> dict:
    """What a Kernel needs to be rebuilt without tracing, as JSON-able data."""
    return {
        "name": kernel.name,
        "threads": kernel.threads,
        "smem_bytes": kernel.smem_bytes,
        "target": kernel.target,
        "params": [[n, t] for n, t in kernel.params],
        "ptx": kernel.ptx,
        "ir": kernel.ir,
        "banks": [asdict(row) for row in kernel.bank_conflicts],
    }


CachedParam = namedtuple("CachedParam", "name type")


@dataclass(eq=False)
class CachedKernelIR:
    """The part of a KernelIR that tilegen.Kernel reads, rebuilt from a PTX entry. There is
    no body: the PTX is final. The grid is recomputed from the spec."""
    name: str
    threads: int
    target: str
    smem_bytes: int
    params: list
    grid: Callable
    level: str = "instr"
    from_cache: bool = True


def kernel_from_payload(spec, payload: dict):
    """A tilegen.Kernel equivalent to the freshly compiled one the payload came from."""
    from .ir.bank_report import BankRow
    from .kernel import Kernel

    ir = CachedKernelIR(
        name=str(payload["name"]), threads=int(payload["threads"]), target=str(payload["target"]),
        smem_bytes=int(payload["smem_bytes"]),
        params=[CachedParam(str(n), str(t)) for n, t in payload["params"]],
        grid=gemm_grid(spec))
    banks = [BankRow(**row) for row in payload["banks"]]
    ptx, tile_ir = payload["ptx"], payload["ir"]
    if not isinstance(ptx, str) or not isinstance(tile_ir, str):
        raise TypeError("ptx and ir must be text")
    return Kernel(ir, ptx, tile_ir, spec, banks=banks)


def load_kernel(spec):
    """The cached Kernel of a GemmSpec, or None (cache off, miss, or a damaged entry)."""
    if not enabled():
        return None
    payload = get_ptx(spec)
    if payload is None:
        return None
    try:
        return kernel_from_payload(spec, payload)
    except (KeyError, TypeError, ValueError):
        _drop("ptx", spec_key(spec))
        return None


def store_kernel(spec, kernel) -> bool:
    """Store a freshly compiled GEMM Kernel; skipped (False) when the cache is off or when
    the grid recomputed from the spec would differ from the kernel's own."""
    if not enabled():
        return False
    if not grid_matches(spec, kernel):
        warn_once("grid", f"the grid of {kernel.name} does not match tilegen.cache.gemm_grid; "
                           "kernels/gemm.py and cache.py disagree, so its PTX is not cached")
        return False
    return put_ptx(spec, kernel_payload(kernel))


# ---- cubin entries (PTX -> linked cubin) ----------------------------------------------

def get_cubin_entry(ptx: str, cc, driver: int):
    """(cubin bytes, JIT info log) stored for this PTX, device and driver, or None."""
    entry = _read("cubin", cubin_key(ptx, cc, driver))
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
    return _write("cubin", cubin_key(ptx, cc, driver), bytes(cubin), meta)


def discard_cubin(ptx: str, cc, driver: int) -> None:
    """Delete a cubin entry the driver refused to load (it is rebuilt by the next load)."""
    root = usable_root()
    if root is not None:
        try:
            _discard(_path("cubin", cubin_key(ptx, cc, driver), root))
        except OSError:
            pass


# ---- housekeeping ----------------------------------------------------------------------

def _entry_files(root: Path):
    for kind, suffix in KINDS.items():
        d = root / kind
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if p.name.endswith(suffix) or p.name.startswith(TMP_PREFIX):
                yield kind, p


def info() -> dict:
    """Where the cache is, whether it is on, its entries and bytes (per kind and in all),
    and this process's hit/miss/corrupt/store counts."""
    root = cache_dir()
    out = {"dir": str(root), "enabled": enabled(), "entries": 0, "bytes": 0,
           "ptx": 0, "cubin": 0, "temp_files": 0, "process": dict(stats)}
    if not root.is_dir():
        return out
    for kind, p in _entry_files(root):
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            continue
        if p.name.startswith(TMP_PREFIX):
            out["temp_files"] += 1
            continue
        out[kind] += 1
        out["entries"] += 1
        out["bytes"] += size
    return out


def clear() -> int:
    """Delete every entry (and leftover temp file) under cache_dir(); returns how many.
    Only tilegen's own files are touched."""
    root = cache_dir()
    n = 0
    if not root.is_dir():
        return 0
    for _, p in list(_entry_files(root)):
        try:
            os.unlink(p)
            n += 1
        except FileNotFoundError:
            pass
    return n


__all__ = ["cache_dir", "enabled", "source_hash", "spec_key", "cubin_key", "get_ptx", "put_ptx",
           "load_kernel", "store_kernel", "kernel_payload", "kernel_from_payload", "gemm_grid",
           "get_cubin", "get_cubin_entry", "put_cubin", "discard_cubin", "clear", "info", "stats"]
