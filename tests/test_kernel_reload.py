"""A Kernel loads its module once, and again after the process's module cache was cleared
(its old function handle would point at an unloaded module)."""
import tilegen
import tilegen.runtime as runtime
from tilegen.runtime import module


class _FakeFunction:
    info_log = "ptxas info    : Used 96 registers"
    local_bytes = 0

    def set_max_dynamic_smem(self, nbytes):
        pass


def test_function_is_reloaded_after_the_module_cache_is_cleared(monkeypatch):
    loads = []
    monkeypatch.setattr(runtime, "load_module",
                        lambda ptx, name, device=0, assemble=None: loads.append(name) or _FakeFunction())
    k = tilegen.compile(tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32)))
    first = k.function()
    assert k.function() is first and len(loads) == 1
    module._generation[0] += 1  # what clear_module_cache does
    try:
        assert k.function() is not first and len(loads) == 2
    finally:
        module._generation[0] -= 1
