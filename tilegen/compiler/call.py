"""A kernel called on arrays: `kernel(A, B, C=c, alpha=2.0)`.

Each array the kernel declared (compiler/arrays.py: matrices, stacks, vectors, counters, f32
scalars in memory) is given by position, in declaration order, or by its name; the other
parameters (scalars, sizes no array gives, sizes only the grid reads) by name. The arrays'
shapes give the size symbols (shapes that disagree are refused, naming both arrays); their
pointers, leading dimensions and stack strides become the parameters the kernel reads.

| arrays                          | where it runs                                            |
| ------------------------------- | -------------------------------------------------------- |
| PyTorch / CuPy / any CUDA array | in place, on the library's current stream (or `stream=`), |
|                                 | asynchronously, as the library's own work                 |
| numpy                           | copied to the GPU, the launch, the arrays the kernel      |
|                                 | writes copied back; without a GPU, or with device="sim",  |
|                                 | on the CPU emulator                                       |

Numpy arrays are laid out as the kernel needs (a matrix declared layout="col" stored
transposed, rows padded to what its copies need); GPU arrays are used as they are, and one
whose layout, alignment or dtype the kernel cannot take is refused with what to pass instead.
"""
from __future__ import annotations

import difflib

import numpy as np

from .. import runtime
from ..arch.dtypes import numpy_dtype
from ..errors import EmulatorWarning, LaunchError, missing_arguments, warn
from ..runtime import interop

RESERVED = ("stream", "device")   # kernel(...)'s own keywords


class GpuMemory:
    """Host arrays through device buffers kept between calls (runtime.HostCallBuffers), on the
    legacy default stream: put (copy in), launch, get (copy back, which waits for the launch)."""

    def __init__(self, device: int):
        self.device = device
        self.buffers = {}

    def put(self, host: np.ndarray, copy: bool = True) -> int:
        """A device buffer for `host`, its bytes copied in unless `copy` is False (an output the
        kernel only writes)."""
        buf = runtime.HostCallBuffers.take(host.nbytes, self.device)
        self.buffers[buf.ptr] = buf
        if copy:
            buf.copy_from_host(host)
        return buf.ptr

    def get(self, ptr: int, host: np.ndarray):
        self.buffers[ptr].copy_to_host(host)

    def launch(self, kernel, args, sizes):
        kernel.launch(args, sizes, device=self.device)   # (the legacy default stream, as the copies)

    def close(self):
        for buf in self.buffers.values():
            runtime.HostCallBuffers.give(buf)
        self.buffers = {}


class EmulatorMemory:
    """Host arrays through the CPU emulator's global memory; a launch runs there (reporting its
    progress when it is long: sim/progress.py)."""

    def __init__(self):
        from ..sim.memory import GlobalMemory  # the emulator loads its PTX grammar on first use

        self.memory = GlobalMemory()

    def put(self, host: np.ndarray, copy: bool = True) -> int:
        ptr = self.memory.alloc(max(host.nbytes, 1))
        # (an output not copied in holds NaNs here, as a reused GPU buffer holds anything: a kernel that
        # read it would show)
        self.memory.write(ptr, host if copy else np.full(host.nbytes, 0xFF, np.uint8))
        return ptr

    def get(self, ptr: int, host: np.ndarray):
        host[...] = self.memory.read(ptr, host.nbytes).view(host.dtype).reshape(host.shape)

    def launch(self, kernel, args, sizes):
        from ..sim.runner import run_kernel

        run_kernel(kernel, args, sizes, self.memory)

    def close(self):
        pass


def _near(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" ({close[0]}?)" if close else ""


def _bind(kernel, positional: tuple, named: dict) -> tuple[dict, dict]:
    """({array name: array}, {other parameter or size: value}) from a call's arguments."""
    arrays = kernel.arrays
    names = [a.name for a in arrays]
    for word in RESERVED:
        if word in names or word in kernel._names:
            raise LaunchError(f"{kernel.name} has a parameter named {word!r}, which kernel(...) takes as where to run: "
                              f"launch it with kernel.launch(args, sizes), or rename the parameter")
    if len(positional) > len(arrays):
        raise LaunchError(f"{kernel.name} takes {len(arrays)} array{'s' if len(arrays) != 1 else ''} by position "
                          f"({', '.join(names) or 'none'}), got {len(positional)}; give scalars and sizes by name")
    given = dict(zip(names, positional))
    others = {}
    described = {p for a in arrays for p in (a.ptr, a.ld, a.stride) if p}
    grid_sizes = kernel.launch_grid.symbols
    for key, value in named.items():
        if key in names:
            if key in given:
                raise LaunchError(f"{kernel.name}: {key} is given twice, by position and by name")
            given[key] = value
        elif key in described:
            owner = next(a.name for a in arrays if key in (a.ptr, a.ld, a.stride))
            raise LaunchError(f"{kernel.name}: {key} comes from {owner}'s array: pass {owner}= (kernel.launch(args, "
                              f"sizes) takes pointers and leading dimensions by hand)")
        elif key in kernel._names or key in grid_sizes:
            others[key] = value
        else:
            known = names + [n for n in kernel._names if n not in described] + sorted(grid_sizes)
            raise LaunchError(f"{kernel.name}: {key} is neither an array nor a parameter of this kernel"
                              f"{_near(key, known)}; it takes the arrays {', '.join(names) or '(none)'}"
                              + (f" and {', '.join(n for n in kernel._names if n not in described)}"
                                 if any(n not in described for n in kernel._names) else ""))
    missing = [n for n in names if n not in given]
    if missing:
        raise LaunchError(f"{kernel.name}: no array for {', '.join(missing)} (its arrays, in order: "
                          f"{', '.join(names)})")
    return given, others


def _is_host(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic, float, int)) and not isinstance(x, bool)


def _sizes_from(kernel, shapes: dict, others: dict) -> dict:
    """Size symbol -> value, from each array's shape (those that disagree refused) and the sizes
    only the grid reads, given by name."""
    sizes, source = {}, {}
    for a in kernel.arrays:
        for sym, n in zip(a.shape, shapes[a.name]):
            if sizes.setdefault(sym, n) != n:
                raise LaunchError(f"{kernel.name}: {a.name} gives {sym} = {n}, but {source[sym]} gives {sym} = "
                                  f"{sizes[sym]}")
            source.setdefault(sym, a.name)
    for key, value in others.items():
        if key in sizes:
            if value != sizes[key]:
                raise LaunchError(f"{kernel.name}: {key} = {value!r} given, but {source[key]} gives {key} = "
                                  f"{sizes[key]}")
        elif key in kernel.launch_grid.symbols:
            sizes[key] = value
    return sizes


def _scalar_array(a, x):
    """A scalar in memory given as a Python number: a one-element float32 array."""
    if isinstance(x, (float, int, np.floating, np.integer)) and not isinstance(x, bool):
        return np.array([x], np.float32)
    return x


def _host_shape(a, x) -> tuple:
    if a.kind == "scalar":
        if not isinstance(x, np.ndarray) or x.size != 1:
            raise LaunchError(f"{a.name} is one f32 in memory: pass a number or a one-element float32 array")
        return ()
    if x.ndim != len(a.shape) and a.kind != "counters":
        what = {"matrix": "a 2-D array", "stack": "a 3-D stack of matrices (count, rows, cols)",
                "vector": "a 1-D array"}[a.kind]
        raise LaunchError(f"{a.name} takes {what}, not a {x.ndim}-D array of shape {x.shape}")
    if a.kind == "counters" and x.ndim != 1:
        raise LaunchError(f"{a.name} takes a 1-D array of counters, not a {x.ndim}-D array of shape {x.shape}")
    return x.shape


def _host_dtype(a, x: np.ndarray) -> np.ndarray:
    """`x` as the kernel reads it: its dtype checked (int32 counters taken as u32)."""
    if a.kind == "counters":
        if x.dtype not in (np.uint32, np.int32):
            raise LaunchError(f"{a.name} holds u32 counters: pass a uint32 (or int32) array of zeros, not {x.dtype}")
        return x.view(np.uint32)
    want = numpy_dtype(a.dtype)
    if x.dtype != want:
        raise LaunchError(f"{a.name} is declared {a.dtype}: pass a {want} array, not {x.dtype} (x.astype(...) "
                          f"converts)")
    if not x.size:
        raise LaunchError(f"{a.name} is empty (shape {x.shape}); tilegen kernels need at least one element")
    return x


def _stored(a, x: np.ndarray) -> np.ndarray:
    """A matrix (or stack) as the kernel stores it: logical "col" transposed."""
    return x if a.logical == "row" else np.swapaxes(x, -1, -2)


def _laid_out(a, x: np.ndarray) -> tuple:
    """(the array laid out as the kernel reads it, its ld, its stack stride): a matrix's rows
    padded to what its copies need."""
    if a.kind not in ("matrix", "stack"):
        return np.ascontiguousarray(x).reshape(-1), 0, 0
    stored = _stored(a, x)
    cols = stored.shape[-1]
    per = max(a.align // stored.itemsize, 1) if a.align else 1
    ld = max(-(-cols // per) * per, 1)
    out = np.zeros(stored.shape[:-1] + (ld,), stored.dtype)
    out[..., :cols] = stored
    stride = int(np.prod(out.shape[-2:])) if a.kind == "stack" else 0
    return out, ld, stride


def _run_host(kernel, given: dict, others: dict, memory) -> None:
    """Numpy arrays through `memory` (GpuMemory or EmulatorMemory)."""
    hosts = {}
    for a in kernel.arrays:
        x = _scalar_array(a, given[a.name]) if a.kind == "scalar" else given[a.name]
        if not isinstance(x, np.ndarray):
            raise LaunchError(f"{a.name} is a {type(x).__name__}; pass a numpy array (or GPU arrays for all of them)")
        _host_shape(a, x)
        x = _host_dtype(a, x) if a.kind != "scalar" else x.astype(np.float32).reshape(1)
        if a.written and not x.flags.writeable:
            raise LaunchError(f"{a.name} is read-only, but the kernel writes it; pass a writable array")
        hosts[a.name] = x
    sizes = _sizes_from(kernel, {a.name: hosts[a.name].shape for a in kernel.arrays}, others)
    args = {}
    placed = []
    try:
        for a in kernel.arrays:
            x = hosts[a.name]
            data, ld, stride = _laid_out(a, x)
            ptr = memory.put(data)
            args[a.ptr] = ptr
            if a.ld:
                args[a.ld] = ld
            if a.stride:
                args[a.stride] = stride
            if a.written:
                placed.append((a, x, ptr, data))
        _launch(kernel, args, sizes, others, memory.launch)
        for a, x, ptr, data in placed:
            memory.get(ptr, data)
            if a.kind in ("matrix", "stack"):
                _stored(a, x)[...] = data[..., :_stored(a, x).shape[-1]]
            else:
                x[...] = data.reshape(x.shape)
    finally:
        memory.close()


def _launch(kernel, args: dict, sizes: dict, others: dict, launch) -> None:
    """The parameters no array gave, from the values given by name and the sizes, then the launch."""
    for name in kernel._names:
        if name not in args:
            if name in others:
                args[name] = others[name]
            elif name in sizes:
                args[name] = sizes[name]
    missing = [n for n, kind in zip(kernel._names, kernel._kinds) if n not in args and kind != "tensormap"]
    if missing:   # (tensor maps are built by the launch from their tensors' parameters)
        raise LaunchError(f"{kernel.name}: {missing_arguments(missing, others)} (give them by name: "
                          f"kernel(..., {missing[0]}=...))")
    launch(kernel, args, sizes)


def _device_arguments(kernel, given: dict, others: dict, device) -> tuple:
    """(args, sizes, GPU, the first array's library adapter or None) of GPU arrays, in place."""
    dev, lib = (device if isinstance(device, int) else None), None
    for x in given.values():   # (the GPU and the stream of the first array of a library known here)
        probe = None if _is_host(x) else interop.probe(x)
        if probe is not None:
            dev, lib = probe[interop.DEVICE] if dev is None else dev, interop.library(x)
            break
    dev = 0 if dev is None else dev
    views = {}
    for a in kernel.arrays:
        x = given[a.name]
        if a.kind in ("matrix", "stack"):
            describe = runtime.describe_array if a.kind == "matrix" else runtime.describe_stack
            view = describe(x, name=a.name, dtype=a.dtype, layout=a.logical, writable=a.written, align=a.align or None,
                            device=dev, on_gpu=True)
        elif a.kind == "counters":
            view = runtime.describe_vector(x, name=a.name, dtype=np.uint32, also=(np.int32,), writable=True,
                                           device=dev, on_gpu=True)
        else:
            view = runtime.describe_vector(x if a.kind == "vector" else _one(a, x), name=a.name,
                                           dtype=a.dtype if a.kind == "vector" else np.float32, device=dev, on_gpu=True)
        views[a.name] = view
    shapes = {}
    args = {}
    for a in kernel.arrays:
        view = views[a.name]
        if a.kind == "stack":
            m = view.matrix
            shapes[a.name] = (view.count, m.rows, m.cols)
            args[a.ptr], args[a.ld], args[a.stride] = m.ptr, m.ld, view.stride
        elif a.kind == "matrix":
            shapes[a.name] = (view.rows, view.cols)
            args[a.ptr], args[a.ld] = view.ptr, view.ld
        else:
            shapes[a.name] = (view.cols,)
            args[a.ptr] = view.ptr
    sizes = _sizes_from(kernel, shapes, others)
    _launch(kernel, args, sizes, others, lambda *_: None)
    return args, sizes, dev, lib


def _one(a, x):
    """A scalar in memory as a one-element vector."""
    shape = tuple(getattr(x, "shape", ()))
    if isinstance(x, (float, int, np.floating, np.integer)) or int(np.prod(shape)) != 1:
        raise LaunchError(f"{a.name} is one f32 in memory: pass a one-element float32 array on the GPU, as the other "
                          f"arrays, not {type(x).__name__}" + (f" of shape {shape}" if shape else ""))
    return x.reshape(1)


MEMO = 64   # calls remembered per kernel (by their arrays' probes and other arguments)


def _plain(v):
    """A value as the memo's key holds it: a float by its bits (-0.0 is not 0.0: an alpha of
    -0.0 signs zeros)."""
    return float(v).hex() if isinstance(v, (float, np.floating)) else v


def _fast_key(kernel, positional: tuple, named: dict, stream, device):
    """The memo's key of a call whose arrays are all of a library known here (runtime/interop.py:
    pointer, shape, strides, dtype and GPU of each, in a few attribute reads), or None."""
    if device is not None or not (stream is None or isinstance(stream, int)):
        return None
    names = kernel._array_names
    if len(positional) == len(names) and not named.keys() & names:
        xs = positional
    else:
        xs = tuple(positional) + tuple(named.get(n) for n in names[len(positional):])
    probes = tuple(map(interop.probe, xs))
    if None in probes:
        return None
    others = tuple((k, _plain(v)) for k, v in named.items() if k not in names)
    try:
        key = (probes, others, stream)
        hash(key)
    except TypeError:   # (an argument that is no plain value: the general path says what it takes)
        return None
    return key


def call(kernel, positional: tuple, named: dict, stream=None, device=None) -> None:
    """kernel(*positional, stream=, device=, **named): see the module's text. A call like one
    before it (the same arrays' pointers, shapes, strides and dtypes, the same other arguments)
    launches what that one derived."""
    key = _fast_key(kernel, positional, named, stream, device)
    if key is not None:
        hit = kernel._calls.get(key)
        if hit is not None:
            args, sizes, dev, lib = hit
            s = stream if stream is not None else lib.stream(dev) if lib is not None else 0
            kernel.launch(args, sizes, stream=s, device=dev)
            return
    if device not in (None, "gpu", "cuda", "sim") and not (isinstance(device, int) and not isinstance(device, bool)
                                                         and device >= 0):
        raise LaunchError(f"device={device!r}; allowed: None (the GPU, else the emulator), 'gpu', 'cuda', a GPU "
                          f"ordinal, or 'sim' (the CPU emulator)")
    given, others = _bind(kernel, positional, named)
    host = all(_is_host(x) for x in given.values()) or not given
    if device == "sim" or host and device is None and not runtime.gpu_available():
        if not host:
            raise LaunchError("device='sim' runs on numpy arrays; pass numpy arrays (or run on the GPU)")
        if device is None:
            warn(f"no GPU found; {kernel.name} runs on the CPU emulator (device='sim' says so and silences this)",
                 EmulatorWarning)
        return _run_host(kernel, given, others, EmulatorMemory())
    if host:
        return _run_host(kernel, given, others, GpuMemory(device if isinstance(device, int) else 0))
    args, sizes, dev, lib = _device_arguments(kernel, given, others, device)
    if stream is None:
        s = lib.stream(dev) if lib is not None else 0
    else:
        s = runtime.stream_handle(stream)
    kernel.launch(args, sizes, stream=s, device=dev)
    if key is not None:   # (remembered once launched: its arguments passed every check)
        if len(kernel._calls) >= MEMO:
            kernel._calls.clear()
        kernel._calls[key] = (args, sizes, dev, lib)


__all__ = ["call", "GpuMemory", "EmulatorMemory"]
