"""tilegen's autotuner: the fastest GemmSpec for a problem on this GPU, and a cache of them.

    from tilegen.tune import tune, lookup
    res = tune("f16", "row", "row", 4096, 4096, 4096, budget_s=60)   # needs a GPU
    res.spec, res.tflops, res.default_tflops, res.candidates, print(res.table)
    lookup("f16", "row", "row", 4000, 4096, 4096, "f32", "NVIDIA H200", "13.0")  # no GPU needed

`python3 -m tilegen.tune --dtype f16 --layout rr --sizes 4096 8192 --budget-s 60` tunes from the
command line. The search space, the pruning, the timing and the cache are in docs/tuning.md.
"""
from ..gemm.tuned import cache_key, entries, key_fields, lookup, shape_bucket
from ..gemm.tuned import clear as clear_cache
from .cli import main
from .measure import device_key as current_device_key
from .search import KernelPool, Trial, TuneResult, format_table, tune
from .space import SearchSpace, enumerate_space, register_estimate, spec_text


__all__ = ["tune", "lookup", "TuneResult", "Trial", "KernelPool", "SearchSpace", "enumerate_space",
           "register_estimate", "spec_text", "format_table", "shape_bucket", "key_fields", "cache_key",
           "entries", "clear_cache", "current_device_key", "main"]
