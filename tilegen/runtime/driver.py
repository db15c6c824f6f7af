"""The CUDA driver: import, initialise, pick the device, hold the primary context.

cuda-python is imported lazily, inside functions, so `import tilegen.runtime` works on
machines without cuda-python, without a driver, or without a GPU. Every driver call's
result tuple goes through `check`, which turns a failure into a DeviceError naming the
error. Without a usable GPU the error says so plainly and names the CPU emulator.
"""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import DeviceError

SIM_HINT = ("pass device='sim' to run the CPU emulator instead (kernel(A, B), tilegen.matmul; a kernel's "
            "launch(args, sizes): tilegen.sim.run_kernel(kernel, args, sizes, memory))")
NO_DRIVER = "CUDA driver not detected"
NO_GPU = "no GPU found"

_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100

_lock = threading.Lock()
_contexts: dict = {}  # (pid, device ordinal) -> CUcontext; per process, so a fork starts afresh
_infos: dict = {}     # (pid, device ordinal) -> DeviceInfo, read once
_available: dict = {}  # pid -> whether a driver and a GPU are present
_current = threading.local()  # .key: the (pid, device) whose context this thread made current


def bindings():
    """cuda.bindings.driver, or DeviceError when cuda-python is missing."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise DeviceError(f"{NO_DRIVER}: cuda-python is not installed ({e}); "
                          f"pip install cuda-python, or {SIM_HINT}") from None
    return driver


def check(result, what: str = "CUDA driver call"):
    """Unpack a cuda-python result tuple (CUresult, *outputs).

    Returns None, the single output, or a tuple of outputs; raises DeviceError with the
    error's name and description when the CUresult is not CUDA_SUCCESS.
    """
    err, outputs = result[0], tuple(result[1:])
    if int(err) != _CUDA_SUCCESS:
        raise _error(err, what)
    if not outputs:
        return None
    return outputs[0] if len(outputs) == 1 else outputs


def error_name(err) -> tuple[str, str]:
    """(name, description) of a CUresult, falling back to the number when unknown."""
    name, text = f"CUresult {int(err)}", ""
    try:
        d = bindings()
        code = err if isinstance(err, d.CUresult) else d.CUresult(int(err))
        name = getattr(code, "name", None) or name  # the enum knows its name without a driver
        r = d.cuGetErrorName(code)
        if int(r[0]) == _CUDA_SUCCESS:
            name = r[1].decode()
        r = d.cuGetErrorString(code)
        if int(r[0]) == _CUDA_SUCCESS:
            text = r[1].decode()
    except Exception:  # an unknown code or no driver library: keep the number
        pass
    return name, text


def _error(err, what: str) -> DeviceError:
    name, text = error_name(err)
    e = DeviceError(f"{what} failed: {name}" + (f" ({text})" if text else ""))
    e.code = int(err)
    e.error_name = name
    return e


def _init(d) -> None:
    """cuInit(0), translating 'no driver library' and 'no device' into plain words."""
    try:
        r = d.cuInit(0)
    except Exception as e:  # cuda-bindings raises when libcuda.so cannot be loaded
        raise DeviceError(f"{NO_DRIVER}: the NVIDIA driver library (libcuda) could not be "
                          f"loaded ({type(e).__name__}); install the NVIDIA driver, or "
                          f"{SIM_HINT}") from None
    code = int(r[0])
    if code == _CUDA_ERROR_NO_DEVICE:
        raise DeviceError(f"{NO_GPU}: the CUDA driver is installed but reports no device "
                          f"(CUDA_ERROR_NO_DEVICE); {SIM_HINT}")
    if code != _CUDA_SUCCESS:
        name, text = error_name(r[0])
        raise DeviceError(f"{NO_DRIVER}: cuInit failed with {name}"
                          + (f" ({text})" if text else "") + f"; {SIM_HINT}")


def device_count() -> int:
    """Number of CUDA devices; DeviceError without a driver or GPU."""
    d = bindings()
    _init(d)
    n = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
    if n <= 0:
        raise DeviceError(f"{NO_GPU}: the CUDA driver reports 0 devices; {SIM_HINT}")
    return int(n)


def ensure_context(device: int = 0):
    """Make `device`'s primary context current on this thread and return it (CUcontext).

    The context is retained once per process and device; later calls only set it current
    again (contexts are current per thread). A thread that already made it current and
    has not switched since (`forget_current` after anything that may switch) pays one dict
    lookup.
    """
    key = (os.getpid(), int(device))
    ctx = _contexts.get(key)
    if ctx is not None and getattr(_current, "key", None) == key:
        return ctx
    d = bindings()
    with _lock:
        ctx = _contexts.get(key)
        if ctx is None:
            n = device_count()
            if not 0 <= int(device) < n:
                raise DeviceError(f"device {device} requested, but {n} GPU(s) found "
                                  f"(ordinals 0..{n - 1})")
            dev = check(d.cuDeviceGet(int(device)), "cuDeviceGet")
            ctx = check(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _contexts[key] = ctx
    current = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is None or int(current) != int(ctx):
        check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    _current.key = key
    return ctx


def forget_current() -> None:
    """This thread's current context may have changed (a launch failed on it): the next
    ensure_context checks with the driver again."""
    _current.key = None


@contextmanager
def capture_relaxed():
    """Let this thread make calls a CUDA graph capture in global mode refuses (module loads,
    function attributes): none of them is a stream operation, but the driver cannot tell,
    so a kernel's first call inside `torch.cuda.graph(...)` would fail. The thread's capture
    mode is relaxed for the block and restored after (what PyTorch does around cudaMalloc)."""
    d = bindings()
    exchange = getattr(d, "cuThreadExchangeStreamCaptureMode", None)
    modes = getattr(d, "CUstreamCaptureMode", None)
    r = exchange(modes.CU_STREAM_CAPTURE_MODE_RELAXED) if exchange is not None and modes is not None else (1,)
    try:
        yield
    finally:
        if int(r[0]) == _CUDA_SUCCESS:
            exchange(r[1])


def gpu_available() -> bool:
    """True when a driver and at least one GPU are present; never raises. Probed once per
    process."""
    pid = os.getpid()
    if pid not in _available:
        try:
            _available[pid] = device_count() > 0
        except Exception:
            _available[pid] = False
    return _available[pid]


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    cc: tuple[int, int]       # compute capability (major, minor)
    sm_count: int
    smem_optin: int           # bytes of shared memory a block may opt in to
    driver_version: str       # CUDA version the driver supports, e.g. "13.0"
    l2_bytes: int = 0         # L2 cache size (0: not reported)

    @property
    def sm(self) -> int:
        """Compute capability as one number: (9, 0) -> 90."""
        return 10 * self.cc[0] + self.cc[1]


def device_info(device: int = 0) -> DeviceInfo:
    """Name, compute capability, SM count, shared-memory limit and driver version of
    `device`, read from the driver once per process."""
    key = (os.getpid(), int(device))
    info = _infos.get(key)
    if info is None:
        info = _infos[key] = _read_device_info(device)
    return info


def _read_device_info(device: int) -> DeviceInfo:
    d = bindings()
    ensure_context(device)
    dev = check(d.cuDeviceGet(int(device)), "cuDeviceGet")
    A = d.CUdevice_attribute

    def attr(a):
        return int(check(d.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute"))

    raw = check(d.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace").strip()
    version = int(check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
    return DeviceInfo(
        name=name,
        cc=(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        sm_count=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        smem_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        driver_version=f"{version // 1000}.{version % 1000 // 10}",
        l2_bytes=attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
    )


def libcuda():
    """libcuda through ctypes (the library cuda-python already loaded), or None."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


_IS_CAPTURING: list = []


def capturing(stream: int) -> bool:
    """Whether `stream` is capturing a CUDA graph (cuStreamIsCapturing; through ctypes, a
    fraction of a microsecond)."""
    if not _IS_CAPTURING:
        fn = getattr(libcuda(), "cuStreamIsCapturing", None)
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)], ctypes.c_int
        _IS_CAPTURING.append(fn)
    fn, status = _IS_CAPTURING[0], ctypes.c_int(0)
    if fn is None:
        r = bindings().cuStreamIsCapturing(stream)
        return int(r[0]) == 0 and int(r[1]) != 0
    return fn(stream or None, ctypes.byref(status)) == 0 and status.value != 0

