"""Memories the emulated kernel sees: global allocations and the CTA's shared memory.

Every access is checked against the allocation it falls in. Vectorised accesses take one
address per thread; a fault names the position of the first bad address, which the
interpreter turns into a SimError naming the thread and the PTX line.
"""
from __future__ import annotations

import bisect

import numpy as np

from .errors import SimError

GLOBAL_BASE = 0x7F00_0000_0000   # far from 0, so a null or small pointer is never valid
ALLOC_ALIGN = 256                # cudaMalloc's guarantee
ALLOC_GAP = 1 << 16              # unmapped bytes after each allocation: overruns land there

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class MemoryFault(Exception):
    """An access outside its memory; `index` is the position of the bad address."""

    def __init__(self, index: int, address: int, reason: str):
        super().__init__(reason)
        self.index = int(index)
        self.address = int(address)
        self.reason = reason


def _padded(nbytes: int) -> np.ndarray:
    # Backing store padded to 16 bytes so aligned accesses can use wide views.
    return np.zeros(-(-max(nbytes, 1) // 16) * 16, dtype=np.uint8)


class Allocation:
    __slots__ = ("base", "size", "data")

    def __init__(self, base: int, size: int):
        self.base = base
        self.size = size
        self.data = _padded(size)

    @property
    def end(self) -> int:
        return self.base + self.size

    def __repr__(self) -> str:
        return f"<allocation 0x{self.base:x}, {self.size} bytes>"


class GlobalMemory:
    """Global memory as separate allocations; an access must lie inside one of them.

    alloc(nbytes) -> address; write(address, data); read(address, nbytes, dtype); free(address).
    """

    def __init__(self):
        self._allocs: list[Allocation] = []
        self._bases: list[int] = []
        self._next = GLOBAL_BASE

    # -- host side --------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise SimError(f"cannot allocate {nbytes} bytes")
        a = Allocation(self._next, nbytes)
        self._next = -(-(a.base + max(nbytes, 1) + ALLOC_GAP) // ALLOC_ALIGN) * ALLOC_ALIGN
        self._allocs.append(a)
        self._bases.append(a.base)
        return a.base

    def free(self, address: int):
        i = self._find(address)
        if i is None or self._allocs[i].base != address:
            raise SimError(f"free(0x{address:x}): not the start of an allocation")
        del self._allocs[i]
        del self._bases[i]

    def allocation(self, address: int):
        i = self._find(address)
        return None if i is None else self._allocs[i]

    def write(self, address: int, data):
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        a, off = self._host_range(address, raw.size, "write")
        a.data[off:off + raw.size] = raw

    def read(self, address: int, nbytes: int, dtype=np.uint8) -> np.ndarray:
        a, off = self._host_range(address, nbytes, "read")
        return a.data[off:off + nbytes].copy().view(dtype)

    def _find(self, address: int):
        i = bisect.bisect_right(self._bases, int(address)) - 1
        if i < 0:
            return None
        a = self._allocs[i]
        return i if a.base <= address < a.base + max(a.size, 1) else None

    def _host_range(self, address, nbytes, what):
        i = self._find(address)
        if i is None or address + nbytes > self._allocs[i].end:
            raise SimError(f"host {what} of {nbytes} bytes at 0x{address:x} is outside every allocation")
        a = self._allocs[i]
        return a, address - a.base

    def at_or_below(self, address: int):
        """The allocation that starts at or below `address` (nearest first), or None."""
        i = bisect.bisect_right(self._bases, int(address)) - 1
        return None if i < 0 else self._allocs[i]

    def describe(self, address: int) -> str:
        """Where an address sits relative to the allocations, for error messages."""
        i = bisect.bisect_right(self._bases, int(address)) - 1
        if i < 0:
            return "below every allocation"
        a = self._allocs[i]
        if address < a.end:
            return f"inside allocation 0x{a.base:x} ({a.size} bytes)"
        return f"{address - a.end} bytes past the end of allocation 0x{a.base:x} ({a.size} bytes)"

    # -- kernel side (vectorised) -----------------------------------------------------------
    def locate(self, addrs: np.ndarray, nbytes: int):
        """Offsets of `addrs` (uint64, one per thread) inside their allocations.

        Returns a list of (allocation, positions or None for all, offsets); raises
        MemoryFault for the first access that does not lie wholly inside one allocation."""
        if addrs.size == 0:
            return []
        lo, hi = int(addrs.min()), int(addrs.max())
        i = self._find(lo)
        if i is not None and hi + nbytes <= self._allocs[i].end:
            a = self._allocs[i]
            return [(a, None, (addrs - np.uint64(a.base)).astype(np.int64))]
        bases = np.array(self._bases, dtype=np.uint64)
        ends = np.array([a.end for a in self._allocs], dtype=np.uint64)
        idx = np.searchsorted(bases, addrs, side="right") - 1
        ok = idx >= 0
        ok[ok] &= addrs[ok] + np.uint64(nbytes) <= ends[idx[ok]]
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            addr = int(addrs[bad])
            raise MemoryFault(bad, addr, f"out-of-bounds global access of {nbytes} bytes "
                                         f"({self.describe(addr)})")
        groups = []
        for j in np.unique(idx):
            pos = np.flatnonzero(idx == j)
            a = self._allocs[int(j)]
            groups.append((a, pos, (addrs[pos] - np.uint64(a.base)).astype(np.int64)))
        return groups

    def load(self, addrs: np.ndarray, width: int, count: int = 1) -> np.ndarray:
        """(n, count) words of `width` bytes from aligned addresses."""
        out = np.empty((addrs.size, count), dtype=_UINT[width])
        for a, pos, off in self.locate(addrs, width * count):
            words = a.data.view(_UINT[width])
            idx = (off // width)[:, None] + np.arange(count)
            if pos is None:
                out[:] = words[idx]
            else:
                out[pos] = words[idx]
        return out

    def store(self, addrs: np.ndarray, values: np.ndarray, width: int):
        """values: (n, count) words of `width` bytes to aligned addresses."""
        count = values.shape[1]
        for a, pos, off in self.locate(addrs, width * count):
            words = a.data.view(_UINT[width])
            idx = (off // width)[:, None] + np.arange(count)
            words[idx] = values if pos is None else values[pos]

    def load_bytes(self, addrs: np.ndarray, nbytes: np.ndarray, size: int) -> np.ndarray:
        """(n, size) bytes; only the first nbytes[i] of row i are read (and checked), the
        rest are zero (cp.async src-size)."""
        out = np.zeros((addrs.size, size), dtype=np.uint8)
        live = np.flatnonzero(nbytes > 0)
        if live.size == 0:
            return out
        a_live, n_live = addrs[live], nbytes[live].astype(np.int64)
        try:
            groups = self.locate(a_live, 1)
        except MemoryFault as f:
            raise MemoryFault(int(live[f.index]), f.address, f"out-of-bounds global read of "
                              f"{int(n_live[f.index])} bytes ({self.describe(f.address)})") from None
        keep = np.arange(size) < n_live[:, None]
        rows = np.zeros((live.size, size), dtype=np.uint8)
        for a, pos, off in groups:
            n = n_live if pos is None else n_live[pos]
            over = off + n > a.size
            if over.any():  # the bytes actually read, [addr, addr + nbytes), must fit
                j = int(np.flatnonzero(over)[0])
                k = j if pos is None else int(pos[j])
                addr = int(a_live[k])
                raise MemoryFault(int(live[k]), addr, f"out-of-bounds global read of {int(n[j])} bytes "
                                                      f"({self.describe(addr + int(n[j]) - 1)})")
            idx = np.minimum(off[:, None] + np.arange(size), a.data.size - 1)
            if pos is None:
                rows[:] = a.data[idx]
            else:
                rows[pos] = a.data[idx]
        out[live] = np.where(keep, rows, 0)
        return out


class SharedMemory:
    """One CTA's shared memory: static arrays first, then the dynamic (.extern) array, in a
    32-bit window that starts at `base`."""

    def __init__(self, size: int, base: int):
        self.size = int(size)
        self.base = int(base)
        self.data = _padded(self.size)

    def offsets(self, addrs: np.ndarray, nbytes: int) -> np.ndarray:
        """Byte offsets of 32-bit shared addresses; MemoryFault if an access leaves the window."""
        off = addrs.astype(np.int64) - self.base
        bad = (off < 0) | (off + nbytes > self.size)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise MemoryFault(i, int(addrs[i]), f"out-of-bounds shared access of {nbytes} bytes: shared "
                                                f"memory is 0x{self.base:x}..0x{self.base + self.size:x} "
                                                f"({self.size} bytes)")
        return off

    def words(self, width: int) -> np.ndarray:
        return self.data.view(_UINT[width])

    def clear(self):
        self.data[:] = 0
