from .cli import main as _main
"""tilegen's benchmarks: `python3 -m tilegen.bench` (or `tilegen bench`).

GEMM throughput against cuBLAS and Triton, the mma.sync peak measured with a tilegen kernel,
compile speed; results as JSON, comparisons with a baseline, Markdown and plots.
See docs/benchmarks.md."""


def main(argv=None) -> int:
    return _main(argv)


__all__ = ["main"]
