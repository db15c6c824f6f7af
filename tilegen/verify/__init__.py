"""Checks of tilegen's hardware facts against real hardware (and recorded dumps of it).

Names are loaded on first use so `python3 -m tilegen.verify.fragments` runs cleanly.
"""
_EXPORTS = {
    "Mismatch": "expect",
    "Probe": "fragments", "ProbeResult": "fragments", "Report": "fragments",
    "build_probes": "fragments", "compare_with_record": "fragments",
    "verify_fragments": "fragments",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tilegen.verify' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
