"""A compiled kernel on the emulator from numpy arrays, by the names its tensors were declared with:
what `kernel(..., device="sim")` does (compiler/call.py), kept under this name.

    run_arrays(kernel, X=x, Y=y, alpha=2.0)        # x, y numpy arrays; updated in place
"""
from __future__ import annotations


def run_arrays(kernel, sizes: dict = None, **named) -> None:
    """Run `kernel` on the emulator with a numpy array for each of its arrays (by name: a matrix
    in its logical rows x columns) and its other parameters by name; `sizes` adds size symbols
    the grid reads that no array or parameter gives. The arrays the kernel writes hold what it
    left in them afterwards."""
    kernel.call_arrays(device="sim", **{**(sizes or {}), **named})


__all__ = ["run_arrays"]
