"""Calling a GEMM kernel: check the operands, place them on the GPU (or the emulator),
launch, return C.

Three paths:
- GPU arrays of PyTorch or CuPy (runtime/interop.py) whose shapes, dtypes, layouts and
  devices fit: the fast path (`FastCall`), a few attribute reads per array and one
  prepared launch on the library's current stream. Rows whose pitch or base is not a
  multiple of 16 bytes are re-pitched into an aligned copy from the library's own
  (stream-ordered) allocator when allowed.
- Other GPU arrays (__cuda_array_interface__ or DLPack), and anything the fast path does
  not take: described and checked by runtime.describe_array, with errors that say what is
  wrong; misaligned rows re-pitched into stream-ordered allocations (cuMemAllocAsync).
- Host (numpy) operands: copied into pitched buffers whose rows are padded to 16 bytes, so
  any shape runs, on the GPU, or on the CPU emulator (device="sim", or no GPU).

The fused epilogue's operands (a bias vector, a residual matrix) have the output's dtype.
"""
from __future__ import annotations

from math import copysign
from operator import itemgetter

import numpy as np

from .. import runtime
from ..arch.dtypes import dtype as arch_dtype
from ..arch.dtypes import F32_INF_FROM, F32_MAX, numpy_dtype
from ..compiler.call import EMULATOR_LIMIT_S, EmulatorMemory, GpuMemory, duration
from ..compiler.call import refuse_long_emulation as _refuse
from ..errors import LaunchError, warn_once
from ..runtime import interop
from ..runtime.interop import DEVICE, DTYPE, PTR, SHAPE, STRIDES
from ..runtime.arrays import check_host, check_writable, padded_ld, pitched_copy
from ..runtime.memory import copy_2d
from ..runtime.tensormap import map_cache, tensor_map_bytes
from .prepare import POINTER_NAMES, SIZE_NAMES, plan, preparations

ALIGN = 16
MEMO = 64   # calls (arrays and scalars) a kernel's fast path remembers the launches of
_NUMBERS = (float, int)
_CANONICAL = ("M", "N", "K", "A_ptr", "A_ld", "B_ptr", "B_ld", "C_ptr", "C_ld", "alpha", "beta",
              "bias_ptr", "R_ptr", "R_ld", "scale_a_ptr", "scale_b_ptr")
NO_SCALES = (None, None)
_WORK = ("WM", "WN", "W_ptr", "W_ld")   # the f32 workspace of partial sums, after the canonical values


def empty_k_error(kernel) -> LaunchError:
    """K = 0 on a kernel that loads through TMA (which describes no empty matrix)."""
    spec = kernel.spec
    other = "" if spec.stream_k or spec.pingpong or spec.prepared_operands else \
        ", or compile the spec with copy='cp.async', persistent=False"
    return LaunchError(f"{kernel.name}: A and B are empty (K = 0), and this kernel loads them through TMA, which "
                       f"describes no empty matrix: tilegen.matmul computes it (C is the epilogue of a zero product, as "
                       f"in numpy){other}")


def check_stream_k_range(spec, M: int, N: int, K: int, ctas: int) -> None:
    """Stream-K's schedule multiplies k-tile counts by CTA counts in 32 bits (template.StreamK)."""
    if spec.stream_k:
        blocks = -(-M // spec.tile.m) * -(-N // spec.tile.n)
        if blocks * -(-K // spec.tile.k) * max(ctas, 1) >= 2 ** 32:
            raise LaunchError(f"stream-K's 32-bit schedule cannot cut {blocks} blocks of K = {K} over {ctas} CTAs "
                              f"(blocks x k-tiles x CTAs must stay under 2^32): use a spec without stream_k")


def workspace_shape(spec, M: int, N: int, ctas: int, count: int = 1) -> tuple:
    """(rows, cols) of the f32 workspace of partial sums (split-K, stream-K). Split-K: each slice's partials
    on M rounded up to whole blocks (template.split_rows), slice after slice; on a stack of
    `count` products, an M x N matrix per slice and product. Stream-K: two block-sized slots
    per CTA of the first kernel's grid (`ctas`; template.StreamK)."""
    if spec.stream_k:
        return 2 * ctas * spec.tile.m, spec.tile.n
    if spec.batched:
        return spec.split_k * count * M, N
    return spec.split_k * -(-M // spec.tile.m) * spec.tile.m, N


def stack_counters(spec, M: int, N: int, count: int) -> int:
    """The arrival counters of a split-K stack: one per block of the walk (template.gemm)."""
    return -(-M // spec.tile.m) * -(-N // spec.tile.n) * count


def workspace_arguments(spec, rows: int, cols: int, ptr: int, M: int, N: int, counters: int = 0) -> dict:
    """The workspace's kernel arguments (a stack's: its matrices M x N elements apart, and the
    address of its arrival counters, zero before the launch)."""
    return {"WM": rows, "WN": cols, "W_ptr": ptr, "W_ld": max(cols, 1),
            **({"W_batch_stride": M * N, "F_ptr": counters} if spec.batched else {})}


def _is_host(x) -> bool:
    return isinstance(x, np.ndarray)


def _pitched(stored: np.ndarray) -> tuple[np.ndarray, int]:
    """(`stored` itself, its row length) where its rows are already whole multiples of 16 bytes
    back to back (C-contiguous, not empty), else (a copy with each row padded so, ld)."""
    rows, cols = stored.shape
    if rows and cols and (cols * stored.itemsize) % ALIGN == 0 and stored.flags.c_contiguous:
        return stored, cols
    buf, ld = _pitched_stack(stored[None])
    return buf[0], ld


def _c_map(kernel):
    """The tensor map a TMA-store kernel writes C through, or None."""
    return next((m for m in kernel.tensor_maps if m.ptr == "C_ptr"), None)


def _shapes(A, B, out):
    M, K = A.shape
    K2, N = B.shape
    if K != K2:
        raise LaunchError(f"A is {M} x {K} but B is {K2} x {N}: inner dimensions differ")
    if out is not None and tuple(out.shape) != (M, N):
        raise LaunchError(f"out has shape {tuple(out.shape)}; expected ({M}, {N})")
    return M, N, K


def real_number(x, what: str) -> float:
    """x as a float where it is a real number (a Python or numpy real, a 0-d real array, a
    one-element GPU tensor); strings, complex numbers and numbers beyond f64 are refused."""
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    if isinstance(x, (str, bytes, complex, np.complexfloating)) or kind in ("c", "U", "S", "O"):
        raise LaunchError(f"{what} must be a real number, got {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        raise LaunchError(f"{what} must be a real number (within float64's range), got {x!r}") from None


F32_BETA_MIN = 2.0 ** -150   # (a beta of at most this magnitude is 0 in float32, the kernel's parameter)


def check_scalars(alpha, beta) -> tuple:
    """(alpha, beta) as floats the kernel's float32 parameters hold: real numbers (real_number),
    finite ones within float32's range (infinities and NaN are taken as they are), and a beta
    that is not 0 not 0 in float32 either: the kernel would then leave C unread, where numpy's
    beta * C still carries C's NaNs and infinities."""
    alpha, beta = real_number(alpha, "alpha"), real_number(beta, "beta")
    for name, x in (("alpha", alpha), ("beta", beta)):
        if abs(x) >= F32_INF_FROM and x not in (float("inf"), float("-inf")):
            raise LaunchError(f"{name}={x!r} is beyond float32's range, the kernel's precision (largest "
                              f"{F32_MAX:.8g}; an infinite {name} is taken)")
    if beta != 0 and -F32_BETA_MIN <= beta <= F32_BETA_MIN:
        raise LaunchError(f"beta={beta!r} is 0 in float32, the kernel's precision, so C would not be read (numpy's "
                          f"beta * C keeps C's NaNs and infinities): pass beta=0, or one of at least 2**-149 in size")
    return alpha, beta


def check_real_arrays(**arrays):
    """Bias, residual and scale arrays are arrays (numpy, torch, CuPy: not lists) of real
    numbers: complex, string and object arrays are refused (numpy would drop the imaginary
    part, or parse the strings)."""
    for name, x in arrays.items():
        if x is not None and not hasattr(x, "shape"):
            raise LaunchError(f"{name} must be an array (numpy, torch or CuPy), not a {type(x).__name__}")
        kind = getattr(getattr(x, "dtype", None), "kind", None)
        if kind in ("c", "U", "S", "O", "M", "m"):
            raise LaunchError(f"{name} has dtype {x.dtype}; it must hold real numbers (float16, bfloat16 or float32 "
                              f"as the kernel takes them)")


def check_device(device) -> None:
    if device not in (None, "gpu", "cuda", "sim") and not (isinstance(device, int) and not isinstance(device, bool)
                                                          and device >= 0):
        raise LaunchError(f"device={device!r}; allowed: None, 'gpu' (or 'cuda'), 'sim' or a GPU index (0, 1, ...)")


def scale_lengths(spec, M: int, N: int) -> tuple:
    """The elements of scale_a and scale_b a kernel reads: M and N for vectors (per row of A, per
    column of B), 1 for per-tensor scales in device memory (Epilogue.device_scale_a / _b)."""
    epi = spec.epilogue
    return (1 if epi.device_scale_a else M), (1 if epi.device_scale_b else N)


def bias_axis(bias, M: int, N: int):
    """Along which axis of the M x N product a bias array runs, as numpy broadcasts it onto
    A @ B: "col" (a value per column) for N elements or a 1 x N array, "row" for an M x 1 array
    (also where M == N), and, tilegen's reading where numpy would refuse it, for a 1-D array of
    M != N elements with N > 1 (with N = 1 numpy would spread M values across an M x M result);
    None where it is none of these."""
    shape = tuple(getattr(bias, "shape", ()))   # (ints in numpy, torch and CuPy alike)
    if shape == (N,) or shape == (1, N):
        return "col"
    if shape == (M, 1) or shape == (M,) and N != 1:
        return "row"
    return None


def bias_vector(bias):
    """The bias as the kernels take it, one dimension (a 1 x N or M x 1 bias as a view of its
    values, or on the GPU a packed copy where that view is strided, such as a column of a matrix:
    the kernels read a bias packed; a 1-D one as it is)."""
    if bias is None or len(getattr(bias, "shape", ())) != 2:
        return bias
    v = bias.reshape(-1)
    lib = interop.library(v)
    if lib is not None:
        p = lib.probe(v)
        if p and len(p[SHAPE]) == 1 and p[SHAPE][0] > 1 and p[STRIDES][0] != 1:
            v = v.contiguous() if hasattr(v, "contiguous") else v.copy()
    return v


def check_epilogue(spec, bias, residual, scales=NO_SCALES):
    epi = spec.epilogue
    for vec, name, size, device in ((scales[0], "scale_a", "M", epi.device_scale_a),
                                    (scales[1], "scale_b", "N", epi.device_scale_b)):
        shape = tuple(getattr(vec, "shape", ()))
        if vec is not None and device and int(np.prod(shape)) != 1:
            raise LaunchError(f"{name} has shape {shape}: this kernel reads {name} as one f32 in device memory (its "
                              f"spec's Epilogue(device_scale_{name[-1]}=True)): pass a one-element f32 array")
        if vec is not None and not device and len(shape) != 1:
            raise LaunchError(f"{name}={vec!r}: a kernel takes {name} as a vector of {size} f32 values (its spec "
                              f"with Epilogue(scale_{'rows' if name == 'scale_a' else 'cols'}=True)) or as one f32 in "
                              f"device memory (Epilogue(device_scale_{name[-1]}=True)); a per-tensor scale goes into "
                              f"alpha (alpha=scale_a * scale_b), or through tilegen.matmul")
    check_real_arrays(bias=bias, residual=residual, scale_a=scales[0], scale_b=scales[1])
    for vec, on, device, name, size in ((scales[0], epi.scale_rows, epi.device_scale_a, "scale_a", "M"),
                                        (scales[1], epi.scale_cols, epi.device_scale_b, "scale_b", "N")):
        if vec is None and device:
            raise LaunchError(f"this kernel reads {name} from device memory: pass {name}= (a one-element f32 array)")
        if (vec is None) == on and not device:
            raise LaunchError(f"this kernel scales by a vector {name} of length {size}: pass {name}=" if on else
                              f"{name}= (a vector) needs a spec with Epilogue(scale_{'rows' if name == 'scale_a' else 'cols'}=True)")
    if (bias is None) != (epi.bias is None):
        if bias is None:
            raise LaunchError(f"this kernel adds a bias per {epi.bias}: pass bias=")
        raise LaunchError("bias= needs a spec with Epilogue(bias='row' or 'col'); this kernel has no bias")
    if (residual is None) == epi.residual:
        if residual is None:
            raise LaunchError("this kernel adds a residual: pass residual=")
        raise LaunchError("residual= needs a spec with Epilogue(residual=True); this kernel has none")


def run_gemm(kernel, A, B, *, out=None, alpha=1.0, beta=0.0, bias=None, residual=None, device=None,
             repitch=False, scales=NO_SCALES):
    """The general path (the fast one, FastCall, is tried first by GemmKernel.__call__)."""
    spec = kernel.spec
    alpha, beta = check_scalars(alpha, beta)
    check_epilogue(spec, bias, residual, scales)
    check_device(device)
    for name, x in (("A", A), ("B", B), ("out", out)):
        if x is not None and not hasattr(x, "shape"):
            raise LaunchError(f"{name} must be an array (numpy, torch or CuPy), not a {type(x).__name__}")
    host = all(x is None or _is_host(x) for x in (A, B, out, bias, residual))
    if device == "sim":
        if not host:
            raise LaunchError("device='sim' runs on numpy arrays; pass numpy arrays (or run on the GPU)")
        return _run_host(kernel, A, B, out, alpha, beta, bias, residual, _SimMemory(explicit=True), scales)
    if host:
        if device is None and not runtime.gpu_available():  # no GPU: the emulator, said plainly
            warn_once("no GPU found; GEMMs on numpy arrays run on the CPU emulator (device='sim'), "
                       f"up to about {EMULATOR_LIMIT_S:.0f} s of emulation each (larger ones need device='sim')")
            return _run_host(kernel, A, B, out, alpha, beta, bias, residual, _SimMemory(explicit=False), scales)
        return _run_host(kernel, A, B, out, alpha, beta, bias, residual,
                         GpuMemory(device if isinstance(device, int) else 0), scales)
    return _run_device(kernel, A, B, out, alpha, beta, bias, residual, repitch, scales)


# ---- the fast path ---------------------------------------------------------------------

def _unusual_scalars(alpha, beta) -> bool:
    """Whether alpha or beta is anything but a Python number the kernel's float32 parameter holds
    as it is (finite within float32's range; beta not 0 in float32 unless 0): the fast paths
    leave those to the general path (check_scalars). Checked before a launch is made; the
    remembered launch of the same scalars needs no check again."""
    return (type(alpha) not in _NUMBERS or type(beta) not in _NUMBERS
            or not (-F32_INF_FROM < alpha < F32_INF_FROM and -F32_INF_FROM < beta < F32_INF_FROM)
            or (beta and -F32_BETA_MIN <= beta <= F32_BETA_MIN))


def _scale_probes(lib, scales) -> tuple:
    """The probes of a call's scale arrays: None for a scale left out, False for one that is not
    an array of `lib` (a number, another library's: no remembered call holds False, so the general
    path runs and says what is wrong)."""
    return tuple(None if x is None else lib.probe(x) if interop.library(x) is lib else False for x in scales)


def _sans_pointers(probes) -> tuple:
    """Scale probes (_scale_probes) without their pointers: what a launch checked of them."""
    return tuple(p and p[1:] for p in probes)


class FastCall:
    """A GEMM kernel's launch from PyTorch / CuPy arrays, prepared once per kernel.

    `fast(A, B, out, bias, residual, alpha, beta, repitch)` launches and returns C, or
    returns None without side effects when anything does not fit (the general path then
    runs, and reports what is wrong). `run(...)` does the same from arrays already probed
    (tilegen.matmul probes them to choose the kernel)."""

    def __init__(self, kernel):
        spec = kernel.spec
        self.kernel = kernel
        self.in_dtype = arch_dtype(spec.dtype).storage
        self.b_dtype = arch_dtype(spec.b_dtype).storage   # (a mixed fp8 pair: B's own)
        self.out_dtype = arch_dtype(spec.out_dtype).storage
        self.in_size = arch_dtype(spec.dtype).bytes
        self.a_row = spec.a_layout == "row"
        self.b_row = spec.b_layout == "row"
        self.bias_axis = spec.epilogue.bias
        self.residual = spec.epilogue.residual
        epi = spec.epilogue
        self.scaled = (epi.scale_rows or epi.device_scale_a, epi.scale_cols or epi.device_scale_b)
        self.any_scaled = self.scaled[0] or self.scaled[1]   # (its remembered call's key holds the scales' probes)
        self.scalar_scales = (epi.device_scale_a, epi.device_scale_b)   # (one element each: shape (1,))
        self.c_map = _c_map(kernel)   # C's TMA-store map: rows it cannot take go to the direct-store kernel
        # operands prepared by first kernels (gemm/prepare.py), which read any pitch; their
        # launches laid out once per shape
        self.prepares = spec.prepared_operands
        self._plans = {}
        # the kernel's parameters, in its order, from the canonical tuple run() builds
        second = kernel.second_kernel()   # split-K's or stream-K's: partial sums -> C
        self.split = second is not None
        base = _CANONICAL + (_WORK if self.split else ())
        names = base + tuple(m.param for m in kernel.tensor_maps)
        self.pick = itemgetter(*(names.index(n) for n, _ in kernel.params))
        if self.split:
            self.sum_kernel = second
            self.sum_pick = itemgetter(*(base.index(n) for n, _ in second.params))
            self.sum_grid = second.launch_grid.evaluator(("M", "N", "K"))
        # TMA kernels: each tensor map from the canonical values of its tensor, through that
        # map's own cache (no hashing of the declaration per call)
        self.maps = _map_layout(kernel, _CANONICAL)
        self.grid = kernel.launch_grid.evaluator(("M", "N", "K"))
        # The last plain call: its arrays' shapes, strides, dtypes and devices, what was derived
        # from them, the launcher, and its pointers, alpha and beta with the arguments they gave.
        # A loop that calls with arrays of one shape checks them once; with the same arrays
        # (and scalars) it launches the same arguments again. Every such call is remembered by
        # its probes (up to MEMO of them), so a model calling one kernel for each of its layers,
        # each with its own arrays, launches each layer's remembered arguments too.
        self._last = None
        self._memo = {}

    def __call__(self, A, B, out, bias, residual, alpha, beta, repitch, scales=NO_SCALES):
        lib = interop.library(A)
        if lib is None:
            return None
        same = A.__class__   # (arrays of one type are of one library: no second lookup)
        if B.__class__ is not same and interop.library(B) is not lib:
            return None
        pc = None
        if out is not None:
            if out.__class__ is not same and interop.library(out) is not lib:
                return None
            pc = lib.probe(out)
        return self.run(lib, lib.probe(A), lib.probe(B), out, pc, bias, residual, alpha, beta, repitch, scales)

    def plain(self, A, B, out, alpha, beta):
        """__call__ with no bias, residual or scales and no re-pitching: kernel(A, B, out=C) as a
        loop calls it. The remembered launch is made here (run()'s, one Python frame fewer on
        the hot path); anything else goes on to run() with the probes made."""
        cls = A.__class__
        lib = interop.library(A)
        if lib is None or B.__class__ is not cls or out.__class__ is not cls or self.any_scaled:
            return self(A, B, out, None, None, alpha, beta, False)
        pa, pb, pc = lib.probe(A), lib.probe(B), lib.probe(out)
        last = self._last
        if last is not None and type(alpha) in _NUMBERS and type(beta) in _NUMBERS:
            key = (pa, pb, pc, alpha, beta)
            if key != last[0]:
                last = self._recall(key)
        else:
            last = None
        if last is not None and last[5] is None and (alpha or copysign(1.0, alpha) == copysign(1.0, last[0][3])) \
                and self.kernel.launcher(pa[4]) is last[3]:
            stream = lib.stream(pa[4])
            for run, grid, args in last[4]:
                run(grid, args, stream)
            return out
        return self.run(lib, pa, pb, out, pc, None, None, alpha, beta, False)

    def run(self, lib, pa, pb, out, pc, bias, residual, alpha, beta, repitch, scales=NO_SCALES):
        if type(alpha) not in _NUMBERS or type(beta) not in _NUMBERS:
            return None   # (the general path converts them, or says what is wrong: check_scalars)
        last = self._last
        if last is not None and bias is None and residual is None and (scales is NO_SCALES) != self.any_scaled:
            if out is None and not beta and pa and pb and \
                    last[1][:8] == (pa[1], pa[2], pa[3], pa[4], pb[1], pb[2], pb[3], pb[4]):
                # no out: a new one like last time's, then the launch with its pointer (below)
                out = lib.empty(last[1][8], self.out_dtype, pa[4])
                pc = lib.probe(out)
            same = (pa, pb, pc, alpha, beta) if scales is NO_SCALES else \
                (pa, pb, pc, alpha, beta, _scale_probes(lib, scales))
            hit = last if same == last[0] else self._recall(same)
            if hit is not None and (alpha or copysign(1.0, alpha) == copysign(1.0, hit[0][3])):
                # the same arrays and scalars as a remembered call (an alpha of -0.0 is not 0.0: it signs
                # C's zeros; a zero beta of either sign leaves C unread): its launches (those whose
                # arguments name a stream's scratch, on that stream only)
                launcher = self.kernel.launcher(pa[4])
                stream = lib.stream(pa[4])
                if launcher is hit[3] and (hit[5] is None or hit[5] == runtime.stream_key(stream)
                                           and not runtime.capturing(stream)):
                    for run, grid, args in hit[4]:
                        run(grid, args, stream)
                    return out
            elif pc and pa and pb and not self.prepares and not (pa[0] | pb[0] | pc[0]) % ALIGN and \
                    (scales is NO_SCALES or _sans_pointers(same[5]) == _sans_pointers(last[0][5])) and \
                    last[1] == (pa[1], pa[2], pa[3], pa[4], pb[1], pb[2], pb[3], pb[4], pc[1], pc[2], pc[3], pc[4]):
                # other operands, out or scale arrays of the same shapes, layouts and dtypes as those
                # checked when remembered: only the pointers change (and the scalars, checked here; the
                # remembered launch above has the very scalars checked when it was made)
                launcher = self.kernel.launcher(pa[4])
                if launcher is last[3] and not _unusual_scalars(alpha, beta):
                    M, N, K, a_ld, b_ld, c_ld, grid = last[2]
                    s_ptrs = (0, 0) if scales is NO_SCALES else tuple(p[PTR] if p else 0 for p in same[5])
                    values = (M, N, K, pa[0], a_ld, pb[0], b_ld, pc[0], c_ld, alpha, beta, 0, 0, 0, *s_ptrs)
                    stream = lib.stream(pa[4])
                    scratch = _scratch(lib, pa[4], stream, []) if self.split else None
                    launches = self._launch(launcher, grid, values, stream, pa[4], scratch)
                    if not isinstance(scratch, _GraphScratch):
                        self._remember((same, last[1], last[2], launcher, launches,
                                        runtime.stream_key(stream) if self.split else None))
                    return out
        if (bias is None) != (self.bias_axis is None) or (residual is None) == self.residual or \
                (scales[0] is None) == self.scaled[0] or (scales[1] is None) == self.scaled[1]:
            return None
        if not pa or not pb or _unusual_scalars(alpha, beta):
            return None
        a_ptr, a_shape, a_strides, a_dtype, device = pa
        b_ptr, b_shape, b_strides, b_dtype, b_device = pb
        if a_dtype != self.in_dtype or b_dtype != self.b_dtype or b_device != device:
            return None
        a, b = _matrix(a_shape, a_strides, self.a_row), _matrix(b_shape, b_strides, self.b_row)
        if a is None or b is None or a[1] != b[0]:
            return None
        M, K, a_ld = a
        N, b_ld = b[1], b[2]
        if K == 0 and self.maps:
            return None   # (the general path says why)
        isz = self.in_size
        # (an operand prepared by a first kernel may have any pitch: it reads single elements)
        a_ok = a_ptr % ALIGN == 0 and ((a_ld * isz) % ALIGN == 0 or (M if self.a_row else K) == 1) \
            or "A" in self.prepares
        b_ok = b_ptr % ALIGN == 0 and ((b_ld * isz) % ALIGN == 0 or (K if self.b_row else N) == 1) \
            or "B" in self.prepares
        if not (a_ok and b_ok or repitch):
            return None
        if out is None:
            if beta != 0.0:
                return None
            out = lib.empty((M, N), self.out_dtype, device)
            pc = lib.probe(out)
        if not pc:
            return None
        c_ptr, c_shape, c_strides, c_dtype, c_device = pc
        if c_dtype != self.out_dtype or c_device != device or c_shape != (M, N):
            return None
        c_ld = c_strides[0] if M > 1 else N
        if not (c_strides[1] == 1 or N == 1) or c_ld < N:
            return None
        if self.c_map is not None and self.c_map.problem(c_ptr, M, N, c_ld) is not None:
            return self.kernel.direct_store_kernel().fast_call.run(lib, pa, pb, out, pc, bias, residual, alpha, beta,
                                                                   repitch, scales)
        bias_ptr = r_ptr = r_ld = 0
        if bias is not None:
            pv = interop.library(bias) is lib and lib.probe(bias)
            length = N if self.bias_axis == "col" else M
            if (not pv or pv[DTYPE] != self.out_dtype or pv[DEVICE] != device or tuple(pv[SHAPE]) != (length,)
                    or (length > 1 and pv[STRIDES][0] != 1)):
                return None
            bias_ptr = pv[PTR]
        if residual is not None:
            pr = interop.library(residual) is lib and lib.probe(residual)
            if not pr or pr[DTYPE] != self.out_dtype or pr[DEVICE] != device or tuple(pr[SHAPE]) != (M, N):
                return None
            rm = _matrix(pr[SHAPE], pr[STRIDES], True)
            if rm is None:
                return None
            r_ptr, r_ld = pr[PTR], rm[2]
        s_ptrs = [0, 0]
        for at, (vec, length) in enumerate(zip(scales, (1 if self.scalar_scales[0] else M,
                                                        1 if self.scalar_scales[1] else N))):
            if vec is not None:
                pv = interop.library(vec) is lib and lib.probe(vec)
                if (not pv or pv[DTYPE] != "float32" or pv[DEVICE] != device
                        or (tuple(pv[SHAPE]) not in ((), (1,)) if self.scalar_scales[at] else tuple(pv[SHAPE]) != (length,))
                        or (length > 1 and pv[STRIDES][0] != 1)):
                    return None
                s_ptrs[at] = pv[PTR]
        launcher = self.kernel.launcher(device)
        stream = lib.stream(device)
        keep = None
        if not (a_ok and b_ok):  # re-pitched copies, from the library's stream-ordered allocator
            keep = []
            if not a_ok:
                a_ptr, a_ld = _repitch(lib, a_ptr, a_ld, (M, K) if self.a_row else (K, M), isz, self.in_dtype,
                                       device, stream, keep)
            if not b_ok:
                b_ptr, b_ld = _repitch(lib, b_ptr, b_ld, (K, N) if self.b_row else (N, K), isz, self.in_dtype,
                                       device, stream, keep)
        firsts = ()
        scratch = _scratch(lib, device, stream, []) if self.split or self.prepares else None
        if self.prepares:   # into the stream's scratch
            a_ptr, a_ld, b_ptr, b_ld, K, firsts = self._prepare(M, N, K, a_ptr, a_ld, b_ptr, b_ld, device, stream,
                                                                scratch)
        grid = self.grid(M, N, K, launcher.sm_count)
        values = (M, N, K, a_ptr, a_ld, b_ptr, b_ld, c_ptr, c_ld, alpha, beta, bias_ptr, r_ptr, r_ld, *s_ptrs)
        launches = firsts + self._launch(launcher, grid, values, stream, device, scratch)
        if keep is None and bias is None and residual is None and c_ptr % ALIGN == 0 \
                and not isinstance(scratch, _GraphScratch):
            # (with scales, their probes too: the launches name their pointers)
            self._remember(((pa, pb, pc, alpha, beta) + (() if scales is NO_SCALES else (_scale_probes(lib, scales),)),
                            (pa[1], pa[2], pa[3], pa[4], pb[1], pb[2], pb[3], pb[4], c_shape, c_strides, c_dtype,
                             c_device),
                            (M, N, K, a_ld, b_ld, c_ld, grid), launcher, launches,
                            runtime.stream_key(stream) if scratch is not None else None))
            if scratch is not None:   # (its launches name the scratch: forgotten when it is freed)
                runtime.StreamScratch.remembered_by(self)
        return out

    def _remember(self, entry: tuple) -> None:
        """entry: (the call's probes and scalars, its arrays' shapes, layouts, dtypes and devices,
        what was derived from them, the launcher, the launches made, the scratch's stream key)."""
        self._last = entry
        memo = self._memo
        if len(memo) >= MEMO:   # (a bound on what a loop over many arrays leaves behind)
            memo.clear()
        try:
            memo[entry[0]] = entry
        except TypeError:   # (a probe of an array library that gives unhashable parts)
            pass

    def _recall(self, key):
        """The remembered call with these probes and scalars, or None."""
        try:
            return self._memo.get(key)
        except TypeError:
            return None

    def forget_scratch(self) -> None:
        """Forget the remembered launches (runtime.free_scratch frees the memory they name)."""
        self._last = None
        self._memo.clear()

    def _prepare(self, M, N, K, a_ptr, a_ld, b_ptr, b_ld, device, stream, scratch):
        """The first kernels' copies (gemm/prepare.py) in `scratch` (_scratch: the stream's, which
        runs them and the GEMM that reads them before the next call's copies), each copy launched
        from values laid out once per shape: the GEMM's (A_ptr, A_ld, B_ptr, B_ld, K) and the
        launches made ((launcher, grid, arguments) each)."""
        laid = self._plans.get((M, N, K))
        if laid is None:
            if len(self._plans) >= 64:   # (a bound on what a loop over many shapes leaves behind)
                self._plans.clear()
            preps, k_gemm = plan(self.kernel.spec, M, N, K)
            copy_bytes = [n for p in preps for n in p.nbytes]
            offsets = iter([sum(copy_bytes[:i]) for i in range(len(copy_bytes))])
            laid = self._plans[(M, N, K)] = (k_gemm, sum(copy_bytes), tuple(
                (_FirstKernel.of(p.kernel, p.kind), p.sizes, tuple(zip(p.operands, offsets, p.ld))) for p in preps))
        k_gemm, nbytes, firsts = laid
        base = scratch.workspace(nbytes)
        ops = {"A": (a_ptr, a_ld), "B": (b_ptr, b_ld)}
        launches = ()
        for first, sizes, copies in firsts:   # (each operand's source, then its copy at its offset)
            launches += first(sizes + tuple(v for op, offset, ld in copies for v in (*ops[op], base + offset, ld)),
                              device, stream)
            ops.update((op, (base + offset, ld)) for op, offset, ld in copies)
        return (*ops["A"], *ops["B"], k_gemm, launches)

    def _launch(self, launcher, grid, values, stream, device, scratch=None) -> tuple:
        """The GEMM's launch from the canonical values; split-K and stream-K: its partial sums into
        an f32 workspace of `scratch` (_scratch), then the second kernel's sum and epilogue into C.
        The launches made ((launcher, grid, arguments) each)."""
        if not self.split:
            args = self.arguments(values)
            launcher(grid, args, stream)
            return ((launcher, grid, args),)
        M, N = values[0], values[1]
        check_stream_k_range(self.kernel.spec, M, N, values[2], grid[0])
        rows, cols = workspace_shape(self.kernel.spec, M, N, grid[0])
        values = values + (rows, cols, scratch.workspace(4 * rows * cols), max(cols, 1))
        args = self.arguments(values)
        launcher(grid, args, stream)
        second = self.sum_kernel.launcher(device)
        second_grid = self.sum_grid(M, N, values[2], second.sm_count)
        if 0 in second_grid:
            return ((launcher, grid, args),)
        sum_args = self.sum_pick(values)
        second(second_grid, sum_args, stream)
        return (launcher, grid, args), (second, second_grid, sum_args)

    def arguments(self, values: tuple) -> tuple:
        """The kernel's arguments, in its order, from the canonical tuple (M, N, K, A_ptr, A_ld,
        B_ptr, B_ld, C_ptr, C_ld, alpha, beta, bias_ptr, R_ptr, R_ld, scale_a_ptr, scale_b_ptr;
        then WM, WN, W_ptr, W_ld for two-kernel specs); a TMA kernel's tensor maps are built
        (or found) from it."""
        try:
            if not self.maps:
                return self.pick(values)
            return self.pick(values + _tensor_maps(self.maps, values))
        except IndexError:
            width = len(_CANONICAL) + (len(_WORK) if self.split else 0)
            if len(values) == width:
                raise
            raise ValueError(f"{self.kernel.name}: arguments() takes {width} values ({', '.join(_CANONICAL)}"
                             + (f", {', '.join(_WORK)}" if self.split else "") + f"), got {len(values)}") from None


def _map_layout(kernel, names: tuple) -> tuple:
    """For each of a kernel's tensor maps: (declaration, its map cache, a getter of its key
    (pointer, rows, columns, leading dimension[, stack stride, count]) from positional values
    in the order of `names`), so that a launch builds (or finds) the map without hashing the
    declaration."""
    return tuple((m, map_cache(m), itemgetter(*(names.index(x) for x in m.names))) for m in kernel.tensor_maps)


def _tensor_maps(layout: tuple, values: tuple) -> tuple:
    """The tensor maps (bytes) of a launch from its positional values (_map_layout)."""
    maps = []
    for m, cache, key_of in layout:
        key = key_of(values)
        raw = cache.get(key)
        maps.append(raw if raw is not None else tensor_map_bytes(m, *key))
    return tuple(maps)


def _matrix(shape, strides, row: bool):
    """(rows, cols, ld) of a 2-D array in the layout asked for, or None when it is not one."""
    if len(shape) != 2:
        return None
    r, c = shape
    s0, s1 = strides
    if r == 0 or c == 0:
        return None
    if row:
        if not (s1 == 1 or c == 1):
            return None
        ld = s0 if r > 1 else c
        return (r, c, ld) if ld >= c else None
    if not (s0 == 1 or r == 1):
        return None
    ld = s1 if c > 1 else r
    return (r, c, ld) if ld >= r else None


def _repitch(lib, ptr, ld, stored, esize, dtype, device, stream, keep):
    """An aligned copy of a stored (rows, cols) matrix, enqueued on `stream`: (ptr, ld).
    The copy's array is kept in `keep` until the launch is enqueued; the library's
    allocator then reuses it only for work ordered after it on that stream."""
    rows, cols = stored
    new_ld = padded_ld(cols, esize, ALIGN)
    buf = lib.empty((rows * new_ld,), dtype, device)
    keep.append(buf)
    dst = lib.probe(buf)[PTR]
    copy_2d(dst, new_ld * esize, ptr, ld * esize, cols * esize, rows, stream)
    return dst, new_ld


class _GraphScratch:
    """The scratch of work being captured into a CUDA graph: new arrays of the caller's library
    (the graph's own memory, for as long as the graph lives), held in `keep` until the launches
    are enqueued, the counters zeroed by a memset the graph replays. (A stream's scratch would
    be shared by the replays of every graph captured on that stream, which may run at once.)"""

    def __init__(self, lib, device: int, stream: int, keep: list):
        self.lib, self.device, self.stream, self.keep = lib, device, stream, keep

    def workspace(self, nbytes: int) -> int:
        buf = self.lib.empty((max(-(-nbytes // 4), 1),), "float32", self.device)
        self.keep.append(buf)
        return self.lib.probe(buf)[PTR]

    def counters(self, count: int) -> int:
        ptr = self.workspace(4 * count)
        runtime.zero_async(ptr, count, self.stream)
        return ptr


def _scratch(lib, device: int, stream: int, keep: list):
    """Where a call's workspaces and arrival counters go: the stream's scratch (runtime.
    StreamScratch), or under a graph capture the graph's own memory (_GraphScratch)."""
    if runtime.capturing(stream):
        return _GraphScratch(lib, device, stream, keep)
    return runtime.StreamScratch.of(device, stream)


class _FirstKernel:
    """A first kernel's launch from positional values (its sizes in SIZE_NAMES[kind]'s order,
    then POINTER_NAMES[kind]'s), laid out once per kernel: its parameters picked in order, its
    tensor maps from their own caches, its grid from the sizes."""

    _made: dict = {}

    @classmethod
    def of(cls, kernel, kind: str) -> "_FirstKernel":
        made = cls._made.get((kernel, kind))
        if made is None:
            made = cls._made[(kernel, kind)] = cls(kernel, kind)
        return made

    def __init__(self, kernel, kind: str):
        self.kernel = kernel
        names = SIZE_NAMES[kind] + POINTER_NAMES[kind]
        self.pick = itemgetter(*((names + tuple(m.param for m in kernel.tensor_maps)).index(n) for n, _ in kernel.params))
        self.maps = _map_layout(kernel, names)
        self.grid = kernel.launch_grid.evaluator(SIZE_NAMES[kind])
        self.sizes = len(SIZE_NAMES[kind])

    def __call__(self, values: tuple, device: int, stream) -> tuple:
        """Launch it; the launch made ((launcher, grid, arguments)), or () for an empty grid."""
        launcher = self.kernel.launcher(device)
        grid = self.grid(*values[:self.sizes], launcher.sm_count)
        if 0 in grid:
            return ()
        args = self.pick(values + _tensor_maps(self.maps, values))
        launcher(grid, args, stream)
        return ((launcher, grid, args),)


# ---- host arrays: through the GPU or the emulator ----------------------------------------

PROGRESS_S = 5.0          # emulations estimated longer than this report their progress,
TICK_S = 5.0              # this often
def _progress(message: str) -> None:
    """A long emulation's progress (sim/progress.py says how)."""
    from ..sim.progress import say

    say(message)


def refuse_long_emulation(M: int, N: int, K: int) -> None:
    """Without a GPU and without device="sim": a GEMM the emulator needs more than
    EMULATOR_LIMIT_S for is refused at once, before compiling (a lower bound from its size)."""
    from ..sim.estimate import gemm_seconds_at_least

    _refuse(f"this {M}x{N}x{K} GEMM", gemm_seconds_at_least(M, N, K), hint=" (tilegen run: --device sim)")


class _SimMemory(EmulatorMemory):
    """Host arrays through the CPU emulator's global memory, a GEMM's launch with its first and
    second kernels and workspace. Before a launch it estimates the emulator's time
    (sim/estimate.py): without device="sim" (`explicit`), a launch over EMULATOR_LIMIT_S is
    refused; a long one reports its progress (_progress)."""

    def launch(self, kernel, args, sizes):
        from ..sim.estimate import estimate_seconds
        from ..sim.runner import EMULATOR_SM_COUNT, run_kernel

        spec = kernel.spec
        prepared = bool(getattr(spec, "prepared_operands", ()))
        preps, k_run = preparations(spec, args) if prepared else ((), sizes["K"])   # (the K the GEMM runs over)
        x, y, z = kernel.grid(sizes, EMULATOR_SM_COUNT)
        trips = -(-k_run // spec.tile.k) if spec is not None else 1
        if spec is not None and spec.split_k > 1:   # (each row of CTAs walks one slice of K)
            trips = -(-trips // spec.split_k)
        count = args.get("BATCH", sizes.get("BATCH", 1))
        if spec is not None and spec.persistent and not (spec.split_k > 1 or spec.stream_k):
            blocks = -(-sizes["M"] // spec.tile.m) * -(-sizes["N"] // spec.tile.n) * count
            trips *= -(-blocks // max(x * y * z, 1))   # (each CTA walks its share of the blocks)
        est = estimate_seconds(kernel.ptx, x * y * z, trips)
        shape = f"{sizes['M']}x{sizes['N']}x{sizes['K']}"
        what = f"this stack of {count} {shape} GEMMs" if count > 1 else f"this {shape} GEMM"
        if not self.explicit:
            _refuse(what, est, "about", hint=" (tilegen run: --device sim)")
        if prepared:   # the operands' first kernels
            K = k_run
            for p in preps:
                dests = tuple(self.put(np.full(max(n // 4, 1), np.nan, np.float32)) for n in p.nbytes)   # (poisoned)
                first = p.arguments(tuple((args[f"{op}_ptr"], args[f"{op}_ld"]) for op in p.operands), dests)
                run_kernel(p.kernel, first, first, self.memory)
                for op, ptr, ld in zip(p.operands, dests, p.ld):
                    args = {**args, f"{op}_ptr": ptr, f"{op}_ld": ld}
            args, sizes = {**args, "K": K}, {**sizes, "K": K}
        second = kernel.second_kernel() if hasattr(kernel, "second_kernel") else None
        if spec is not None and (spec.split_k > 1 or spec.stream_k):   # partial sums (split-K's slices, stream-K's pieces)
            check_stream_k_range(kernel.spec, sizes["M"], sizes["N"], sizes["K"], x)
            rows, cols = workspace_shape(kernel.spec, sizes["M"], sizes["N"], x, count)
            counters = self.put(np.zeros(max(stack_counters(spec, sizes["M"], sizes["N"], count), 1), np.uint32)) \
                if spec.batched else 0
            w = workspace_arguments(kernel.spec, rows, cols, self.put(np.full(max(rows * cols, 1), np.nan, np.float32)),
                                    sizes["M"], sizes["N"], counters)   # (poisoned: a slot read before it is written shows)
            args, sizes = {**args, **w}, {**sizes, "WM": rows, "WN": cols}
        if second is not None:   # then C from them (the GEMM's own progress below, not each kernel's)
            run = lambda: (run_kernel(kernel, args, sizes, self.memory, progress=False),  # noqa: E731
                           run_kernel(second, args, sizes, self.memory, progress=False))
        else:
            run = lambda: run_kernel(kernel, args, sizes, self.memory, progress=False)  # noqa: E731
        if est <= PROGRESS_S:
            run()
            return
        from ..sim.progress import ticking

        _progress(f"emulating {shape} on the CPU: about {duration(est)}")
        with ticking(lambda seconds: f"emulating {shape}: {seconds:.0f} s of about {duration(est)}", TICK_S, TICK_S):
            run()


def _run_host(kernel, A, B, out, alpha, beta, bias, residual, memory, scales=NO_SCALES):
    spec = kernel.spec
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    check_host(A, "A", in_dt, spec.dtype)
    check_host(B, "B", numpy_dtype(spec.b_dtype), spec.b_dtype)
    if out is not None:
        check_host(out, "out", out_dt, spec.out_dtype)
        check_writable(out)
    M, N, K = _shapes(A, B, out)
    if beta != 0.0 and out is None:
        raise LaunchError("beta != 0 reads C from out=; pass out")
    if out is None:
        out = np.empty((M, N), dtype=out_dt)
    if M == 0 or N == 0:
        return out
    if K == 0 and kernel.tensor_maps:
        raise empty_k_error(kernel)
    try:
        a_stored, lda = _pitched(A if spec.a_layout == "row" else A.T)
        b_stored, ldb = _pitched(B if spec.b_layout == "row" else B.T)
        c_host, ldc = _pitched(out)   # rows 16-byte aligned: a TMA store's tensor map takes them
    except MemoryError:   # (a broadcast view's dense copy can be far larger than the view)
        memory.close()
        sizes = sum((x.shape[0] * x.shape[1] * x.itemsize) for x in (A, B, out))
        raise LaunchError(f"the {M}x{N}x{K} product's operands, copied into dense rows for the launch ({sizes} bytes "
                          f"for A, B and C), do not fit in this machine's memory") from None
    try:
        args = {"M": M, "N": N, "K": K, "A_ptr": memory.put(a_stored), "A_ld": lda,
                "B_ptr": memory.put(b_stored), "B_ld": ldb, "C_ptr": memory.put(c_host, copy=beta != 0), "C_ld": ldc,
                "alpha": alpha, "beta": beta}
        if bias is not None:
            length = N if spec.epilogue.bias == "col" else M
            check_host(bias, "bias", out_dt, spec.out_dtype, ndim=1)
            if bias.shape[0] != length:
                raise LaunchError(f"bias has {bias.shape[0]} elements; a bias per {spec.epilogue.bias} needs {length}")
            args["bias_ptr"] = memory.put(np.ascontiguousarray(bias))
        if residual is not None:
            check_host(residual, "residual", out_dt, spec.out_dtype)
            if residual.shape != (M, N):
                raise LaunchError(f"residual has shape {residual.shape}; expected ({M}, {N})")
            args["R_ptr"], args["R_ld"] = memory.put(np.ascontiguousarray(residual)), N
        for vec, name, length in zip(scales, ("scale_a", "scale_b"), scale_lengths(spec, M, N)):
            if vec is not None:
                vec = vec.reshape(-1) if length == 1 else vec   # (a per-tensor scale: any one-element shape)
                check_host(vec, name, np.dtype(np.float32), "f32", ndim=1)
                if vec.shape[0] != length:
                    raise LaunchError(f"{name} has {vec.shape[0]} elements; it scales each of the {length} "
                                      f"{'rows' if name == 'scale_a' else 'columns'}")
                args[f"{name}_ptr"] = memory.put(np.ascontiguousarray(vec))
        memory.launch(kernel, args, {"M": M, "N": N, "K": K})
        memory.get(args["C_ptr"], c_host)
    finally:
        memory.close()
    if c_host is not out:   # (C went out through a padded copy)
        out[...] = c_host[:M, :N]
    return out


# ---- stacks of matrices (a batched spec: one launch, grid row y on matrix y) -----------------

MAX_STRIDE_BYTES = 2 ** 32   # a batch stride in bytes is a 32-bit product in the kernel (dsl/batched.py)


def run_batched(kernel, A, B, out, count: int, *, alpha=1.0, beta=0.0, bias=None, residual=None, device=None):
    """C[b] = act(alpha * A[b] @ B[b] + beta * C[b] + bias) + residual[b] for b < count, one
    launch of a batched spec's kernel. A is (1 or count, M, K), B (1 or count, K, N) (a stack of
    one is the same matrix for every b: batch stride 0), out and residual (count, M, N). numpy
    stacks run through the GPU or the emulator; GPU arrays are used in place when their
    matrices and pitches are 16-byte aligned, else None is returned (the caller multiplies
    matrix by matrix, re-pitching them)."""
    alpha, beta = check_scalars(alpha, beta)
    M, K = int(A.shape[1]), int(A.shape[2])
    N = int(B.shape[2])
    sizes = {"M": M, "N": N, "K": K, "BATCH": count}
    if all(x is None or _is_host(x) for x in (A, B, out, bias, residual)):
        return _run_batched_host(kernel, A, B, out, count, sizes, alpha, beta, bias, residual, device)
    lib = interop.library(A)
    if lib is None or device is not None or any(x is not None and interop.library(x) is not lib
                                                 for x in (B, out, bias, residual)):
        return None
    pa, pb = lib.probe(A), lib.probe(B)
    pc = None if out is None else lib.probe(out)
    pr = None if residual is None else lib.probe(residual)
    if not pa or not pb or (out is not None and not pc) or (residual is not None and not pr):
        return None
    return kernel.batched_call.run(lib, pa, pb, out, pc, count, bias, pr, alpha, beta)


_BATCHED = ("M", "N", "K", "BATCH", "A_ptr", "A_ld", "A_batch_stride", "B_ptr", "B_ld", "B_batch_stride",
            "C_ptr", "C_ld", "C_batch_stride", "alpha", "beta", "bias_ptr", "R_ptr", "R_ld", "R_batch_stride")
_WORKSPACE = ("W_ptr", "W_ld", "W_batch_stride", "F_ptr")   # (split-K stacks: their workspace_arguments)


COORD_LIMIT = 2 ** 31   # TMA's coordinates are signed 32-bit
# (the stack row that names a block, template.TmaStack: matrix * M + row, a 32-bit product)
STACK_ROWS_LIMIT = 2 ** 32


def stack_problem(spec, M: int, N: int, K: int, count: int):
    """Why a stack cannot run on a batched spec's warp-specialized kernel (template.TmaStack: its
    operands through 3-D tensor maps), or None; every other batched spec takes any stack."""
    if not (spec.batched and spec.persistent):
        return None
    if min(M, N, K) == 0:
        return "a dimension is empty (TMA describes no empty matrix)"
    if max(M, N, K, count) >= COORD_LIMIT:
        return f"a dimension of {max(M, N, K, count)} is over TMA's signed 32-bit coordinates"
    if count * M >= STACK_ROWS_LIMIT:
        return f"its {count} x {M} rows are over the kernel's 32-bit stack rows"
    if spec.split_k > 1 and M * N * 4 >= MAX_STRIDE_BYTES:
        return (f"each product's f32 partial sums ({M} x {N}) take 4 GiB or more, and split-K's workspace "
                f"matrices must lie under 4 GiB apart")
    if spec.split_k * count >= STACK_ROWS_LIMIT:
        return f"its {spec.split_k} slices x {count} matrices of partial sums are over the kernel's 32-bit index"
    return None


def refuse_stack(spec, M: int, N: int, K: int, count: int) -> None:
    """LaunchError when a TMA stack kernel cannot take this stack (stack_problem says why)."""
    why = stack_problem(spec, M, N, K, count)
    if why is not None:
        raise LaunchError(f"this batched kernel reads stacks through TMA, which this stack does not allow: {why}; "
                          f"use a batched spec with copy='cp.async' (tilegen.matmul picks one)")


class BatchedCall:
    """A batched kernel's launch from PyTorch / CuPy stacks, prepared once per kernel: the
    arrays' probes (runtime/interop.py) of shape (1 or count, rows, cols) placed and packed into
    one launch on the library's current stream."""

    def __init__(self, kernel):
        spec = kernel.spec
        self.kernel = kernel
        self.types = (arch_dtype(spec.dtype), arch_dtype(spec.b_dtype), arch_dtype(spec.out_dtype))
        self.rows = (spec.a_layout == "row", spec.b_layout == "row")
        self.bias = spec.epilogue.bias   # None, "col" (N values) or "row" (M)
        self.residual = spec.epilogue.residual
        self.tma = spec.persistent   # (template.TmaStack: the whole stack in one launch, any strides)
        self.direct_c = spec.store != "tma"   # C written by direct stores, which take any pitch
        # split-K (TMA stacks): the slices' partial sums into a workspace, added by the last slice
        # of each block to arrive (template.gemm), both kept per stream (runtime.StreamScratch)
        self.split = spec.split_k > 1
        values = _BATCHED + (_WORKSPACE if self.split else ())
        self.maps = _map_layout(kernel, values)
        names = values + tuple(m.param for m in kernel.tensor_maps)
        self.pick = itemgetter(*(names.index(n) for n, _ in kernel.params))
        self.grid = kernel.launch_grid.evaluator(("M", "N", "K", "BATCH"))
        # The last call of one launch without copies or epilogue vectors: its arrays' probes, count and
        # scalars, with its launcher, grid, arguments and (split-K, whose arguments name the stream's
        # scratch) stream. A loop over the same arrays launches them again.
        self._last = None

    @staticmethod
    def _c_unaligned(pc, pb, tc, dev) -> bool:
        """Whether C (out's probe; or, with no out, the C this call would make) is a stack whose rows
        or matrices are not 16-byte aligned (otherwise fit for a TMA store)."""
        if pc is None:   # (a new stack's matrices are whole numbers of its rows apart)
            return len(pb[SHAPE]) == 3 and bool((pb[SHAPE][2] * tc.bytes) % ALIGN)
        return _stack_place(pc, True, tc, dev, output=True) is None and \
            _stack_place(pc, True, tc, dev, output=True, aligned=False) is not None

    def run(self, lib, pa, pb, out, pc, count: int, bias, pr, alpha, beta):
        """out (made when None; then beta must be 0), or None when the arrays do not fit: another
        layout or device, an epilogue operand missing, a stack TMA cannot describe."""
        if type(alpha) not in _NUMBERS or type(beta) not in _NUMBERS:
            return None   # (the general path converts them, or says what is wrong: check_scalars)
        last = self._last
        if last is not None and pc is not None and bias is None and pr is None \
                and (pa, pb, pc, count, alpha, beta) == last[0] \
                and (alpha or copysign(1.0, alpha) == copysign(1.0, last[0][4])):   # (-0.0 signs C's zeros)
            launcher = self.kernel.launcher(pa[DEVICE])
            stream = lib.stream(pa[DEVICE])
            if launcher is last[1] and (last[4] is None or last[4] == runtime.stream_key(stream)
                                        and not runtime.capturing(stream)):
                launcher(last[2], last[3], stream)
                return out
        if (bias is None) != (self.bias is None) or (pr is None) == self.residual or _unusual_scalars(alpha, beta):
            return None   # (the remembered launch above has the very scalars checked when it was made)
        dev = pa[DEVICE]
        ta, tb, tc = self.types
        if not self.direct_c and self._c_unaligned(pc, pb, tc, dev):
            # C's rows or matrices cannot take TMA stores: the kernel's twin that stores directly (any pitch, C in place)
            return self.kernel.direct_store_kernel().batched_call.run(lib, pa, pb, out, pc, count, bias, pr, alpha,
                                                                       beta)
        # Operands whose rows or matrices are not 16-byte aligned go through aligned copies (enqueued
        # only once everything fits).
        keep = []
        a, b = (_aligned_stack(lib, p, row, t, dev, keep) for p, row, t in ((pa, self.rows[0], ta), (pb, self.rows[1], tb)))
        if a is None or b is None or a[0][3][1] != b[0][3][0] or pa[SHAPE][0] not in (1, count) \
                or pb[SHAPE][0] not in (1, count):
            return None
        (a, a_in), (b, b_in) = a, b
        (M, K), N = a[3], b[3][1]
        if out is None:
            if beta:
                return None
            out = lib.empty((count, M, N), tc.storage, dev)
            pc = lib.probe(out)
        # C in place: direct stores take any pitch, TMA stores 16-byte aligned rows and matrices (_c_unaligned)
        c = _stack_place(pc, True, tc, dev, output=True, aligned=not self.direct_c)
        if c is None or pc[SHAPE] != (count, M, N):
            return None
        r, r_in = (0, 0, 0), None
        if pr is not None:
            placed = _aligned_stack(lib, pr, True, tc, dev, keep)
            if placed is None or pr[SHAPE] != (count, M, N):
                return None
            r, r_in = placed[0][:3], placed[1]
        bias_ptr = 0
        if bias is not None:
            pv = interop.library(bias) is lib and lib.probe(bias)
            length = N if self.bias == "col" else M
            if not pv or pv[DTYPE] != tc.storage or pv[DEVICE] != dev or tuple(pv[SHAPE]) != (length,) \
                    or (length > 1 and pv[STRIDES][0] != 1):
                return None
            bias_ptr = pv[PTR]
        launcher = self.kernel.launcher(dev)
        stream = lib.stream(dev)
        if count == 0:
            return out
        if self.tma and stack_problem(self.kernel.spec, M, N, K, count) is not None:
            return None
        for copy in (a_in, b_in, r_in):
            if copy is not None:
                _copy_stack(*copy, stream)
        launches = []
        if self.tma:   # every matrix through 3-D tensor maps (stack_problem)
            values = (M, N, K, count, *a[:3], *b[:3], *c[:3], float(alpha), float(beta), bias_ptr, *r)
            if self.split:   # (the workspace and counters of this stream's scratch)
                scratch = _scratch(lib, dev, stream, keep)
                rows, cols = workspace_shape(self.kernel.spec, M, N, 0, count)
                values += (scratch.workspace(4 * rows * cols), N, M * N,
                           scratch.counters(stack_counters(self.kernel.spec, M, N, count)))
            launches.append((self.grid(M, N, K, count, launcher.sm_count),
                             self.pick(values + _tensor_maps(self.maps, values))))
        else:
            sizes = (ta.bytes, tb.bytes, tc.bytes, tc.bytes)
            for start, n in _chunks(count):   # (grid.y takes up to GRID_Y matrices at a time)
                grid = self.grid(M, N, K, n, launcher.sm_count)
                if 0 in grid:
                    break
                (pa_, pb_, pc_, pr_) = (p[0] + start * p[2] * e for p, e in zip((a, b, c, r), sizes))
                values = (M, N, K, n, pa_, *a[1:3], pb_, *b[1:3], pc_, *c[1:3], float(alpha), float(beta), bias_ptr,
                          pr_, *r[1:3])
                launches.append((grid, self.pick(values)))
        for grid, args in launches:
            launcher(grid, args, stream)
        if len(launches) == 1 and not keep and bias is None and pr is None:   # (one launch, nothing copied or captured)
            self._last = ((pa, pb, pc, count, alpha, beta), launcher, *launches[0],
                          runtime.stream_key(stream) if self.split else None)
            if self.split:   # (its arguments name the scratch: forgotten when it is freed)
                runtime.StreamScratch.remembered_by(self)
        return out

    def forget_scratch(self) -> None:
        """Forget the remembered launch (runtime.free_scratch frees the memory it names)."""
        self._last = None


GRID_Y = 65535   # matrices per launch of a batched kernel (its grid's y extent)


def _chunks(count: int):
    """(first matrix, matrices) of each launch a stack of `count` takes."""
    return [(start, min(GRID_Y, count - start)) for start in range(0, count, GRID_Y)]


def _stack_place(p, row: bool, dt, device, output: bool = False, aligned: bool = True):
    """(ptr, ld, batch stride, (rows, cols)) of a probed stack (n, rows, cols) of arch dtype `dt`
    in the layout asked for, or None when it is not one, is on another device, is not 16-byte
    aligned for cp.async and TMA (with aligned=False that is allowed: see _aligned_stack), or
    (an output) has matrices that overlap."""
    if not p or p[DEVICE] != device or len(p[SHAPE]) != 3 or p[DTYPE] != dt.storage:
        return None
    ptr, (n, r, c), (sb, s0, s1) = p[PTR], p[SHAPE], p[STRIDES]
    m = _matrix((r, c), (s0, s1), row)
    if m is None:
        return None
    ld, esize = m[2], dt.bytes
    stride = sb if n > 1 else 0
    if stride < 0 or stride * esize >= MAX_STRIDE_BYTES or (
            aligned and (ptr % ALIGN or (ld * esize) % ALIGN or (stride * esize) % ALIGN)):
        return None
    if output and n > 1 and stride < (r if row else c) * ld:
        return None
    return ptr, ld, stride, (r, c)


def _aligned_stack(lib, p, row: bool, dt, device, keep: list):
    """An operand's probed stack placed as _stack_place places it, in place where its matrices and
    rows are 16-byte aligned, else in a new aligned array (kept in `keep` until the launch is
    enqueued): (place, None) or (place, the copy into the new array for _copy_stack, to enqueue
    before the launch), or None when the stack is not one."""
    place = _stack_place(p, row, dt, device)
    if place is not None:
        return place, None
    place = _stack_place(p, row, dt, device, aligned=False)
    if place is None:
        return None
    ptr, ld, stride, (r, c) = place
    esize = dt.bytes
    n = p[SHAPE][0] if stride else 1   # (a matrix for every index, stride 0: one copy serves them all)
    rows, cols = (r, c) if row else (c, r)
    new_ld = padded_ld(cols, esize, ALIGN)
    if n > 1 and rows * new_ld * esize >= MAX_STRIDE_BYTES:
        return None
    buf = lib.empty((max(n * rows * new_ld, 1),), dt.storage, device)
    keep.append(buf)
    new = (lib.probe(buf)[PTR], new_ld, rows * new_ld if n > 1 else 0)
    return (*new, (r, c)), (new, (ptr, ld, stride), n, rows, cols, esize)


def _copy_stack(dst, src, n: int, rows: int, cols: int, esize: int, stream) -> None:
    """Copy n matrices of rows x cols elements from the stack src to the stack dst, each given as
    (pointer, ld, stride) in elements: one 2-D copy where both stacks' rows are evenly spaced
    (each matrix right after the one before), else one per matrix."""
    (dp, dld, ds), (sp, sld, ss) = dst, src
    if n == 1 or (ds == rows * dld and ss == rows * sld):
        copy_2d(dp, dld * esize, sp, sld * esize, cols * esize, n * rows, stream)
        return
    for i in range(n):
        copy_2d(dp + i * ds * esize, dld * esize, sp + i * ss * esize, sld * esize, cols * esize, rows, stream)


def _run_batched_host(kernel, A, B, out, count, sizes, alpha, beta, bias, residual, device):
    spec = kernel.spec
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    M, N, K = sizes["M"], sizes["N"], sizes["K"]
    check_host(A, "A", in_dt, spec.dtype, ndim=3)
    check_host(B, "B", numpy_dtype(spec.b_dtype), spec.b_dtype, ndim=3)
    if out is None:
        if beta != 0.0:
            raise LaunchError("beta != 0 reads C from out=; pass out")
        out = np.empty((count, M, N), dtype=out_dt)
    check_host(out, "out", out_dt, spec.out_dtype, ndim=3)
    check_writable(out)
    if residual is not None:
        check_host(residual, "residual", out_dt, spec.out_dtype, ndim=3)
        if residual.shape != (count, M, N):
            raise LaunchError(f"residual has shape {residual.shape}; expected {(count, M, N)}")
    if bias is not None:
        check_host(bias, "bias", out_dt, spec.out_dtype, ndim=1)
        length = N if spec.epilogue.bias == "col" else M
        if bias.shape[0] != length:
            raise LaunchError(f"bias has {bias.shape[0]} elements; a bias per {spec.epilogue.bias} needs {length}")
    if M == 0 or N == 0 or count == 0:
        return out
    refuse_stack(spec, M, N, K, count)
    if device == "sim":
        memory = _SimMemory(explicit=True)
    elif device is None and not runtime.gpu_available():
        memory = _SimMemory(explicit=False)
    else:
        memory = GpuMemory(device if isinstance(device, int) else 0)
    try:
        args = {"M": M, "N": N, "K": K, "alpha": alpha, "beta": beta}
        c_host = None
        for name, x, row in (("A", A, spec.a_layout == "row"), ("B", B, spec.b_layout == "row"), ("C", out, True),
                             ("R", residual, True)):
            if x is None:
                continue
            stored, ld = _pitched_stack(x if row else x.swapaxes(1, 2))
            if x.shape[0] > 1 and stored.shape[1] * ld * stored.itemsize >= MAX_STRIDE_BYTES:
                raise LaunchError(f"each matrix of {name} is 4 GiB or more: a stack's matrices must be under 4 GiB apart")
            args[f"{name}_ptr"], args[f"{name}_ld"] = memory.put(stored, copy=name != "C" or beta != 0), ld
            args[f"{name}_batch_stride"] = stored.shape[1] * ld if x.shape[0] > 1 else 0
            if name == "C":
                c_host = stored
        if bias is not None:
            args["bias_ptr"] = memory.put(np.ascontiguousarray(bias))
        esize = {"A": numpy_dtype(spec.dtype).itemsize, "B": numpy_dtype(spec.b_dtype).itemsize}
        if spec.persistent:   # every matrix in one launch (template.TmaStack)
            memory.launch(kernel, {**args, "BATCH": count}, sizes)
        for start, n in _chunks(count) if not spec.persistent else ():   # (grid.y: up to GRID_Y matrices a launch)
            moved = {f"{t}_ptr": args[f"{t}_ptr"] + start * args[f"{t}_batch_stride"] * esize.get(t, out_dt.itemsize)
                     for t in "ABCR" if f"{t}_ptr" in args}
            memory.launch(kernel, {**args, **moved}, {**sizes, "BATCH": n})
        memory.get(args["C_ptr"], c_host)
    finally:
        memory.close()
    out[...] = c_host[:, :M, :N]
    return out


def _pitched_stack(stored: np.ndarray) -> tuple[np.ndarray, int]:
    """_pitched for each matrix of a (n, rows, cols) stack: one (n, rows, ld) copy."""
    return pitched_copy(stored, ALIGN)


# ---- other GPU arrays: described and checked ------------------------------------------------

def _aligned(view, stream, keep: list):
    """(pointer, ld) of `view`, re-pitched into a 16-byte aligned stream-ordered allocation
    when its base or row pitch does not allow 16-byte copies."""
    esize = view.dtype.itemsize
    if view.ptr % ALIGN == 0 and (view.ld * esize) % ALIGN == 0:
        return view.ptr, view.ld
    rows, cols = (view.rows, view.cols) if view.layout == "row" else (view.cols, view.rows)
    ld = padded_ld(cols, esize, ALIGN)
    buf = runtime.StreamBuffer(max(rows, 1) * ld * esize, stream)
    keep.append(buf)
    copy_2d(buf.ptr, ld * esize, view.ptr, view.ld * esize, cols * esize, rows, stream)
    return buf.ptr, ld


def _run_device(kernel, A, B, out, alpha, beta, bias, residual, repitch=False, scales=NO_SCALES):
    spec = kernel.spec
    if kernel.tensor_maps and len(getattr(A, "shape", ())) == 2 and A.shape[1] == 0:
        raise empty_k_error(kernel)
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    # (operands prepared by first kernels may have any pitch: they read single elements)
    align = {op: None if repitch or op in spec.prepared_operands else ALIGN for op in "AB"}
    a = runtime.describe_array(A, name="A", dtype=in_dt, shape=None, layout=spec.a_layout, writable=False,
                               align=align["A"], on_gpu=True)
    b = runtime.describe_array(B, name="B", dtype=numpy_dtype(spec.b_dtype), shape=None, layout=spec.b_layout, writable=False,
                               align=align["B"], on_gpu=True)
    M, K = a.rows, a.cols
    if b.rows != K:
        raise LaunchError(f"A is {M} x {K} but B is {b.rows} x {b.cols}: inner dimensions differ")
    N = b.cols
    if out is None:
        if beta != 0.0:
            raise LaunchError("beta != 0 reads C from out=; pass out")
        out = _empty_like_device(A, (M, N), out_dt)
    c = runtime.describe_array(out, name="out", dtype=out_dt, shape=(M, N), layout="row", writable=True, align=None,
                               on_gpu=True)
    if M == 0 or N == 0:
        return out
    c_map = _c_map(kernel)
    if c_map is not None and c_map.problem(c.ptr, M, N, c.ld) is not None:
        kernel = kernel.direct_store_kernel()   # C's rows do not suit TMA stores
    lib = interop.library(A)
    stream = lib.stream(a.device or 0) if lib is not None else 0
    keep: list = []  # re-pitched copies, freed in stream order after the kernel
    a_ptr, a_ld = _aligned(a, stream, keep) if repitch and "A" not in spec.prepared_operands else (a.ptr, a.ld)
    b_ptr, b_ld = _aligned(b, stream, keep) if repitch and "B" not in spec.prepared_operands else (b.ptr, b.ld)
    args = {"M": M, "N": N, "K": K, "A_ptr": a_ptr, "A_ld": a_ld, "B_ptr": b_ptr, "B_ld": b_ld,
            "C_ptr": c.ptr, "C_ld": c.ld, "alpha": alpha, "beta": beta}
    if bias is not None:
        length = N if spec.epilogue.bias == "col" else M
        if tuple(getattr(bias, "shape", ())) != (length,):
            raise LaunchError(f"bias must have shape ({length},) for a bias per {spec.epilogue.bias}, "
                              f"got {tuple(getattr(bias, 'shape', ()))}")
        args["bias_ptr"] = runtime.describe_array(bias.reshape(1, length), name="bias", dtype=out_dt,
                                                  shape=(1, length), layout="row", on_gpu=True).ptr
    if residual is not None:
        r = runtime.describe_array(residual, name="residual", dtype=out_dt, shape=(M, N), layout="row", on_gpu=True)
        args["R_ptr"], args["R_ld"] = r.ptr, r.ld
    for vec, name, length in zip(scales, ("scale_a", "scale_b"), scale_lengths(spec, M, N)):
        if vec is not None:
            vec = vec.reshape(-1) if length == 1 else vec   # (a per-tensor scale: any one-element shape)
            if tuple(getattr(vec, "shape", ())) != (length,):
                raise LaunchError(f"{name} must have shape ({length},), got {tuple(getattr(vec, 'shape', ()))}")
            args[f"{name}_ptr"] = runtime.describe_array(vec.reshape(1, length), name=name, dtype=np.float32,
                                                         shape=(1, length), layout="row", on_gpu=True).ptr
    try:
        kernel.launch(args, {"M": M, "N": N, "K": K}, stream=stream)
    finally:
        for buf in keep:
            buf.free()  # stream-ordered: after the kernel that reads it
    return out


def _empty_like_device(x, shape, dtype):
    """A new GPU array of the same library as `x` (torch or CuPy)."""
    lib = interop.library(x)
    if lib is None:
        raise LaunchError(f"pass out= for GPU arrays of type {type(x).__name__}")
    dev = interop.probe(x)
    return lib.empty(shape, np.dtype(dtype).name, dev[DEVICE] if dev else 0)


__all__ = ["run_gemm", "FastCall", "check_epilogue", "ALIGN"]
