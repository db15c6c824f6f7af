"""A GEMM call on the emulator: the host path of tilegen.gemm_call with GlobalMemory in
place of the GPU. A and B are copied into 16-byte pitched buffers exactly as for the GPU
(gemm_call._pitched), C is copied in (beta may read it) and back out."""
from __future__ import annotations

import numpy as np

from ..arch.dtypes import numpy_dtype
from ..errors import LaunchError
from .memory import GlobalMemory
from .runner import run_kernel


def run_gemm_sim(kernel, A, B, *, out=None, alpha=1.0, beta=0.0, memory=None):
    from ..gemm_call import _check_host, _pitched, _shapes  # the GPU host path's own checks

    spec = kernel.spec
    in_dt, out_dt = numpy_dtype(spec.dtype), numpy_dtype(spec.out_dtype)
    for x, name in ((A, "A"), (B, "B"), (out, "out")):
        if x is not None and not isinstance(x, np.ndarray):
            raise LaunchError(f"device='sim' runs on numpy arrays; {name} is a {type(x).__name__}")
    alpha, beta = float(alpha), float(beta)
    _check_host(A, "A", in_dt, spec.dtype)
    _check_host(B, "B", in_dt, spec.dtype)
    if out is not None:
        _check_host(out, "out", out_dt, spec.out_dtype)
        if not out.flags.writeable:
            raise LaunchError("out is read-only")
    M, N, K = _shapes(A, B, out)
    if beta != 0.0 and out is None:
        raise LaunchError("beta != 0 reads C from out=; pass out")
    if out is None:
        out = np.empty((M, N), dtype=out_dt)
    if M == 0 or N == 0:
        return out
    a_stored, lda = _pitched(A if spec.a_layout == "row" else A.T)
    b_stored, ldb = _pitched(B if spec.b_layout == "row" else B.T)
    c_host = np.ascontiguousarray(out)
    mem = memory if memory is not None else GlobalMemory()
    ptrs = []
    for host in (a_stored, b_stored, c_host):
        p = mem.alloc(host.nbytes)
        mem.write(p, host)
        ptrs.append(p)
    args = {"M": M, "N": N, "K": K, "A_ptr": ptrs[0], "A_ld": lda, "B_ptr": ptrs[1], "B_ld": ldb,
            "C_ptr": ptrs[2], "C_ld": N, "alpha": alpha, "beta": beta}
    try:
        run_kernel(kernel, args, {"M": M, "N": N, "K": K}, mem)
        c_host[...] = mem.read(ptrs[2], c_host.nbytes).view(out_dt).reshape(M, N)
    finally:
        if memory is not None:
            for p in ptrs:
                memory.free(p)
    if c_host is not out:
        out[...] = c_host
    return out
