"""A kernel called on arrays: `kernel(A, B, C=c, alpha=2.0)`.

Each array the kernel declared (compiler/arrays.py: matrices, stacks, vectors, counters, f32
scalars in memory) is given by position, in declaration order, or by its name; the other
parameters (scalars, sizes no array gives, sizes only the grid reads) by name. The arrays'
shapes give the size symbols (shapes that disagree are refused, naming both arrays); their
pointers, leading dimensions and stack strides become the parameters the kernel reads.

| arrays                          | where it runs                                             |
| ------------------------------- | --------------------------------------------------------- |
| PyTorch / CuPy                  | in place, on the library's current stream (or `stream=`), |
|                                 | asynchronously, as the library's own work                 |
| other CUDA arrays (CAI, DLPack) | in place, on `stream=` (the legacy default stream without)|
| numpy (or CPU DLPack arrays)    | copied to the GPU, the launch, the arrays the kernel      |
|                                 | writes copied back, on the default stream; the call       |
|                                 | returns when done. Without a GPU, or with device="sim",   |
|                                 | on the CPU emulator                                       |

Numpy arrays are laid out as the kernel needs (a matrix declared layout="col" stored
transposed, rows padded to what its copies need); GPU arrays are used as they are, and one
whose layout, alignment or dtype the kernel cannot take is refused with what to pass instead.
"""
from __future__ import annotations

import difflib
import math
import numbers

import numpy as np

from .. import runtime
from ..arch.dtypes import numpy_dtype
from ..errors import LaunchError, missing_arguments, warn_once
from ..runtime import interop
from ..runtime.module import module_generation

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


EMULATOR_LIMIT_S = 30.0   # without a GPU, longer emulations need device="sim"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def refuse_long_emulation(what: str, seconds: float, bound: str = "at least", hint: str = "") -> None:
    """Without a GPU and without device="sim": work the emulator needs more than EMULATOR_LIMIT_S
    for (`seconds`, an estimate `bound` words) is refused at once, saying how to run it anyway."""
    if seconds > EMULATOR_LIMIT_S:
        raise LaunchError(f"no GPU found, and {what} would take {bound} {duration(seconds)} on the CPU emulator (more "
                          f"than {EMULATOR_LIMIT_S:.0f} s): pass device='sim' to run it there anyway{hint}, or run it "
                          f"on a machine with an NVIDIA GPU")


class EmulatorMemory:
    """Host arrays through the CPU emulator's global memory; a launch runs there (reporting its
    progress when it is long: sim/progress.py). Without device="sim" (`explicit`), a launch the
    emulator needs more than EMULATOR_LIMIT_S for by the estimate of its PTX (sim/estimate.py: its
    loops counted as running no trip, so the estimate is low) is refused at once."""

    def __init__(self, explicit: bool = True):
        from ..sim.memory import GlobalMemory  # the emulator loads its PTX grammar on first use

        self.memory = GlobalMemory()
        self.explicit = explicit

    def put(self, host: np.ndarray, copy: bool = True) -> int:
        ptr = self.memory.alloc(max(host.nbytes, 1))
        # (an output not copied in holds NaNs here, as a reused GPU buffer holds anything: a kernel that
        # read it would show)
        self.memory.write(ptr, host if copy else np.full(host.nbytes, 0xFF, np.uint8))
        return ptr

    def get(self, ptr: int, host: np.ndarray):
        host[...] = self.memory.read(ptr, host.nbytes).view(host.dtype).reshape(host.shape)

    def launch(self, kernel, args, sizes):
        from ..sim.estimate import estimate_seconds
        from ..sim.runner import EMULATOR_SM_COUNT, run_kernel

        if not self.explicit:
            ctas = math.prod(kernel.grid(sizes, EMULATOR_SM_COUNT))
            refuse_long_emulation(f"{kernel.name} over {ctas} CTAs", estimate_seconds(kernel.ptx, ctas, 0),
                                  "at least about")
        run_kernel(kernel, args, sizes, self.memory)

    def close(self):
        pass


def _near(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" ({close[0]}?)" if close else ""


def _grid_only(kernel) -> list:
    """Sizes the grid reads that are no parameter: given by name, or taken from the arrays."""
    return sorted(kernel.launch_grid.symbols - set(kernel._names))


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
    described = {p: a.name for a in arrays for p in (a.ptr, a.ld, a.stride) if p}
    maps = {n: n.rsplit("_tmap", 1)[0] for n, kind in zip(kernel._names, kernel._kinds) if kind == "tensormap"}
    takes = [n for n in kernel._names if n not in described and n not in maps] + _grid_only(kernel)
    for key, value in named.items():
        if key in names:
            if key in given:
                raise LaunchError(f"{kernel.name}: {key} is given twice, by position and by name")
            given[key] = value
        elif key in described:
            owner = described[key]
            raise LaunchError(f"{kernel.name}: {key} comes from {owner}'s array: pass {owner}= (kernel.launch(args, "
                              f"sizes) takes pointers and leading dimensions by hand)")
        elif key in maps:
            raise LaunchError(f"{kernel.name}: {key} is the tensor map the launch builds from {maps[key]}'s array "
                              f"(kernel.launch(args, sizes) takes one made by hand)")
        elif key in takes:
            others[key] = value
        else:
            raise LaunchError(f"{kernel.name}: {key} is neither an array nor a parameter of this kernel"
                              f"{_near(key, names + takes)}; it takes the arrays {', '.join(names) or '(none)'}"
                              + (f" and {', '.join(takes)}" if takes else ""))
    missing = [n for n in names if n not in given]
    if missing:
        takes = f", {_TAKES[arrays[names.index(missing[0])].kind]}" if len(missing) == 1 else ""
        raise LaunchError(f"{kernel.name}: no array for {', '.join(missing)}{takes} (its arrays, in order: "
                          f"{', '.join(names)})")
    return given, others


_TAKES = {"matrix": "a 2-D array (numpy, PyTorch, CuPy)", "stack": "a 3-D array of matrices (count, rows, cols)",
          "vector": "a 1-D array", "counters": "a 1-D uint32 (or int32) array of zeros",
          "scalar": "a number or a one-element float32 array"}


def _where(x) -> str:
    """'host' (numpy, or a CPU DLPack array), 'number', 'gpu' (a CUDA array), or '' (none). Asks
    DLPack first and looks for __cuda_array_interface__ on the type: a PyTorch tensor's property
    raises (a tensor that requires grad, fp8) rather than say it has none."""
    if isinstance(x, np.ndarray):
        return "host"
    if isinstance(x, (bool, np.bool_)):
        return ""
    if isinstance(x, numbers.Real):
        return "number"
    if interop.probe(x) is not None:
        return "gpu"
    if hasattr(type(x), "__dlpack_device__"):
        try:
            kind = int(x.__dlpack_device__()[0])
        except Exception:
            return ""
        return "host" if kind == 1 else "gpu" if kind in (2, 13) else ""
    return "gpu" if hasattr(type(x), "__cuda_array_interface__") or hasattr(x, "__cuda_array_interface__") else ""


def _classify(kernel, given: dict) -> bool:
    """True when the call's arrays are on the host (numpy, CPU DLPack, numbers for scalars), False
    when on the GPU; an argument that is no array (None, a list, a bool) refused, naming it."""
    kinds = set()
    for a in kernel.arrays:
        x, where = given[a.name], _where(given[a.name])
        if not where or where == "number" and a.kind != "scalar":
            what = "None" if x is None else f"a {type(x).__name__}"
            raise LaunchError(f"{kernel.name}: {a.name} is {what}; it takes {_TAKES[a.kind]}")
        kinds.add(where)
    return "gpu" not in kinds


def _stream(stream):
    """A stream given to kernel(...) as the handle the driver takes; a LaunchError for anything else."""
    h = runtime.stream_handle(stream)
    if isinstance(h, bool) or not (isinstance(h, int) and h >= 0 or type(h).__name__ == "CUstream"):
        raise LaunchError(f"stream={stream!r}: pass a PyTorch, CuPy or tilegen stream, a CUstream, or a stream "
                          f"handle (an int)")
    return h


def _check_size(kernel, key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < 2 ** 31:
        raise LaunchError(f"{kernel.name}: {key} = {value!r}: a size is a whole number from 0 to 2^31 - 1")


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
            _check_size(kernel, key, value)
            if value != sizes[key]:
                raise LaunchError(f"{kernel.name}: {key} = {value!r} given, but {source[key]} gives {key} = "
                                  f"{sizes[key]}")
        elif key in kernel.launch_grid.symbols:
            _check_size(kernel, key, value)
            sizes[key] = int(value)
    return sizes


def _host_array(a, x) -> np.ndarray:
    """A host argument as the numpy array the kernel reads: its shape and dtype checked (int32
    counters read as u32; a scalar's number as one float32)."""
    if a.kind == "scalar":
        if _where(x) == "number":
            return np.array([x], np.float32)
        x = _numpy(a, x)
        if x.size != 1 or x.dtype != np.float32:
            raise LaunchError(f"{a.name} is one f32 in memory: pass a number or a one-element float32 array, not "
                              f"{x.dtype} of shape {x.shape}")
        return x.reshape(1)
    x = _numpy(a, x)
    runtime.refuse_masked(x, a.name)
    if x.ndim != (len(a.shape) if a.kind != "counters" else 1):
        raise LaunchError(f"{a.name} takes {_TAKES[a.kind]}, not a {x.ndim}-D array of shape {x.shape}")
    if not x.size:
        raise LaunchError(f"{a.name} is empty (shape {x.shape}); tilegen kernels need at least one element")
    if a.kind == "counters":
        if x.dtype not in (np.uint32, np.int32):
            raise LaunchError(f"{a.name} holds u32 counters: pass a uint32 (or int32) array of zeros, not {x.dtype}")
        if x.any():
            raise LaunchError(f"{a.name} holds counters that must be 0 before the launch (each last arrival puts its "
                              f"own back to 0): pass np.zeros(n, np.uint32), n at least the counters the kernel "
                              f"counts on")
        x = x.view(np.uint32)
    else:
        runtime.check_host(x, a.name, numpy_dtype(a.dtype), a.dtype, x.ndim)
    if a.written:
        runtime.check_writable(x, a.name)
    return x


def _numpy(a, x) -> np.ndarray:
    """A CPU DLPack array (a PyTorch CPU tensor) as numpy, sharing its memory."""
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.from_dlpack(x)
    except Exception as e:
        raise LaunchError(f"{a.name}: a host array numpy cannot read ({e}); pass a numpy array") from None


def _stored(a, x: np.ndarray) -> np.ndarray:
    """A matrix (or stack) as the kernel stores it: logical "col" transposed."""
    return x if a.logical == "row" else np.swapaxes(x, -1, -2)


def _laid_out(a, x: np.ndarray) -> tuple:
    """(the array laid out as the kernel reads it, its ld, its stack stride): a matrix's rows
    padded to what its copies need."""
    if a.kind not in ("matrix", "stack"):
        return np.ascontiguousarray(x).reshape(-1), 0, 0
    out, ld = runtime.pitched_copy(_stored(a, x), a.align)
    return out, ld, int(np.prod(out.shape[-2:])) if a.kind == "stack" else 0


def _run_host(kernel, given: dict, others: dict, memory) -> None:
    """Host arrays through `memory` (GpuMemory or EmulatorMemory)."""
    hosts = {}
    for a in kernel.arrays:
        hosts[a.name] = _host_array(a, given[a.name])
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
    """The parameters no array gave, from the sizes and the values given by name (each checked
    against its parameter's type), then the launch."""
    for name, kind in zip(kernel._names, kernel._kinds):
        if name in args:
            continue
        if name in sizes:
            args[name] = sizes[name]
        elif name in others:
            value = others[name]
            try:
                runtime.pack_arg(value, kind)
            except LaunchError as e:
                raise LaunchError(f"{kernel.name}: {name} = {value!r}: {str(e).split(': ', 1)[-1]}") from None
            args[name] = value
    missing = [n for n, kind in zip(kernel._names, kernel._kinds) if n not in args and kind != "tensormap"]
    if missing:   # (tensor maps are built by the launch from their tensors' parameters)
        raise LaunchError(f"{kernel.name}: {missing_arguments(missing, others)} (give them by name: "
                          f"kernel(..., {missing[0]}=...))")
    launch(kernel, args, sizes)


def _device_arguments(kernel, given: dict, others: dict, device) -> tuple:
    """(args, sizes, GPU, the first array's library adapter or None) of GPU arrays, in place."""
    dev, lib = (device if isinstance(device, int) else None), None
    for x in given.values():   # (the GPU and the stream of the first array of a library known here)
        probe = interop.probe(x)
        if probe is not None:
            dev, lib = probe[interop.DEVICE] if dev is None else dev, interop.library(x)
            break
    dev = 0 if dev is None else dev
    args, shapes = {}, {}
    for a in kernel.arrays:
        x = given[a.name]
        if a.kind in ("matrix", "stack"):
            describe = runtime.describe_array if a.kind == "matrix" else runtime.describe_stack
            view = describe(x, name=a.name, dtype=a.dtype, layout=a.logical, writable=a.written, align=a.align or None,
                            device=dev, on_gpu=True)
        elif a.kind == "scalar":
            if _where(x) == "number":
                raise LaunchError(f"{a.name} is one f32 in memory: pass a one-element float32 array on the GPU, as "
                                  f"the other arrays, not a {type(x).__name__}")
            view = runtime.describe_scalar(x, name=a.name, device=dev, on_gpu=True)
        else:
            view = runtime.describe_vector(x, name=a.name, dtype=np.uint32 if a.kind == "counters" else a.dtype,
                                           also=(np.int32,) if a.kind == "counters" else (), writable=a.written,
                                           device=dev, on_gpu=True)
        if a.kind == "stack":
            m = view.matrix
            shapes[a.name] = (view.count, m.rows, m.cols)
            args[a.ptr], args[a.ld], args[a.stride] = m.ptr, m.ld, view.stride
        elif a.kind == "matrix":
            shapes[a.name] = (view.rows, view.cols)
            args[a.ptr], args[a.ld] = view.ptr, view.ld
        else:
            shapes[a.name] = (view.cols,) if a.kind == "vector" else ()
            args[a.ptr] = view.ptr
    sizes = _sizes_from(kernel, shapes, others)
    _launch(kernel, args, sizes, others, lambda *_: None)
    return args, sizes, dev, lib


MEMO = 64   # calls remembered per kernel (by their arrays' probes and other arguments)


def _plain(v):
    """A value as the memo's key holds it: a float by its bits (-0.0 is not 0.0: an alpha of
    -0.0 signs zeros), a bool apart from the int it equals."""
    if isinstance(v, (float, np.floating)):
        return float(v).hex()
    return ("bool", v) if isinstance(v, bool) else v


def _fast_key(kernel, positional: tuple, named: dict, stream, device):
    """The memo's key of a call whose arrays are all of a library known here (runtime/interop.py:
    pointer, shape, strides, dtype and GPU of each, in a few attribute reads), or None."""
    if device is not None or not (stream is None or type(stream) is int):
        return None
    names = kernel._array_names
    arrays_named = named and not named.keys().isdisjoint(names)
    if arrays_named and positional and not named.keys().isdisjoint(names[:len(positional)]):
        return None   # (an array given twice: the general path says so)
    xs = tuple(positional) + tuple(named.get(n) for n in names[len(positional):]) if arrays_named or \
        len(positional) != len(names) else positional
    libs, probes = interop.LIBRARIES, []
    for x in xs:
        lib = libs.get(x.__class__) or interop.library(x)
        p = lib.probe(x) if lib else None
        if p is None:
            return None
        probes.append(p)
    if arrays_named:   # (the arrays' probes stand for them: the other arguments only)
        keys = tuple(k for k in named if k not in names)
        values = [named[k] for k in keys]
    else:
        keys, values = tuple(named), named.values()
    # (floats by their bits, as _plain says, without a call for the common float)
    return tuple(probes), keys, tuple([v.hex() if v.__class__ is float else _plain(v) for v in values]), stream


def call(kernel, positional: tuple, named: dict, stream=None, device=None) -> None:
    """kernel(*positional, stream=, device=, **named): see the module's text. A call of PyTorch or
    CuPy arrays like one before it (no device=, a stream given as an int or not at all, the same
    arrays' pointers, shapes, strides, dtypes and GPU, the same other arguments in the same order)
    launches what that one derived."""
    key = _fast_key(kernel, positional, named, stream, device)
    if key is not None:
        try:
            hit = kernel._calls.get(key)
        except TypeError:   # (an argument that is no plain value: the general path says what it takes)
            key = hit = None
        if hit is not None:
            args, sizes, dev, lib, launcher, grid, values = hit
            s = stream if stream is not None else lib.stream(dev) if lib is not None else 0
            entry = kernel._launchers.get(dev)
            if launcher is not None and entry is not None and entry[1] is launcher and entry[0] == module_generation():
                launcher(grid, values, s)   # (what kernel.launch derived from these arguments, its Launcher current)
            else:
                kernel.launch(args, sizes, stream=s, device=dev)
            return
    if device not in (None, "gpu", "cuda", "sim") and not (isinstance(device, int) and not isinstance(device, bool)
                                                         and device >= 0):
        raise LaunchError(f"device={device!r}; allowed: None (the GPU, else the emulator), 'gpu', 'cuda', a GPU "
                          f"ordinal, or 'sim' (the CPU emulator)")
    given, others = _bind(kernel, positional, named)
    host = _classify(kernel, given)
    if host and stream is not None:
        raise LaunchError("stream= is for GPU arrays: a call on numpy arrays copies them in, runs and copies back on "
                          "the default stream, and returns when done")
    if device == "sim" or host and device is None and not runtime.gpu_available():
        if not host:
            gpu = next(a.name for a in kernel.arrays if _where(given[a.name]) == "gpu")
            raise LaunchError(f"device='sim' runs on numpy arrays; {gpu} is a {type(given[gpu]).__name__} on the GPU")
        if device is None:
            warn_once("no GPU found; kernels of your own on numpy arrays run on the CPU emulator (device='sim' asks "
                      "for it and silences this)")
        return _run_host(kernel, given, others, EmulatorMemory(explicit=device == "sim"))
    if host:
        return _run_host(kernel, given, others, GpuMemory(device if isinstance(device, int) else 0))
    args, sizes, dev, lib = _device_arguments(kernel, given, others, device)
    s = (lib.stream(dev) if lib is not None else 0) if stream is None else _stream(stream)
    kernel.launch(args, sizes, stream=s, device=dev)
    if key is not None:   # (remembered once launched: its arguments passed every check)
        last = kernel._last_launch   # (a kernel of one's own: its one launch, the grid and values it packed)
        launched = last[3:6] if kernel.spec is None and last is not None and last[0] == args and last[2] == dev \
            else (None, None, None)
        if len(kernel._calls) >= MEMO:
            kernel._calls.clear()
        kernel._calls[key] = (args, sizes, dev, lib, *launched)


__all__ = ["call", "GpuMemory", "EmulatorMemory", "refuse_long_emulation"]
