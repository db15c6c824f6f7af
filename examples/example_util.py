"""What the examples share: run a DSL kernel on numpy arrays on the GPU (when one is present)
or on tilegen's CPU emulator, and report the error against a float64 reference.

Not an example itself: batched_gemm.py, gemm_softmax.py and flash_attention.py import it.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

# Run from a checkout: the tilegen next to this folder wins over an installed copy.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_ROOT, "tilegen")) and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

ALIGN = 16  # cp.async moves 16 bytes: every row of an operand starts 16-byte aligned


EMULATOR_LIMIT_S = 30.0   # (as tilegen run's: longer emulations only with --device sim)


def pick_device(choice: str = "auto", work=None) -> str:
    """"gpu" or "sim" for a --device choice of auto, gpu or sim. `work`, (M, N, K) or a count of
    multiply-adds, is what the example computes: without a GPU and without --device sim, work the
    emulator needs more than EMULATOR_LIMIT_S for is refused at once (exit 2), as tilegen run does."""
    from tilegen.runtime import gpu_available

    if choice == "sim":
        return "sim"
    if gpu_available():
        return "gpu"
    if choice == "gpu":
        print("--device gpu: no GPU found (CUDA driver not detected); use --device sim", file=sys.stderr)
        raise SystemExit(2)
    if work is not None:
        from tilegen.sim.estimate import GEMM_FLOPS_MAX

        macs = work if isinstance(work, int) else work[0] * work[1] * work[2]
        seconds = 2.0 * macs / GEMM_FLOPS_MAX
        if seconds > EMULATOR_LIMIT_S:
            print(f"no GPU found, and this would take at least {seconds / 60:.0f} min on the CPU emulator "
                  f"(more than {EMULATOR_LIMIT_S:.0f} s): pass --device sim to run it there anyway, or smaller "
                  f"sizes", file=sys.stderr)
            raise SystemExit(2)
    return "sim"


def device_for(device: str) -> str:
    """"gpu" or "sim" for the examples' functions' device= ("auto", "gpu" or "sim"): a library call
    raises (ValueError) where the command line exits."""
    from tilegen.runtime import gpu_available

    if device not in ("auto", "gpu", "sim"):
        raise ValueError(f"device={device!r}; allowed: 'auto' (the GPU when present, else the CPU emulator), "
                         f"'gpu' or 'sim' (the emulator)")
    if device == "gpu" and not gpu_available():
        raise ValueError("device='gpu': no GPU found (CUDA driver not detected); device='sim' runs the CPU emulator")
    return "sim" if device == "sim" or not gpu_available() else "gpu"


MAX_SIZE = 1 << 20


def size(text: str) -> int:
    """An argparse type: a size from 1 to MAX_SIZE (a bad one exits 2 with a message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{value}: a size from 1 to {MAX_SIZE}")
    return value


def seed(text: str) -> int:
    """An argparse type: a random seed from 0 to 2^32 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{value}: a seed from 0 to 2^32 - 1")
    return value


def device_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--device", choices=("auto", "gpu", "sim"), default="auto",
                        help="where to run: the GPU when present (auto), or the CPU emulator (sim)")
    parser.add_argument("--seed", type=seed, default=0)


def padded(x: np.ndarray) -> tuple[np.ndarray, int]:
    """x (..., rows, cols) with each row padded to a multiple of 16 bytes: (copy, ld)."""
    per = ALIGN // x.itemsize
    cols = x.shape[-1]
    ld = max(per, -(-cols // per) * per)
    out = np.zeros(x.shape[:-1] + (ld,), dtype=x.dtype)
    out[..., :cols] = x
    return out, ld


class Runner:
    """Device memory and launches on "gpu" (cuda-python, through tilegen.runtime) or "sim"
    (tilegen.sim). Pointers are plain ints either way."""

    def __init__(self, device: str):
        self.device = device
        self._keep = []
        if device == "sim":
            from tilegen.sim import GlobalMemory

            self.memory = GlobalMemory()

    def put(self, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        if self.device == "sim":
            ptr = self.memory.alloc(array.nbytes)
            self.memory.write(ptr, array.tobytes())
            return ptr
        from tilegen.runtime import DeviceBuffer

        buf = DeviceBuffer.from_host(array)
        self._keep.append(buf)
        return buf.ptr

    def poisoned(self, shape, dtype) -> int:
        """An output buffer full of NaN: elements the kernel never writes stay NaN."""
        return self.put(np.full(shape, np.nan, dtype=dtype))

    def get(self, ptr: int, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        if self.device == "sim":
            out[...] = np.frombuffer(self.memory.read(ptr, out.nbytes), dtype=dtype).reshape(shape)
            return out
        buf = next(b for b in self._keep if b.ptr == ptr)
        return buf.copy_to_host(out)

    def launch(self, kernel, args: dict, sizes: dict):
        if self.device == "sim":
            from tilegen.sim import run_kernel

            run_kernel(kernel, args, sizes, memory=self.memory)
            return
        from tilegen.runtime import synchronize

        kernel.launch(args, sizes)
        synchronize()

    def time_ms(self, kernel, args: dict, sizes: dict, repeat: int = 20) -> float:
        """Mean time of one launch on the GPU (after a warm-up launch)."""
        from tilegen.runtime import Event, elapsed_ms

        kernel.launch(args, sizes)
        start, stop = Event(), Event()
        start.record()
        for _ in range(repeat):
            kernel.launch(args, sizes)
        stop.record()
        return elapsed_ms(start, stop) / repeat


def report(what: str, error: float, limit: float, extra: str = "") -> int:
    """Print the check's line; 0 when it passes, 1 when it fails."""
    ok = bool(np.isfinite(error)) and error <= limit
    print(f"{what}: error {error:.3g} (limit {limit:.3g}){extra}  {'PASS' if ok else 'FAIL'}")
    sys.stdout.flush()
    return 0 if ok else 1


def numpy_dtype(name: str):
    from tilegen.arch.dtypes import numpy_dtype as nd

    return nd(name)
