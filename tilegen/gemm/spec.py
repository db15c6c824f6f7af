"""GemmSpec: a frozen, hashable, validated description of one GEMM kernel.

Every field has a default, so `GemmSpec(dtype="f16")` is a complete spec. Fields left at
None are resolved from the others at construction, so two specs that describe the same
kernel compare equal and hash alike. Anything invalid raises SpecError naming the field,
the bad value and what is allowed.
"""
from __future__ import annotations

import difflib
import functools
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Optional, Union

import numpy as np

from ..arch import dtypes as _dtypes
from ..arch.dtypes import FP8
from ..arch.mma import DEFAULT_ATOM, MMA_ATOMS, MmaAtom, atoms_for
from ..arch.swizzle import SWIZZLE_MODES
from ..arch.targets import NEWER_GPUS, TARGETS, Target
from ..errors import SpecError
from ..ir.tile import activation_choices, canonical_activation
from . import textspec
from .layouts import smem_layout
from .mainloops import MAINLOOPS

OPERAND_DTYPES = ("tf32", "f16", "bf16", "f32", "e4m3", "e5m2")
ACC_DTYPES = ("f32", "f16")
OUT_DTYPES = ("f32", "f16", "bf16")
LAYOUTS = ("row", "col")
SWIZZLES = ("auto", *SWIZZLE_MODES, "pad", "none")
BIAS = (None, "row", "col")
STAGES = range(2, 33)
INSTRUCTIONS = tuple(MAINLOOPS)
COPY_BYTES = 16  # one cp.async moves 16 bytes; tile rows are built from such chunks
COPIES = ("cp.async", "tma")
STORES = ("direct", "tma")
CLUSTERS = ((1, 1), (2, 1), (1, 2))   # CTAs per cluster along (M, N)
MAX_SPLIT_K = 16
MAX_PROMOTE = 8
STREAM_K_FIXUP = (64, 64)   # the stream-K fix-up kernel's block of C (template.stream_k_fixup)
# fp8 wgmma: k-tiles (of 128) per promotion. Measured on the H200 (docs/perf_notes.md section 25):
# every 2 keeps the error at cuBLASLt's (torch._scaled_mm) up to K = 16384; every 4 is 5% faster and
# up to 10% less accurate; never (0) 10% faster again, with 2-4x cuBLASLt's error at long K.
FP8_PROMOTE = 2


def _target_hint(name) -> str:
    """Why a target name is not one tilegen generates for, and what to use instead."""
    if not isinstance(name, str):
        return ""
    if name.lower() in TARGETS:
        return f"targets are lower case: {name.lower()!r}"
    digits = name[3:].rstrip("aAfF") if name.lower().startswith("sm_") else ""
    if not digits.isdigit():
        return ""
    if int(digits) < 80:
        return "tilegen needs sm_80 or newer (mma.sync, cp.async)"
    return (f"newer than the targets tilegen generates for; on such a GPU {NEWER_GPUS}'s PTX runs through the "
            f"driver's JIT: pass target='{NEWER_GPUS}' (tilegen.matmul does)")


# fields of the Hopper kernels only: a refusal of them on another instruction says what to add
_WGMMA_FIELDS = ("persistent", "copy", "store", "cluster", "stream_k", "pingpong", "swap_ab", "promote")


def _valid_on_wgmma(given: dict) -> bool:
    """Whether the fields a caller gave, refused on their instruction, make a valid Hopper spec
    with instruction='wgmma' (a target given for another GPU stays, and is refused)."""
    if given.get("instruction") == "wgmma":
        return False
    try:
        GemmSpec(**{**given, "instruction": "wgmma"})
    except (SpecError, ValueError, TypeError):
        return False
    return True
_INT_FIELDS = ("stages", "group_m", "frag_buffers", "split_k", "promote")


def _int(v):
    """v as a Python int where it is an integer of another type (numpy's, from sizes computed
    with numpy), else v itself: a spec holds plain ints (its repr names its kernels' cache entries)."""
    return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) and type(v) is not int else v


def _ints(name: str, value, n: int) -> tuple:
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, (list, tuple)) and len(value) == n:
        value = tuple(_int(v) for v in value)
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            return value
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

    C = act(alpha * s_row * s_col * A @ B + beta * C0 + bias) + residual; alpha and beta are
    launch arguments. bias: None, "row" (length M) or "col" (length N). activation: none, relu,
    gelu_tanh, gelu_erf, silu; "gelu" is PyTorch's default GELU and means gelu_erf. scale_rows /
    scale_cols: f32 vectors of length M / N multiplying each row / column of A @ B (the
    per-row scales of A and per-column scales of B of a scaled fp8 GEMM). device_scale_a /
    device_scale_b: A's / B's per-tensor scale, one f32 the kernel reads from device memory
    (parameter scale_a_ptr / scale_b_ptr) and multiplies into alpha: torch._scaled_mm's scale
    tensors, used where they are (no read-back to the host, so capturable in a CUDA graph).
    """
    bias: Optional[str] = None
    activation: str = "none"
    residual: bool = False
    scale_rows: bool = False
    scale_cols: bool = False
    device_scale_a: bool = False
    device_scale_b: bool = False

    def __post_init__(self):
        if self.bias not in BIAS:
            raise SpecError("epilogue.bias", self.bias, "None, 'row' (length M), 'col' (length N)")
        act = canonical_activation("none" if self.activation is None else self.activation)   # (None: as matmul's)
        if act is None:
            raise SpecError("epilogue.activation", self.activation, activation_choices())
        object.__setattr__(self, "activation", act)
        for name in ("residual", "scale_rows", "scale_cols", "device_scale_a", "device_scale_b"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"epilogue.{name}", getattr(self, name), "True or False")
        for vector, scalar in (("scale_rows", "device_scale_a"), ("scale_cols", "device_scale_b")):
            if getattr(self, vector) and getattr(self, scalar):
                raise SpecError(f"epilogue.{scalar}", True, f"False with {vector} (one scale per operand: a vector "
                                                            f"or one number)")

    @property
    def is_plain(self) -> bool:
        return (self.bias is None and self.activation == "none" and not self.residual and not self.scale_rows
                and not self.scale_cols and not self.device_scale_a and not self.device_scale_b)


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
    | stages     | 2..32 shared-memory pipeline stages (as many as | 3; 4 for wgmma           |
    |            | the GPU's shared memory holds)                  |                          |
    | swizzle    | auto, 128B, 64B, 32B, pad, none                 | auto (widest that fits)  |
    | group_m    | CTA rows per group in the launch order (L2)     | 8                        |
    | frag_buffers | 1, or 2 to load k-step kk+1 during kk's mma   | 2; 1 for f32 (registers) |
    |            | (wgmma: 2 with promote=1, two accumulators      | and wgmma                |
    |            | taking turns; needs ptxas's registers)          |                          |
    | epilogue   | Epilogue(...)                                   | plain                    |
    | target     | sm_80, sm_86, sm_89, sm_90, sm_90a              | sm_80; sm_89 for fp8;    |
    |            |                                                 | sm_90a for wgmma         |
    | instruction| mma.sync, or wgmma (sm_90a, f16/bf16/tf32)      | mma.sync                 |
    | persistent | wgmma: one CTA per SM walks the tiles, loading  | True for f16/bf16 wgmma  |
    |            | the next tile while storing this one; with TMA  | (TMA copies), else False |
    |            | copies, warp-specialized: a producer warpgroup  |                          |
    |            | ahead of `warps` issues every copy              |                          |
    | copy       | auto, cp.async (every thread copies), tma (one  | auto: tma for f16/bf16   |
    |            | thread, TMA boxes completing on mbarriers)      | wgmma, else cp.async     |
    | store      | auto, direct (each thread writes its results),  | auto: tma for warp-      |
    |            | tma (through shared memory and TMA stores while | specialized kernels with |
    |            | the next block's main loop runs; beta = 0)      | a plain epilogue         |
    | promote    | fp8 wgmma: every `promote` k-tiles the products | 2 for fp8 wgmma, else 0  |
    |            | (the tensor cores keep fewer bits while they    | (matmul: 1 where ptxas   |
    |            | accumulate fp8) are added into an f32 total in  | assembles it)            |
    |            | registers; 0: never (True = 1, False = 0); 1:   |                          |
    |            | cuBLASLt's error                                |                          |
    | split_k    | 1..16: K in that many slices, one CTA each per  | 1                        |
    |            | block, their f32 partial sums added in order by |                          |
    |            | a second kernel that applies the epilogue       |                          |
    |            | (persistent=False; a stack on the warp-special- |                          |
    |            | ized kernel: a row of persistent CTAs a slice,  |                          |
    |            | the last slice to finish a block adding them)   |                          |
    | stream_k   | warp-specialized wgmma: the blocks past the     | False                    |
    |            | last whole wave of CTAs are shared out by       |                          |
    |            | k-tiles evenly across as many CTAs as keep      |                          |
    |            | pieces 8 k-tiles long (template.StreamK); their |                          |
    |            | f32 pieces are added in order by a second       |                          |
    |            | kernel that applies the epilogue                |                          |
    | pingpong   | warp-specialized wgmma: two consumer warp-      | False                    |
    |            | groups, each multiplying whole tile.m x tile.n  |                          |
    |            | blocks of its own (alternate ones), so one's    |                          |
    |            | epilogue runs while the other's wgmmas do;      |                          |
    |            | warps = (4, 1), one warpgroup per block         |                          |
    | cluster    | (1, 1); (2, 1): two CTAs along M share each B   | (1, 1)                   |
    |            | k-tile, each loading half and multicasting it;  |                          |
    |            | (1, 2): along N, sharing A (warp-specialized    |                          |
    |            | wgmma kernels, sm_90a)                          |                          |
    | (f32 on wgmma: first kernels split A and B into |                          |
    |            | tf32 parts side by side along K, multiplied by  |                          |
    |            | one tf32 kernel promoted every F32_PROMOTE      |                          |
    |            | k-tiles: 3xTF32, f32 accuracy; gemm/prepare.py) |                          |
    | pretranspose | tf32 wgmma with an MN-major operand (A col-   | False                    |
    |            | major, B row-major): a first kernel copies it   |                          |
    |            | K-major into a stream-ordered workspace, then   |                          |
    |            | the K-major kernel runs (gemm/prepare.py);      |                          |
    |            | tile, copy and the rest default as for A row-   |                          |
    |            | major, B column-major. "A" (A column-major, B   |                          |
    |            | row-major): A alone is copied, then the kernel  |                          |
    |            | of A and B row-major (B through registers)      |                          |
    | batched    | a stack of products C[b] = A[b] @ B[b], one     | False                    |
    |            | grid row per matrix (program_id("y")), each     |                          |
    |            | operand's matrices `<name>_batch_stride`        |                          |
    |            | elements apart (0: one matrix for all), cp.async|                          |
    |            | copies; with copy="tma" the warp-specialized    |                          |
    |            | kernel walking every block of every matrix,     |                          |
    |            | each stack through a 3-D tensor map             |                          |
    |            | (template.TmaStack)                             |                          |
    | swap_ab    | 16-bit and fp8 wgmma: compute C^T = B^T A^T,    | False                    |
    |            | so that tile.n (64 per warpgroup, warps (1, 4)) |                          |
    |            | fills wgmma's rows and tile.m (16..256 by 16:   |                          |
    |            | decoding's few rows) its n; stores C directly,  |                          |
    |            | transposed                                      |                          |

    `instruction` names the main-loop family (tilegen/gemm/mainloops/): its defaults, its
    rules and its pipeline; the wgmma family's rules are in WgmmaLoop's docstring.
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
    persistent: Optional[bool] = None
    copy: str = "auto"
    store: str = "auto"
    cluster: tuple = (1, 1)
    split_k: int = 1
    promote: Optional[int] = None
    stream_k: bool = False
    pingpong: bool = False
    pretranspose: Union[bool, str] = False   # False, True, or "A"
    batched: bool = False
    swap_ab: bool = False

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen)
        given = {f.name: getattr(self, f.name) for f in fields(self)}   # (as the caller wrote them)
        for name in _INT_FIELDS:   # (numpy integers, from sizes computed with numpy: plain ints)
            set_(name, _int(getattr(self, name)))
        for name, names in (("dtype", OPERAND_DTYPES), ("acc_dtype", ACC_DTYPES), ("out_dtype", OUT_DTYPES)):
            value = getattr(self, name)   # ("BF16" is bf16, as activations take any case)
            if isinstance(value, str) and value.lower() in names:
                set_(name, value.lower())
        cluster = self.cluster.tolist() if isinstance(self.cluster, np.ndarray) else self.cluster
        if isinstance(cluster, (list, tuple)):
            set_("cluster", tuple(_int(v) for v in cluster))
        if not (isinstance(self.pretranspose, bool) or self.pretranspose == "A"):
            raise SpecError("pretranspose", self.pretranspose, "True, False or 'A'")
        if self.dtype not in OPERAND_DTYPES:
            raise SpecError("dtype", self.dtype, ", ".join(OPERAND_DTYPES))
        if self.pretranspose or self.splits_operands:   # the kernel that runs is another: its defaults, its rules
            if self.b_layout is None:
                set_("b_layout", "row")
            self._check_prepared()
            if self.splits_operands:   # f32 on wgmma: one tf32 product of the operands' parts, promoted
                twin = replace(self, dtype="tf32", a_layout="row", b_layout="col", tile=self.tile or F32_WGMMA_TILE,
                               promote=F32_PROMOTE if self.promote is None else self.promote)
            elif self.pretranspose == "A":   # A copied K-major; A and B row-major, B through registers on TMA
                twin = replace(self, a_layout="row", b_layout="row", pretranspose=False,
                               copy="tma" if self.copy == "auto" else self.copy)
            else:
                twin = replace(self, a_layout="row", b_layout="col", pretranspose=False)
            for f in _RESOLVED:
                set_(f, getattr(twin, f))
            return
        if self.dtype not in OPERAND_DTYPES:
            raise SpecError("dtype", self.dtype, ", ".join(OPERAND_DTYPES))
        if self.b_layout is None:  # fp8 has no transposing load: its B must be K-major
            set_("b_layout", "col" if self.dtype in FP8 else "row")
        if self.instruction not in MAINLOOPS:
            raise SpecError("instruction", self.instruction, ", ".join(INSTRUCTIONS))
        family = MAINLOOPS[self.instruction]
        if self.target is None:
            set_("target", family.default_target(self.dtype))
        if not isinstance(self.target, str) or self.target not in TARGETS:
            raise SpecError("target", self.target, ", ".join(TARGETS), _target_hint(self.target))
        if self.acc_dtype not in ACC_DTYPES:
            raise SpecError("acc_dtype", self.acc_dtype, ", ".join(ACC_DTYPES))
        if self.out_dtype not in OUT_DTYPES:
            raise SpecError("out_dtype", self.out_dtype, ", ".join(OUT_DTYPES))
        for name in ("a_layout", "b_layout"):
            if getattr(self, name) not in LAYOUTS:
                raise SpecError(name, getattr(self, name), "'row', 'col'")
        if self.epilogue is None:   # (no epilogue: the plain one; `epilogue = none` in a .tg file)
            set_("epilogue", Epilogue())
        if not isinstance(self.epilogue, Epilogue):
            raise SpecError("epilogue", self.epilogue, "an Epilogue(...) (in a .tg file a block: epilogue { bias = col "
                                                       "activation = gelu }), or None for none")
        default_tile, default_warps = family.default_tile_warps(self.dtype, self.b_layout, self.swap_ab is True)
        set_("_tile_chosen", self.tile is not None and self.warps is None)   # (whom a mismatch blames)
        set_("_warps_chosen", self.warps is not None and self.tile is None)
        set_("tile", TileShape.of(self.tile if self.tile is not None else default_tile))
        set_("warps", WarpLayout.of(self.warps if self.warps is not None else default_warps))
        deeper = self.stages is None and family.default_stage_count(self.dtype) > family.default_stages
        if self.stages is None:
            set_("stages", family.default_stage_count(self.dtype))
        if self.atom is None:
            key = (self.dtype, self.acc_dtype)
            if key not in DEFAULT_ATOM:
                legal = sorted({a.acc_type.name for a in atoms_for(self.dtype)})
                raise SpecError("acc_dtype", self.acc_dtype, ", ".join(legal) or "f32",
                                f"no mma atom takes {self.dtype} operands with that accumulator")
            set_("atom", DEFAULT_ATOM[key])
        if self.swizzle == "auto":
            set_("swizzle", self._auto_swizzle())
        if self.frag_buffers is None:
            set_("frag_buffers", family.default_frag_buffers(self.dtype))
        if self.persistent is None:
            set_("persistent", family.default_persistent(self))
        if self.copy == "auto":
            set_("copy", family.default_copy(self))
        if self.promote is None:
            set_("promote", FP8_PROMOTE if self.instruction == "wgmma" and self.dtype in FP8 else 0)
        elif isinstance(self.promote, bool):
            set_("promote", int(self.promote))
        if self.store == "auto":
            set_("store", family.default_store(self))
        if deeper and self._pipeline_too_big():   # (a deeper default, not a chosen tile's refusal)
            set_("stages", family.default_stages)
        try:
            self._validate()
        except SpecError as e:
            if e.field in _WGMMA_FIELDS and e.why and _valid_on_wgmma(given):   # (what the user did not know to add)
                raise SpecError(e.field, e.value, e.allowed, e.why + "; add instruction='wgmma' (the target sm_90a, "
                                "persistent CTAs, copy and store follow from it)") from None
            raise

    def _pipeline_too_big(self) -> bool:
        try:
            return self.smem_bytes() > self.target_info.smem_per_block
        except Exception:   # (a spec _validate refuses: it says why)
            return False

    def _check_prepared(self):
        if self.batched:
            raise SpecError("batched", True, "False with operands prepared by first kernels (pretranspose=True, "
                            "dtype='f32' on wgmma)", "the first kernels copy one matrix")
        for name in ("a_layout", "b_layout"):
            if getattr(self, name) not in LAYOUTS:
                raise SpecError(name, getattr(self, name), "'row', 'col'")
        if self.splits_operands:
            if self.pretranspose:
                raise SpecError("pretranspose", True, "False for f32 on wgmma",
                                "the split into tf32 parts writes them K-major already")
            if self.split_k != 1 or self.stream_k:
                raise SpecError("split_k/stream_k", (self.split_k, self.stream_k), "(1, False) for f32 on wgmma",
                                "the tf32 parts are one long product, promoted as it goes")
            if self.promote != 0 and (self.copy == "cp.async" or self.persistent is False or self.pingpong):
                raise SpecError("copy/persistent", (self.copy, self.persistent), "the defaults for f32 on wgmma",
                                "its tf32 parts' product is added into an f32 total as it goes (promote), which the "
                                "warp-specialized TMA kernel does; promote=0 allows other kernels, at about 100x the "
                                "error (the tensor cores truncate as they accumulate)")
            return
        if self.dtype != "tf32" or self.instruction != "wgmma":
            raise SpecError("pretranspose", True, "False for this spec",
                            "a transposing first copy is built for tf32 on wgmma, which reads tf32 only K-major "
                            "(16-bit wgmma transposes by itself; fp8 and mma.sync kernels do not need it)")
        if (self.a_layout, self.b_layout) == ("row", "col"):
            raise SpecError("pretranspose", True, "False for A row-major, B column-major",
                            "both operands are already K-major: there is nothing to transpose")
        if self.pretranspose == "A" and (self.a_layout, self.b_layout) != ("col", "row"):
            raise SpecError("pretranspose", "A", "True or False for these layouts",
                            "'A' copies a column-major A K-major and feeds a row-major B through registers: it is "
                            "built for A column-major with B row-major")
        if self.split_k != 1 or self.stream_k:
            raise SpecError("pretranspose", True, "False with split_k or stream_k",
                            "the transposing copy pays off on large products, which need neither")

    @property
    def splits_operands(self) -> bool:
        """f32 on wgmma: first kernels split each operand into tf32 parts side by side along K
        (gemm/prepare.py), which one promoted tf32 product multiplies (3xTF32)."""
        return self.dtype == "f32" and self.instruction == "wgmma"

    @property
    def kernel_spec(self) -> "GemmSpec":
        """The spec of the GEMM kernel that runs: itself; with pretranspose the same spec with A
        row-major and B column-major (its operands' K-major copies); for f32 on wgmma, the tf32
        one that multiplies the operands' parts."""
        if self.splits_operands:
            return replace(self, dtype="tf32", a_layout="row", b_layout="col")
        if not self.pretranspose:
            return self
        return replace(self, a_layout="row", b_layout="row" if self.pretranspose == "A" else "col", pretranspose=False)

    @property
    def transposed_operands(self) -> tuple:
        """The operands a pretranspose spec copies K-major first: "A" (column-major), "B" (row-major;
        not with pretranspose="A", whose kernel takes B through registers)."""
        if not self.pretranspose:
            return ()
        if self.pretranspose == "A":
            return ("A",)
        return tuple(op for op, layout, mn in (("A", self.a_layout, "col"), ("B", self.b_layout, "row"))
                     if layout == mn)

    @property
    def prepared_operands(self) -> tuple:
        """The operands first kernels prepare (gemm/prepare.py): both for f32 on wgmma, the
        MN-major ones with pretranspose, else none."""
        return ("A", "B") if self.splits_operands else self.transposed_operands

    # -- derived facts ------------------------------------------------------------------------
    @property
    def mainloop(self):
        """The main-loop family (tilegen/gemm/mainloops/) `instruction` names."""
        return MAINLOOPS[self.instruction]

    @property
    def mma(self) -> MmaAtom:
        return MMA_ATOMS[self.atom]

    @property
    def operand_dtype(self) -> _dtypes.DType:
        return _dtypes.dtype(self.dtype)

    @property
    def b_dtype(self) -> str:
        """B's operand dtype: the spec's, or the atom's B type for a mixed fp8 pair (e4m3 x e5m2)."""
        return self.mma.b_type.name if self.dtype in FP8 else self.dtype

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
    def math_threads(self) -> int:
        """The threads of `warps`, which run the tensor cores and the epilogue."""
        return 32 * self.warps.count

    @property
    def warp_specialized(self) -> bool:
        """Whether a producer role (its own warps, ahead of `warps`) issues the copies."""
        return self.mainloop.producer_warps(self) > 0

    @property
    def consumers(self) -> int:
        """Math groups of `warps` each: two with pingpong (each on its own blocks), else one."""
        return 2 if self.pingpong else 1

    @property
    def threads(self) -> int:
        """The CTA's threads: the math warps (of every consumer group) and any producer warps."""
        return 32 * (self.warps.count * self.consumers + self.mainloop.producer_warps(self))

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.tile.m // self.warps.m, self.tile.n // self.warps.n

    @property
    def swaps_operands(self) -> bool:
        """Whether the kernel computes C^T = B^T A^T (the family decides)."""
        return self.mainloop.swaps_operands(self.kernel_spec)

    @property
    def register_operand(self):
        """The operand ("A", "B" or None) loaded into registers for the tensor cores."""
        return self.mainloop.register_operand(self.kernel_spec)

    def stage_layout(self, operand: str) -> str:
        """The memory order ("row" or "col") of an operand's shared stages: the tensor's,
        unless the family transposes it while copying."""
        if operand not in ("A", "B"):
            raise ValueError(f"operand {operand!r}; allowed: 'A', 'B'")
        return self.mainloop.stage_layout(self.kernel_spec, operand)

    def transposes(self, operand: str) -> bool:
        """Whether the kernel's copies of an operand transpose it into its stages."""
        k = self.kernel_spec
        return k.stage_layout(operand) != (k.a_layout if operand == "A" else k.b_layout)

    @property
    def tf32_truncates(self) -> bool:
        """Whether the tensor cores truncate tf32 operands (unit roundoff 2^-10) instead of
        rounding them to nearest while loading fragments (cvt.rna, 2^-11). (f32 on wgmma: no,
        its operands' tf32 parts are exact.)"""
        return not self.splits_operands and self.mainloop.tf32_truncates(self.kernel_spec)

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
        if self.pretranspose:
            return self.kernel_spec.smem_bytes()
        total = sum(smem_layout(self, op).stage_bytes for op in "AB") * self.stages
        if self.copy == "tma":
            total += 2 * 8 * self.stages  # a full and an empty mbarrier per stage
            total += 2 * 8 * self.pingpong  # the consumers' two turn mbarriers
        if self.store == "tma":
            family = self.mainloop
            # slices of C on their way out, through buffers of each consumer's own
            _, layout, vector_buffers = family.store_staging(self)
            total += family.STAGING_BUFFERS * self.consumers * layout.stage_bytes
            total += family.staged_vector_bytes(self, vector_buffers)   # the epilogue's vectors, staged per block
        return total + 1024  # dynamic shared memory is rounded up to a 1024-byte boundary

    def replace(self, **changes) -> "GemmSpec":
        """This spec with `changes`. A field that holds what the spec would resolve it to from
        the others (the tile, atom, stages, target, ... when left out) is resolved again for
        the new spec, so spec.replace(dtype="bf16") is the bf16 spec with the same choices, not
        the f16 atom refused; a field set to anything else stays unless changed. (Read from the
        values alone: equal specs replace alike, however they were made.)"""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        derived = {}
        for name in _DERIVED:
            if name in changes:
                continue
            try:
                if getattr(GemmSpec(**{**values, name: _DEFAULTS[name]}), name) == values[name]:
                    derived[name] = _DEFAULTS[name]
            except SpecError:   # (the others alone do not make a spec: the field was chosen)
                pass
        return GemmSpec(**{**values, **derived, **changes})

    def to_text(self, minimal: bool = False) -> str:
        """The spec as .tg text (every field; minimal=True: only those off their defaults)."""
        return spec_to_text(self, minimal=minimal)

    @classmethod
    def from_text(cls, text_or_path) -> "GemmSpec":
        """A spec from .tg text or a path to a .tg file (gemm/textspec.py)."""
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
                v = "plain" if v.is_plain else (f"bias={v.bias},act={v.activation},residual={v.residual}"
                                                + (",scale_rows" if v.scale_rows else "")
                                                + (",scale_cols" if v.scale_cols else "")
                                                + (",device_scale_a" if v.device_scale_a else "")
                                                + (",device_scale_b" if v.device_scale_b else ""))
            parts.append(f"{f.name}={v}")
        return "GemmSpec(" + ", ".join(parts) + ")"

    # -- validation ---------------------------------------------------------------------------
    def _tile_warps_mismatch(self, rule: str):
        """A tile and warps that do not fit together: blamed on the field the user gave where the
        other is its default."""
        t, w = self.tile, self.warps
        if getattr(self, "_warps_chosen", False):
            raise SpecError("warps", (w.m, w.n), rule, f"the default tile {t.m}x{t.n}x{t.k} does not fit these "
                                                       f"warps: pass a tile too")
        why = f"it does not fit the default warps {w.m}x{w.n}: pass warps too" \
            if getattr(self, "_tile_chosen", False) else ""
        raise SpecError("tile", (t.m, t.n, t.k), rule, why)

    def _auto_swizzle(self) -> str:
        """The widest XOR swizzle whose span divides both operand rows; padding otherwise."""
        esize = _dtypes.dtype(self.dtype).bytes
        widths = [self.operand_tile(op)[1] * esize for op in "AB"]
        rows = [self.operand_tile(op)[0] for op in "AB"]
        for mode, swz in SWIZZLE_MODES.items():  # widest first
            if all(w % swz.span == 0 and r * swz.span % swz.period == 0 for w, r in zip(widths, rows)):
                return mode
        return "pad"

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
                            "fp8 operands must be K-major (A row-major, B the transpose of a row-major N x K "
                            "matrix, as torch._scaled_mm takes them): neither ldmatrix (8-bit) nor wgmma (fp8) "
                            "transposes them on sm_89/sm_90")
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
        family = self.mainloop
        if self.copy not in COPIES:
            raise SpecError("copy", self.copy, ", ".join(("auto",) + COPIES))
        if self.copy not in family.copies:
            raise SpecError("copy", self.copy, ", ".join(family.copies), f"{family.instruction} kernels copy with "
                            + " or ".join(family.copies))
        if self.store not in STORES:
            raise SpecError("store", self.store, ", ".join(("auto",) + STORES))
        if self.store not in family.stores:
            raise SpecError("store", self.store, ", ".join(family.stores), f"{family.instruction} kernels store with "
                            + " or ".join(family.stores))
        if isinstance(self.split_k, bool) or not isinstance(self.split_k, int) or not 1 <= self.split_k <= MAX_SPLIT_K:
            raise SpecError("split_k", self.split_k, f"an int in 1..{MAX_SPLIT_K}")
        if self.split_k > 1 and self.persistent and not self.batched:
            raise SpecError("split_k", self.split_k, "1 for a persistent kernel",
                            "split-K runs one CTA per block and slice of K: give persistent=False (a stack on "
                            "the warp-specialized kernel walks its blocks slice by slice)")
        if not isinstance(self.stream_k, bool):
            raise SpecError("stream_k", self.stream_k, "True or False")
        if self.stream_k:
            t = self.tile
            if not self.warp_specialized or self.cluster != (1, 1):
                raise SpecError("stream_k", self.stream_k, "False for this kernel",
                                "stream-K is built for the warp-specialized wgmma kernel (instruction='wgmma', "
                                "persistent, copy='tma', target sm_90a) without a cluster")
            if t.m % STREAM_K_FIXUP[0] or t.n % STREAM_K_FIXUP[1]:
                raise SpecError("tile", (t.m, t.n, t.k), f"tile.m a multiple of {STREAM_K_FIXUP[0]} and tile.n of "
                                f"{STREAM_K_FIXUP[1]} with stream_k (the fix-up kernel's blocks)")
        if not isinstance(self.swap_ab, bool):
            raise SpecError("swap_ab", self.swap_ab, "True or False")
        if self.swap_ab and (self.instruction != "wgmma" or self.dtype not in ("f16", "bf16", "e4m3", "e5m2")):
            raise SpecError("swap_ab", self.swap_ab, "False here", "C^T = B^T A^T is built for f16, bf16 and fp8 "
                            "wgmma kernels (tf32 with a row-major B swaps by itself)")
        if not isinstance(self.batched, bool):
            raise SpecError("batched", self.batched, "True or False")
        epi = self.epilogue
        if self.batched and (epi.scale_rows or epi.scale_cols or epi.device_scale_a or epi.device_scale_b):
            raise SpecError("batched", self.batched, "False with scales per row or column or in device memory",
                            "a stack's scales would differ per matrix: scale alpha, or multiply matrix by matrix")
        by_offset = not self.persistent and self.copy == "cp.async" and self.store == "direct"
        by_tma = (self.warp_specialized and self.epilogue.bias != "row"
                  and (self.swap_ab or not self.swaps_operands))   # (tf32's C^T = B^T A^T walks B's rows)
        if self.batched and self.split_k > 1 and not by_tma and not self.stream_k:
            raise SpecError("split_k", self.split_k, "1 for this batched kernel",
                            "a stack's K is split only on the warp-specialized TMA kernel (instruction='wgmma', "
                            "copy='tma', target sm_90a, no bias per row)")
        if self.batched and (not (by_offset or by_tma) or self.stream_k or self.pingpong or self.cluster != (1, 1)):
            raise SpecError("batched", self.batched, "False for this kernel",
                            "a stack of products runs one CTA per block and matrix, copying with cp.async and "
                            "storing directly (copy='cp.async', persistent=False), or on the warp-specialized TMA "
                            "kernel without a bias per row (3-D tensor maps of the stacks: template.TmaStack); no "
                            "cluster, stream-K or ping-pong")
        if not isinstance(self.pingpong, bool):
            raise SpecError("pingpong", self.pingpong, "True or False")
        if self.pingpong:
            if not self.warp_specialized or self.cluster != (1, 1) or self.stream_k:
                raise SpecError("pingpong", self.pingpong, "False for this kernel",
                                "ping-pong consumers are built for the warp-specialized wgmma kernel (instruction="
                                "'wgmma', persistent, copy='tma', target sm_90a) without a cluster or stream-K")
            if (self.warps.m, self.warps.n) != (4, 1):
                raise SpecError("warps", (self.warps.m, self.warps.n), "(4, 1) with pingpong",
                                "each of the two consumer warpgroups multiplies a whole block")
        if not isinstance(self.promote, int) or not 0 <= self.promote <= MAX_PROMOTE:
            raise SpecError("promote", self.promote, f"0..{MAX_PROMOTE} (k-tiles per promotion; 0: never)")
        if self.promote and not (self.instruction == "wgmma" and self.dtype in FP8 + ("tf32",) and self.warp_specialized
                                 and self.register_operand is None):
            raise SpecError("promote", self.promote, "0 (or False) for this kernel",
                            "promotion is built for fp8 and K-major tf32 on the warp-specialized wgmma kernel")
        if self.cluster not in CLUSTERS:
            raise SpecError("cluster", self.cluster, ", ".join(map(str, CLUSTERS)))
        if self.cluster != (1, 1) and not (family.clusters and self.warp_specialized):
            raise SpecError("cluster", self.cluster, "(1, 1) for this kernel",
                            "clusters are built for the warp-specialized wgmma kernel (instruction='wgmma', "
                            "persistent, copy='tma', target sm_90a)")
        if self.persistent and not family.persistent:
            raise SpecError("persistent", self.persistent, f"False for {family.instruction} kernels",
                            "persistent CTAs are built for the " + " and ".join(
                                f"{f.instruction} main loop" for f in MAINLOOPS.values() if f.persistent))
        family.validate(self)
        t, w = self.tile, self.warps
        if t.m % (w.m * atom.m):
            self._tile_warps_mismatch(f"tile.m a multiple of warps.m * atom.m = {w.m * atom.m}")
        # Fragments of B are loaded two n8 atoms at a time (one ldmatrix.x4 / paired loads).
        if t.n % (w.n * 2 * atom.n):
            self._tile_warps_mismatch(f"tile.n a multiple of warps.n * 2 * atom.n = {w.n * 2 * atom.n}")
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
            elif self.copy == "cp.async" and chunks % self.threads:   # every thread copies its share
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


# f32 on wgmma (3xTF32 as one tf32 product over three times K): promoted every 2 k-tiles of 128x128x32
# tiles (two accumulators of 64 registers each). Measured on the H200 (run 114) against cuBLAS f32:
# 2.6x / 2.3x at 4096^3 / 8192^3 for the product alone, error 3.8e-7 / 4.9e-7 (cuBLAS f32: 1.1e-6 /
# 1.6e-6); every k-tile: 2.0-2.3x, 4.7e-7; every 4: as fast as 2, 4.1e-7; never: 4.2e-5.
F32_WGMMA_TILE = (128, 128, 32)
F32_PROMOTE = 2

# the fields __post_init__ resolves from the others (a pretranspose spec takes its K-major twin's)
_RESOLVED = ("tile", "warps", "atom", "stages", "swizzle", "frag_buffers", "persistent", "copy", "promote",
             "store", "target")

# the fields __post_init__ fills in when left at their defaults
_DERIVED = ("b_layout", "tile", "warps", "atom", "stages", "swizzle", "frag_buffers", "target", "persistent", "copy",
            "store", "promote")
_DEFAULTS = {f.name: f.default for f in fields(GemmSpec) if f.name in _DERIVED}

KINDS = {"gemm": GemmSpec}  # the blocks a .tg file may hold


_FIELD_NAMES: dict = {}   # class -> its dataclass fields' names


def _named_fields_only(cls):
    """cls's dataclass __init__, which on a keyword that is no field says so with the nearest
    field (GemmSpec(stagez=3): did you mean 'stages'?) and the list, instead of Python's bare
    "unexpected keyword argument"."""
    init = cls.__init__

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(type(self)))
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            near = difflib.get_close_matches(unknown[0], names, n=1)
            raise TypeError(f"{type(self).__name__} has no field {unknown[0]!r}"
                            + (f" (did you mean {near[0]!r}?)" if near else "") + f"; its fields: {', '.join(names)}")
        init(self, *args, **kwargs)
    cls.__init__ = checked
    return cls


for _cls in (GemmSpec, Epilogue):
    _named_fields_only(_cls)


def parse_spec_text(text_or_path, overrides: Optional[dict] = None, *, source: Optional[str] = None) -> GemmSpec:
    """A GemmSpec from .tg text or a path to a .tg file (a str holding '{' is text; any
    other str, or a PathLike, is a path). With `source` (a name for error messages, such as
    "<stdin>") the first argument is always the text.

    `overrides` maps field names to values written as in the text ({"stages": "4",
    "tile": "64x64x32", "epilogue": "bias = col"}); each replaces the file's item and is
    reported as `--<field>` in errors (the CLI's shortcuts)."""
    return textspec.parse_text(text_or_path, KINDS, overrides=overrides, source=source)


def spec_to_text(spec, minimal: bool = False) -> str:
    """The canonical .tg text of a spec: every field (or, minimal=True, only those that differ
    from what the defaults give), in the dataclass's field order; parse_spec_text reads it
    back to an equal spec."""
    keyword = next((k for k, cls in KINDS.items() if type(spec) is cls), None)
    if keyword is None:
        raise SpecError("spec", type(spec).__name__, ", ".join(c.__name__ for c in KINDS.values()),
                        "spec_to_text writes GEMM specs")
    return textspec.dataclass_to_text(spec, keyword, minimal=minimal)
