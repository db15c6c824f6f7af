"""tilegen's version (one place; tilegen.__version__ re-exports it)."""
__version__ = "0.1.0"
