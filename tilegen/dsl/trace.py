"""The tracing state: which kernel is being built, and where in the user's source we are."""
from __future__ import annotations

import contextlib
import os
import sys
import threading

from ..errors import DSLError

_DSL = os.path.dirname(os.path.abspath(__file__))  # this package: the DSL's own frames
_CONTEXTLIB = os.path.abspath(contextlib.__file__)  # `with tilegen.dsl.if_(...)` enters through it
_state = threading.local()


def user_location() -> str:
    """file:line of the innermost frame outside the DSL package: the kernel source that
    called the primitive (a user's, or one of tilegen's own kernels such as the GEMM)."""
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_DSL + os.sep) and path != _CONTEXTLIB:
            return f"{os.path.basename(path)}:{f.f_lineno}"
        f = f.f_back
    return "?"


def fail(message: str):
    raise DSLError(f"{user_location()}: {message}")


def current():
    tr = getattr(_state, "trace", None)
    if tr is None:
        fail("tile primitives can only be used inside a function decorated with @tilegen.kernel "
             "while it is being compiled")
    return tr


def begin(trace):
    if getattr(_state, "trace", None) is not None:
        raise DSLError("a kernel is already being traced on this thread (kernels cannot nest)")
    _state.trace = trace


def end():
    _state.trace = None


def made(ir):
    """Record where register fragment (or row vector) `ir` is made: the regions (runtime loop and
    if_ bodies) open there and the user's line; primitives.tile_op refuses its use once one of
    those bodies is closed. Returns `ir`."""
    tr = current()
    tr.homes[id(ir)] = (ir, tr.builder.open_regions(), user_location())
    return ir
