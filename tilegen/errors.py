"""Errors users see. Each names what was wrong and what is allowed."""

import difflib


class TilegenError(Exception):
    """Base class of every error tilegen raises on purpose."""


class SpecError(TilegenError, ValueError):
    """An invalid kernel spec: names the field, the bad value and the legal set."""

    def __init__(self, field: str, value, allowed: str, why: str = ""):
        self.field = field
        self.value = value
        self.allowed = allowed
        self.why = why
        msg = f"{field}={shown(value)} is invalid"
        if why:
            msg += f": {why}"
        msg += f"; allowed: {allowed}"
        super().__init__(msg)


def shown(value, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (a huge value must not make a huge message)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 20]}... ({len(text)} characters)"


class LaunchError(TilegenError, ValueError):
    """Arguments a compiled kernel cannot run on (shape, dtype, stride, alignment)."""


class DeviceError(TilegenError, RuntimeError):
    """No usable GPU or driver, or a CUDA driver call failed."""


class DSLError(TilegenError):
    """A mistake in a kernel written with the tile DSL; points at the user's line."""


class IRError(TilegenError):
    """An IR invariant broken by a front-end or a pass (a tilegen bug, or a DSL misuse)."""


class HazardError(IRError):
    """A pipeline schedule that would read data before it lands or overwrite data in use
    (the hazard check, ir/hazards.py)."""


class EmulatorWarning(UserWarning):
    """No GPU was found, so work the caller did not send to the emulator by name runs on the
    CPU emulator (device="sim") instead. Said once a process; silenced like any warning:
    warnings.filterwarnings("ignore", category=tilegen.EmulatorWarning)."""


class PrecisionWarning(UserWarning):
    """A value tilegen was given is rounded to a narrower dtype before it is used (say, an f32
    bias added by an epilogue that works in the bf16 output's dtype)."""


class PerformanceWarning(UserWarning):
    """A kernel that runs, but slower than it should (say, registers spilled to local memory)."""


def missing_arguments(missing, given) -> str:
    """"missing arguments a, b", with the given names that look like misspellings of them."""
    near = []
    for name in missing:
        close = difflib.get_close_matches(name, [g for g in given if g not in missing], n=1)
        if close:
            near.append(f"{close[0]!r} for {name!r}?")
    return f"missing arguments {', '.join(missing)}" + (f" (given: {'; '.join(near)})" if near else "")


_said: set = set()


def warn_once(message: str, category=None) -> None:
    """warn(message, category) once a process (an EmulatorWarning unless another is given)."""
    if message not in _said:
        _said.add(message)
        warn(message, category or EmulatorWarning)


def warn(message: str, category) -> None:
    """warnings.warn pointing at the first line outside tilegen: the caller's code, however deep
    in tilegen the warning is made."""
    import os
    import sys
    import warnings

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, f = 2, sys._getframe(1)   # (stacklevel 1 is this function; 2 its caller)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(package):
        level, f = level + 1, f.f_back
    warnings.warn(message, category, stacklevel=level)

