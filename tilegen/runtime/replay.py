"""A launch repeated with the same arguments, replayed as a CUDA graph (the "graph" launch route).

cuGraphLaunch of an executable graph that holds one kernel launch cost the H200's host 1.72 us a
call, cuLaunchKernelEx of the same kernel 4.33 (docs/perf_notes.md section 58, run 336). A Launcher
on the "graph" route (TILEGEN_LAUNCH=graph) gives each launch to its Replay, which counts the launches
that pack the very bytes of the one before (values, grid and stream; equal values in new objects, such
as kernel.launch's from a dict, count; a float of the other sign does not). After REPEATS plain launches
of those bytes the Replay
captures the one launch on a private stream into a graph, instantiates it, and from then on launches
the executable on the caller's stream. Launches of other bytes reset it (the executable is freed).
A stream that is capturing a graph of its own gets the plain launch (an executable's launch there
would become part of that capture), and after a failure to build an executable so does every launch
of that Launcher: the replay only ever saves time, never changes what runs.

The route is chosen by hand until the GPU suite and the host times have been measured with it
(perf_notes 58 says what to settle first).
"""
from __future__ import annotations

import ctypes
import struct
import weakref

from . import driver as _drv
from .driver import capturing as _capturing

REPEATS = 2          # plain launches of one buffer before it is replayed as a graph
_STREAM_AT = 32      # CUlaunchConfig's hStream, bytes into the configuration
_CAPTURE_MODE = 1    # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' captures are left alone
_NON_BLOCKING = 1    # CU_STREAM_NON_BLOCKING

_GRAPH_LAUNCH: list = []    # [cuGraphLaunch through ctypes, or None]
_PRIVATE: dict = {}         # device -> the stream launches are captured on


def _graph_launch():
    if not _GRAPH_LAUNCH:
        lib = _drv.libcuda()
        fn = getattr(lib, "cuGraphLaunch", None) if lib is not None else None
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
        _GRAPH_LAUNCH.append(fn)
    return _GRAPH_LAUNCH[0]


def _private_stream(device: int):
    stream = _PRIVATE.get(device)
    if stream is None:
        stream = _PRIVATE[device] = _drv.check(_drv.bindings().cuStreamCreate(_NON_BLOCKING), "cuStreamCreate")
    return stream


def _destroy(executable) -> None:
    try:
        _drv.bindings().cuGraphExecDestroy(executable)
    except Exception:  # noqa: BLE001  (at interpreter exit the driver may be gone)
        pass


class Replay:
    """The graph replay of one Launcher's packed launch (module docstring). Called under the
    Launcher's lock with the stream the buffer holds; returns the driver's error code."""

    def __init__(self, launcher):
        self.launcher = launcher
        self.executable = None   # the instantiated graph of the packed launch (its handle as an int), or None
        self.seen = 0            # plain launches of the packed buffer so far
        self.broken = False      # building failed once: plain launches from then on
        self.raw = None          # the buffer's bytes the launches counted in `seen` packed
        self._free = None

    def reset(self) -> None:
        """The buffer is packed with other bytes: its executable no longer launches them."""
        if self._free is not None:
            self._free()   # (freed asynchronously by the driver if a launch of it is in flight)
            self._free = None
        self.executable, self.seen, self.raw = None, 0, None

    def packed(self, stream: int) -> int:
        """The Launcher packed its buffer anew (other value objects): the same bytes as before
        (equal values: a float's sign and every bit count) go on as a repeat, others start over
        with a plain launch."""
        raw = self.launcher._storage.raw
        if raw == self.raw:
            return self(stream)
        self.reset()
        self.raw = raw
        return self.launcher._fn(*self.launcher._ex_args)

    def __call__(self, stream: int) -> int:
        launcher = self.launcher
        if self.executable is None:
            self.seen += 1
            if self.seen > REPEATS and not self.broken and not _capturing(stream):
                self._build(stream)
            if self.executable is None:
                return launcher._fn(*launcher._ex_args)
        elif _capturing(stream):
            return launcher._fn(*launcher._ex_args)
        return _graph_launch()(self.executable, stream or None)

    def _build(self, stream: int) -> None:
        """Capture the packed launch on the private stream and instantiate it; on any failure the
        Launcher keeps launching plainly."""
        launcher = self.launcher
        if _graph_launch() is None:
            self.broken = True
            return
        d = _drv.bindings()
        at = launcher.buffer.config_offset + _STREAM_AT
        graph = None
        try:
            private = _private_stream(launcher.device)
            if int(d.cuStreamBeginCapture(private, d.CUstreamCaptureMode(_CAPTURE_MODE))[0]):
                self.broken = True
                return
            struct.pack_into("<Q", launcher._storage, at, int(private))
            try:
                err = launcher._fn(*launcher._ex_args)
            finally:
                struct.pack_into("<Q", launcher._storage, at, stream)
                end = d.cuStreamEndCapture(private)
            if err or int(end[0]):
                self.broken = True
                return
            graph = end[1]
            made = d.cuGraphInstantiate(graph, 0)
            if int(made[0]):
                self.broken = True
                return
            executable = made[1]
            self.executable = int(executable)
            self._free = weakref.finalize(self, _destroy, executable)
        except Exception:  # noqa: BLE001  (a driver without graphs, a binding of another shape)
            self.broken = True
        finally:
            if graph is not None:
                d.cuGraphDestroy(graph)


__all__ = ["Replay", "REPEATS"]
