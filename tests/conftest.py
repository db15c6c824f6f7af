"""Test-wide setup: the disk cache lives in a fresh directory per run, so tests never read
kernels another run (or an older tilegen) left behind, and never fill the user's cache."""
import os
import shutil
import tempfile

import pytest


def pytest_configure(config):
    if "TILEGEN_TEST_KEEP_CACHE" not in os.environ:
        path = tempfile.mkdtemp(prefix="tilegen-test-cache-")
        os.environ["TILEGEN_CACHE_DIR"] = path
        config._tilegen_cache_dir = path


def pytest_unconfigure(config):
    path = getattr(config, "_tilegen_cache_dir", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cdir(tmp_path, monkeypatch):
    """A fresh, enabled cache in tmp_path/cache (not created yet), and no kernels remembered
    in this process, so compiles go through the disk cache."""
    from tilegen import compiler

    root = tmp_path / "cache"
    monkeypatch.setenv("TILEGEN_CACHE_DIR", str(root))
    monkeypatch.delenv("TILEGEN_CACHE", raising=False)
    compiler.forget()
    return root
