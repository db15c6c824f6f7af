"""Device memory, streams and events.

DeviceBuffer owns one cuMemAlloc allocation. Host copies take numpy arrays whose memory
is one contiguous block (C or Fortran order): the bytes move as they are, so the layout
on the device is the layout on the host.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
import weakref

from ..errors import DeviceError, LaunchError
from . import driver as _drv


def _host_block(arr, what: str, writable: bool = False):
    import numpy as np

    if not isinstance(arr, np.ndarray):
        raise LaunchError(f"{what} needs a numpy array; got {type(arr).__name__}")
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise LaunchError(f"{what} needs a contiguous numpy array; use np.ascontiguousarray")
    if writable and not arr.flags.writeable:
        raise LaunchError(f"{what} needs a writable numpy array")
    return arr


# Finalisers and graph capture: Python's garbage collector runs finalisers wherever an allocation finds
# cycles to collect, which may be while another part of the program captures a CUDA graph (PyTorch
# collects before capturing only on request). A cuMemFree or cuMemFreeAsync then, in the global
# capture mode graphs are captured in by default, invalidates that capture; with the finalising
# thread's mode relaxed it does not (run 323, H200), so the buffers' finalisers free in it.


class DeviceBuffer:
    """`nbytes` of device memory on `device`. `.ptr` is the raw address (an int)."""

    def __init__(self, nbytes: int, device: int = 0):
        nbytes = int(nbytes)
        if nbytes < 0:
            raise LaunchError(f"cannot allocate {nbytes} bytes")
        d = _drv.bindings()
        _drv.ensure_context(device)
        self._pid = os.getpid()
        self.device = device
        self.nbytes = nbytes
        # cuMemAlloc rejects 0 bytes; a 1-byte allocation keeps .ptr valid for empty arrays
        self._dptr = _drv.check(d.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})")
        self.ptr = int(self._dptr)

    def __repr__(self) -> str:
        state = "freed" if self._dptr is None else f"ptr=0x{self.ptr:x}"
        return f"DeviceBuffer({self.nbytes} bytes, device={self.device}, {state})"

    @classmethod
    def from_host(cls, arr, device: int = 0) -> "DeviceBuffer":
        """A new buffer holding a copy of the numpy array's bytes."""
        buf = cls(_host_block(arr, "DeviceBuffer.from_host").nbytes, device)
        buf.copy_from_host(arr)
        return buf

    def _live(self):
        if self._dptr is None:
            raise DeviceError("this DeviceBuffer was freed")
        d = _drv.bindings()
        _drv.ensure_context(self.device)
        return d

    def _fits(self, arr, what: str) -> None:
        if arr.nbytes > self.nbytes:
            raise LaunchError(f"{what}: array of {arr.nbytes} bytes does not fit the "
                              f"{self.nbytes}-byte buffer")

    def copy_from_host(self, arr) -> None:
        arr = _host_block(arr, "copy_from_host")
        self._fits(arr, "copy_from_host")
        d = self._live()
        if arr.nbytes:
            _drv.check(d.cuMemcpyHtoD(self.ptr, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD")

    def copy_to_host(self, arr):
        """Fill the numpy array from the start of the buffer; returns it."""
        arr = _host_block(arr, "copy_to_host", writable=True)
        self._fits(arr, "copy_to_host")
        d = self._live()
        if arr.nbytes:
            _drv.check(d.cuMemcpyDtoH(arr.ctypes.data, self.ptr, arr.nbytes), "cuMemcpyDtoH")
        return arr

    def fill_bytes(self, value: int) -> None:
        """Set every byte to `value` (cuMemsetD8), e.g. 0xFF to poison outputs."""
        if not 0 <= int(value) <= 255:
            raise LaunchError(f"fill_bytes value {value} is not a byte (0..255)")
        d = self._live()
        if self.nbytes:
            _drv.check(d.cuMemsetD8(self.ptr, int(value), self.nbytes), "cuMemsetD8")

    def close(self) -> None:
        """Free the memory now; later use raises. Safe to call twice."""
        dptr, self._dptr = getattr(self, "_dptr", None), None
        if dptr is None or os.getpid() != self._pid or sys.is_finalizing():
            return  # nothing to free, another process's memory, or the driver is going away
        d = _drv.bindings()
        _drv.ensure_context(self.device)
        _drv.check(d.cuMemFree(dptr), "cuMemFree")

    def __del__(self):
        try:
            with _drv.capture_relaxed():   # (a capture may be under way: the note above DeviceBuffer)
                self.close()
        except Exception:  # never raise from a finaliser (e.g. at interpreter exit)
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HostCallBuffers:
    """Device buffers of calls on numpy arrays (each operand copied in, the launch, the result
    copied back, all on the legacy default stream), kept for the next such call instead of a
    cuMemAlloc and a cuMemFree (which waits for the whole device) per operand per call. The
    legacy stream orders a later copy into a reused buffer after the work that read it. Buffers
    of up to MAX_BYTES, rounded up to a power of two so that nearby sizes share them; at most
    KEEP_BYTES kept per device; larger ones are allocated and freed per call."""

    MAX_BYTES = 32 << 20
    KEEP_BYTES = 128 << 20
    _free: dict = {}             # device -> [DeviceBuffer] ready for the next call
    _lock = threading.Lock()

    @classmethod
    def take(cls, nbytes: int, device: int) -> DeviceBuffer:
        """A buffer of at least `nbytes` on `device` (contents undefined)."""
        nbytes = max(int(nbytes), 1)
        if nbytes > cls.MAX_BYTES:
            return DeviceBuffer(nbytes, device)
        size = max(256, 1 << (nbytes - 1).bit_length())
        with cls._lock:
            free = cls._free.get(device, ())
            for i, buf in enumerate(free):
                if buf.nbytes == size:
                    return free.pop(i)
        try:
            return DeviceBuffer(size, device)
        except DeviceError:   # (out of memory: the kept buffers first)
            if not cls.release():
                raise
            return DeviceBuffer(size, device)

    @classmethod
    def give(cls, buf: DeviceBuffer) -> None:
        """`buf` back for a later call (its work enqueued on the legacy stream), or freed."""
        if buf.nbytes <= cls.MAX_BYTES and buf._dptr is not None and buf._pid == os.getpid():
            with cls._lock:
                free = cls._free.setdefault(buf.device, [])
                if sum(b.nbytes for b in free) + buf.nbytes <= cls.KEEP_BYTES:
                    free.append(buf)
                    return
        buf.close()

    @classmethod
    def release(cls) -> int:
        """Free every kept buffer; the bytes freed."""
        with cls._lock:
            kept = [b for free in cls._free.values() for b in free]
            cls._free.clear()
        for b in kept:
            b.close()
        return sum(b.nbytes for b in kept)


class StreamBuffer:
    """`nbytes` of device memory allocated and freed in the order of `stream`'s work
    (cuMemAllocAsync / cuMemFreeAsync): no synchronisation, and usable inside CUDA graph
    capture. `free()` once the work that reads it is enqueued. A driver without memory
    pools gets a plain allocation, freed after that stream's work completes."""

    def __init__(self, nbytes: int, stream=0, device: int = 0):
        d = _drv.bindings()
        _drv.ensure_context(device)
        self.device, self.nbytes = device, int(nbytes)
        self.stream = int(stream or 0)
        self._pid = os.getpid()
        r = d.cuMemAllocAsync(max(self.nbytes, 1), self.stream) if hasattr(d, "cuMemAllocAsync") else (None,)
        if r[0] is not None and int(r[0]) == 0:
            self._async = True
            self._dptr = r[1]
        else:  # no stream-ordered allocator: a plain allocation
            self._async = False
            self._dptr = _drv.check(d.cuMemAlloc(max(self.nbytes, 1)), f"cuMemAlloc({self.nbytes})")
        self.ptr = int(self._dptr)

    def free(self) -> None:
        """Free after the work enqueued on the stream so far. Safe to call twice."""
        dptr, self._dptr = self._dptr, None
        if dptr is None or os.getpid() != self._pid or sys.is_finalizing():
            return
        d = _drv.bindings()
        _drv.ensure_context(self.device)
        if self._async:
            _drv.check(d.cuMemFreeAsync(dptr, self.stream), "cuMemFreeAsync")
        else:
            _drv.check(d.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
            _drv.check(d.cuMemFree(dptr), "cuMemFree")

    def __del__(self):
        try:
            with _drv.capture_relaxed():   # (a capture may be under way: the note above DeviceBuffer)
                self.free()
        except Exception:
            pass


PER_THREAD_STREAM = 2   # CU_STREAM_PER_THREAD: one handle, a default stream of each host thread


def stream_key(stream: int):
    """What names the queue a launch on `stream` joins: the handle, and for the per-thread
    default stream the calling thread too (its handle is every thread's)."""
    return (stream, threading.get_ident()) if stream == PER_THREAD_STREAM else stream


def zero_async(ptr: int, words: int, stream: int) -> None:
    """Set `words` 32-bit words at `ptr` to 0, in `stream`'s order (captured into a graph
    when the stream captures)."""
    _drv.check(_drv.bindings().cuMemsetD32Async(ptr, 0, words, stream), "cuMemsetD32Async")


class StreamScratch:
    """Device memory that the launches on one stream reuse: a workspace (a kernel's partial
    sums, read back within the launch) and u32 counters that are 0 between launches (arrival
    counters, dsl/arrivals.py: each launch puts back to 0 what it counted). A stream runs its
    launches one after another, so one scratch per (device, stream_key) serves every kernel
    launched there, as cuBLAS keeps a workspace per stream. It grows and never shrinks, until
    free_scratch frees every stream's (a warning says when more than MANY_STREAMS hold one). Its
    memory is tilegen's own (cuMemAlloc), zeroed on a private stream. Work being captured into
    a CUDA graph must not use it (replays of two graphs may run at once): the callers give such
    work memory of its own (gemm/call.py). A stream destroyed while its work still runs must not
    have its handle reused for tilegen's launches before that work ends."""

    _of: dict = {}   # (process, device, stream_key) -> StreamScratch
    _users = weakref.WeakSet()   # what remembers launches naming a scratch (forget_scratch() on release)
    MANY_STREAMS = 64   # scratches of one process past which a warning says they are kept (free_scratch)
    _warned = False

    @classmethod
    def of(cls, device: int, stream: int) -> "StreamScratch":
        key = (os.getpid(), device, stream_key(stream))
        scratch = cls._of.get(key)
        if scratch is None:
            scratch = cls._of[key] = cls(device)
            if len(cls._of) > cls.MANY_STREAMS and not cls._warned:
                cls._warned = True
                held = sum(s.nbytes for s in cls._of.values())
                warnings.warn(f"tilegen keeps scratch memory for each stream its split-K and prepared-operand "
                              f"launches ran on: {len(cls._of)} streams now hold {held / 2 ** 20:.1f} MiB. Reuse "
                              f"streams, or call tilegen.free_scratch() to free it", RuntimeWarning, stacklevel=2)
        return scratch

    @classmethod
    def remembered_by(cls, user) -> None:
        """`user` keeps launches whose arguments name a scratch: free_scratch calls its
        forget_scratch() first."""
        cls._users.add(user)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in (self._work, self._counters, *self._outgrown) if b is not None)

    @classmethod
    def release(cls) -> int:
        """free_scratch(): every stream's scratch of this process freed, once the devices have
        finished their work; the bytes freed."""
        mine = [(key, s) for key, s in cls._of.items() if key[0] == os.getpid()]
        if not mine:
            return 0
        for user in list(cls._users):   # no remembered launch names the memory any more
            user.forget_scratch()
        with _drv.capture_relaxed():
            for device in sorted({s.device for _, s in mine}):
                try:
                    synchronize(device)
                except DeviceError as e:
                    raise DeviceError(f"free_scratch waits for the device's work to end, which failed (a CUDA graph "
                                      f"capture in progress forbids it: call it outside capture): {e}") from None
        freed = 0
        for key, s in mine:
            freed += s.nbytes
            for buf in (s._work, s._counters, *s._outgrown):
                if buf is not None:
                    buf.close()
            s._work = s._counters = None
            s._outgrown = []
            del cls._of[key]
        cls._warned = False
        return freed

    def __init__(self, device: int):
        self.device = device
        self._work = self._counters = None
        self._outgrown = []

    def workspace(self, nbytes: int) -> int:
        """The address of at least `nbytes` (contents undefined)."""
        if self._work is None or self._work.nbytes < nbytes:
            self._work = self._grow(self._work, nbytes, zero=False)
        return self._work.ptr

    def counters(self, count: int) -> int:
        """The address of at least `count` u32 counters, each 0 before the next launch."""
        if self._counters is None or self._counters.nbytes < 4 * count:
            self._counters = self._grow(self._counters, 4 * count, zero=True)
        return self._counters.ptr

    def _grow(self, old, nbytes: int, zero: bool) -> DeviceBuffer:
        size = max(int(nbytes), 256, 2 * old.nbytes if old is not None else 0)   # (doubling: few growths)
        with _drv.capture_relaxed():
            try:
                buf = DeviceBuffer(size, self.device)
            except DeviceError:   # (no room to double: what is asked for only)
                size = max(int(nbytes), 256)
                buf = DeviceBuffer(size, self.device)
            if zero:   # on a stream of its own: no capture, nor the caller's stream, waits on it
                side = Stream(self.device)
                try:
                    zero_async(buf.ptr, size // 4, side.handle)
                    side.synchronize()
                finally:
                    side.close()
        if old is not None:
            self._outgrown.append(old)
        return buf


class Stream:
    """A non-blocking CUDA stream (does not synchronise with the legacy default stream)."""

    def __init__(self, device: int = 0):
        d = _drv.bindings()
        _drv.ensure_context(device)
        self._pid = os.getpid()
        self.device = device
        flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        self.handle = _drv.check(d.cuStreamCreate(flags), "cuStreamCreate")

    def synchronize(self) -> None:
        d = _drv.bindings()
        _drv.ensure_context(self.device)
        _drv.check(d.cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def close(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle is None or os.getpid() != self._pid or sys.is_finalizing():
            return
        _drv.check(_drv.bindings().cuStreamDestroy(handle), "cuStreamDestroy")

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _stream(stream):
    return 0 if stream is None else getattr(stream, "handle", stream)


class Event:
    """A CUDA event with timing enabled."""

    def __init__(self, device: int = 0):
        d = _drv.bindings()
        _drv.ensure_context(device)
        self._pid = os.getpid()
        self.device = device
        self.handle = _drv.check(d.cuEventCreate(0), "cuEventCreate")

    def record(self, stream=None) -> "Event":
        """Record on `stream` (a Stream, a CUstream, or None for the legacy default stream)."""
        _drv.check(_drv.bindings().cuEventRecord(self.handle, _stream(stream)), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        _drv.check(_drv.bindings().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def close(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle is None or os.getpid() != self._pid or sys.is_finalizing():
            return
        _drv.check(_drv.bindings().cuEventDestroy(handle), "cuEventDestroy")

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def elapsed_ms(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events; waits for `end` first."""
    end.synchronize()
    return float(_drv.check(_drv.bindings().cuEventElapsedTime(start.handle, end.handle),
                            "cuEventElapsedTime"))


def synchronize(device: int = 0) -> None:
    """Wait for all work on the device's context (cuCtxSynchronize)."""
    d = _drv.bindings()
    _drv.ensure_context(device)
    _drv.check(d.cuCtxSynchronize(), "cuCtxSynchronize")


def free_scratch() -> int:
    """Free the device memory tilegen keeps per stream (split-K's partial sums and arrival
    counters, operands prepared by first kernels such as tf32's K-major copy of B), after
    waiting for every device it is on to finish its work; returns the bytes freed. The next
    call that needs scratch allocates it again; and the buffers kept for calls on numpy arrays
    (HostCallBuffers). Not while a CUDA graph is being captured, nor while other threads launch
    tilegen work."""
    return StreamScratch.release() + HostCallBuffers.release()


def copy_2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width_bytes: int, height: int,
            stream=None) -> None:
    """Copy `height` rows of `width_bytes` between two device buffers with their own pitches
    (cuMemcpy2DAsync), e.g. to re-pitch an operand whose rows are not 16-byte aligned."""
    if width_bytes <= 0 or height <= 0:
        return
    d = _drv.bindings()
    p = d.CUDA_MEMCPY2D()
    p.srcMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice = int(src)
    p.srcPitch = int(src_pitch)
    p.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.dstDevice = int(dst)
    p.dstPitch = int(dst_pitch)
    p.WidthInBytes = int(width_bytes)
    p.Height = int(height)
    _drv.check(d.cuMemcpy2DAsync(p, int(stream or 0)), "cuMemcpy2DAsync")
