"""Prepared launches: what a kernel's launch needs, built once, so that each launch packs
its values with one struct call into a parameter buffer that already exists and makes one
driver call.

cuLaunchKernel takes `kernelParams`, an array of pointers, one per parameter, each to the
bytes of that parameter (ptx.md 7.3). A Launcher owns one buffer holding every parameter
at its natural alignment and the pointer array into it; cuda-python takes the array's
address as a plain int, so nothing is converted per call. The driver copies the values
when the launch is enqueued, so the buffer is free again as soon as the call returns (a
lock keeps two threads from packing into it at once).

The call itself goes through cuda.bindings, or, with TILEGEN_LAUNCH=ctypes, through ctypes
straight into libcuda (the library cuda-python loaded); both take the same arguments. On
the H200 host the bindings route measured 1.2 us faster per call, interleaved in one process
(docs/perf_notes.md): ctypes' conversion of eleven arguments costs more than the bindings'.
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading

from ..errors import LaunchError
from . import driver as _drv
from .module import stream_handle
from .params import ARG_KINDS, check_launch_dims, pack_arg

# kind -> struct code; each aligned to its size (a tensor map: 128 bytes, by value)
_CODE = {"ptr": "Q", "u64": "Q", "u32": "I", "s32": "i", "f32": "f", "f64": "d", "tensormap": "128s"}
_SIZE = {"Q": 8, "I": 4, "i": 4, "f": 4, "d": 8, "128s": 128}
_INVALID_CONTEXT = (201, 400)  # CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE


def launch_route() -> str:
    """"bindings" (cuda.bindings.driver.cuLaunchKernel, the default) or "ctypes" (libcuda's
    cuLaunchKernel directly), from TILEGEN_LAUNCH."""
    route = os.environ.get("TILEGEN_LAUNCH", "bindings").strip().lower()
    return route if route in ("bindings", "ctypes") else "bindings"


class ParamBuffer:
    """The parameters of one kernel, packed at their natural offsets, and the pointer array
    cuLaunchKernel reads them through."""

    def __init__(self, kinds):
        for i, k in enumerate(kinds):
            if k not in _CODE:
                raise LaunchError(f"kernel argument {i}: kind {k!r} is not one of {', '.join(ARG_KINDS)}")
        self.kinds = tuple(kinds)
        fmt, offsets, at = "<", [], 0
        for k in self.kinds:
            code = _CODE[k]
            pad = -at % _SIZE[code]
            fmt += "x" * pad + code
            at += pad
            offsets.append(at)
            at += _SIZE[code]
        self.struct = struct.Struct(fmt)
        self.storage = ctypes.create_string_buffer(max(self.struct.size, 8))
        base = ctypes.addressof(self.storage)
        self.pointers = (ctypes.c_void_p * max(len(self.kinds), 1))(*[base + o for o in offsets])
        self.address = ctypes.addressof(self.pointers) if self.kinds else 0

    def pack(self, values) -> None:
        """Write the values; a value struct refuses (a pointer object, a number out of range)
        goes through params.pack_arg, which converts it or says what is wrong."""
        try:
            self.struct.pack_into(self.storage, 0, *values)
        except (struct.error, OverflowError, TypeError):
            if len(values) != len(self.kinds):
                raise LaunchError(f"the kernel takes {len(self.kinds)} arguments; got {len(values)}") from None
            plain = []
            for i, (v, k) in enumerate(zip(values, self.kinds)):
                value, _ = pack_arg(v, k, i)
                plain.append(bytes(value) if k == "tensormap" else value.value if hasattr(value, "value") else value)
            self.struct.pack_into(self.storage, 0, *plain)


def _ctypes_launch():
    """libcuda's cuLaunchKernel through ctypes (the library cuda-python already loaded), or
    None where ctypes cannot load it."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    fn = lib.cuLaunchKernel
    u = ctypes.c_uint
    fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_CTYPES: list = []


class Launcher:
    """One loaded kernel, ready to launch: `launcher(grid, values, stream)`.

    values are in the kernel's parameter order (ints for pointers and integers, floats);
    stream as module.stream_handle takes it (an int handle is used as it is). The calling
    thread's current context is not checked before each launch: a launch refused for the
    context (a new thread, another device's context current) makes it current and is
    retried once."""

    def __init__(self, function, kinds, threads: int, smem: int, device: int = 0):
        self.function = function
        self.buffer = ParamBuffer(kinds)
        self.block = check_launch_dims((1, 1, 1), (threads, 1, 1))[1]
        self.smem = int(smem)
        self.device = device
        self.handle = function.handle
        self.route = launch_route()
        if self.route == "ctypes" and not _CTYPES:
            _CTYPES.append(_ctypes_launch())
        if self.route == "ctypes" and _CTYPES[0] is None:
            self.route = "bindings"
        self._driver = _drv.bindings()
        self._pack = self.buffer.struct.pack_into
        self._storage = self.buffer.storage
        self._address = self.buffer.address
        self.lock = threading.Lock()
        self._ctypes = self.route == "ctypes"
        self._fn = _CTYPES[0] if self._ctypes else self._driver.cuLaunchKernel
        self._handle = int(function.handle) if self._ctypes else function.handle

    def _launch(self, grid, stream) -> int:
        bx, by, bz = self.block
        if self._ctypes:
            return self._fn(self._handle, grid[0], grid[1], grid[2], bx, by, bz, self.smem, stream, self._address, None)
        return self._fn(self._handle, grid[0], grid[1], grid[2], bx, by, bz, self.smem, stream, self._address, 0)[0]

    def __call__(self, grid, values, stream=0) -> None:
        if stream.__class__ is not int:
            stream = int(stream_handle(stream))
        bx, by, bz = self.block
        with self.lock:
            try:
                self._pack(self._storage, 0, *values)
            except (struct.error, OverflowError, TypeError):
                self.buffer.pack(values)  # converts what it can, or says what is wrong
            if self._ctypes:
                err = self._fn(self._handle, grid[0], grid[1], grid[2], bx, by, bz, self.smem, stream, self._address,
                               None)
            else:
                err = self._fn(self._handle, grid[0], grid[1], grid[2], bx, by, bz, self.smem, stream, self._address,
                               0)[0]
        if err:
            self._failed(int(err), grid, values, stream)

    def _failed(self, err: int, grid, values, stream) -> None:
        if err in _INVALID_CONTEXT:  # this thread has no (or another) context current: once more
            _drv.forget_current()
            _drv.ensure_context(self.device)
            with self.lock:
                self.buffer.pack(values)
                err = int(self._launch(grid, stream))
            if not err:
                return
        check_launch_dims(grid, self.block)  # a grid out of range says so plainly
        _drv.check((err,), f"launching {self.function.entry} (grid {tuple(grid)}, block {self.block}, "
                           f"{self.smem} B dynamic smem)")


__all__ = ["Launcher", "ParamBuffer", "launch_route"]
