"""A compiled kernel on the emulator from numpy arrays, by the names its tensors were declared with:
what `kernel(..., device="sim")` does (compiler/call.py), kept under this name.

    run_arrays(kernel, X=x, Y=y, alpha=2.0)        # x, y numpy arrays; updated in place
"""
from __future__ import annotations

from .errors import SimError


def run_arrays(kernel, sizes: dict = None, **named) -> None:
    """Run `kernel` on the emulator with a numpy array for each of its arrays (by name: a matrix
    in its logical rows x columns) and its other parameters by name; `sizes` adds size symbols
    the grid reads that no array or parameter gives. The arrays the kernel writes hold what it
    left in them afterwards. What does not fit is a tilegen.LaunchError, as for kernel(...)."""
    clash = sorted(set(sizes or {}) & set(named))
    if clash:
        raise SimError(f"{getattr(kernel, 'name', 'kernel')}: {', '.join(clash)} given both in sizes and by name: give "
                       f"each once")
    kernel.call_arrays(device="sim", **{**(sizes or {}), **named})


__all__ = ["run_arrays"]
