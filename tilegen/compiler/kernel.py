"""Kernel: what tilegen.compile returns. Holds the PTX, the IR as text and the launch
geometry as data; loads its module on first use and launches it. A GEMM kernel
(tilegen.gemm.GemmKernel) also runs on arrays: kernel(A, B)."""
from __future__ import annotations

import os
import struct
import warnings
from functools import cached_property
from operator import itemgetter
from typing import Optional

from .. import runtime
from ..codegen.ptxas import PtxasError, assemble_cubin, find_ptxas, resources
from ..errors import LaunchError, PerformanceWarning, missing_arguments
from ..ir.bank_report import format_bank_report
from ..ir.grid import LaunchGrid
from ..runtime.module import module_generation
from .arrays import ArrayParam
from .call import call as call_on_arrays


class PtxasAssembler:
    """The runtime's assembler (runtime.load_module): ptxas's (cubin, report) of a PTX, or
    (None, why). `identity` tells one ptxas from another in the cubin store's keys."""

    def __init__(self, exe: str):
        self.exe = exe
        try:
            st = os.stat(exe)
            self.identity = f"{exe} {st.st_size} {st.st_mtime_ns}"
        except OSError:
            self.identity = exe

    def __call__(self, ptx: str, arch: str) -> tuple:
        try:
            return assemble_cubin(ptx, arch, exe=self.exe)
        except PtxasError as e:
            return None, str(e)


def spill_message(name: str, spilled: int, why: str, ptx: str, ptxas_here: bool) -> str:
    """What a user reads when the GPU's compiler spilled a kernel's registers."""
    text = f"{name}: the GPU's compiler spilled registers to local memory ({spilled} bytes per thread), so it runs slowly"
    if "setmaxnreg" in ptx:
        text += (" (the driver's JIT gives every thread the registers the launch allows, not the ones setmaxnreg "
                 "moves to the math warpgroups)")
    text += f"; {why}" if why else ""
    if not ptxas_here:
        return text + (". With ptxas installed (the CUDA toolkit, `pip install nvidia-cuda-nvcc`, or Triton's copy; "
                       "TILEGEN_PTXAS names one) tilegen assembles such kernels itself; or choose smaller tiles")
    return text + "; choose smaller tiles"


class Kernel:
    """A compiled kernel.

    | attribute     | what                                                         |
    | ------------- | ------------------------------------------------------------ |
    | ptx           | the PTX module (text)                                        |
    | ir            | the tile-level IR, as text (offsets assigned)                |
    | instructions  | the instruction-level IR after every pass, as text           |
    | params        | [(name, type)] in launch order                               |
    | launch_grid   | the grid over the size symbols (tilegen.ir.grid.LaunchGrid)  |
    | tensor_maps   | [arch.tma.TensorMapDecl]: TMA maps built at each launch      |
    | barriers      | [(name, shared offset, stages)] of the mbarriers             |
    | arrays        | [compiler.arrays.ArrayParam]: each memory parameter, as data |
    | leading       | [(tensor, ld, rows, cols parameters, dtype, logical order)]  |
    | cluster       | CTAs per cluster (x, y, z), (1, 1, 1) without (sm_90)        |
    | threads, smem_bytes, target, name, spec (GemmSpec or None)                   |
    | resources     | ptxas's report (registers, shared memory, spills) or None    |
    """

    def __init__(self, *, name: str, threads: int, target: str, smem_bytes: int, params, grid: LaunchGrid,
                 ptx: str, ir: str, instructions=None, banks=(), spec=None, tensor_maps=(), barriers=(), arrays=()):
        self.name = name
        self.threads = int(threads)
        self.target = target
        self.smem_bytes = int(smem_bytes)
        self.params = [(str(n), str(t)) for n, t in params]
        self.launch_grid = grid
        self.ptx = ptx
        self.ir = ir
        self._instructions = instructions  # text, or a function that prints it
        self.bank_conflicts = list(banks)  # BankRow per shared access (ir/bank_report.py)
        self.spec = spec
        self.tensor_maps = tuple(tensor_maps)
        self.barriers = tuple((str(n), int(o), int(k)) for n, o, k in barriers)
        self.arrays = tuple(ArrayParam(*a) for a in arrays)
        self.leading = tuple((a.name, a.ld, a.rows, a.cols, a.dtype, a.logical) for a in self.arrays if a.ld)
        self._array_names = tuple(a.name for a in self.arrays)
        self._calls: dict = {}   # kernel(...)'s remembered calls (compiler/call.py)
        self._grid = grid.evaluator()
        self._names = tuple(n for n, _ in self.params)
        self._values = itemgetter(*self._names) if len(self._names) > 1 else (
            (lambda args, n=self._names: tuple(args[x] for x in n)))
        self._kinds = tuple(_KINDS[t] for _, t in self.params)
        self._functions: dict = {}  # device -> (module generation, runtime Function)
        self._launchers: dict = {}  # device -> (module generation, runtime Launcher)
        # the last launch(): (args, sizes, device, launcher, grid, values), its dicts copied; the
        # same arguments again launch the same values (the Launcher's buffer already holds them)
        self._last_launch = None
        floats = tuple(n for n, t in self.params if t == "f32")
        pack = struct.Struct(f"<{len(floats)}d").pack
        # the float arguments' bytes: equal dicts may hold a zero of the other sign (an alpha of
        # -0.0 signs C's zeros), which launches other bytes
        self._float_bytes = (lambda args: b"") if not floats else (lambda args, n=floats[0]: pack(args[n])) \
            if len(floats) == 1 else (lambda args, get=itemgetter(*floats): pack(*get(args)))

    def __repr__(self) -> str:
        return f"<tilegen.Kernel {self.name}: {self.threads} threads, {self.smem_bytes} B shared>"

    @property
    def cluster(self) -> tuple:
        """CTAs per cluster (x, y, z); (1, 1, 1) without clusters."""
        return self.launch_grid.cluster

    @property
    def instructions(self) -> str:
        """The instruction-level IR after every pass (what codegen printed as PTX), as text;
        Kernel.ir is the tile level."""
        if callable(self._instructions):
            self._instructions = self._instructions()
        return self._instructions

    @cached_property
    def resources(self):
        """ptxas's report (registers, shared memory, spills) or None when ptxas is absent."""
        if find_ptxas() is None:
            return None
        try:
            return resources(self.ptx, self.target, self.smem_bytes)
        except PtxasError:
            return None

    def bank_report(self) -> str:
        """Wavefronts per warp of every shared-memory access, against the ideal."""
        return format_bank_report(self.bank_conflicts)

    def grid(self, sizes: dict, sm_count: Optional[int] = None) -> tuple:
        """(x, y, z) for these sizes. A grid that depends on the multiprocessor count
        (persistent kernels) takes `sm_count`, by default this machine's GPU's."""
        if sm_count is None and self.launch_grid.reads_sm_count:
            if not runtime.gpu_available():
                raise LaunchError(f"{self.name}'s grid depends on the GPU's multiprocessor count and there is "
                                  f"no GPU here: pass sm_count=")
            sm_count = self.launcher().sm_count if self.cluster != (1, 1, 1) else runtime.device_info().sm_count
        try:
            return self._grid(sizes, sm_count)
        except KeyError as e:
            raise LaunchError(f"{self.name}: the grid needs size {e.args[0]!r}; sizes given: "
                              f"{', '.join(sizes) or 'none'}") from None

    # -- running ----------------------------------------------------------------------------
    def __call__(self, *arrays, stream=None, device=None, **named):
        """Run on arrays: each array the kernel declared by position (in declaration order) or
        by name, the other parameters and sizes only the grid reads by name. GPU arrays (PyTorch,
        CuPy, any CUDA array) are used in place on their library's current stream (or `stream`);
        numpy arrays are copied to the GPU and the arrays the kernel writes copied back, or run
        on the CPU emulator (device="sim", or no GPU). compiler/call.py says more."""
        return call_on_arrays(self, arrays, named, stream, device)

    def call_arrays(self, *arrays, stream=None, device=None, **named):
        """kernel(...) of a DSL kernel (a GEMM kernel's own kernel(A, B) takes the GEMM's
        operands instead)."""
        return call_on_arrays(self, arrays, named, stream, device)

    def function(self, device: int = 0):
        """The loaded CUDA function (JIT-compiled by the driver on first use; loaded again
        after the module cache was cleared)."""
        entry = self._functions.get(device)
        if entry is not None and entry[0] == module_generation():
            return entry[1]
        # ptxas, where installed, assembles what the driver's JIT spills (runtime/module.py)
        exe = find_ptxas()
        fn = runtime.load_module(self.ptx, self.name, device=device, assemble=PtxasAssembler(exe) if exe else None)
        if fn.local_bytes:
            warnings.warn(spill_message(self.name, fn.local_bytes, fn.spill_note, self.ptx, exe is not None),
                          PerformanceWarning, stacklevel=2)
        fn.set_max_dynamic_smem(self.smem_bytes)
        self._functions[device] = (module_generation(), fn)
        return fn

    def launcher(self, device: int = 0):
        """The prepared launch of this kernel on `device` (runtime.Launcher, with the GPU's
        multiprocessor count as .sm_count), built once per loaded function."""
        entry = self._launchers.get(device)
        if entry is not None and entry[0] == module_generation():
            return entry[1]
        fn = self.function(device)
        cluster = self.cluster if self.cluster != (1, 1, 1) else None
        launcher = runtime.Launcher(fn, self._kinds, self.threads, self.smem_bytes, device, cluster)
        launcher.sm_count = runtime.device_info(device).sm_count
        if cluster:   # a persistent grid counts the CTAs that fit at once in clusters
            launcher.sm_count = runtime.cluster_capacity(fn, self.threads, self.smem_bytes, cluster, launcher.sm_count)
        self._launchers[device] = (module_generation(), launcher)
        return launcher

    def leading_problem(self, args: dict, sizes: dict = None) -> str:
        """What is wrong with a tensor's leading dimension in these arguments (its rows would
        overlap: ld below the columns of a matrix of more than one row), or ""."""
        sizes = sizes or {}
        for tensor, ld, rows, cols, *_ in self.leading:
            got = [args.get(n, sizes.get(n)) for n in (ld, rows, cols)]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in got):
                continue
            n_ld, n_rows, n_cols = got
            if n_rows > 1 and 0 <= n_ld < n_cols:   # (a negative one is out of range: the launch says so)
                return (f"{ld} = {n_ld} is less than the {n_cols} elements of each stored row of {tensor} ({cols} = "
                        f"{n_cols}): its rows would overlap; {ld} is the elements from one row's start to the next, "
                        f"at least {cols}")
        return ""

    _sim_refusal = ("kernel.launch runs on the GPU; on the CPU emulator: tilegen.sim.run_kernel(kernel, args, "
                    "sizes, memory), the pointers addresses in memory (a tilegen.sim.GlobalMemory)")

    def launch(self, args: dict, sizes: dict, stream=None, device=0):
        """Launch with every parameter given by name (pointers as ints, scalars as numbers)
        and the size symbols the grid reads; on `stream` (a handle, a tilegen/torch/CuPy
        stream, or None for the default stream). A TMA kernel's tensor maps are built from
        their tensors' arguments unless given. On the CPU emulator the same arguments go to
        tilegen.sim.run_kernel(kernel, args, sizes, memory)."""
        last = self._last_launch
        if last is not None:
            try:   # (values whose == is no truth value, arrays, are not the last launch's)
                same = args == last[0] and sizes == last[1] and device == last[2] and self._float_bytes(args) == last[6]
            except (TypeError, ValueError, RuntimeError, struct.error):
                same = False
            if same:
                entry = self._launchers.get(device)
                if entry is not None and entry[1] is last[3] and entry[0] == module_generation():
                    last[3](last[4], last[5], stream)   # (the Launcher's buffer holds these very values)
                    return
        if device == "sim":
            raise LaunchError(f"{self.name}: {self._sim_refusal}")
        problem = self.leading_problem(args, sizes)
        if problem:
            raise LaunchError(f"{self.name}: {problem}")
        given = args
        if self.tensor_maps:
            args = runtime.fill_tensor_maps(self.tensor_maps, args)
        try:
            values = self._values(args)
        except KeyError:
            missing = [n for n in self._names if n not in args]
            raise LaunchError(f"{self.name}: {missing_arguments(missing, args)}") from None
        launcher = self.launcher(device)
        grid = self.grid(sizes, launcher.sm_count)
        if 0 in grid:
            return
        self._last_launch = None
        launcher(grid, values, stream)
        # remembered only of plain numbers: an object given (a buffer, a tensor map) would be kept
        # alive, and compares by identity whatever it holds now
        if all(v.__class__ in _PLAIN for v in given.values()):
            self._last_launch = (dict(given), dict(sizes), device, launcher, grid, values, self._float_bytes(given))


_PLAIN = (int, float, bool)
_KINDS = {"u64": "ptr", "u32": "u32", "s32": "s32", "f32": "f32", "tensormap": "tensormap"}

__all__ = ["Kernel"]
