"""GemmKernel: a compiled GEMM, callable on arrays: kernel(A, B, out=C)."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from .. import compiler, runtime
from ..compiler import Kernel
from ..errors import LaunchError
from .call import (NO_SCALES, BatchedCall, FastCall, check_device, check_epilogue, check_scalars, check_stream_k_range,
                   refuse_stack, run_batched, run_gemm, stack_counters, workspace_arguments,
                   workspace_shape)
from .template import trace_gemm, trace_split_k_sum, trace_stream_k_fixup
from .prepare import preparations


@dataclass(frozen=True)
class SplitKSum:
    """What names a split-K spec's second kernel (the ordered sum of the slices' partials and
    the epilogue) in the compiled-kernel memo and the disk cache."""
    gemm: object   # the GemmSpec

    @property
    def target(self) -> str:
        return self.gemm.target


@dataclass(frozen=True)
class StreamKFixup(SplitKSum):
    """What names a stream-K spec's second kernel (the pieces' ordered sums and the epilogue)."""


class GemmKernel(Kernel):
    """A Kernel whose spec is a GemmSpec: C = act(alpha * A @ B + beta * C + bias) + residual."""

    _fast = None
    _batched = None
    _direct = None
    _sum = None
    _one_launch = None   # whether launch() is Kernel.launch alone (decided on the first launch)

    _sim_refusal = "kernel.launch of a GEMM runs on the GPU; on the CPU emulator call it on arrays: " \
                   "kernel(A, B, out=C, device='sim')"

    def direct_store_kernel(self) -> "GemmKernel":
        """This kernel, or for a spec with store="tma" its twin that writes C directly (for
        outputs whose rows TMA cannot take), compiled once."""
        if self.spec.store != "tma":
            return self
        if self._direct is None:
            self._direct = compile_gemm(self.spec.replace(store="direct"))
        return self._direct

    def split_sum_kernel(self) -> Kernel:
        """A split-K spec's second kernel (template.split_k_sum), compiled once."""
        if self._sum is None:
            self._sum = compiler.compile_spec(SplitKSum(self.spec), lambda s: trace_split_k_sum(s.gemm))
        return self._sum

    def second_kernel(self):
        """The kernel that adds the f32 workspace's partial sums into C with the epilogue:
        split-K's sum of slices or stream-K's fix-up; None for one-kernel specs (a split-K
        stack's last slice to finish a block adds the slices itself: template.gemm)."""
        if self.spec.split_k > 1 and not self.spec.batched:
            return self.split_sum_kernel()
        if self.spec.stream_k:
            if self._sum is None:
                self._sum = compiler.compile_spec(StreamKFixup(self.spec), lambda s: trace_stream_k_fixup(s.gemm))
            return self._sum
        return None

    def launch(self, args: dict, sizes: dict, stream=None, device: int = 0):
        """Kernel.launch; with split_k > 1 or stream_k (2-D) the two kernels on `stream`, the f32
        workspace taken from and given back to the stream-ordered allocator in between; a split-K
        stack in one launch, its workspace and arrival counters from the stream's scratch (or,
        while the stream captures a graph, the graph's own); with operands prepared first
        (pretranspose, f32 on wgmma: gemm/prepare.py), their kernels before, into workspaces from
        the stream-ordered allocator."""
        if self._one_launch:   # (the hot path first: Kernel.launch refuses device="sim" with _sim_refusal)
            return Kernel.launch(self, args, sizes, stream, device)
        if device == "sim":
            raise LaunchError(f"{self.name}: {self._sim_refusal}")
        if self._one_launch is None:   # (no first kernels, no second kernel, no stack's workspace)
            spec = self.spec
            self._one_launch = not spec.prepared_operands and self.second_kernel() is None and \
                not (spec.split_k > 1 and spec.batched)
            if self._one_launch:
                return Kernel.launch(self, args, sizes, stream, device)
        if self.spec.prepared_operands:
            handle = int(runtime.stream_handle(stream))
            preps, K = preparations(self.spec, args)
            copies = []
            try:
                for p in preps:
                    dests = [runtime.StreamBuffer(max(n, 4), handle, device) for n in p.nbytes]
                    copies += dests
                    first = p.arguments(tuple((args[f"{op}_ptr"], args[f"{op}_ld"]) for op in p.operands),
                                        tuple(d.ptr for d in dests))
                    p.kernel.launch(first, first, stream=handle, device=device)
                    for op, dest, ld in zip(p.operands, dests, p.ld):
                        args = {**args, f"{op}_ptr": dest.ptr, f"{op}_ld": ld}
                        args.pop(f"{op}_tmap", None)   # (a map given for the operand describes the original)
                return super().launch({**args, "K": K}, {**sizes, "K": K}, stream=handle, device=device)
            finally:
                for buf in copies:
                    buf.free()   # stream-ordered: after the GEMM that reads it
        second = self.second_kernel()
        if self.spec.split_k > 1 and self.spec.batched:   # one launch: the stream's workspace and counters
            M, N, count = int(sizes["M"]), int(sizes["N"]), int(args.get("BATCH", sizes.get("BATCH", 1)))
            refuse_stack(self.spec, M, N, int(sizes["K"]), count)   # (the workspace's matrices: a 32-bit stride and index)
            handle = int(runtime.stream_handle(stream))
            rows, cols = workspace_shape(self.spec, M, N, 0, count)
            counters = stack_counters(self.spec, M, N, count)
            bufs = []
            if runtime.capturing(handle):   # (the graph's own memory: graphs captured on one stream may run at once)
                bufs = [runtime.StreamBuffer(max(4 * rows * cols, 4), handle, device),
                        runtime.StreamBuffer(4 * counters, handle, device)]
                runtime.zero_async(bufs[1].ptr, counters, handle)
                work, arrivals = bufs[0].ptr, bufs[1].ptr
            else:
                scratch = runtime.StreamScratch.of(device, handle)
                work, arrivals = scratch.workspace(4 * rows * cols), scratch.counters(counters)
            try:
                w = workspace_arguments(self.spec, rows, cols, work, M, N, arrivals)
                return super().launch({**args, **w}, {**sizes, "WM": rows, "WN": cols}, stream=handle, device=device)
            finally:
                for buf in bufs:
                    buf.free()   # stream-ordered: after the launch that reads it
        if second is None:
            return super().launch(args, sizes, stream=stream, device=device)
        M, N = int(sizes["M"]), int(sizes["N"])
        ctas = self.grid(sizes, self.launcher(device).sm_count)[0]
        check_stream_k_range(self.spec, M, N, int(sizes["K"]), ctas)
        rows, cols = workspace_shape(self.spec, M, N, ctas, int(args.get("BATCH", 1)))
        handle = int(runtime.stream_handle(stream))
        work = runtime.StreamBuffer(max(rows * cols * 4, 4), handle, device)
        try:
            w = workspace_arguments(self.spec, rows, cols, work.ptr, M, N)
            sizes = {**sizes, "WM": rows, "WN": cols}
            super().launch({**args, **w}, sizes, stream=handle, device=device)
            second.launch({**args, **w}, sizes, stream=handle, device=device)
        finally:
            work.free()

    @property
    def batched_call(self) -> BatchedCall:
        """The prepared launch of a batched spec's kernel from PyTorch / CuPy stacks, built once."""
        if self._batched is None:
            self._batched = BatchedCall(self)
        return self._batched

    @property
    def fast_call(self) -> FastCall:
        """The prepared call from PyTorch / CuPy arrays (gemm/call.py), built once."""
        if self._fast is None:
            self._fast = FastCall(self) if not self.spec.batched else _takes_nothing
        return self._fast

    def __call__(self, A=None, B=None, *, out=None, alpha: float = 1.0, beta: float = 0.0, bias=None, residual=None,
                 device=None, repitch: bool = False, scale_a=None, scale_b=None, **unknown):
        """C = act(alpha * A @ B + beta * C + bias) + residual (the epilogue its spec names; with
        Epilogue(scale_rows=, scale_cols=) A @ B's rows are multiplied by the f32 vector scale_a,
        its columns by scale_b).
        A is M x K and B is K x N whatever their memory layout.

        numpy arrays in -> a numpy array out (through the GPU, or the CPU emulator with
        device="sim" or without a GPU). GPU arrays (PyTorch, CuPy, anything with
        __cuda_array_interface__ or DLPack) are used in place and the kernel runs on their
        library's current stream. C has the spec's out_dtype (f32 unless the spec says
        otherwise: GemmSpec(dtype="f16") computes f16 x f16 -> f32; tilegen.matmul picks an
        out_dtype equal to the inputs'). GPU operands whose rows are not 16-byte aligned are
        refused, or copied into aligned buffers first with repitch=True (tilegen.matmul does
        that)."""
        if unknown or A is None or B is None:
            raise self._call_error(A, B, unknown)
        scales = NO_SCALES if scale_a is None and scale_b is None else (scale_a, scale_b)
        if device is None:
            fast = self._fast or self.fast_call
            if bias is None and residual is None and scales is NO_SCALES and out is not None and not repitch:
                done = fast.plain(A, B, out, alpha, beta)
            else:
                done = fast(A, B, out, bias, residual, alpha, beta, repitch, scales)
            if done is not None:
                return done
        if self.spec.batched:   # (off the hot path: a batched kernel's fast call takes nothing)
            return self._call_stack(A, B, out, alpha, beta, bias, residual, device, scales)
        return run_gemm(self, A, B, out=out, alpha=alpha, beta=beta, bias=bias, residual=residual, device=device,
                        repitch=repitch, scales=scales)


    _KEYWORDS = ("out", "alpha", "beta", "bias", "residual", "device", "repitch", "scale_a", "scale_b")

    def _call_error(self, A, B, unknown: dict) -> LaunchError:
        """What is wrong with a call that names something kernel(A, B, ...) does not take."""
        if A is None or B is None:
            gone = " and ".join(n for n, x in (("A", A), ("B", B)) if x is None)
            return LaunchError(f"{self.name}: kernel(A, B, out=...) takes the GEMM's operands A (M x K) and B (K x N); "
                               f"{gone} {'were' if ' and ' in gone else 'was'} not given")
        name = next(iter(unknown))
        hint = " (C is out= here)" if name == "C" else ""
        if name in ("A", "B"):
            hint = f" ({name} is given by position: kernel(A, B, out=...))"
        near = difflib.get_close_matches(name, self._KEYWORDS, n=1)
        return LaunchError(f"{self.name}: kernel(...) of a GEMM takes no {name}={hint or (f' ({near[0]}?)' if near else '')}"
                           f"; it takes A, B and {', '.join(k + '=' for k in self._KEYWORDS)} (a kernel's arrays by their "
                           f"declared names: kernel.call_arrays)")

    def _call_stack(self, A, B, out, alpha, beta, bias, residual, device, scales):
        """A batched kernel on stacks: A (count or 1, M, K), B (count or 1, K, N) -> C (count, M, N)."""
        shapes = [tuple(getattr(x, "shape", ())) for x in (A, B)]
        if any(len(s) != 3 for s in shapes) or shapes[0][2] != shapes[1][1]:
            raise LaunchError(f"a batched kernel multiplies stacks A (count, M, K) and B (count, K, N) (a stack of "
                              f"one matrix is used for every product); got shapes {shapes[0]} and {shapes[1]}")
        count = max(shapes[0][0], shapes[1][0])
        if {shapes[0][0], shapes[1][0]} - {1, count}:
            raise LaunchError(f"A holds {shapes[0][0]} matrices and B {shapes[1][0]}: each must hold 1 or {count}")
        if scales is not NO_SCALES:
            raise LaunchError("scale_a / scale_b are not built for batched kernels: scale alpha instead")
        M, N = shapes[0][1], shapes[1][2]
        if out is not None and tuple(out.shape) != (count, M, N):
            raise LaunchError(f"out has shape {tuple(out.shape)}; expected {(count, M, N)}")
        if residual is not None and tuple(residual.shape) != (count, M, N):
            raise LaunchError(f"residual has shape {tuple(residual.shape)}; expected {(count, M, N)}")
        check_epilogue(self.spec, bias, residual)
        length = N if self.spec.epilogue.bias == "col" else M
        if bias is not None and tuple(getattr(bias, "shape", ())) != (length,):
            raise LaunchError(f"bias has shape {tuple(getattr(bias, 'shape', ()))}; a bias per "
                              f"{self.spec.epilogue.bias} has {length} elements")
        alpha, beta = check_scalars(alpha, beta)
        host = all(x is None or isinstance(x, np.ndarray) for x in (A, B, out, bias, residual))
        check_device(device)
        if device is not None and not host:
            raise LaunchError(f"device={device!r} places numpy arrays; GPU arrays run where they are: leave it out")
        refuse_stack(self.spec, shapes[0][1], shapes[1][2], shapes[0][2], count)
        c = run_batched(self, A, B, out, count, alpha=alpha, beta=beta, bias=bias, residual=residual, device=device)
        if c is None:
            raise LaunchError("these GPU arrays do not fit this batched kernel: each operand's matrices must be laid "
                              f"out as its spec says (A {self.spec.a_layout}-major, B {self.spec.b_layout}-major, C "
                              f"row-major, its matrices apart), of its dtypes (C, bias and residual "
                              f"{self.spec.out_dtype}), on one GPU, with 16-byte aligned rows and matrices "
                              f"(tilegen.matmul takes any)")
        return c


class _TakesNothing:
    """A batched kernel's fast call, which takes nothing (None: stacks go through
    GemmKernel._call_stack and BatchedCall), called as a FastCall is."""

    def __call__(self, *args):
        return None

    def plain(self, *args):
        return None


_takes_nothing = _TakesNothing()


def compile_gemm(spec) -> GemmKernel:
    """The kernel of a GemmSpec: this process's memo, else the disk cache, else traced and built."""
    return compiler.compile_spec(spec, trace_gemm, GemmKernel)


__all__ = ["GemmKernel", "SplitKSum", "compile_gemm"]
