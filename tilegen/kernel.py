"""Kernel: what tilegen.compile returns. Holds the PTX and the IR, loads the module on
first use, and runs it on numpy arrays (copied through the GPU) or on GPU arrays in place."""
from __future__ import annotations

from functools import cached_property

from .errors import LaunchError


class Kernel:
    def __init__(self, ir, ptx: str, tile_ir: str, spec=None, banks=()):
        self._ir = ir
        self.bank_conflicts = list(banks)  # BankRow per shared access (ir/bank_report.py)
        self.ptx = ptx
        self.ir = tile_ir
        self.spec = spec
        self.name = ir.name
        self.threads = ir.threads
        self.smem_bytes = ir.smem_bytes
        self.target = ir.target
        self._function = None
        self._generation = None  # the module cache's generation the function was loaded in

    def __repr__(self) -> str:
        return f"<tilegen.Kernel {self.name}: {self.threads} threads, {self.smem_bytes} B shared>"

    @cached_property
    def resources(self):
        """ptxas's report (registers, shared memory, spills) or None when ptxas is absent."""
        from .codegen.ptxas import PtxasError, find_ptxas, resources

        if find_ptxas() is None:
            return None
        try:
            return resources(self.ptx, self.target, self.smem_bytes)
        except PtxasError:
            return None

    @cached_property
    def instructions(self) -> str:
        """The instruction-level IR after every pass (what codegen printed as PTX), as text;
        Kernel.ir is the tile level."""
        from .ir.printer import print_ir

        if getattr(self._ir, "from_cache", False):  # a disk-cached kernel keeps only its PTX
            from .compiler import trace
            from .ir import run_passes

            return print_ir(run_passes(trace(self.spec)[0]))
        return print_ir(self._ir)

    def bank_report(self) -> str:
        """Wavefronts per warp of every shared-memory access, against the ideal."""
        from .ir.bank_report import format_bank_report

        return format_bank_report(self.bank_conflicts)

    @property
    def params(self) -> list:
        return [(p.name, p.type) for p in self._ir.params]

    def grid(self, sizes: dict) -> tuple:
        return tuple(self._ir.grid(sizes))

    # -- running ----------------------------------------------------------------------------
    def function(self, device: int = 0):
        """The loaded CUDA function (JIT-compiled by the driver on first use)."""
        from .runtime.module import module_generation

        if self._function is None or self._generation != module_generation():
            from .runtime import load_module

            fn = load_module(self.ptx, self.name, device=device)
            fn.set_max_dynamic_smem(self.smem_bytes)
            self._function = fn
            self._generation = module_generation()
        return self._function

    def launch(self, args: dict, sizes: dict, stream=None, device: int = 0):
        """Launch with every parameter given by name: pointers as ints, scalars as numbers."""
        missing = [n for n, _ in self.params if n not in args]
        if missing:
            raise LaunchError(f"{self.name}: missing arguments {', '.join(missing)}")
        kinds = {"u64": "ptr", "u32": "u32", "s32": "s32", "f32": "f32"}
        packed = [(args[n], kinds[t]) for n, t in self.params]
        grid = self.grid(sizes)
        if min(grid) == 0:
            return
        self.function(device).launch(grid, (self.threads, 1, 1), packed, smem=self.smem_bytes, stream=stream)

    def __call__(self, A, B, *, out=None, alpha: float = 1.0, beta: float = 0.0, bias=None, residual=None,
                 device=None, repitch: bool = False):
        """C = act(alpha * A @ B + beta * C + bias) + residual for a GEMM kernel (the epilogue
        its spec names). A is M x K and B is K x N whatever their memory layout; numpy in ->
        numpy out, GPU arrays are used in place; device="sim" runs the CPU emulator.
        GPU operands whose rows are not 16-byte aligned are refused, or copied into aligned
        buffers first with repitch=True (tilegen.matmul does that)."""
        if self.spec is None:
            raise LaunchError(f"{self.name} is not a GEMM: use Kernel.launch(args, sizes)")
        from .gemm_call import run_gemm

        return run_gemm(self, A, B, out=out, alpha=alpha, beta=beta, bias=bias, residual=residual, device=device,
                        repitch=repitch)


__all__ = ["Kernel"]
