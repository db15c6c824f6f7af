"""Shared helpers for tests that assemble PTX."""
import pytest

from tilegen.codegen.ptxas import PtxasError, assemble, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def assert_assembles(ptx: str, arch: str):
    try:
        return assemble(ptx, arch)
    except PtxasError as e:  # show the message, not a traceback into subprocess
        pytest.fail(str(e))
