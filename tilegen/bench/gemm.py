"""One GEMM row: tilegen, cuBLAS and Triton on the same random operands, checked, timed.

For each (dtype, layout, size): `n_sets` buffer sets (A, B and each implementation's own C)
are allocated so that their total exceeds L2 several times over, and call i of every
implementation uses set i % n_sets. tilegen's result is checked against a reference once
before it is timed; a wrong result is reported as WRONG and not timed.
"""
from __future__ import annotations

import math

import numpy as np

from ..gemm import compile_gemm, matmul
from ..sim.numerics import tf32_operand
from .report import finish_row
from .timing import time_back_to_back, time_calls, time_pair_back_to_back

L2_FACTOR = 4          # buffer sets span at least this many times the L2 size
MAX_SETS = 64
HOST_CHECK_ROWS = 128  # rows of C checked on the host when no GPU reference exists

_ELEM_BYTES = {"tf32": 4, "f32": 4, "f16": 2, "bf16": 2, "e4m3": 1, "e5m2": 1}
# unit roundoff of the operand rounding (tf32 keeps 10 mantissa bits) and of the output
# fp8: the operands are exact; the tensor cores' fp8 accumulation keeps about 14 bits (promotion window)
_U_IN = {"tf32": 2.0 ** -11, "f16": 0.0, "bf16": 0.0, "e4m3": 2.0 ** -13, "e5m2": 2.0 ** -13,
         "f32": 2.0 ** -22}   # (3xTF32 leaves out lo * lo, about 2^-22 of a product)
_U_OUT = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}


def error_bound(dtype: str, out_dtype: str, k: int, truncated: bool = False) -> float:
    """Largest relative error ||C - ref||_F / ||ref||_F a correct kernel shows against an
    exact f32 reference on N(0, 1) data: operand and output rounding with a factor 4 of
    margin, plus f32 accumulation over K (with random signs, far below K * 2^-24). Truncated
    tf32 operands (wgmma) carry twice the rounding error of rounded ones."""
    return 4.0 * (_U_IN[dtype] * (2 if truncated else 1) + _U_OUT[out_dtype]) + k * 2.0 ** -24 + 1e-6


def rotation_sets(set_bytes: int, l2_bytes: int, factor: int = L2_FACTOR, max_sets: int = MAX_SETS) -> int:
    """How many buffer sets so that together they span `factor` times the L2 (at least 2)."""
    need = math.ceil(factor * l2_bytes / max(1, set_bytes))
    return max(2, min(max_sets, need))


def spec_text(spec) -> str:
    t, w = spec.tile, spec.warps
    return (f"{t.m}x{t.n}x{t.k} w{w.m}x{w.n} s{spec.stages} {spec.swizzle} g{spec.group_m} "
            f"{spec.target} out={spec.out_dtype}")


def _first_line(e: BaseException, limit: int = 300) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:limit]


class GemmBench:
    def __init__(self, backend, events, opts, delay=None, l2_bytes: int = 60 << 20, cublas: bool = True,
                 triton=None, log=None, front_door: bool = True, kernel_for=None):
        self.backend = backend
        # kernel_for(spec) -> kernel: with it, each row times the kernel tilegen.matmul picks for
        # its arrays (what users get), not the one run() is given (which names dtype and layouts)
        self.kernel_for = kernel_for
        self.events = events
        self.opts = opts
        self.delay = delay
        self.l2_bytes = l2_bytes
        self.cublas = cublas and backend.cublas_name is not None
        self.triton = triton if backend.name == "torch" else None
        self.front_door = front_door and backend.name == "torch"
        self.log = log or (lambda msg: None)

    def _time(self, call, n_sets):
        return time_calls(call, n_sets, self.events, self.opts, self.delay)

    def run(self, kernel, m: int, n: int, k: int, peak: dict | None = None) -> dict:
        spec = kernel.spec
        dtype, out_dt = spec.dtype, spec.out_dtype
        be = self.backend
        row = {"dtype": dtype, "layout": spec.a_layout[0] + spec.b_layout[0], "m": m, "n": n, "k": k,
               "spec": spec_text(spec), "kernel": kernel.name, "errors": {}, "check": None}
        a_stored = (m, k) if spec.a_layout == "row" else (k, m)
        b_stored = (k, n) if spec.b_layout == "row" else (n, k)
        ein = _ELEM_BYTES[dtype]
        set_bytes = (m * k + k * n) * ein + m * n * _ELEM_BYTES[out_dt]
        n_sets = rotation_sets(set_bytes, self.l2_bytes)
        row["sets"] = n_sets
        row["rotation_mb"] = round(n_sets * set_bytes / 2 ** 20, 1)
        A = [be.random(*a_stored, dtype) for _ in range(n_sets)]
        B = [be.random(*b_stored, dtype) for _ in range(n_sets)]
        try:
            Al = [be.t(x) if spec.a_layout == "col" else x for x in A]
            Bl = [be.t(x) if spec.b_layout == "col" else x for x in B]
        except Exception:  # noqa: BLE001  (no transposed views: tilegen only)
            Al = Bl = None
        ref = None
        try:
            if self.kernel_for is not None and Al is not None:
                try:
                    chosen = matmul.explain(Al[0], Bl[0], allow_tf32=dtype == "tf32").spec   # (f32 rows: 3xTF32)
                    if chosen != spec:
                        kernel = self.kernel_for(chosen)
                        row.update(spec=spec_text(chosen), kernel=kernel.name)
                    row["kernel_choice"] = "tilegen.matmul's"
                except Exception as e:  # noqa: BLE001  (matmul refuses these arrays: the given spec)
                    row["errors"]["matmul's choice"] = _first_line(e)
            ref = self._tilegen(row, kernel, A, B, Al, Bl, a_stored[1], b_stored[1], n_sets, m, n, k, out_dt)
            if self.cublas and Al is not None:
                self._cublas(row, dtype, Al, Bl, n_sets, m, n)
            if self.front_door and Al is not None:
                self._front_door(row, dtype, Al, Bl, n_sets, m, n, k, out_dt, ref)
            if self.triton is not None and Al is not None:
                self._triton(row, Al, Bl, n_sets, m, n, out_dt, ref)
        finally:
            del A, B, Al, Bl, ref
            be.synchronize()
            be.release()
        return finish_row(row, peak)

    # -- tilegen -----------------------------------------------------------------------------
    def _tilegen(self, row, kernel, A, B, Al, Bl, lda, ldb, n_sets, m, n, k, out_dt):
        be = self.backend
        C = [be.empty(m, n, out_dt) for _ in range(n_sets)]
        args = [{"M": m, "N": n, "K": k, "A_ptr": be.ptr(A[i]), "A_ld": lda, "B_ptr": be.ptr(B[i]),
                 "B_ld": ldb, "C_ptr": be.ptr(C[i]), "C_ld": n, "alpha": 1.0, "beta": 0.0}
                for i in range(n_sets)]
        sizes = {"M": m, "N": n, "K": k}
        stream = be.stream

        def call(i):
            kernel.launch(args[i], sizes, stream=stream)

        ref = None
        try:
            be.fill_nan(C[0])  # anything the kernel leaves unwritten fails the check
            call(0)
            be.synchronize()
            ref, rel, how = self._check(row["dtype"], kernel.spec, A[0], B[0], Al, Bl, C[0])
            bound = error_bound(row["dtype"], out_dt, k, kernel.spec.tf32_truncates)
            ok = rel is not None and math.isfinite(rel) and rel <= bound
            row.update(check="ok" if ok else "WRONG", rel_err=rel, err_bound=bound, check_ref=how)
            if not ok:
                self.log(f"!!! tilegen {row['dtype']} {row['layout']} {m}x{n}x{k}: WRONG result "
                         f"(relative error {rel} > {bound:.1e}); not timed")
                return ref
        except Exception as e:  # noqa: BLE001
            row["check"] = "error"
            row["errors"]["tilegen"] = _first_line(e)
            self.log(f"!!! tilegen {row['dtype']} {row['layout']} {m}x{n}x{k}: {row['errors']['tilegen']}")
            return ref
        try:
            t = self._time(call, n_sets)
            row["tilegen_ms"] = t.ms
            row["tilegen_timing"] = t.as_dict()
        except Exception as e:  # noqa: BLE001
            row["errors"]["tilegen"] = _first_line(e)
        return ref

    def _check(self, dtype, spec, A0, B0, Al, Bl, C0):
        """(reference or None, relative error, what the reference was)."""
        be = self.backend
        if be.reference is not None and Al is not None:
            ref = be.reference(Al[0], Bl[0])
            return ref, be.rel_err(C0, ref), "cuBLAS f32 GEMM (TF32 off)"
        rng = np.random.default_rng(0)
        m = C0.rows if hasattr(C0, "rows") else C0.shape[0]
        rows = np.sort(rng.choice(m, size=min(m, HOST_CHECK_ROWS), replace=False))
        a = be.to_host(A0)
        a = a[rows, :] if spec.a_layout == "row" else a[:, rows].T
        b = be.to_host(B0)
        b = b if spec.b_layout == "row" else b.T
        if dtype == "tf32":  # the tensor core sees operands rounded (or truncated) to tf32
            to_tf32 = _truncate_tf32 if spec.tf32_truncates else round_tf32
            a, b = to_tf32(a), to_tf32(b)
        want = a @ b
        got = be.to_host(C0)[rows, :]
        norm = float(np.linalg.norm(want))
        rel = float(np.linalg.norm(got - want)) / (norm if norm > 0 else 1.0)
        return None, rel, f"numpy float64 on {len(rows)} random rows of C"

    # -- cuBLAS ------------------------------------------------------------------------------
    def _cublas(self, row, dtype, Al, Bl, n_sets, m, n):
        be = self.backend
        try:
            C = [be.empty(m, n, be.cublas_out_dtype(dtype)) for _ in range(n_sets)]
            calls = [be.cublas(dtype, Al[i], Bl[i], C[i]) for i in range(n_sets)]
            with be.tf32(dtype == "tf32"):
                calls[0]()
                be.synchronize()
                t = self._time(lambda i: calls[i](), n_sets)
            row["cublas_ms"] = t.ms
            row["cublas_timing"] = t.as_dict()
        except Exception as e:  # noqa: BLE001
            row["errors"]["cublas"] = _first_line(e)

    # -- what users call ---------------------------------------------------------------------
    def _front_door(self, row, dtype, Al, Bl, n_sets, m, n, k, out_dt, ref):
        """tilegen.matmul(A, B, out=C) and torch.matmul(A, B, out=C) exactly as a user's loop
        calls them, back to back (host time included), tilegen's checked first; beside them
        the kernel matmul chose, launched back to back from prepared arguments, so that the
        ratio of the two is what the call path costs (both run the GPU without pause)."""
        be = self.backend
        try:
            C = [be.empty(m, n, out_dt) for _ in range(n_sets)]
            with be.tf32(dtype == "tf32"):
                tf32 = dtype == "tf32"   # (an f32 row is 3xTF32 whatever TILEGEN_ALLOW_TF32 says)
                be.fill_nan(C[0])
                matmul(Al[0], Bl[0], out=C[0], allow_tf32=tf32)
                be.synchronize()
                spec = matmul.explain(Al[0], Bl[0], out=C[0], allow_tf32=tf32).spec
                row["front_spec"] = spec_text(spec) + f" {spec.instruction}"
                if ref is not None:
                    rel = be.rel_err(C[0], ref)
                    bound = error_bound(dtype, out_dt, k, spec.tf32_truncates)
                    row["front_rel_err"] = rel
                    if not (math.isfinite(rel) and rel <= bound):
                        row["errors"]["tilegen.matmul"] = f"wrong result (relative error {rel:.2e} > {bound:.1e})"
                        return
                chosen = compile_gemm(spec)
                values = [(m, n, k, be.ptr(Al[i]), _ld(Al[i], spec.a_layout), be.ptr(Bl[i]), _ld(Bl[i], spec.b_layout),
                           be.ptr(C[i]), n, 1.0, 0.0, 0, 0, 0, 0, 0) for i in range(n_sets)]
                launcher, stream = chosen.launcher(0), be.stream
                if spec.prepared_operands:   # its kernels: the operands prepared first, then the GEMM
                    names = ("M", "N", "K", "A_ptr", "A_ld", "B_ptr", "B_ld", "C_ptr", "C_ld", "alpha", "beta")
                    named = [dict(zip(names, v)) for v in values]
                    kernels = lambda i: chosen.launch(named[i], named[i], stream=stream)  # noqa: E731
                else:
                    args = [chosen.fast_call.arguments(v) for v in values]
                    grid = chosen.fast_call.grid(m, n, k, launcher.sm_count)
                    kernels = lambda i: launcher(grid, args[i], stream)  # noqa: E731
                front, kern = time_pair_back_to_back(
                    lambda i: matmul(Al[i], Bl[i], out=C[i], allow_tf32=tf32), kernels, n_sets, self.events, self.opts)
                row["front_ms"], row["front_kernel_ms"] = front.ms, kern.ms
                if self.cublas:
                    Ct = [be.empty(m, n, be.cublas_out_dtype(dtype)) for _ in range(n_sets)]
                    calls = [be.cublas(dtype, Al[i], Bl[i], Ct[i]) for i in range(n_sets)]
                    calls[0]()
                    be.synchronize()
                    row["cublas_front_ms"] = time_back_to_back(lambda i: calls[i](), n_sets, self.events,
                                                               self.opts).ms
        except Exception as e:  # noqa: BLE001
            row["errors"]["tilegen.matmul"] = _first_line(e)

    # -- Triton ------------------------------------------------------------------------------
    def _triton(self, row, Al, Bl, n_sets, m, n, out_dt, ref):
        be, tm = self.backend, self.triton
        try:
            C = [be.empty(m, n, out_dt) for _ in range(n_sets)]
            f32 = row["dtype"] == "f32"   # (three tf32 products, as tilegen's f32; else TF32)
            tm.matmul(Al[0], Bl[0], C[0], f32=f32)  # autotunes for this shape and layout
            be.synchronize()
            row["triton_config"] = tm.best_config(Al[0], Bl[0])
            if ref is not None:
                be.fill_nan(C[0])
                tm.matmul(Al[0], Bl[0], C[0], f32=f32)
                rel = be.rel_err(C[0], ref)
                row["triton_rel_err"] = rel
                bound = error_bound(row["dtype"], out_dt, row["k"])
                if not (math.isfinite(rel) and rel <= bound):
                    row["errors"]["triton"] = f"Triton's result is off (relative error {rel:.2e} > {bound:.1e}); not timed"
                    return
            t = self._time(lambda i: tm.matmul(Al[i], Bl[i], C[i], f32=f32), n_sets)
            row["triton_ms"] = t.ms
            row["triton_timing"] = t.as_dict()
        except Exception as e:  # noqa: BLE001
            row["errors"]["triton"] = _first_line(e)


def _ld(view, layout: str) -> int:
    """Leading dimension, in elements, of a matrix (or transposed view) in `layout`: torch's
    stride() in elements, or numpy-style strides in bytes."""
    stride = view.stride() if callable(getattr(view, "stride", None)) else tuple(
        s // view.itemsize for s in view.strides)
    return stride[0] if layout == "row" else stride[1]


def _truncate_tf32(x: np.ndarray) -> np.ndarray:
    """f32 values as wgmma reads them as tf32: the low 13 mantissa bits dropped."""
    return tf32_operand(np.asarray(x, dtype=np.float32).view(np.uint32)).astype(np.float64)


def round_tf32(x: np.ndarray) -> np.ndarray:
    """Round f32 values to tf32 (10 mantissa bits), to nearest with ties away, as cvt.rna does."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x1000) & 0xFFFFE000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)
