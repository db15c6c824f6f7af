"""Test-wide setup: the disk cache lives in a fresh directory per run, so tests never read
kernels another run (or an older tilegen) left behind, and never fill the user's cache."""
import os
import shutil
import tempfile


def pytest_configure(config):
    if "TILEGEN_TEST_KEEP_CACHE" not in os.environ:
        path = tempfile.mkdtemp(prefix="tilegen-test-cache-")
        os.environ["TILEGEN_CACHE_DIR"] = path
        config._tilegen_cache_dir = path


def pytest_unconfigure(config):
    path = getattr(config, "_tilegen_cache_dir", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
