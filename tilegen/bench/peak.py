"""The mma.sync peak: a register-only loop of tensor-core mma, written in the tilegen DSL.

Each warp loads one A and one B fragment from shared memory once, then runs
`iters` iterations of `unroll` mma calls over a tiles_m x tiles_n grid of independent
accumulators (tiles_m * tiles_n dependency chains, enough to hide the mma latency), and
finally stores the accumulators so that nothing is dead code. Nothing touches memory
inside the loop, so the time is the tensor pipe's alone.

FLOPs of one launch = 2 * atom.m * atom.n * atom.k * tiles_m * tiles_n * unroll * iters * warps.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dsl as tg
from ..arch.dtypes import numpy_dtype
from ..arch.mma import DEFAULT_ATOM, MMA_ATOMS
from ..frontend import compile as tg_compile
from ..runtime import DeviceBuffer, synchronize

PEAK_DTYPES = ("tf32", "f16", "bf16")
SMEM_ROWS = 64          # rows of each shared operand tile (>= 16 * tiles_m and >= 8 * tiles_n)
SMEM_ROW_BYTES = 128    # one 128B swizzle span per row


@dataclass(frozen=True)
class PeakConfig:
    """One shape of the peak kernel. CTAs = sm_count * ctas_per_sm at launch."""
    dtype: str = "f16"
    tiles_m: int = 2
    tiles_n: int = 4
    warps: int = 8
    unroll: int = 4
    ctas_per_sm: int = 2

    @property
    def atom(self):
        return MMA_ATOMS[DEFAULT_ATOM[(self.dtype, "f32")]]

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def flops(self, iters: int, ctas: int) -> int:
        a = self.atom
        return 2 * a.m * a.n * a.k * self.tiles_m * self.tiles_n * self.unroll * iters * self.warps * ctas

    def out_shape(self, ctas: int) -> tuple[int, int]:
        """(rows, cols) of the f32 output: one tiles_m*16 x tiles_n*8 block per warp."""
        a = self.atom
        return ctas * self.warps * self.tiles_m * a.m, self.tiles_n * a.n

    def kernel_name(self) -> str:
        return (f"tilegen_mma_peak_{self.dtype}_{self.tiles_m}x{self.tiles_n}"
                f"_w{self.warps}_u{self.unroll}")


# A few shapes per dtype; the bench reports the fastest (they differ by a few percent).
PEAK_CONFIGS = {
    dt: (PeakConfig(dt, 2, 4, 8, 4, 2), PeakConfig(dt, 4, 4, 4, 2, 2), PeakConfig(dt, 2, 2, 8, 8, 4))
    for dt in PEAK_DTYPES
}


@tg.kernel
def mma_peak(cfg):
    atom = cfg.atom
    tm, tn = cfg.tiles_m, cfg.tiles_n
    if tm * atom.m > SMEM_ROWS or tn * atom.n > SMEM_ROWS:
        raise ValueError(f"peak kernel: {tm} x {tn} atoms do not fit the {SMEM_ROWS}-row shared tiles")
    # one CTA per cfg.warps blocks of tm x tn atoms of C's rows
    tg.launch(threads=cfg.threads, grid=(tg.cdiv("M", cfg.warps * tm * atom.m), 1, 1))
    # A tiny A (row-major, K contiguous) and B (column-major, K contiguous), shared by all CTAs.
    A = tg.tensor("A", cfg.dtype, ("AM", "AK"))
    B = tg.tensor("B", cfg.dtype, ("BK", "BN"), layout="col")
    C = tg.tensor("C", "f32", ("M", "N"))
    iters = tg.scalar("iters", "u32")
    cols = SMEM_ROW_BYTES // (4 if cfg.dtype == "tf32" else 2)
    sA = tg.shared("sA", cfg.dtype, SMEM_ROWS, cols, swizzle="128B")
    sB = tg.shared("sB", cfg.dtype, SMEM_ROWS, cols, swizzle="128B", logical="col")
    tg.copy_async(sA[0], A.block(0, 0), comment="the operand tile, once")
    tg.copy_async(sB[0], B.block(0, 0), comment="the operand tile, once")
    tg.commit()
    tg.wait(0)
    tg.barrier()

    acc = tg.fragment(atom, "C", (tm, tn), name="acc")
    a = tg.fragment(atom, "A", (tm, 1), name="a")
    b = tg.fragment(atom, "B", (1, tn), name="b")
    tg.load(a, sA[0], 0, 0, comment="fragment a, loaded once")
    tg.load(b, sB[0], 0, 0, comment="fragment b, loaded once")
    for _ in tg.range(iters):
        for _u in range(cfg.unroll):
            tg.mma(acc, a, b)

    # Every warp stores its own block, so no accumulator is dead.
    row0 = (tg.program_id() * cfg.warps + tg.warp_id()) * (tm * atom.m)
    tg.store(C.block(row0, 0), acc)


def compile_peak(cfg: PeakConfig, target: str = "sm_80"):
    return tg_compile(mma_peak, cfg=cfg, target=target, name=cfg.kernel_name())


# Measured on the H200 (DESIGN.md, "Measured ceilings"): what --peak should come close to.
REFERENCE_PEAK = {"tf32": 311.0, "f16": 618.0, "bf16": 624.0}


class PeakProblem:
    """Host side of one peak launch: operand tiles, launch arguments, the expected output."""

    def __init__(self, cfg: PeakConfig, ctas: int, values):
        import numpy as np


        self.cfg, self.ctas = cfg, ctas
        self.cols = SMEM_ROW_BYTES // (4 if cfg.dtype == "tf32" else 2)   # K extent of the tiles
        host_dt = numpy_dtype("f32" if cfg.dtype == "tf32" else cfg.dtype)
        # A is stored M x K (row-major), B is stored N x K (column-major K x N)
        self.a = np.ascontiguousarray(np.asarray(values(SMEM_ROWS, self.cols), dtype=np.float32).astype(host_dt))
        self.b = np.ascontiguousarray(np.asarray(values(SMEM_ROWS, self.cols), dtype=np.float32).astype(host_dt))
        self.rows, self.n = cfg.out_shape(ctas)
        self.c_bytes = self.rows * self.n * 4

    def args(self, a_ptr: int, b_ptr: int, c_ptr: int, iters: int) -> dict:
        return {"AM": SMEM_ROWS, "AK": self.cols, "A_ptr": a_ptr, "A_ld": self.cols,
                "BK": self.cols, "BN": SMEM_ROWS, "B_ptr": b_ptr, "B_ld": self.cols,
                "M": self.rows, "N": self.n, "C_ptr": c_ptr, "C_ld": self.n, "iters": int(iters)}

    def sizes(self) -> dict:
        return {"M": self.rows}

    def expected_block(self, iters: int):
        """What every warp's block holds after `iters` iterations: the fragments' product
        (rows 0..16*tiles_m of A, columns 0..8*tiles_n of B, the first atom.k of K), summed
        unroll * iters times."""
        import numpy as np

        cfg, atom = self.cfg, self.cfg.atom
        a = self.a[: cfg.tiles_m * atom.m, : atom.k].astype(np.float64)
        b = self.b[: cfg.tiles_n * atom.n, : atom.k].astype(np.float64).T
        return (a @ b) * (cfg.unroll * iters)

    def check(self, out, iters: int) -> str:
        """"" when every warp's block of `out` (rows x n f32) is right, else what is wrong.
        Exact on small-integer data: a loop that did not run would fake a peak."""
        import numpy as np

        want = self.expected_block(iters)
        blocks = np.asarray(out, dtype=np.float64).reshape(self.ctas * self.cfg.warps, *want.shape)
        bad = ~np.isclose(blocks, want[None], rtol=1e-6, atol=0)
        if not bad.any():
            return ""
        w = int(np.argwhere(bad)[0][0])
        return (f"{int(bad.any(axis=(1, 2)).sum())} of {blocks.shape[0]} warp blocks differ from numpy "
                f"(first: warp {w}, max |diff| {float(np.nanmax(np.abs(blocks[w] - want))):.3g})")


class PeakBuffers:
    """Device buffers of a PeakProblem."""

    def __init__(self, problem: PeakProblem, device: int = 0):
        self.problem = problem
        self.A = DeviceBuffer.from_host(problem.a, device)
        self.B = DeviceBuffer.from_host(problem.b, device)
        self.C = DeviceBuffer(problem.c_bytes, device)

    def args(self, iters: int) -> dict:
        return self.problem.args(self.A.ptr, self.B.ptr, self.C.ptr, iters)

    def output(self):
        import numpy as np

        out = np.empty((self.problem.rows, self.problem.n), dtype=np.float32)
        self.C.copy_to_host(out)
        return out

    def close(self):
        for b in (self.A, self.B, self.C):
            b.close()


def small_ints(rng):
    """Values in {-2, -1, 1, 2}: exact in every operand type, so the check is exact."""
    def make(rows, cols):
        return rng.choice([-2.0, -1.0, 1.0, 2.0], size=(rows, cols))
    return make


def uniform(rng):
    return lambda rows, cols: rng.uniform(-1.0, 1.0, size=(rows, cols))


def verify_peak_kernel(kernel, cfg: PeakConfig, ctas: int, iters: int = 257, device: int = 0) -> str:
    """Run the kernel on integer data and compare every warp's block with numpy exactly.
    Returns "" when right, else what is wrong."""
    import numpy as np


    problem = PeakProblem(cfg, ctas, small_ints(np.random.default_rng(7)))
    bufs = PeakBuffers(problem, device)
    try:
        bufs.C.fill_bytes(0xFF)
        kernel.launch(bufs.args(iters), problem.sizes(), device=device)
        synchronize(device)
        return problem.check(bufs.output(), iters)
    finally:
        bufs.close()


def measure_peak_config(cfg: PeakConfig, sm_count: int, target: str, events, target_ms: float = 20.0,
                        reps: int = 5, device: int = 0) -> dict:
    """TFLOP/s of one peak kernel shape, checked first, timed as the median of `reps` launches."""
    import statistics

    import numpy as np

    kernel = compile_peak(cfg, target)
    ctas = sm_count * cfg.ctas_per_sm
    out = {"config": cfg.kernel_name(), "ctas": ctas, "threads": cfg.threads}
    problem = verify_peak_kernel(kernel, cfg, ctas, device=device)
    if problem:
        out["error"] = f"wrong result: {problem}"
        return out
    bufs = PeakBuffers(PeakProblem(cfg, ctas, uniform(np.random.default_rng(11))), device)
    try:
        sizes = {"ctas": ctas}
        e0, e1 = events.get(2)

        def timed(iters: int) -> float:
            events.record(e0)
            kernel.launch(bufs.args(iters), sizes, stream=events.stream, device=device)
            events.record(e1)
            return events.elapsed(e0, e1)

        iters = 1024
        ms = timed(iters)
        for _ in range(4):  # grow until the launch is long enough to time well
            if ms >= target_ms / 4:
                break
            iters = int(min(1 << 24, iters * max(2.0, target_ms / max(ms, 1e-3))))
            ms = timed(iters)
        iters = int(min(1 << 24, max(64, iters * target_ms / max(ms, 1e-3))))
        samples = [timed(iters) for _ in range(max(1, reps))]
        ms = statistics.median(samples)
        out.update(iters=iters, ms=ms, tflops=cfg.flops(iters, ctas) / (ms * 1e-3) / 1e12)
        return out
    finally:
        bufs.close()


def run_peak(dtypes, sm_count: int, target: str, events, device: int = 0, log=None) -> dict:
    """{dtype: {"tflops", "config", "reference", "configs": [...]}} over PEAK_CONFIGS."""
    results = {}
    for dt in dtypes:
        tries = []
        for cfg in PEAK_CONFIGS[dt]:
            try:
                tries.append(measure_peak_config(cfg, sm_count, target, events, device=device))
            except Exception as e:  # noqa: BLE001  (report it, try the next shape)
                tries.append({"config": cfg.kernel_name(), "error": f"{type(e).__name__}: {e}"})
            if log:
                t = tries[-1]
                log(f"peak {dt} {t['config']}: " + (f"{t['tflops']:.1f} TFLOP/s" if "tflops" in t else t["error"]))
        good = [t for t in tries if "tflops" in t]
        best = max(good, key=lambda t: t["tflops"]) if good else None
        results[dt] = {"tflops": best["tflops"] if best else None, "config": best["config"] if best else None,
                       "reference": REFERENCE_PEAK.get(dt), "configs": tries}
    return results


SPIN_CONFIG = PeakConfig("f16", 1, 2, 1, 1, 1)  # one warp, two dependent-chain mma per iteration


class SpinKernel:
    """A one-CTA, one-warp peak kernel used to hold a stream busy (timing.Delay): its run
    time grows linearly with `iters`. For backends without torch.cuda._sleep."""

    def __init__(self, target: str, stream=None, device: int = 0):
        import numpy as np

        self.cfg = SPIN_CONFIG
        self.kernel = compile_peak(self.cfg, target)
        self.bufs = PeakBuffers(PeakProblem(self.cfg, 1, small_ints(np.random.default_rng(3))), device)
        self.stream, self.device = stream, device

    def __call__(self, units: int) -> None:
        self.kernel.launch(self.bufs.args(max(1, int(units))), {"ctas": 1}, stream=self.stream, device=self.device)
