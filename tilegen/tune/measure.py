"""Timing candidate kernels on the GPU for the tuner, with tilegen.bench's machinery.

One `GpuMeasurer` per problem (dtype, layouts, M, N, K, out dtype): random N(0, 1) operands in
buffer sets rotated past L2 (bench.gemm.rotation_sets), arrays and the reference from
bench.backends (torch preferred: the reference is cuBLAS in f32 with TF32 off; otherwise a
float64 numpy product of sampled rows), times from bench.timing.time_calls (CUDA events around
every call, median after warm-up, a delay kernel holding the stream while Python enqueues).

The tuner talks to it through these methods, which the CPU tests replace with fakes:
prepare(kernel) (load/JIT), check(kernel) -> (ok, rel_err, bound), screen(kernel) -> ms (a
few calls), time(kernel, final=False) -> ms, healthy() -> bool, close(); and, optional,
prelink(kernel) -> bool, which the compile pool calls in its threads to link the PTX to a
cubin ahead of time (into the disk cache, where the runtime's load finds it).
"""
from __future__ import annotations

import math

import numpy as np

from .. import runtime
from ..bench import backends, env
from ..bench.gemm import HOST_CHECK_ROWS, error_bound, round_tf32, rotation_sets
from ..bench.timing import EventPool, TimingOptions, make_delay, time_calls

_ELEM_BYTES = {"tf32": 4, "f32": 4, "f16": 2, "bf16": 2}

# Search timings are short (many candidates); the finalists are re-timed as the bench does.
SEARCH_TIMING = TimingOptions(warmup_ms=10.0, rep_ms=40.0, min_reps=5, max_reps=300)
SCREEN_TIMING = TimingOptions(warmup=0, reps=3)
FINAL_TIMING = TimingOptions(warmup_ms=30.0, rep_ms=200.0, min_reps=10, max_reps=1000)


def device_key(device: int = 0) -> tuple:
    """(GPU name, driver version) of a device, as the tuned-config cache keys them."""
    info = runtime.device_info(device)
    return info.name, info.driver_version


class GpuMeasurer:
    def __init__(self, dtype: str, a_layout: str, b_layout: str, m: int, n: int, k: int,
                 out_dtype: str = "f32", device: int = 0, backend: str = "auto", log=None):
        self.log = log or (lambda msg: None)
        self.device = device
        runtime.ensure_context(device)
        self.info = runtime.device_info(device)
        self.target = env.device_target(self.info.cc)
        self.dtype, self.out_dtype = dtype, out_dtype
        self.a_layout, self.b_layout = a_layout, b_layout
        self.m, self.n, self.k = m, n, k
        be = self.backend = backends.pick_backend(backend, device)
        self.events = EventPool(be.stream, device)
        self.delay = self._make_delay()
        a_stored = (m, k) if a_layout == "row" else (k, m)
        b_stored = (k, n) if b_layout == "row" else (n, k)
        set_bytes = (m * k + k * n) * _ELEM_BYTES[dtype] + m * n * _ELEM_BYTES[out_dtype]
        self.n_sets = rotation_sets(set_bytes, env.l2_bytes(device))
        self.A = [be.random(*a_stored, dtype) for _ in range(self.n_sets)]
        self.B = [be.random(*b_stored, dtype) for _ in range(self.n_sets)]
        self.C = [be.empty(m, n, out_dtype) for _ in range(self.n_sets)]
        self.args = [{"M": m, "N": n, "K": k, "A_ptr": be.ptr(self.A[i]), "A_ld": a_stored[1],
                      "B_ptr": be.ptr(self.B[i]), "B_ld": b_stored[1], "C_ptr": be.ptr(self.C[i]), "C_ld": n,
                      "alpha": 1.0, "beta": 0.0} for i in range(self.n_sets)]
        self.sizes = {"M": m, "N": n, "K": k}
        self.stream = be.stream
        self.bound = error_bound(dtype, out_dtype, k)
        self._ref = None
        self.reference_name = None
        be.synchronize()

    # -- helpers ---------------------------------------------------------------------------
    def _make_delay(self):
        try:
            return make_delay(self.backend, self.target, self.events, self.log)
        except Exception as e:  # noqa: BLE001  (timing still works, small sizes get noisier)
            self.log(f"no delay kernel ({type(e).__name__}: {e})")
            return None

    def _call(self, kernel):
        args, sizes, stream, device = self.args, self.sizes, self.stream, self.device
        return lambda i: kernel.launch(args[i], sizes, stream=stream, device=device)

    def _reference(self):
        """Built once per problem: (kind, data) for comparing C[0] against."""
        if self._ref is not None:
            return self._ref
        be = self.backend
        try:
            Al = be.t(self.A[0]) if self.a_layout == "col" else self.A[0]
            Bl = be.t(self.B[0]) if self.b_layout == "col" else self.B[0]
        except Exception:  # noqa: BLE001  (no transposed views: host check)
            Al = Bl = None
        if be.reference is not None and Al is not None:
            self._ref = ("device", be.reference(Al, Bl))
            self.reference_name = "cuBLAS f32 GEMM (TF32 off)"
            return self._ref
        rng = np.random.default_rng(0)
        rows = np.sort(rng.choice(self.m, size=min(self.m, HOST_CHECK_ROWS), replace=False))
        a = be.to_host(self.A[0])
        a = a[rows, :] if self.a_layout == "row" else a[:, rows].T
        b = be.to_host(self.B[0])
        b = b if self.b_layout == "row" else b.T
        if self.dtype == "tf32":  # the tensor core sees operands rounded to tf32
            a, b = round_tf32(a), round_tf32(b)
        self._ref = ("host", (rows, a @ b))
        self.reference_name = f"numpy float64 on {len(rows)} random rows of C"
        return self._ref

    # -- what the tuner calls --------------------------------------------------------------
    def prelink(self, kernel) -> bool:
        """Link the kernel's PTX to a cubin in the calling (pool) thread and store it in the disk
        cache, with the runtime's own linker and cache entry, so that prepare() only loads it.
        False (nothing done) when the disk cache is off; failures are left to prepare()."""
        return runtime.precompile(kernel.ptx, self.device)

    def prepare(self, kernel) -> None:
        """Load the module (driver JIT or the disk cubin cache) outside any timing."""
        kernel.function(self.device)

    def check(self, kernel) -> tuple:
        """Launch once into a NaN-filled C and compare with the reference:
        (ok, relative error, bound)."""
        be = self.backend
        kind, ref = self._reference()
        be.fill_nan(self.C[0])
        self._call(kernel)(0)
        be.synchronize()
        if kind == "device":
            rel = be.rel_err(self.C[0], ref)
        else:
            rows, want = ref
            got = be.to_host(self.C[0])[rows, :]
            norm = float(np.linalg.norm(want))
            rel = float(np.linalg.norm(got - want)) / (norm if norm > 0 else 1.0)
        ok = rel is not None and math.isfinite(rel) and rel <= self.bound
        return ok, rel, self.bound

    def screen(self, kernel) -> float:
        """A quick median of a few calls (the kernel has run before)."""
        return time_calls(self._call(kernel), self.n_sets, self.events, SCREEN_TIMING, self.delay).ms

    def time(self, kernel, final: bool = False) -> float:
        opts = FINAL_TIMING if final else SEARCH_TIMING
        return time_calls(self._call(kernel), self.n_sets, self.events, opts, self.delay).ms

    def healthy(self) -> bool:
        """False once the CUDA context is unusable (a sticky error such as an illegal address)."""
        try:
            self.backend.synchronize()
            return True
        except Exception:  # noqa: BLE001
            return False

    def close(self) -> None:
        self.A = self.B = self.C = self.args = None
        self._ref = None
        try:
            self.backend.synchronize()
            self.backend.release()
        except Exception:  # noqa: BLE001
            pass


__all__ = ["GpuMeasurer", "device_key", "SEARCH_TIMING", "SCREEN_TIMING", "FINAL_TIMING"]
