"""Test-wide setup: the packages the tests import are there (else one message, not an import
error per test file); the disk cache lives in a fresh directory per run, so tests never read
kernels another run (or an older tilegen) left behind, and never fill the user's cache."""
import gc
import importlib.util
import os
import shutil
import tempfile

import pytest

# tilegen's runtime needs (pyproject.toml's dependencies, less cuda-python: without it the GPU
# tests skip) and the test extra's hypothesis
NEEDED = ("numpy", "lark", "ml_dtypes", "hypothesis")


def pytest_configure(config):
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        pytest.exit(f"tilegen's tests need {', '.join(missing)}, not installed for this Python: install the project "
                    f"with its test extra (python3 -m pip install -e '.[test]'), or run the tests from the environment "
                    f"that has it", returncode=4)
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


@pytest.fixture(autouse=True)
def _fresh_host_choices():
    """matmul's choices for numpy operands forgotten before each test: a test that replaces what
    explain reads (the target, the tuned store) sees its own choices, not an earlier test's."""
    importlib.import_module("tilegen.gemm.matmul")._host_specs.clear()


@pytest.fixture(autouse=True)
def _cycles_collected_after_gpu_tests(request):
    """After each GPU test, the reference cycles it left collected: a torch CUDAGraph in one,
    collected inside a later test's capture, would invalidate that capture (PyTorch destroys the
    graph with calls a capture refuses; it collects before capturing only on request)."""
    yield
    if request.node.get_closest_marker("gpu") is not None:
        gc.collect()


@pytest.fixture
def sim_gpu(monkeypatch):
    """The CPU emulator standing in for a GPU under the fast paths (tests/sim_device.py): arrays
    in its memory are taken as PyTorch tensors are, and launches run on the emulator."""
    from sim_device import SimDevice

    dev = SimDevice(monkeypatch)
    yield dev
    dev.forget()
