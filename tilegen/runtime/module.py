"""PTX -> loaded module -> kernel function, through the driver's JIT.

`load_module` JIT-compiles PTX with cuModuleLoadDataEx and keeps the info and error logs
(ptx.md 7.2). A failure saves the PTX to a temp file and raises a DeviceError that shows
the JIT log, the failing PTX line and the file, so the error can be reproduced with ptxas.
Modules are cached per (context, PTX hash): loading the same text twice is free.
With the disk store on (tilegen/store.py, TILEGEN_CACHE != 0) the PTX is linked to a cubin
by the driver linker instead, stored (runtime/cubins.py), and later processes load it.

Where the loaded kernels spill registers (their local memory size), an `assemble` callable
the caller passes (compiler/kernel.py: ptxas, when installed) gets a chance: its cubin
replaces the driver's when it loads and spills less. (The driver's JIT gives every thread
the registers the launch allows; ptxas gives warpgroups that take more with setmaxnreg what
they take: docs/perf_notes.md section 38.)
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading

from ..arch.targets import STATIC_SMEM_MAX
from ..errors import DeviceError, LaunchError
from .. import store
from . import cubins
from . import driver as _drv
from .params import check_launch_dims, pack_args
from .replay import forget_all

_LOG_BYTES = 1 << 16

_lock = threading.Lock()
_modules: dict = {}     # (context, sha256) -> (CUmodule, info log, why its kernels still spill)
_functions: dict = {}   # (context, sha256, entry) -> Function

_PARAM_BYTES = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4}
_KIND_BYTES = {"ptr": 8, "u64": 8, "f64": 8, "u32": 4, "s32": 4, "f32": 4}


# ---- pure helpers (no GPU) -------------------------------------------------------------

def ptx_entries(ptx: str) -> list[str]:
    """Names of the kernels (.entry) a PTX module defines."""
    return re.findall(r"\.entry\s+([A-Za-z_$][\w$]*)", ptx)


def entry_param_bytes(ptx: str, entry: str) -> list:
    """Byte size of each .param of `entry`, None where it is not a scalar (e.g. .b8 x[128])."""
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\(([^)]*)\)", ptx)
    if m is None:
        return []
    sizes = []
    for p in filter(None, (x.strip() for x in m.group(1).split(","))):
        t = re.search(r"\.(u64|s64|b64|f64|u32|s32|b32|f32)\s+[\w$%]+\s*$", p)
        sizes.append(_PARAM_BYTES[t.group(1)] if t else None)
    return sizes


def jit_error_line(log: str):
    """The PTX line number of the first error in a ptxas/JIT log, or None.

    ptxas writes "ptxas application ptx input, line 123; error   : ..." (JIT) or
    "ptxas file.ptx, line 123; error   : ..." (command line).
    """
    m = re.search(r"line (\d+); (?:error|fatal)", log) or re.search(r"line (\d+);", log)
    return int(m.group(1)) if m else None


def save_ptx(ptx: str) -> str:
    """Write PTX to a fresh temp file (tilegen-*.ptx) and return its path."""
    fd, path = tempfile.mkstemp(prefix="tilegen-", suffix=".ptx")
    with os.fdopen(fd, "w") as f:
        f.write(ptx)
    return path


def jit_error_message(ptx: str, log: str, path: str, error: str, arch: str | None = None) -> str:
    """The text of a JIT failure: error, driver log, failing PTX line, saved file, repro."""
    lines = [f"the CUDA driver could not JIT-compile the PTX: {error}"]
    log = log.strip()
    lines.append("driver log:" if log else "driver log: (empty)")
    lines += ["  " + x for x in log.splitlines()]
    n = jit_error_line(log)
    src = ptx.splitlines()
    if n is not None and 1 <= n <= len(src):
        lines.append(f"PTX line {n}: {src[n - 1].strip()}")
    lines.append(f"full PTX written to {path}")
    lines.append(f"reproduce: ptxas -arch={arch or 'sm_XY'} -o /dev/null {path}")
    return "\n".join(lines)


# ---- loading ---------------------------------------------------------------------------

def _jit(d, ptx: str, arch: str | None):
    """cuModuleLoadDataEx with info/error log buffers; returns the CUmodule and info log."""
    O = d.CUjit_option
    info, err = bytearray(_LOG_BYTES), bytearray(_LOG_BYTES)
    r = d.cuModuleLoadDataEx(
        ptx.encode() + b"\0", 5,
        [O.CU_JIT_INFO_LOG_BUFFER, O.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
         O.CU_JIT_ERROR_LOG_BUFFER, O.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, O.CU_JIT_LOG_VERBOSE],
        [info, len(info), err, len(err), 1])
    info_log = _log_text(info)
    if int(r[0]) != 0:
        raise _jit_failure(ptx, r[0], _log_text(err), info_log, arch)
    return r[1], info_log


def _log_text(buf: bytearray) -> str:
    return buf.split(b"\0", 1)[0].decode(errors="replace")


def _jit_failure(ptx: str, code, log: str, info_log: str, arch: str | None) -> DeviceError:
    """The DeviceError of a failed JIT or link: driver log, failing line, PTX saved to a file."""
    name, text = _drv.error_name(code)
    path = save_ptx(ptx)
    e = DeviceError(jit_error_message(ptx, log or info_log, path,
                                      name + (f" ({text})" if text else ""), arch))
    e.ptx_path, e.jit_log, e.line = path, log, jit_error_line(log)
    return e


# ---- disk-cached cubins (runtime/cubins.py) --------------------------------------------
# With the cache on, PTX goes through the driver linker (ptx.md 7.5): cuLinkCreate with log
# buffers, cuLinkAddData(PTX), cuLinkComplete; the cubin is copied out before cuLinkDestroy,
# stored under (PTX, compute capability, cuDriverGetVersion), and loaded with
# cuModuleLoadData. A later process loads the stored cubin and skips the JIT. With
# TILEGEN_CACHE=0 (or bindings without the linker) the PTX is JIT-loaded as above.

_LINKER = ("cuLinkCreate", "cuLinkAddData", "cuLinkComplete", "cuLinkDestroy",
           "cuModuleLoadData", "cuDriverGetVersion")


def _arch_specific_target(d, ptx: str):
    """CUjit_target of an arch-specific PTX target (sm_90a -> CU_TARGET_COMPUTE_90A), else None."""
    m = re.search(r"^\s*\.target\s+sm_(\d+)([af])\b", ptx, re.M)
    targets = getattr(d, "CUjit_target", None)
    if m is None or targets is None:
        return None
    return getattr(targets, f"CU_TARGET_COMPUTE_{m.group(1)}{m.group(2).upper()}", None)


def _link(d, ptx: str, arch: str | None):
    """PTX -> cubin bytes through the driver linker; returns (cubin, info log)."""
    import ctypes

    O = d.CUjit_option
    # The driver writes into these buffers until cuLinkDestroy: they stay referenced here
    # (the bindings keep the option-value array alive on the CUlinkState, not the buffers).
    info, err = bytearray(_LOG_BYTES), bytearray(_LOG_BYTES)
    options = [O.CU_JIT_INFO_LOG_BUFFER, O.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
               O.CU_JIT_ERROR_LOG_BUFFER, O.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, O.CU_JIT_LOG_VERBOSE]
    values = [info, len(info), err, len(err), 1]
    target = _arch_specific_target(d, ptx)
    if target is not None:  # .target sm_90a: compile for exactly that, not the context's sm_90
        options.append(O.CU_JIT_TARGET)
        values.append(target)
    state = _drv.check(d.cuLinkCreate(len(options), options, values), "cuLinkCreate")
    try:
        image = ptx.encode() + b"\0"  # PTX must be NUL-terminated
        r = d.cuLinkAddData(state, d.CUjitInputType.CU_JIT_INPUT_PTX, image, len(image),
                            b"tilegen.ptx", 0, None, None)
        if int(r[0]) == 0:
            r = d.cuLinkComplete(state)  # (CUresult, address, size); the image belongs to state
        if int(r[0]) != 0:
            raise _jit_failure(ptx, r[0], _log_text(err), _log_text(info), arch)
        address, size = int(r[1]), int(r[2])
        if not address or size <= 0:
            raise DeviceError(f"cuLinkComplete returned an empty cubin ({size} bytes)")
        cubin = ctypes.string_at(address, size)  # copied out before cuLinkDestroy frees it
        return cubin, _log_text(info)
    finally:
        d.cuLinkDestroy(state)


def local_bytes(d, module, ptx: str) -> int:
    """Local memory per thread of the module's kernels (the most of any): tilegen's kernels keep
    no arrays there, so any is registers the compiler spilled. Read from the loaded functions,
    not the compile log: where the driver reuses a compile from its own JIT cache, the log has
    no ptxas lines at all."""
    most = 0
    for entry in ptx_entries(ptx):
        r = d.cuModuleGetFunction(module, entry.encode())
        if int(r[0]) == 0:
            most = max(most, _function_local_bytes(d, r[1]))
    return most


def _function_local_bytes(d, function) -> int:
    """CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES of a loaded kernel (0 where the bindings cannot say)."""
    attributes = getattr(d, "CUfunction_attribute", None)
    if attributes is None or not hasattr(d, "cuFuncGetAttribute"):
        return 0
    v = d.cuFuncGetAttribute(attributes.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function)
    return int(v[1]) if int(v[0]) == 0 else 0


def _load_cubin(d, cubin: bytes):
    """The CUmodule of `cubin`, or None where this driver refuses it."""
    r = d.cuModuleLoadData(cubin)
    return r[1] if int(r[0]) == 0 else None


def _assembly_arch(ptx: str, arch: str | None) -> str | None:
    """What to assemble `ptx` for: its arch-specific target (sm_90a) as it names it, else this
    device's (an sm_80 kernel on an sm_86 GPU: sm_86 code, as the driver's JIT makes)."""
    m = re.search(r"^\s*\.target\s+(sm_\d+)([af]?)\b", ptx, re.M)
    if m is not None and m.group(2):
        return m.group(1) + m.group(2)
    return arch or (m.group(1) if m else None)


def _reassembled(d, ptx: str, arch: str | None, module, spilled: int, assemble):
    """((module, cubin, log) or None, why not, whether that verdict lasts): `assemble`'s cubin
    of `ptx` where the driver's `module` spills `spilled` bytes per thread and the assembler's
    loads and spills less (the driver's module is then unloaded). A cubin that spills too, or
    that the driver refuses, would be so again: that verdict is worth storing."""
    if not spilled:
        return None, "", False
    if assemble is None:
        return None, "no ptxas was at hand to assemble it", False
    target = _assembly_arch(ptx, arch)
    if target is None:
        return None, "the PTX names no target to assemble it for", False
    try:
        cubin, report = assemble(ptx, target)
    except Exception as e:   # the caller's assembler failing must not lose the driver's loaded module
        return None, f"the assembler failed: {type(e).__name__}: {e}", False
    if cubin is None:
        return None, f"ptxas could not assemble it: {_reason(report)}", False
    better = _load_cubin(d, cubin)
    if better is None:
        return None, f"this driver refused ptxas's {target} cubin", True
    worse = local_bytes(d, better, ptx)
    if worse >= spilled:
        d.cuModuleUnload(better)
        return None, f"ptxas's cubin spills too ({worse} bytes per thread)", True
    d.cuModuleUnload(module)
    log = f"assembled by ptxas for {target} (the driver's compile spilled {spilled} bytes per thread):\n{report}"
    return (better, cubin, log), "", False


def _reason(report) -> str:
    """The line of a failed assembler's report that says why (its error, else its last line)."""
    lines = [line.strip() for line in str(report or "").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "fatal" in line.lower()]
    return (errors or lines or ["no reason given"])[0 if errors else -1]


def _load(d, ptx: str, cc, arch: str | None, assemble=None):
    """(CUmodule, info log, why its kernels still spill or ""): with the disk store a stored
    cubin (the assembler's first, where one is at hand), else linked, stored and loaded; where
    the driver's kernels spill, `assemble`'s cubin if it loads and spills less (stored too, or
    else the lasting verdict, so later processes do not assemble again). The assembler's
    entries are keyed by its `identity` (which ptxas), so a new one tries afresh."""
    if cc is None or not store.enabled() or not all(hasattr(d, n) for n in _LINKER):
        module, info_log = _jit(d, ptx, arch)
        better, why, _ = _reassembled(d, ptx, arch, module, local_bytes(d, module, ptx), assemble)
        return (better[0], better[2], "") if better is not None else (module, info_log, why)
    driver = int(_drv.check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
    maker = f"ptxas {getattr(assemble, 'identity', '')}".strip()
    verdict = None   # why the stored verdict says this assembler does no better
    if assemble is not None:   # never with TILEGEN_PTXAS=off
        hit = cubins.get_cubin_entry(ptx, cc, driver, maker=maker)
        if hit is not None and not hit[0]:
            verdict = hit[1]
        elif hit is not None:
            module = _load_cubin(d, hit[0])
            if module is not None:
                return module, hit[1], ""
            cubins.discard_cubin(ptx, cc, driver, maker=maker)
    hit = cubins.get_cubin_entry(ptx, cc, driver)
    if hit is not None and hit[1].startswith("assembled by ptxas"):   # (a first version stored ptxas's here)
        cubins.discard_cubin(ptx, cc, driver)
        hit = None
    module = None
    if hit is not None:
        cubin, info_log = hit
        module = _load_cubin(d, cubin)
        if module is None:
            cubins.discard_cubin(ptx, cc, driver)  # refused by this driver: rebuild it
    if module is None:
        cubin, info_log = _link(d, ptx, arch)
        cubins.put_cubin(ptx, cc, driver, cubin, info_log)
        module = _drv.check(d.cuModuleLoadData(cubin), "cuModuleLoadData(linked cubin)")
    if verdict is not None:
        return module, info_log, verdict
    better, why, lasting = _reassembled(d, ptx, arch, module, local_bytes(d, module, ptx), assemble)
    if better is None:
        if lasting:
            cubins.put_cubin(ptx, cc, driver, b"", why, maker=maker)
        return module, info_log, why
    cubins.put_cubin(ptx, cc, driver, better[1], better[2], maker=maker)
    return better[0], better[2], ""


def precompile(ptx: str, device: int = 0) -> bool:
    """Link `ptx` to a cubin and store it in the disk cache without loading it (safe to call
    from worker threads, so many kernels can be prepared at once). False when there is no
    cubin cache to fill (cache off, or bindings without the driver linker). (Whether its
    kernels spill is checked when it is loaded.)"""
    d = _drv.bindings()
    if not store.enabled() or not all(hasattr(d, n) for n in _LINKER):
        return False
    _drv.ensure_context(device)  # contexts are current per thread
    cc = tuple(_drv.device_info(device).cc)
    driver = int(_drv.check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
    if cubins.get_cubin_entry(ptx, cc, driver) is not None:
        return True
    cubin, info_log = _link(d, ptx, "sm_%d%d" % cc)
    return cubins.put_cubin(ptx, cc, driver, cubin, info_log)


def load_module(ptx: str, entry: str, device: int = 0, assemble=None) -> "Function":
    """JIT-load `ptx` (cached per context and PTX text) and return its kernel `entry`.
    `assemble(ptx, arch) -> (cubin, report)` (or (None, why) where it cannot), if given, is
    tried where the driver's kernels spill registers (its cubin is kept where it loads and
    spills less). Function.local_bytes says what the loaded kernel spills, Function.spill_note
    why it was not assembled."""
    if not isinstance(ptx, str) or not ptx.strip():
        raise LaunchError("load_module needs PTX text (a non-empty str)")
    entries = ptx_entries(ptx)
    if entry not in entries:
        raise LaunchError(f"kernel {entry!r} is not defined in the PTX; entries: "
                          f"{', '.join(entries) or '(none)'}")
    d = _drv.bindings()
    ctx = _drv.ensure_context(device)
    digest = hashlib.sha256(ptx.encode()).hexdigest()
    key = (int(ctx), digest)
    with _lock:
        fn = _functions.get(key + (entry,))
        if fn is not None:
            return fn
        if key not in _modules:
            arch = cc = None
            try:
                cc = tuple(_drv.device_info(device).cc)
                arch = "sm_%d%d" % cc
            except DeviceError:
                pass
            with _drv.capture_relaxed():
                _modules[key] = _load(d, ptx, cc, arch, assemble)  # disk cubin cache, else JIT
        module, info_log, why = _modules[key]
        with _drv.capture_relaxed():   # (a lazily loaded function may load at its first query)
            handle = _drv.check(d.cuModuleGetFunction(module, entry.encode()),
                                f"cuModuleGetFunction({entry!r})")
            spilled = _function_local_bytes(d, handle)
        fn = Function(module, handle, entry, info_log, device, entry_param_bytes(ptx, entry))
        fn.local_bytes = spilled
        fn.spill_note = why if spilled else ""
        _functions[key + (entry,)] = fn
        return fn


_generation = [0]  # bumped when modules are unloaded: Functions from before are stale


def module_generation() -> int:
    return _generation[0]


def clear_module_cache() -> None:
    """Unload every cached module of this process (their Functions become unusable; a
    tilegen.Kernel notices and loads its module again)."""
    d = _drv.bindings()
    forget_all()   # (the Launchers' graph executables launch these modules' kernels)
    with _lock:
        _generation[0] += 1
        for module, _, _ in _modules.values():
            try:
                d.cuModuleUnload(module)
            except Exception:
                pass
        _modules.clear()
        _functions.clear()


def stream_handle(stream):
    """A stream as the handle the driver takes (an int or a CUstream): None is 0 (the
    legacy default stream); a tilegen Stream (.handle), a torch stream (.cuda_stream), a
    CuPy stream (.ptr); a CUstream or an int as it is."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("handle", "cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if v is not None:
            return v
    return stream


class Function:
    """A loaded kernel: the driver handles, the JIT's resource report, launch()."""

    def __init__(self, module, handle, entry: str, info_log: str, device: int, param_bytes):
        self.module = module
        self.handle = handle
        self.entry = entry
        self.info_log = info_log      # registers / shared memory / spills, as ptxas -v prints
        self.local_bytes = 0          # local memory per thread: spilled registers (load_module)
        self.spill_note = ""          # why a spilling kernel was not assembled by ptxas instead
        self.device = device
        self.param_bytes = list(param_bytes)
        self.max_dynamic_smem = STATIC_SMEM_MAX

    def __repr__(self) -> str:
        return f"Function({self.entry!r}, device={self.device})"

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        """Allow `nbytes` of dynamic shared memory; only needed (and only set) above 48 KB."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise LaunchError(f"dynamic shared memory of {nbytes} bytes; must be >= 0")
        if nbytes <= STATIC_SMEM_MAX or nbytes <= self.max_dynamic_smem:
            return
        d = _drv.bindings()
        _drv.ensure_context(self.device)
        limit = _drv.device_info(self.device).smem_optin
        if nbytes > limit:
            raise LaunchError(f"kernel {self.entry} asks for {nbytes} bytes of dynamic shared "
                              f"memory; this GPU allows at most {limit} bytes per block")
        A = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        with _drv.capture_relaxed():
            _drv.check(d.cuFuncSetAttribute(self.handle, A, nbytes),
                       f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes})")
        self.max_dynamic_smem = nbytes

    def check_args(self, args) -> None:
        """Argument count and sizes against the kernel's .param list (a mismatch is UB)."""
        if not self.param_bytes:
            return
        if len(args) != len(self.param_bytes):
            raise LaunchError(f"kernel {self.entry} takes {len(self.param_bytes)} arguments; "
                              f"got {len(args)}")
        for i, ((_, kind), size) in enumerate(zip(args, self.param_bytes)):
            if size is not None and _KIND_BYTES.get(kind, size) != size:
                raise LaunchError(f"kernel {self.entry} argument {i} is a {size}-byte .param; "
                                  f"kind {kind!r} passes {_KIND_BYTES[kind]} bytes")

    def launch(self, grid, block, args, smem: int = 0, stream=None) -> None:
        """Enqueue the kernel. args: [(value, kind)], kind in ptr/u32/s32/u64/f32/f64."""
        g, b = check_launch_dims(grid, block)
        args = list(args)
        params = pack_args(args)
        self.check_args(args)
        smem = int(smem)
        if smem < 0:
            raise LaunchError(f"dynamic shared memory of {smem} bytes; must be >= 0")
        self.set_max_dynamic_smem(smem)
        d = _drv.bindings()
        _drv.ensure_context(self.device)
        _drv.check(d.cuLaunchKernel(self.handle, *g, *b, smem, stream_handle(stream),
                                    params if params[0] else None, 0),
                   f"launching {self.entry} (grid {g}, block {b}, {smem} B dynamic smem)")
