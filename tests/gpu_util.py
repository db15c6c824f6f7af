"""GPU test helpers: the `gpu` skip and a record of what ran, for docs/results/."""
import json
import os

import pytest

from tilegen.runtime import gpu_available

requires_gpu = pytest.mark.skipif(not gpu_available(), reason="no NVIDIA GPU and driver")


def record(kind: str, **fields):
    """Append one JSON line to $TILEGEN_RECORD (when set) so a GPU run leaves its numbers."""
    path = os.environ.get("TILEGEN_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")
