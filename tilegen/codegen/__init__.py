"""IR (instruction level) -> PTX text."""
from .ptx import emit_ptx

__all__ = ["emit_ptx"]
