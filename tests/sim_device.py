"""A GPU of the tests' own, run by the CPU emulator: the fast paths' code on CPU machines.

The fast paths (gemm/call.py FastCall and BatchedCall, gemm/matmul.py's remembered choices)
take PyTorch and CuPy tensors through a small adapter (runtime/interop.py: probe, stream,
empty) and launch through prepared launchers, tensor maps, per-stream scratch and 2-D copies,
all of which need a GPU. Here each of those is replaced by the emulator's equivalent, and
nothing else: `SimArray`s live in the emulator's global memory, their adapter probes them as
the torch adapter probes tensors, a launch runs the kernel's PTX on the emulator with the
grid and positional arguments the fast path built, and the tensor maps are the emulator's
(the same fields cuTensorMapEncodeTiled takes). So a test drives the very code a torch user
runs, call by call (remembered launches, new pointers, outputs made per call, re-pitched
operands, split-K's second kernel), and compares with numpy.

Use the `sim_gpu` fixture (conftest.py): `dev.array(host)`, `dev.empty(shape, dtype)`,
`x.numpy()`, `dev.launches` (kernel name, grid, stream) and `dev.arguments` in order,
`dev.capturing = True` for calls made as if a CUDA graph were being captured."""
from __future__ import annotations

import importlib

import numpy as np

from tilegen import compiler, runtime
from tilegen.runtime.module import module_generation
from tilegen.runtime import interop
from tilegen.sim.memory import GlobalMemory
from tilegen.sim.runner import EMULATOR_SM_COUNT, SHARED_BASE, launch
from tilegen.sim.tma import encode_tensor_map

gemm_call = importlib.import_module("tilegen.gemm.call")
tensormap = importlib.import_module("tilegen.runtime.tensormap")
gemm_matmul = importlib.import_module("tilegen.gemm.matmul")   # (tilegen.gemm.matmul is also the function)

STREAM = 0x5EED0   # the handle the adapter gives as its library's current stream


class _Device:
    id = 0
    index = 0


class SimArray:
    """An array in the emulator's global memory, strided as a CuPy array is (strides in bytes,
    numpy dtypes); `.T` is a transposed view, `.numpy()` a host copy of its elements."""

    device = _Device()

    def __init__(self, dev: "SimDevice", ptr: int, shape, elements, dtype):
        self.dev, self.ptr = dev, int(ptr)
        self.dtype = np.dtype(dtype)
        self.shape, self.elements = tuple(int(s) for s in shape), tuple(int(s) for s in elements)

    itemsize = property(lambda self: self.dtype.itemsize)
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))

    def __getitem__(self, i) -> "SimArray":
        """The i-th array along the first axis (an integer index: a view)."""
        if not isinstance(i, (int, np.integer)) or not self.shape or not -self.shape[0] <= i < self.shape[0]:
            raise IndexError(f"SimArray takes an integer index within its first axis, not {i!r}")
        i = int(i) % self.shape[0]
        return SimArray(self.dev, self.ptr + i * self.elements[0] * self.itemsize, self.shape[1:], self.elements[1:],
                        self.dtype)
    strides = property(lambda self: tuple(s * self.itemsize for s in self.elements))

    @property
    def T(self) -> "SimArray":
        return SimArray(self.dev, self.ptr, self.shape[::-1], self.elements[::-1], self.dtype)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "strides": self.strides,
                "version": 3}

    def reshape(self, *shape) -> "SimArray":
        """A view with another shape, of an array stored back to back (as the fast path reshapes
        the output it makes)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else tuple(shape)
        if -1 in shape:
            known = int(np.prod([n for n in shape if n != -1]))
            shape = tuple(int(np.prod(self.shape)) // known if n == -1 else n for n in shape)
        kept = [(n, e) for n, e in zip(self.shape, self.elements) if n != 1]
        if tuple(n for n, _ in kept) == tuple(n for n in shape if n != 1):   # (dimensions of 1 dropped or added: a view)
            inner = iter(e for _, e in kept)
            return SimArray(self.dev, self.ptr, shape, tuple(1 if n == 1 else next(inner) for n in shape), self.dtype)
        if self.elements != _packed(self.shape):
            raise ValueError("reshape of a view that is not packed")
        return SimArray(self.dev, self.ptr, shape, _packed(shape), self.dtype)

    def copy(self) -> "SimArray":
        """A packed copy (as CuPy's copy: C order)."""
        return self.dev.array(self.numpy())

    def numpy(self) -> np.ndarray:
        if not self.shape or 0 in self.shape:
            return np.zeros(self.shape, self.dtype)
        span = sum((n - 1) * s for n, s in zip(self.shape, self.elements)) + 1
        flat = self.dev.memory.read(self.ptr, span * self.itemsize).view(self.dtype)
        return np.lib.stride_tricks.as_strided(flat, self.shape, self.strides).copy()

    def write(self, host: np.ndarray) -> None:
        """New contents, in place (same shape)."""
        host = np.asarray(host, self.dtype)
        if host.shape != self.shape:
            raise ValueError(f"write of shape {host.shape} into {self.shape}")
        for index in np.ndindex(*self.shape):
            at = self.ptr + self.itemsize * sum(i * s for i, s in zip(index, self.elements))
            self.dev.memory.write(at, host[index].reshape(1).view(np.uint8))


def _packed(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


class _Adapter:
    """The interop adapter of SimArrays (runtime/interop.py's _Torch, for the emulator)."""

    name = "simgpu"

    def __init__(self, dev: "SimDevice"):
        self.dev = dev

    def probe(self, x):
        return x.ptr, x.shape, x.elements, x.dtype.name, 0

    def stream(self, device: int) -> int:
        return self.dev.stream

    def empty(self, shape, dtype: str, device: int):
        return self.dev.empty(tuple(shape), dtype)


class _Launcher:
    """runtime.Launcher on the emulator: the positional arguments by parameter name, the grid as
    the fast path computed it for EMULATOR_SM_COUNT multiprocessors."""

    sm_count = EMULATOR_SM_COUNT

    def __init__(self, dev: "SimDevice", kernel):
        self.dev, self.kernel = dev, kernel
        self.names = [n for n, _ in kernel.params]

    def __call__(self, grid, values, stream=0) -> None:
        k = self.kernel
        if len(values) != len(self.names):
            raise AssertionError(f"{k.name}: {len(values)} arguments for {len(self.names)} parameters")
        args = dict(zip(self.names, values))
        self.dev.launches.append((k.name, tuple(grid), stream))
        self.dev.arguments.append(args)
        cluster = getattr(k, "cluster", (1, 1, 1))
        launch(k.ptx, grid, k.threads, args, memory=self.dev.memory, entry=k.name,
               shared_bytes=k.smem_bytes, shared_base=SHARED_BASE, barriers=getattr(k, "barriers", ()),
               cluster=cluster if tuple(cluster) != (1, 1, 1) else None)


class _Scratch:
    """runtime.StreamScratch in the emulator's memory: a workspace of undefined contents
    (NaN-poisoned here) and counters that are 0 between launches."""

    def __init__(self, dev: "SimDevice"):
        self.dev = dev
        self.work = self.count = None

    def workspace(self, nbytes: int) -> int:
        if self.work is None or self.work[1] < nbytes:
            self.work = (self.dev.alloc(max(nbytes, 4), fill=0xFF), nbytes)
        return self.work[0]

    def counters(self, count: int) -> int:
        if self.count is None or self.count[1] < count:
            self.count = (self.dev.alloc(4 * max(count, 1), fill=0), count)
        return self.count[0]


class SimDevice:
    """The emulator standing in for GPU 0 (module docstring)."""

    def __init__(self, monkeypatch):
        self.memory = GlobalMemory()
        self.launches = []     # (kernel name, grid, stream) of each launch, in order
        self.arguments = []    # ... and its arguments by parameter name
        self.capturing = False   # what runtime.capturing says of every stream
        self.stream = STREAM
        self.kernels = {}
        self.scratch = {}
        self.copies = 0
        adapter = _Adapter(self)
        monkeypatch.setitem(interop._LIBS, SimArray, adapter)
        monkeypatch.setattr(compiler.Kernel, "launcher", lambda kernel, device=0: self._launcher(kernel))
        monkeypatch.setattr(gemm_call, "tensor_map_bytes", encode_tensor_map)
        monkeypatch.setattr(tensormap, "tensor_map_bytes", encode_tensor_map)   # (Kernel.launch's maps)
        monkeypatch.setattr(gemm_call, "copy_2d", self._copy_2d)
        monkeypatch.setattr(runtime, "capturing", lambda stream: self.capturing)
        monkeypatch.setattr(runtime, "zero_async", self._zero)
        monkeypatch.setattr(runtime.StreamScratch, "of",
                            classmethod(lambda cls, device, stream: self.scratch.setdefault(stream, _Scratch(self))))
        # matmul's remembered choices start empty and are put back after the test (their keys do
        # not name the array library)
        for name in ("_chosen", "_exact", "_stacks"):
            monkeypatch.setattr(gemm_matmul, name, {})
        monkeypatch.setattr(gemm_matmul, "_sm_count", lambda: EMULATOR_SM_COUNT)
        # the general path of GPU arrays (describe, check, launch by name) must not run: a call the
        # fast paths decline fails here, so a test that returns went through them
        monkeypatch.setattr(gemm_call, "_run_device", _general_path)

    def alloc(self, nbytes: int, fill: int = 0xFF) -> int:
        ptr = self.memory.alloc(max(int(nbytes), 1))
        self.memory.write(ptr, np.full(max(int(nbytes), 1), fill, np.uint8))
        return ptr

    def array(self, host: np.ndarray, *, pitch: int = None, order: str = "C", offset: int = 0) -> SimArray:
        """host's elements in emulator memory: row-major (or column-major with order="F"), rows
        `pitch` elements apart (default: packed), starting `offset` elements into the buffer."""
        host = np.asarray(host)
        if host.ndim != 2:
            shape = host.shape
            ptr = self.alloc((host.size + offset) * host.itemsize)
            self.memory.write(ptr + offset * host.itemsize, np.ascontiguousarray(host).reshape(-1).view(np.uint8))
            return SimArray(self, ptr + offset * host.itemsize, shape, _packed(shape), host.dtype)
        stored = host if order == "C" else host.T
        rows, cols = stored.shape
        pitch = cols if pitch is None else pitch
        size = host.itemsize
        ptr = self.alloc((offset + rows * pitch) * size)
        for r in range(rows):
            self.memory.write(ptr + (offset + r * pitch) * size, np.ascontiguousarray(stored[r]).view(np.uint8))
        a = SimArray(self, ptr + offset * size, (rows, cols), (pitch, 1), host.dtype)
        return a if order == "C" else a.T

    def empty(self, shape, dtype) -> SimArray:
        dt = _numpy_dtype(dtype)
        shape = tuple(int(s) for s in shape)
        ptr = self.alloc(int(np.prod(shape, dtype=np.int64)) * dt.itemsize)   # NaN-poisoned (0xFF bytes)
        return SimArray(self, ptr, shape, _packed(shape), dt)

    def _launcher(self, kernel):
        got = self.kernels.get(id(kernel))
        if got is None or got.kernel is not kernel:
            got = self.kernels[id(kernel)] = _Launcher(self, kernel)
            if isinstance(getattr(kernel, "_launchers", None), dict):   # (as Kernel.launcher keeps it: launch's memo)
                kernel._launchers[0] = (module_generation(), got)
        return got

    def _copy_2d(self, dst, dst_pitch, src, src_pitch, width_bytes, height, stream=None):
        self.copies += 1
        for r in range(int(height)):
            self.memory.write(dst + r * dst_pitch, self.memory.read(src + r * src_pitch, width_bytes))

    def _zero(self, ptr, words, stream):
        self.memory.write(ptr, np.zeros(4 * int(words), np.uint8))

    def forget(self) -> None:
        """What the kernels this device ran remember of it (remembered launches name its launchers
        and memory), forgotten."""
        for launcher in self.kernels.values():
            for call in (getattr(launcher.kernel, "_fast", None), getattr(launcher.kernel, "_batched", None)):
                if call is not None and hasattr(call, "_last"):
                    call._last = None
                    getattr(call, "_memo", {}).clear()


def _general_path(*args, **kwargs):
    raise AssertionError("the general path ran (gemm/call.py _run_device): the fast paths declined this call")


def _numpy_dtype(name) -> np.dtype:
    if isinstance(name, np.dtype):
        return name
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, str(name)))
