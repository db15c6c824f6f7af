"""Prepared launches: what a kernel's launch needs, built once, so that each launch packs
its values with one struct call into a parameter buffer that already exists and makes one
driver call.

cuLaunchKernel takes `kernelParams`, an array of pointers, one per parameter, each to the
bytes of that parameter (ptx.md 7.3). A Launcher owns one buffer holding every parameter
at its natural alignment and the pointer array into it; cuda-python takes the array's
address as a plain int, so nothing is converted per call. The driver copies the values
when the launch is enqueued, so the buffer is free again as soon as the call returns (a
lock keeps two threads from packing into it at once).

Four routes make the call (TILEGEN_LAUNCH picks one):
  "graph"     the default: "ex", and a launch repeated with the same values (the third time a
              set of values is launched, and every time after) replayed as a CUDA graph
              (runtime/replay.py: cuGraphLaunch costs the host less than a kernel's launch;
              docs/perf_notes.md section 59);
  "ex"        cuLaunchKernelEx through ctypes: the launch configuration (grid, block, shared
              memory, stream, attributes such as a cluster shape) is packed into the same buffer
              as the parameters, so the call passes four pointers that never change, and ctypes
              converts nothing per call;
  "bindings"  cuLaunchKernel through cuda.bindings (eleven arguments, converted by Cython);
  "ctypes"    cuLaunchKernel through ctypes (eleven arguments, converted by ctypes; slowest).
A cluster launch (cluster=(x, y, z)) needs cuLaunchKernelEx, so it takes "graph" (or "ex") whatever
the choice. Measured per call on the H200 host: docs/perf_notes.md section 16.
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
from .replay import Replay

# kind -> struct code; each aligned to its size (a tensor map: 128 bytes, by value)
_CODE = {"ptr": "Q", "u64": "Q", "u32": "I", "s32": "i", "f32": "f", "f64": "d", "tensormap": "128s"}
_SIZE = {"Q": 8, "I": 4, "i": 4, "f": 4, "d": 8, "128s": 128}
_INVALID_CONTEXT = (201, 400)  # CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE


ROUTES = ("ex", "graph", "bindings", "ctypes")
_CONFIGURED = ("ex", "graph")   # the routes whose buffer holds a CUlaunchConfig (cuLaunchKernelEx)


def launch_route() -> str:
    """The driver call launches go through, from TILEGEN_LAUNCH: "graph" (the default), "ex",
    "bindings" or "ctypes" (module docstring)."""
    route = os.environ.get("TILEGEN_LAUNCH", "graph").strip().lower()
    return route if route in ROUTES else "graph"


class ParamBuffer:
    """The parameters of one kernel, packed at their natural offsets, and the pointer array
    cuLaunchKernel reads them through. With `config=True` a CUlaunchConfig follows the
    parameters in the same buffer (cluster: its attribute too), and `pack_launch` writes the
    parameters, the grid and the stream with one struct call."""

    def __init__(self, kinds, block=(1, 1, 1), smem: int = 0, cluster=None, config: bool = False):
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
        self.block, self.smem = tuple(block), int(smem)
        size = max(self.struct.size, 8)
        if config:
            self.config_offset = size + (-size % 8)
            # CUlaunchConfig: grid x y z, block x y z, shared bytes, (pad), stream; then the
            # attribute array's address and count, which the per-call struct leaves alone.
            self.launch_struct = struct.Struct(fmt + "x" * (self.config_offset - self.struct.size) + "7I4xQ")
            attrs_offset = self.config_offset + _CONFIG_BYTES
            size = attrs_offset + (_ATTR_BYTES if cluster else 0)
        self.storage = ctypes.create_string_buffer(size)
        base = ctypes.addressof(self.storage)
        self.pointers = (ctypes.c_void_p * max(len(self.kinds), 1))(*[base + o for o in offsets])
        self.address = ctypes.addressof(self.pointers) if self.kinds else 0
        if config:
            self.config_address = base + self.config_offset
            attrs = (base + attrs_offset, 1) if cluster else (0, 0)
            struct.pack_into("<QI", self.storage, self.config_offset + 40, *attrs)
            if cluster:  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, value {x, y, z}
                struct.pack_into("<I4x3I", self.storage, attrs_offset, _CLUSTER_DIMENSION, *cluster)

    def pack(self, values) -> None:
        """Write the values; a value struct refuses (a pointer object, a number out of range)
        goes through params.pack_arg, which converts it or says what is wrong."""
        try:
            self.struct.pack_into(self.storage, 0, *values)
        except (struct.error, OverflowError, TypeError):
            self.struct.pack_into(self.storage, 0, *self.plain(values))

    def plain(self, values) -> list:
        """values converted by params.pack_arg (or a LaunchError saying which is wrong)."""
        if len(values) != len(self.kinds):
            raise LaunchError(f"the kernel takes {len(self.kinds)} arguments; got {len(values)}")
        plain = []
        for i, (v, k) in enumerate(zip(values, self.kinds)):
            value, _ = pack_arg(v, k, i)
            plain.append(bytes(value) if k == "tensormap" else value.value if hasattr(value, "value") else value)
        return plain

    def pack_launch(self, grid, values, stream: int) -> None:
        """The parameters and the launch configuration for cuLaunchKernelEx, in one write."""
        (bx, by, bz), smem = self.block, self.smem
        try:
            self.launch_struct.pack_into(self.storage, 0, *values, grid[0], grid[1], grid[2], bx, by, bz, smem, stream)
        except (struct.error, OverflowError, TypeError):
            self.launch_struct.pack_into(self.storage, 0, *self.plain(values), *check_launch_dims(grid, self.block)[0],
                                         bx, by, bz, smem, stream)


_CONFIG_BYTES = 56  # sizeof(CUlaunchConfig) on 64-bit hosts
_ATTR_BYTES = 72  # sizeof(CUlaunchAttribute): id, pad, a 64-byte value union
_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


def _ctypes_launch(lib):
    fn = lib.cuLaunchKernel
    u = ctypes.c_uint
    fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def _ex_launch(lib):
    try:
        fn = lib.cuLaunchKernelEx
    except AttributeError:  # a driver older than CUDA 12.0
        return None
    fn.argtypes = [ctypes.c_void_p] * 4
    fn.restype = ctypes.c_int
    return fn


_FUNCTIONS: dict = {}


def _driver_function(route: str):
    """libcuda's cuLaunchKernelEx ("ex") or cuLaunchKernel ("ctypes") as a ctypes function,
    looked up once; None where it cannot be had."""
    if route not in _FUNCTIONS:
        lib = _drv.libcuda()
        _FUNCTIONS[route] = None if lib is None else (_ex_launch if route == "ex" else _ctypes_launch)(lib)
    return _FUNCTIONS[route]


_NOTHING_PACKED = (None, None, None)


class Launcher:
    """One loaded kernel, ready to launch: `launcher(grid, values, stream)`.

    values are in the kernel's parameter order (ints for pointers and integers, floats);
    stream as module.stream_handle takes it (an int handle is used as it is); cluster, a
    cluster shape (x, y, z) the grid is launched in (ptx.md 6.9). The calling thread's
    current context is not checked before each launch: a launch refused for the context (a
    new thread, another device's context current) makes it current and is retried once."""

    def __init__(self, function, kinds, threads: int, smem: int, device: int = 0, cluster=None):
        self.function = function
        self.block = check_launch_dims((1, 1, 1), (threads, 1, 1))[1]
        self.smem = int(smem)
        self.device = device
        self.cluster = tuple(cluster) if cluster else None
        self.handle = function.handle
        route = launch_route()
        if self.cluster and route not in _CONFIGURED:
            route = "graph"
        if route != "bindings" and _driver_function("ex" if route == "graph" else route) is None:
            if self.cluster:
                raise LaunchError("a cluster launch needs cuLaunchKernelEx (CUDA 12.0 or newer), which "
                                  "this driver does not have")
            route = "bindings"
        self.route = route
        self._config = route in _CONFIGURED
        self.buffer = ParamBuffer(kinds, self.block, self.smem, self.cluster, config=self._config)
        self.lock = threading.Lock()
        self._packed = _NOTHING_PACKED   # (values, grid, stream) the configured routes' buffer holds
        self._storage = self.buffer.storage
        self._address = self.buffer.address
        self._replay = Replay(self) if route == "graph" else None
        if self._config:  # four pointers that never change; ctypes converts nothing per call
            self._fn = _driver_function("ex")
            self._ex_args = (ctypes.c_void_p(self.buffer.config_address), ctypes.c_void_p(int(function.handle)),
                             ctypes.c_void_p(self._address or None), None)
            self._pack = self.buffer.launch_struct.pack_into
        else:
            self._fn = _driver_function(route) if route == "ctypes" else _drv.bindings().cuLaunchKernel
            self._handle = int(function.handle) if route == "ctypes" else function.handle
            self._pack = self.buffer.struct.pack_into

    def _launch(self, grid, stream) -> int:
        """The driver call with the buffer as it is (the values already packed)."""
        if self._config:
            return self._fn(*self._ex_args)
        bx, by, bz = self.block
        if self.route == "ctypes":
            return self._fn(self._handle, grid[0], grid[1], grid[2], bx, by, bz, self.smem, stream, self._address, None)
        return self._fn(self._handle, grid[0], grid[1], grid[2], bx, by, bz, self.smem, stream, self._address, 0)[0]

    def __call__(self, grid, values, stream=0) -> None:
        if stream.__class__ is not int:
            stream = int(stream_handle(stream))
        with self.lock:
            if self._config:
                # the buffer still holds these very (immutable) values: launch it as it is
                if values is not self._packed[0] or grid is not self._packed[1] or stream != self._packed[2] \
                        or values.__class__ is not tuple or grid.__class__ is not tuple:
                    self._packed = _NOTHING_PACKED
                    try:
                        self._pack(self._storage, 0, *values, grid[0], grid[1], grid[2], *self.block, self.smem,
                                   stream)
                    except (struct.error, OverflowError, TypeError):
                        self.buffer.pack_launch(grid, values, stream)  # converts what it can, or says what is wrong
                    self._packed = (values, grid, stream)
                    # (the graph route: equal values in new objects pack the same bytes, and replay too)
                    err = self._fn(*self._ex_args) if self._replay is None else self._replay.packed(stream)
                elif self._replay is not None:
                    err = self._replay(stream)
                else:
                    err = self._fn(*self._ex_args)
            else:
                try:
                    self._pack(self._storage, 0, *values)
                except (struct.error, OverflowError, TypeError):
                    self.buffer.pack(values)
                err = self._launch(grid, stream)
        if err:
            self._failed(int(err), grid, values, stream)

    def relaunch(self) -> None:
        """The driver's call alone, on the buffer the last launch packed (the "ex" route): the
        floor under a launch's host time, for `tilegen bench --host`."""
        if not self._config or self._packed is _NOTHING_PACKED:
            raise LaunchError(f"relaunch: {self.function.entry} has no packed launch to repeat (route {self.route!r})")
        with self.lock:
            err = self._fn(*self._ex_args)
        if err:
            self._failed(int(err), self._packed[1], self._packed[0], self._packed[2])

    def _failed(self, err: int, grid, values, stream) -> None:
        if err in _INVALID_CONTEXT:  # this thread has no (or another) context current: once more
            _drv.forget_current()
            _drv.ensure_context(self.device)
            with self.lock:
                if self._config:
                    # (another thread may have launched in between: the buffer no longer holds what
                    # _packed says, and after this repack it holds this call's values)
                    self._packed = _NOTHING_PACKED
                    if self._replay is not None:
                        self._replay.reset()
                    self.buffer.pack_launch(grid, values, stream)
                else:
                    self.buffer.pack(values)
                err = int(self._launch(grid, stream))
            if not err:
                return
        check_launch_dims(grid, self.block)  # a grid out of range says so plainly
        where = f" in clusters of {self.cluster}" if self.cluster else ""
        _drv.check((err,), f"launching {self.function.entry} (grid {tuple(grid)}{where}, block {self.block}, "
                           f"{self.smem} B dynamic smem)")


def cluster_capacity(function, threads: int, smem: int, cluster, sm_count: int) -> int:
    """How many CTAs of this kernel run at once in clusters of `cluster` (the driver's
    cuOccupancyMaxActiveClusters times the cluster's size): what a persistent cluster kernel
    takes for SM_COUNT. Without the query, the multiprocessors rounded down to whole clusters."""
    size = cluster[0] * cluster[1] * cluster[2]
    fallback = max(size, sm_count - sm_count % size)
    d = _drv.bindings()
    try:
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = cluster
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
        cfg.sharedMemBytes = int(smem)
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        cfg.attrs, cfg.numAttrs = [attr], 1
        err, n = d.cuOccupancyMaxActiveClusters(function.handle, cfg)
    except Exception:  # noqa: BLE001  (an older driver or binding: the plain estimate)
        return fallback
    return int(n) * size if int(err) == 0 and int(n) > 0 else fallback


__all__ = ["Launcher", "ParamBuffer", "ROUTES", "cluster_capacity", "launch_route"]
