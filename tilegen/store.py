"""tilegen's small disk store: checksummed entries under one user-only folder.

Three kinds of entries use it: compiled GEMM PTX (tilegen.compiler.cache), driver-linked
cubins (tilegen.runtime.cubins) and tuned configs (tilegen.gemm.tuned). An entry of kind K
with key KEY lives at `cache_dir()/K/KEY.K.entry`.

Every file is `MAGIC <json header>\\n<payload>`; the header carries the payload's size and
sha256. A read verifies both (and the key); an entry that fails is deleted and counts as
a miss, so it is rebuilt, never trusted. Writes go to a temporary file in the same
directory and are renamed over the entry (os.replace, atomic), so readers see an old
entry, a new one or none, and concurrent writers of one key are harmless (last wins; both
wrote the same content). Directories are created user-only (0700) and files are 0600; a
cache root owned by someone else or writable by group/others is not used.

Environment: TILEGEN_CACHE=0 disables the store (no reads, no writes). TILEGEN_CACHE_DIR
picks the directory; otherwise $XDG_CACHE_HOME/tilegen, otherwise ~/.cache/tilegen.
A store that cannot be read or written (read-only disk, full disk) only costs speed: the
work goes ahead uncached, with one warning per process.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Optional

FORMAT = 1                      # bump when the entry layout changes
MAGIC = b"TILEGEN-CACHE/1 "
KINDS = ("ptx", "cubin", "tune")
TMP_PREFIX = ".tmp-"
_DISABLED = ("0", "false", "no", "off")

stats = {"hits": 0, "misses": 0, "corrupt": 0, "stores": 0, "errors": 0}  # this process
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
    os.makedirs(cache_dir(), mode=0o700, exist_ok=True)
    os.makedirs(path, mode=0o700, exist_ok=True)


# ---- keys ------------------------------------------------------------------------------

def digest(*parts) -> str:
    """sha256 of the parts, each length-prefixed (so ("ab", "c") and ("a", "bc") differ)."""
    h = hashlib.sha256()
    for part in parts:
        b = part if isinstance(part, bytes) else str(part).encode()
        h.update(b"%d:" % len(b))
        h.update(b)
    return h.hexdigest()


# ---- entries on disk -------------------------------------------------------------------

def suffix(kind: str) -> str:
    return f".{kind}.entry"


def entry_path(kind: str, key: str, root: Path) -> Path:
    return root / kind / (key + suffix(kind))


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


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def read(kind: str, key: str):
    """(payload, meta) of an intact entry, or None. A damaged entry is deleted."""
    if not enabled():
        return None
    root = usable_root()
    if root is None:
        return None
    path = entry_path(kind, key, root)
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
        _unlink(path)
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
            _unlink(Path(tmp))


def write(kind: str, key: str, payload: bytes, meta: dict) -> Optional[Path]:
    """Store an entry atomically; its path, or None if not stored."""
    if not enabled():
        return None
    root = usable_root()
    if root is None:
        return None
    path = entry_path(kind, key, root)
    try:
        write_atomic(path, encode_entry(kind, key, payload, meta))
    except OSError as e:
        stats["errors"] += 1
        warn_once("write", f"cannot write {path} ({e})")
        return None
    stats["stores"] += 1
    return path


def discard(kind: str, key: str, *, corrupt: bool = False) -> None:
    """Delete an entry: one a reader refused, or (corrupt=True) one whose checksum held but
    whose content did not (then counted as a corrupt miss instead of the hit it was)."""
    if corrupt:
        stats["corrupt"] += 1
        stats["hits"] -= 1
        stats["misses"] += 1
    root = usable_root()
    if root is not None:
        _unlink(entry_path(kind, key, root))


# ---- housekeeping ----------------------------------------------------------------------

def entry_files(root: Path, kinds=KINDS):
    """(kind, path) of every entry and leftover temp file under `root`."""
    for kind in kinds:
        d = root / kind
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if p.name.endswith(suffix(kind)) or p.name.startswith(TMP_PREFIX):
                yield kind, p


def info() -> dict:
    """Where the store is, whether it is on, its entries and bytes (per kind and in all),
    and this process's hit/miss/corrupt/store counts."""
    root = cache_dir()
    out = {"dir": str(root), "enabled": enabled(), "entries": 0, "bytes": 0,
           **{kind: 0 for kind in KINDS}, "temp_files": 0, "process": dict(stats)}
    if not root.is_dir():
        return out
    for kind, p in entry_files(root):
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


def clear(kinds=KINDS) -> int:
    """Delete every entry of `kinds` (and leftover temp files) under cache_dir(); returns
    how many. Only tilegen's own files are touched."""
    root = cache_dir()
    n = 0
    if not root.is_dir():
        return 0
    for _, p in list(entry_files(root, kinds)):
        try:
            os.unlink(p)
            n += 1
        except FileNotFoundError:
            pass
    return n


__all__ = ["cache_dir", "enabled", "digest", "read", "write", "discard", "write_atomic", "encode_entry",
           "decode_entry", "entry_path", "info", "clear", "stats", "warn_once", "usable_root"]
