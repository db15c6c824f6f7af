"""Hardware facts as data: dtypes, mma atoms, fragment maps, ldmatrix/stmatrix,
swizzles, the shared-memory bank model and per-target limits.

Everything else in tilegen reads these tables; nothing re-derives them.
This package imports nothing else of tilegen.
"""
from .dtypes import DType, DTYPES, dtype
from .fragments import FragmentMap
from .mma import MmaAtom, MMA_ATOMS, mma_atom, atoms_for
from .ldmatrix import MatrixLoad, LDMATRIX, STMATRIX, matrix_op
from .swizzle import Swizzle, SWIZZLE_MODES, swizzle_mode
from .banks import wavefronts, matrix_wavefronts
from .targets import Target, TARGETS, target, ptx_version_for

__all__ = [
    "DType", "DTYPES", "dtype", "FragmentMap", "MmaAtom", "MMA_ATOMS", "mma_atom",
    "atoms_for", "MatrixLoad", "LDMATRIX", "STMATRIX", "matrix_op", "Swizzle",
    "SWIZZLE_MODES", "swizzle_mode", "wavefronts", "matrix_wavefronts", "Target",
    "TARGETS", "target", "ptx_version_for",
]
