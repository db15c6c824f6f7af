"""Launches repeated with the same arguments, replayed as CUDA graphs (the "graph" launch route, the
default; TILEGEN_LAUNCH=ex launches every time).

cuGraphLaunch of an executable graph that holds one kernel launch cost the H200's host 1.72-1.93 us
a call, cuLaunchKernelEx of the same kernel 4.33-5.03 (docs/perf_notes.md sections 58-59). A
Launcher on the "graph" route gives each launch to its Replay, which keeps a small table keyed by
the bytes the launch packed (values, grid and stream; equal values in new objects, such as
kernel.launch's from a dict, are the same key; a float of the other sign is not). A key's first
REPEATS launches are plain; the next captures that one launch on a private stream into a graph,
instantiates it, and from then on launches the executable on the caller's stream. So a model that
calls one kernel for each of its layers, with each layer's own arguments, replays every layer once
each has been seen REPEATS times. The table holds CAPACITY keys, the least recently launched
dropped first (its executable freed), so arguments that never repeat cost a lookup, not a capture.

A stream that is capturing a graph of its own gets the plain launch (an executable's launch there
would become part of that capture), and no executable is freed to make room while it captures; the
driver calls that build and free executables run in relaxed capture mode (another thread's capture
in global mode would refuse them). A build that fails leaves that launch plain, and after
MAX_FAILURES so does every launch of that Launcher: the replay only ever saves time, never changes
what runs. The capture check and the
graph launch go through ctypes with their arguments converted once, when the key's graph is built
(with argtypes a call converts each argument again, which cost the capture check about half a
microsecond of its 0.9; section 59).
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
import weakref
from collections import OrderedDict

from . import driver as _drv

REPEATS = 2          # plain launches of one key before it is replayed as a graph
CAPACITY = 64        # keys (argument sets) a Launcher remembers
MAX_FAILURES = 3     # failed builds after which a Launcher launches plainly for good
_STREAM_AT = 32      # CUlaunchConfig's hStream, bytes into the configuration
_CAPTURE_MODE = 1    # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' captures are left alone
_NON_BLOCKING = 1    # CU_STREAM_NON_BLOCKING

_CALLS: list = []    # [(cuGraphLaunch, cuStreamIsCapturing) through ctypes, or None]
_PRIVATE: dict = {}  # (process, current context) -> the stream launches are captured on
_BUILDING = threading.Lock()   # one capture at a time on a context's private stream (Launchers of other threads)
_REPLAYS = weakref.WeakSet()   # every Replay, for forget_all()


def _driver_calls():
    """cuGraphLaunch(exec, stream) and cuStreamIsCapturing(stream, status*) through ctypes, taking
    ready ctypes values (no argtypes: nothing converted per call), or None without them."""
    if not _CALLS:
        lib = _drv.libcuda()
        fns = [getattr(lib, name, None) if lib is not None else None
               for name in ("cuGraphLaunch", "cuStreamIsCapturing")]
        for fn in fns:
            if fn is not None:
                fn.restype = ctypes.c_int
        _CALLS.append(tuple(fns) if all(fns) else None)
    return _CALLS[0]


def _private_stream():
    """The stream of the thread's current context that launches are captured on (a thread that
    switched to another device's context gets that context's: the capture then fails, and the
    launch stays plain)."""
    d = _drv.bindings()
    key = (os.getpid(), int(_drv.check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")))
    stream = _PRIVATE.get(key)
    if stream is None:
        stream = _PRIVATE[key] = _drv.check(d.cuStreamCreate(_NON_BLOCKING), "cuStreamCreate")
    return stream


def _destroy(executable, pid: int) -> None:
    if os.getpid() != pid:   # (a forked child: the executable is its parent's)
        return
    try:
        with _drv.capture_relaxed():
            _drv.bindings().cuGraphExecDestroy(executable)
    except Exception:  # noqa: BLE001  (the driver may be shutting down)
        pass


def forget_all() -> None:
    """Free every Launcher's executables (modules are being unloaded: their kernels go too)."""
    for replay in list(_REPLAYS):
        replay.reset()


class _Graph:
    """One key's replay: the plain launches seen so far, then the executable and the ready ctypes
    arguments of its launch."""
    __slots__ = ("seen", "executable", "args", "free", "__weakref__")

    def __init__(self):
        self.seen = 0
        self.executable = None   # its handle as an int once built
        self.args = None         # (executable, stream) as ctypes values
        self.free = None         # the finalizer that destroys the executable

    def drop(self) -> None:
        if self.free is not None:
            self.free()   # (freed asynchronously by the driver if a launch of it is in flight)
        self.free = self.executable = self.args = None
        self.seen = 0


class Replay:
    """The graph replays of one Launcher's packed launches (module docstring). Called under the
    Launcher's lock with the stream the buffer holds; returns the driver's error code."""

    def __init__(self, launcher):
        self.launcher = launcher
        self.graphs: OrderedDict = OrderedDict()   # packed bytes -> _Graph, least recent first
        self.current = None                        # the _Graph of the bytes the buffer holds
        self.failures = 0                          # builds that failed
        self.broken = False                        # MAX_FAILURES builds failed: plain launches from then on
        self._status = ctypes.c_int(0)             # cuStreamIsCapturing's answer (under the lock)
        self._status_ref = ctypes.byref(self._status)
        self._stream_args: dict = {}               # stream -> ctypes.c_void_p, for the capture check
        _REPLAYS.add(self)

    def reset(self) -> None:
        """Forget every key (the buffer's bytes may no longer be what they were launched as)."""
        for graph in self.graphs.values():
            graph.drop()
        self.graphs.clear()
        self.current = None

    def packed(self, stream: int) -> int:
        """The Launcher packed its buffer anew: look its bytes up (or add them) and launch."""
        raw = self.launcher._storage.raw
        graphs = self.graphs
        graph = graphs.get(raw)
        if graph is None:
            if len(graphs) >= CAPACITY:
                if self._capturing(stream):   # (no executable freed inside the caller's capture)
                    self.current = None
                    return self.launcher._fn(*self.launcher._ex_args)
                graphs.popitem(last=False)[1].drop()
            graph = graphs[raw] = _Graph()
        else:
            graphs.move_to_end(raw)
        self.current = graph
        return self(stream)

    def _capturing(self, stream: int) -> bool:
        arg = self._stream_args.get(stream)
        if arg is None:
            if len(self._stream_args) >= CAPACITY:
                self._stream_args.clear()
            arg = self._stream_args[stream] = ctypes.c_void_p(stream or None)
        return _driver_calls()[1](arg, self._status_ref) != 0 or self._status.value != 0

    def __call__(self, stream: int) -> int:
        graph = self.current
        if graph is None:   # (reset under a launch that had not been looked up)
            return self.packed(stream)
        if graph.args is not None:
            calls = _CALLS[0]
            if calls[1](graph.args[1], self._status_ref) == 0 and self._status.value == 0:
                return calls[0](*graph.args)
            return self.launcher._fn(*self.launcher._ex_args)   # the stream captures: launch plainly
        graph.seen += 1
        if graph.seen > REPEATS and not self.broken:
            if _driver_calls() is None:
                self.broken = True
            elif not self._capturing(stream):
                with _BUILDING:
                    self._build(graph, stream)
                if graph.args is not None:
                    return _CALLS[0][0](*graph.args)
        return self.launcher._fn(*self.launcher._ex_args)

    def _build(self, graph: _Graph, stream: int) -> None:
        """Capture the packed launch on the private stream and instantiate it (the launch itself is
        then the executable's first); on any failure this launch stays plain."""
        launcher = self.launcher
        d = _drv.bindings()
        at = launcher.buffer.config_offset + _STREAM_AT
        captured = private = None
        begun = False
        with _drv.capture_relaxed():
            try:
                private = _private_stream()
                begun = not int(d.cuStreamBeginCapture(private, d.CUstreamCaptureMode(_CAPTURE_MODE))[0])
                if not begun:
                    return self._failed()
                struct.pack_into("<Q", launcher._storage, at, int(private))
                try:
                    err = launcher._fn(*launcher._ex_args)
                finally:
                    struct.pack_into("<Q", launcher._storage, at, stream)
                    begun = False
                    end = d.cuStreamEndCapture(private)
                if err or int(end[0]):
                    return self._failed()
                captured = end[1]
                made = d.cuGraphInstantiate(captured, 0)
                if int(made[0]):
                    return self._failed()
                executable = made[1]
                free = weakref.finalize(graph, _destroy, executable, os.getpid())
                free.atexit = False   # (at exit the process's executables go with it)
                graph.free, graph.executable = free, int(executable)
                graph.args = (ctypes.c_void_p(graph.executable), ctypes.c_void_p(stream or None))
            except Exception:  # noqa: BLE001  (a driver without graphs, a binding of another shape)
                self._failed()
            finally:
                if begun:   # (interrupted between the capture's start and its launch)
                    d.cuStreamEndCapture(private)
                if captured is not None:
                    d.cuGraphDestroy(captured)

    def _failed(self) -> None:
        self.failures += 1
        self.broken = self.failures >= MAX_FAILURES


__all__ = ["CAPACITY", "Replay", "REPEATS", "forget_all"]
