"""GemmSpec: a frozen, hashable, validated description of one GEMM kernel.

Every field has a default, so `GemmSpec(dtype="f16")` is a complete spec. Fields left at
None are resolved from the others at construction, so two specs that describe the same
kernel compare equal and hash alike. Anything invalid raises SpecError naming the field,
the bad value and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Optional, Union

from .arch import dtypes as _dtypes
from .arch.mma import DEFAULT_ATOM, MMA_ATOMS, MmaAtom, atoms_for
from .arch.swizzle import SWIZZLE_MODES
from .arch.targets import TARGETS, Target
from .errors import SpecError

OPERAND_DTYPES = ("tf32", "f16", "bf16", "f32", "e4m3", "e5m2")
ACC_DTYPES = ("f32", "f16")
OUT_DTYPES = ("f32", "f16", "bf16")
LAYOUTS = ("row", "col")
SWIZZLES = ("auto", *SWIZZLE_MODES, "pad", "none")
ACTIVATIONS = ("none", "relu", "gelu_tanh", "gelu_erf", "silu")
BIAS = (None, "row", "col")
STAGES = range(2, 7)
INSTRUCTIONS = ("mma.sync", "wgmma")
COPY_BYTES = 16  # one cp.async moves 16 bytes; tile rows are built from such chunks


def _ints(name: str, value, n: int) -> tuple:
    if isinstance(value, (list, tuple)) and len(value) == n and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return tuple(value)
    raise SpecError(name, value, f"a tuple of {n} positive ints")


@dataclass(frozen=True)
class TileShape:
    """Threadblock tile: each CTA computes an m x n block of C, stepping k at a time."""
    m: int
    n: int
    k: int

    @classmethod
    def of(cls, value) -> "TileShape":
        if isinstance(value, TileShape):
            value = (value.m, value.n, value.k)  # re-checked: a hand-built TileShape is unvalidated
        return cls(*_ints("tile", value, 3))

    def __iter__(self):
        return iter((self.m, self.n, self.k))


@dataclass(frozen=True)
class WarpLayout:
    """Warps of a CTA as an m x n grid; each warp owns a (tile.m/m) x (tile.n/n) warp tile."""
    m: int
    n: int

    @classmethod
    def of(cls, value) -> "WarpLayout":
        if isinstance(value, WarpLayout):
            value = (value.m, value.n)
        return cls(*_ints("warps", value, 2))

    @property
    def count(self) -> int:
        return self.m * self.n

    def __iter__(self):
        return iter((self.m, self.n))


@dataclass(frozen=True)
class Epilogue:
    """What happens between the accumulator and the single store of C.

    C = act(alpha * A @ B + beta * C0 + bias) + residual; alpha and beta are launch
    arguments. bias: None, "row" (length M) or "col" (length N).
    """
    bias: Optional[str] = None
    activation: str = "none"
    residual: bool = False

    def __post_init__(self):
        if self.bias not in BIAS:
            raise SpecError("epilogue.bias", self.bias, "None, 'row' (length M), 'col' (length N)")
        if self.activation not in ACTIVATIONS:
            raise SpecError("epilogue.activation", self.activation, ", ".join(ACTIVATIONS))
        if not isinstance(self.residual, bool):
            raise SpecError("epilogue.residual", self.residual, "True or False")

    @property
    def is_plain(self) -> bool:
        return self.bias is None and self.activation == "none" and not self.residual


# Defaults per operand dtype: (tile, stages). Tiles give 64 x 64 warp tiles with 2 x 2 warps
# and k-tiles whose rows are 128 bytes wide (one 128B swizzle span) for K-major operands.
_DEFAULT_TILE = {"tf32": (128, 128, 32), "f16": (128, 128, 64), "bf16": (128, 128, 64), "f32": (128, 64, 32),
                 "e4m3": (128, 128, 128), "e5m2": (128, 128, 128)}

# wgmma: two warpgroups of m64n256, four stages of 128-byte K rows (192 KB of shared memory).
_WGMMA_TILE = {"f16": (128, 256, 64), "bf16": (128, 256, 64), "tf32": (128, 256, 32)}
# tf32 with a row-major B computes C^T = B^T A^T: two warpgroups of 64 columns of C, each
# issuing m64n256 over the tile's 256 rows, B^T from registers (docs/perf_notes.md section 15).
_WGMMA_TF32_ROW_B = ((256, 128, 32), (1, 8))


def _wgmma_defaults(dtype: str, b_layout: str):
    """(tile, warps) of a wgmma spec that gives neither."""
    if dtype == "tf32" and b_layout == "row":
        return _WGMMA_TF32_ROW_B
    return _WGMMA_TILE.get(dtype) or _DEFAULT_TILE[dtype], (8, 1)


@dataclass(frozen=True)
class GemmSpec:
    """A GEMM kernel: C (M x N) = alpha * A (M x K) @ B (K x N) + beta * C.

    | field      | legal values                                    | default                  |
    | ---------- | ----------------------------------------------- | ------------------------ |
    | dtype      | tf32, f16, bf16, f32 (3xTF32), e4m3, e5m2       | f16                      |
    | acc_dtype  | f32; f16 for f16 operands                       | f32                      |
    | out_dtype  | f32, f16, bf16                                  | f32                      |
    | a_layout   | row (K contiguous), col (M contiguous)          | row                      |
    | b_layout   | row (N contiguous), col (K contiguous)          | row; col for fp8         |
    | tile       | (M, N, K) per CTA                               | by dtype, 128 x 128 x *; |
    |            |                                                 | 128 x 256 x * for wgmma  |
    |            |                                                 | (tf32, row-major B:      |
    |            |                                                 | 256 x 128 x 32, (1, 8))  |
    | warps      | (warps along M, warps along N), 1..16 in all    | (2, 2); (8, 1) for wgmma |
    | atom       | an mma atom name taking dtype/acc_dtype         | the largest-k atom       |
    | stages     | 2..6 shared-memory pipeline stages              | 3; 4 for wgmma           |
    | swizzle    | auto, 128B, 64B, 32B, pad, none                 | auto (widest that fits)  |
    | group_m    | CTA rows per group in the launch order (L2)     | 8                        |
    | frag_buffers | 1, or 2 to load k-step kk+1 during kk's mma   | 2; 1 for f32 (registers) |
    | epilogue   | Epilogue(...)                                   | plain                    |
    | target     | sm_80, sm_86, sm_89, sm_90, sm_90a              | sm_80; sm_89 for fp8;    |
    |            |                                                 | sm_90a for wgmma         |
    | instruction| mma.sync, or wgmma (sm_90a, f16/bf16/tf32)      | mma.sync                 |
    | persistent | wgmma: one CTA per SM walks the tiles, loading  | False                    |
    |            | the next tile while storing this one            |                          |

    With instruction="wgmma" each warpgroup (4 warps stacked along M) multiplies a 64-row
    slice of the tile straight from shared memory: warps.m is a multiple of 4, every warp
    tile is 16 rows high (tile.m = 16 * warps.m) and at most 256 columns wide; the copies run
    stages - 2 tiles ahead of the tensor cores (one more stage is still being read by them).
    wgmma reads tf32 from shared memory only K-major; only its A may come from registers.
    So a tf32 kernel with a row-major (N-major) B computes C^T = B^T A^T (swaps_operands):
    its warpgroups are 4 warps side by side along N (warps (1, 4k), tile.n = 16 * warps.n,
    tile.m at most 256), each loading its 64 columns of B into registers. A column-major A
    goes through registers too (register_operand), or, in a swapped kernel, is transposed
    while copied (stage_layout). The tensor cores truncate the f32 values they read from
    shared memory to tf32; register operands are rounded to nearest (tf32_truncates).
    """

    dtype: str = "f16"
    acc_dtype: str = "f32"
    out_dtype: str = "f32"
    a_layout: str = "row"
    b_layout: Optional[str] = None
    tile: Union[TileShape, tuple, None] = None
    warps: Union[WarpLayout, tuple, None] = None
    atom: Optional[str] = None
    stages: Optional[int] = None
    swizzle: str = "auto"
    group_m: int = 8
    frag_buffers: Optional[int] = None
    epilogue: Epilogue = field(default_factory=Epilogue)
    target: Optional[str] = None
    instruction: str = "mma.sync"
    persistent: bool = False

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen)
        if self.dtype not in OPERAND_DTYPES:
            raise SpecError("dtype", self.dtype, ", ".join(OPERAND_DTYPES))
        if self.b_layout is None:  # fp8 has no transposing load: its B must be K-major
            set_("b_layout", "col" if self.dtype in ("e4m3", "e5m2") else "row")
        if self.instruction not in INSTRUCTIONS:
            raise SpecError("instruction", self.instruction, ", ".join(INSTRUCTIONS))
        if self.target is None:
            set_("target", "sm_90a" if self.instruction == "wgmma"
                 else "sm_89" if self.dtype in ("e4m3", "e5m2") else "sm_80")
        if not isinstance(self.target, str) or self.target not in TARGETS:
            raise SpecError("target", self.target, ", ".join(TARGETS),
                            "tilegen needs sm_80 or newer (mma.sync, cp.async)"
                            if isinstance(self.target, str) and self.target.startswith("sm_") else "")
        if self.acc_dtype not in ACC_DTYPES:
            raise SpecError("acc_dtype", self.acc_dtype, ", ".join(ACC_DTYPES))
        if self.out_dtype not in OUT_DTYPES:
            raise SpecError("out_dtype", self.out_dtype, ", ".join(OUT_DTYPES))
        for name in ("a_layout", "b_layout"):
            if getattr(self, name) not in LAYOUTS:
                raise SpecError(name, getattr(self, name), "'row', 'col'")
        if not isinstance(self.epilogue, Epilogue):
            raise SpecError("epilogue", self.epilogue, "an Epilogue(...)")
        wgmma = self.instruction == "wgmma"
        default_tile, default_warps = (_wgmma_defaults(self.dtype, self.b_layout) if wgmma
                                       else (_DEFAULT_TILE[self.dtype], (2, 2)))
        set_("tile", TileShape.of(self.tile if self.tile is not None else default_tile))
        set_("warps", WarpLayout.of(self.warps if self.warps is not None else default_warps))
        if self.stages is None:
            set_("stages", 4 if wgmma else 3)
        if self.atom is None:
            key = (self.dtype, self.acc_dtype)
            if key not in DEFAULT_ATOM:
                legal = sorted({a.acc_type.name for a in atoms_for(self.dtype)})
                raise SpecError("acc_dtype", self.acc_dtype, ", ".join(legal),
                                f"no mma atom takes {self.dtype} operands with that accumulator")
            set_("atom", DEFAULT_ATOM[key])
        if self.swizzle == "auto":
            set_("swizzle", self._auto_swizzle())
        if self.frag_buffers is None:  # 3xTF32's split fragments leave no registers for two sets;
            # wgmma reads its operands from shared memory: no operand fragments at all
            set_("frag_buffers", 1 if self.dtype == "f32" or self.instruction == "wgmma" else 2)
        self._validate()

    # -- derived facts ------------------------------------------------------------------------
    @property
    def mma(self) -> MmaAtom:
        return MMA_ATOMS[self.atom]

    @property
    def operand_dtype(self) -> _dtypes.DType:
        return _dtypes.dtype(self.dtype)

    @property
    def mma_dtype(self) -> str:
        """What the tensor cores see: f32 operands run as three tf32 products (3xTF32)."""
        return "tf32" if self.dtype == "f32" else self.dtype

    @property
    def split_tf32(self) -> bool:
        """f32 accuracy from tf32 tensor cores: A@B ~ Ahi@Bhi + Ahi@Blo + Alo@Bhi."""
        return self.dtype == "f32"

    @property
    def target_info(self) -> Target:
        return TARGETS[self.target]

    @property
    def threads(self) -> int:
        return 32 * self.warps.count

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.tile.m // self.warps.m, self.tile.n // self.warps.n

    @property
    def swaps_operands(self) -> bool:
        """tf32 wgmma with a row-major B: the kernel computes C^T = B^T A^T, so that the
        N-major B (which wgmma cannot read from shared memory as tf32) is the A operand,
        fed from registers, and A^T, K-major, is read from shared memory."""
        return self.instruction == "wgmma" and self.dtype == "tf32" and self.b_layout == "row"

    @property
    def register_operand(self):
        """The operand ("A", "B" or None) a wgmma kernel loads into registers: the MN-major
        tf32 one that becomes wgmma's A."""
        if self.instruction != "wgmma" or self.dtype != "tf32":
            return None
        if self.swaps_operands:
            return "B"
        return "A" if self.a_layout == "col" else None

    def stage_layout(self, operand: str) -> str:
        """The memory order ("row" or "col") of an operand's shared stages: the tensor's,
        except for a column-major A in a swapped tf32 wgmma kernel (swaps_operands), where
        wgmma reads A^T K-major from shared memory: its copies transpose it."""
        if operand not in ("A", "B"):
            raise ValueError(f"operand {operand!r}; allowed: 'A', 'B'")
        if operand == "A" and self.swaps_operands:
            return "row"
        return self.a_layout if operand == "A" else self.b_layout

    def transposes(self, operand: str) -> bool:
        """Whether the copies of an operand transpose it into its stages."""
        return self.stage_layout(operand) != (self.a_layout if operand == "A" else self.b_layout)

    @property
    def tf32_truncates(self) -> bool:
        """wgmma reads tf32 operands as the f32 values the copies left in shared memory and
        truncates them (unit roundoff 2^-10); the mma.sync path rounds them to nearest while
        loading its fragments (cvt.rna, 2^-11), as wgmma kernels do for the operand they load
        into registers (register_operand)."""
        return self.instruction == "wgmma" and self.dtype == "tf32"

    def operand_tile(self, operand: str) -> tuple[int, int]:
        """(rows, contiguous columns) of one stage of an operand's shared tile, in elements:
        a row-major A stage is tile.m rows of tile.k, a column-major one tile.k rows of
        tile.m; likewise for B (stage_layout gives the order)."""
        t = self.tile
        if self.stage_layout(operand) == "row":
            return (t.m, t.k) if operand == "A" else (t.k, t.n)
        return (t.k, t.m) if operand == "A" else (t.n, t.k)

    def is_k_major(self, operand: str) -> bool:
        """Whether the operand's stages run along K (what the shared-memory reads see)."""
        return self.stage_layout(operand) == ("row" if operand == "A" else "col")

    def smem_bytes(self) -> int:
        """Shared memory the pipeline needs (all stages of A and B, alignment slack included)."""
        from .layout import smem_layout  # local: layout depends on spec's fields only

        total = sum(smem_layout(self, op).stage_bytes for op in "AB") * self.stages
        return total + 1024  # dynamic shared memory is rounded up to a 1024-byte boundary

    def replace(self, **changes) -> "GemmSpec":
        return replace(self, **changes)

    def to_text(self, minimal: bool = False) -> str:
        """The spec as .tg text (every field; minimal=True: only those off their defaults)."""
        from .textspec import spec_to_text  # local: the text format imports spec

        return spec_to_text(self, minimal=minimal)

    @classmethod
    def from_text(cls, text_or_path) -> "GemmSpec":
        """A spec from .tg text or a path to a .tg file (tilegen/textspec.py)."""
        from .textspec import parse_spec_text

        return parse_spec_text(text_or_path)

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, TileShape):
                v = f"{v.m}x{v.n}x{v.k}"
            elif isinstance(v, WarpLayout):
                v = f"{v.m}x{v.n}"
            elif isinstance(v, Epilogue):
                v = "plain" if v.is_plain else f"bias={v.bias},act={v.activation},residual={v.residual}"
            parts.append(f"{f.name}={v}")
        return "GemmSpec(" + ", ".join(parts) + ")"

    # -- validation ---------------------------------------------------------------------------
    def _auto_swizzle(self) -> str:
        """The widest XOR swizzle whose span divides both operand rows; padding otherwise."""
        esize = _dtypes.dtype(self.dtype).bytes
        widths = [self.operand_tile(op)[1] * esize for op in "AB"]
        rows = [self.operand_tile(op)[0] for op in "AB"]
        for mode, swz in SWIZZLE_MODES.items():  # widest first
            if all(w % swz.span == 0 and r * swz.span % swz.period == 0 for w, r in zip(widths, rows)):
                return mode
        return "pad"

    @property
    def wgmma(self):
        """The wgmma shape each warpgroup issues (instruction="wgmma" only)."""
        from .arch.wgmma import WgmmaShape

        return WgmmaShape(self.dtype, self.warp_tile[0] if self.swaps_operands else self.warp_tile[1])

    def _validate_wgmma(self):
        from .arch import wgmma as W

        t, w = self.tile, self.warps
        if not self.target_info.arch_specific or self.target_info.sm < 90:
            raise SpecError("target", self.target, "sm_90a", "wgmma exists only on the arch-specific Hopper target")
        if self.dtype not in W.K_BY_DTYPE or self.acc_dtype != "f32":
            raise SpecError("dtype", self.dtype, ", ".join(W.K_BY_DTYPE),
                            "wgmma kernels take f16, bf16 or tf32 operands and accumulate in f32")
        if self.frag_buffers != 1:
            raise SpecError("frag_buffers", self.frag_buffers, "1",
                            "wgmma reads its operands from shared memory: there are no fragments to double-buffer")
        if self.swaps_operands:
            if w.m != 1 or w.n % W.WARPGROUP or t.n != 16 * w.n:
                raise SpecError("warps", (w.m, w.n), f"(1, a multiple of 4) with tile.n = 16 * warps.n (tile.n is {t.n})",
                                "tf32 with a row-major B computes C^T = B^T A^T: each warpgroup of 4 warps "
                                "side by side along N computes 64 columns")
            if t.m not in W.N_RANGE:
                raise SpecError("tile", (t.m, t.n, t.k), "tile.m a multiple of 8 up to 256",
                                f"each warpgroup issues m64n{t.m} over the tile's rows (C^T = B^T A^T)")
        elif w.m % W.WARPGROUP or t.m != 16 * w.m:
            raise SpecError("warps", (w.m, w.n), f"warps.m a multiple of 4 with tile.m = 16 * warps.m (tile.m is {t.m})",
                            "each warpgroup of 4 warps stacked along M computes 64 rows")
        wn = self.warp_tile[1]
        if not self.swaps_operands and wn not in W.N_RANGE:
            raise SpecError("tile", (t.m, t.n, t.k), "tile.n / warps.n a multiple of 8 up to 256",
                            f"each warpgroup issues m64n{wn}")
        if self.swizzle not in W.SWIZZLE_CODE:
            raise SpecError("swizzle", self.swizzle, ", ".join(W.SWIZZLE_CODE),
                            "wgmma reads shared memory through descriptors of swizzled layouts")
        span = SWIZZLE_MODES[self.swizzle].span
        esize = self.operand_dtype.bytes
        if self.is_k_major("A") or self.is_k_major("B"):
            if W.K_BY_DTYPE[self.dtype] * esize > span:
                raise SpecError("swizzle", self.swizzle, "128B, 64B",
                                f"one k-step of {W.K_BY_DTYPE[self.dtype] * esize} bytes must fit in a swizzle span")
        if not self.is_k_major("B") and self.register_operand != "B" and (wn * esize) % span:
            raise SpecError("tile", (t.m, t.n, t.k), f"tile.n / warps.n a multiple of {span // esize}",
                            "an N-major B splits between warpgroups on whole swizzle panels")
        if self.stages < 3:
            raise SpecError("stages", self.stages, "3..6", "wgmma kernels keep one stage for the tensor cores "
                            "still reading the previous tile")

    def _validate(self):
        if not isinstance(self.atom, str) or self.atom not in MMA_ATOMS:
            raise SpecError("atom", self.atom, ", ".join(a.name for a in atoms_for(self.dtype, acc=self.acc_dtype))
                            or ", ".join(MMA_ATOMS))
        tgt, atom, dt = self.target_info, self.mma, self.operand_dtype
        if dt.min_sm > tgt.sm:
            raise SpecError("target", self.target, ", ".join(t for t, x in TARGETS.items() if x.sm >= dt.min_sm),
                            f"{self.dtype} mma needs sm_{dt.min_sm} or newer")
        if atom.a_type.name != self.mma_dtype or atom.acc_type.name != self.acc_dtype:
            legal = [a.name for a in atoms_for(self.mma_dtype, acc=self.acc_dtype)]
            raise SpecError("atom", self.atom, ", ".join(legal) or "none",
                            f"the atom must take {self.dtype} operands and accumulate in {self.acc_dtype}")
        if atom.min_sm > tgt.sm:
            raise SpecError("target", self.target, ", ".join(t for t, x in TARGETS.items() if x.sm >= atom.min_sm),
                            f"atom {atom.name} needs sm_{atom.min_sm} or newer")
        if dt.bits == 8 and (self.a_layout, self.b_layout) != ("row", "col"):
            raise SpecError("a_layout/b_layout", (self.a_layout, self.b_layout), "('row', 'col') for fp8",
                            "fp8 operands must be K-major: there is no 8-bit ldmatrix transpose before sm_100")
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or self.stages not in STAGES:
            raise SpecError("stages", self.stages, f"{STAGES.start}..{STAGES.stop - 1}")
        if not 1 <= self.warps.count <= 16:
            raise SpecError("warps", (self.warps.m, self.warps.n), "1 to 16 warps in all")
        if self.frag_buffers not in (1, 2) or isinstance(self.frag_buffers, bool):
            raise SpecError("frag_buffers", self.frag_buffers, "1, 2")
        if isinstance(self.group_m, bool) or not isinstance(self.group_m, int) or not 1 <= self.group_m <= 64:
            raise SpecError("group_m", self.group_m, "an int in 1..64 (1 = plain row-by-row order)")
        if not isinstance(self.persistent, bool):
            raise SpecError("persistent", self.persistent, "True, False")
        if self.persistent and self.instruction != "wgmma":
            raise SpecError("persistent", self.persistent, "False for mma.sync kernels",
                            "persistent CTAs are built for the wgmma main loop (instruction='wgmma')")
        if self.instruction == "wgmma":
            self._validate_wgmma()
        t, w = self.tile, self.warps
        if t.m % (w.m * atom.m):
            raise SpecError("tile", (t.m, t.n, t.k), f"tile.m a multiple of warps.m * atom.m = {w.m * atom.m}")
        # Fragments of B are loaded two n8 atoms at a time (one ldmatrix.x4 / paired loads).
        if t.n % (w.n * 2 * atom.n):
            raise SpecError("tile", (t.m, t.n, t.k), f"tile.n a multiple of warps.n * 2 * atom.n = {w.n * 2 * atom.n}")
        if t.k % atom.k:
            raise SpecError("tile", (t.m, t.n, t.k), f"tile.k a multiple of atom.k = {atom.k}")
        wm, wn = self.warp_tile
        if wm * wn // (atom.m * atom.n) * atom.c.regs > 128:
            raise SpecError("tile", (t.m, t.n, t.k),
                            "warp tiles of at most 128 accumulator registers per thread "
                            f"(this one needs {wm * wn // (atom.m * atom.n) * atom.c.regs}): more warps or a smaller tile")
        if self.swizzle not in SWIZZLES:
            raise SpecError("swizzle", self.swizzle, ", ".join(SWIZZLES))
        for op in "AB":
            rows, cols = self.operand_tile(op)
            row_bytes = cols * dt.bytes
            if row_bytes % COPY_BYTES:
                raise SpecError("tile", (t.m, t.n, t.k),
                                f"operand {op}'s shared rows are {row_bytes} bytes; they must be a multiple of 16 bytes")
            chunks = rows * row_bytes // COPY_BYTES
            if self.transposes(op):  # 4-byte elements in 8-row x 16-byte blocks, one per warp
                blocks = rows // 8 * (row_bytes // COPY_BYTES)
                if rows % 8 or blocks % self.warps.count:
                    raise SpecError("tile", (t.m, t.n, t.k),
                                    f"operand {op} is transposed while copied, in blocks of 8 rows x 16 bytes: "
                                    f"its {rows} x {row_bytes}-byte stage must split into whole blocks for each "
                                    f"of the {self.warps.count} warps")
            elif chunks % self.threads:
                raise SpecError("tile", (t.m, t.n, t.k),
                                f"operand {op}'s tile has {chunks} 16-byte chunks, not a multiple of the "
                                f"{self.threads} threads that copy it")
            swz = SWIZZLE_MODES.get(self.swizzle)
            if swz is not None and (rows * swz.span) % swz.period:
                raise SpecError("swizzle", self.swizzle, "pad, none or a narrower swizzle",
                                f"operand {op}'s shared tile has {rows} rows, too few to fill one swizzle period")
            if self.swizzle in SWIZZLE_MODES and row_bytes % SWIZZLE_MODES[self.swizzle].span:
                legal = [m for m, s in SWIZZLE_MODES.items() if row_bytes % s.span == 0] + ["pad", "none"]
                raise SpecError("swizzle", self.swizzle, ", ".join(legal),
                                f"operand {op}'s shared rows are {row_bytes} bytes, not a multiple of the swizzle span")
        need = self.smem_bytes()
        if need > tgt.smem_per_block:
            raise SpecError("stages", self.stages, f"a pipeline within {tgt.smem_per_block} bytes on {tgt.name}",
                            f"tile {t.m}x{t.n}x{t.k} with {self.stages} stages needs {need} bytes of shared memory")
