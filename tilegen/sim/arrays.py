"""A compiled kernel on the emulator from numpy arrays, by the names its tensors were declared with:
the arrays are laid out in the emulator's memory as the kernel declares them (a tensor declared
layout="col" is stored transposed), their sizes become the size parameters, the other parameters
(scalars, sizes no array gives) are passed by name, and after the run every array holds what the
kernel left in its tensor.

    run_arrays(kernel, X=x, Y=y, alpha=2.0)        # x, y numpy arrays; updated in place
"""
from __future__ import annotations

import difflib

import numpy as np

from ..arch.dtypes import numpy_dtype
from .errors import SimError
from .memory import GlobalMemory
from .runner import run_kernel


def run_arrays(kernel, sizes: dict = None, **named) -> None:
    """Run `kernel` on the emulator with a numpy array for each of its tensors (by name, in its
    logical rows x columns) and its other parameters by name; `sizes` adds size symbols the grid
    reads that no array or parameter gives. The arrays hold the tensors' contents afterwards."""
    leading = getattr(kernel, "leading", ())
    params = [n for n, _ in kernel.params]
    if any(n.endswith("_batch_stride") for n in params):
        raise SimError(f"{kernel.name}: run_arrays takes 2-D tensors; a kernel of stacks (batched_tensor) runs with "
                       f"run_kernel(kernel, args, sizes, memory)")
    sizes, memory, args, placed = dict(sizes or {}), GlobalMemory(), {}, []
    given = {}   # size symbol -> the tensor that gave it
    for tensor, ld, rows, cols, dtype, logical in leading:
        if tensor not in named:
            raise SimError(f"{kernel.name}: no array for tensor {tensor} (its tensors: "
                           f"{', '.join(t[0] for t in leading)})")
        x = named.pop(tensor)
        want = numpy_dtype(dtype)
        if not isinstance(x, np.ndarray) or x.ndim != 2:
            raise SimError(f"{kernel.name}: {tensor} takes a 2-D numpy array, not {type(x).__name__}"
                           + (f" of {x.ndim} dimensions" if isinstance(x, np.ndarray) else ""))
        if x.dtype != want:
            raise SimError(f"{kernel.name}: {tensor} is declared {dtype}: pass a {want} array, not {x.dtype} "
                           f"(x.astype(...) converts)")
        stored = x if logical == "row" else x.T
        for sym, n in ((rows, stored.shape[0]), (cols, stored.shape[1])):
            if sizes.setdefault(sym, n) != n:
                raise SimError(f"{kernel.name}: {tensor} gives {sym} = {n}, but {given.get(sym, 'sizes')} gives "
                               f"{sym} = {sizes[sym]}")
            given.setdefault(sym, tensor)
        data = np.ascontiguousarray(stored)
        ptr = memory.alloc(max(data.nbytes, 1))
        memory.write(ptr, data)
        args[f"{tensor}_ptr"], args[ld] = ptr, max(data.shape[1], 1)
        placed.append((x, logical, ptr, data.shape))
    for name, value in named.items():
        if name not in params:
            near = difflib.get_close_matches(name, params, n=1)
            raise SimError(f"{kernel.name}: {name} is neither a tensor nor a parameter of this kernel"
                           + (f" ({near[0]}?)" if near else "") + f"; its parameters: {', '.join(params)}")
        args[name] = value
    for name in params:
        if name not in args and name in sizes:
            args[name] = sizes[name]
    run_kernel(kernel, args, sizes, memory)
    for x, logical, ptr, shape in placed:
        out = memory.read(ptr, int(np.prod(shape)) * x.dtype.itemsize, x.dtype).reshape(shape)
        x[...] = out if logical == "row" else out.T


__all__ = ["run_arrays"]
