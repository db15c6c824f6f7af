"""The tracing state: which kernel is being built, and where in the user's source we are."""
from __future__ import annotations

import os
import sys
import threading

from ..errors import DSLError

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the tilegen package
_state = threading.local()


def user_location() -> str:
    """file:line of the innermost frame outside tilegen (the user's kernel source)."""
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        # tilegen's own kernels (kernels/, bench/) are DSL user code too
        inside = path[len(_HERE):]
        if not path.startswith(_HERE + os.sep) or inside.startswith((os.sep + "kernels" + os.sep, os.sep + "bench" + os.sep)):
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
