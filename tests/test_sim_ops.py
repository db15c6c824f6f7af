"""Instruction semantics of the emulator, one small hand-written PTX kernel at a time,
against numpy / Python integers. The tensor-core checks pack inputs and unpack outputs
with tilegen.arch's fragment maps: an independent path from the emulator's own tables."""
import struct

import ml_dtypes
import numpy as np
import pytest

from tilegen.arch import LDMATRIX, MMA_ATOMS, STMATRIX
from tilegen.sim import GlobalMemory, SimError, launch

N = 64  # threads of the element-wise kernels (two warps)
REGS = """    .reg .b32 %r<64>;
    .reg .b64 %rd<32>;
    .reg .f32 %f<32>;
    .reg .pred %p<16>;
    .reg .b16 %h<8>;"""


def module(body: str, params, threads: int = N, smem: bool = False, target: str = "sm_80") -> str:
    plist = ",\n".join(f"    .param .{t} {n}" for n, t in params)
    ext = ".extern .shared .align 16 .b8 smem[];\n" if smem else ""
    return (f".version 7.8\n.target {target}\n.address_size 64\n{ext}.visible .entry k(\n{plist}\n)\n"
            f".reqntid {threads}, 1, 1\n{{\n{REGS}\n{body}\n    ret;\n}}\n")


def pointer(reg: str, param: str, stride: int) -> str:
    """reg = param + tid * stride (a global address)."""
    return (f"    ld.param.u64 {reg}, [{param}];\n    cvta.to.global.u64 {reg}, {reg};\n"
            f"    mov.u32 %r60, %tid.x;\n    mul.wide.u32 %rd30, %r60, {stride};\n    add.s64 {reg}, {reg}, %rd30;")


def run(ptx, inputs: dict, outputs: dict, threads=N, scalars=None, smem=0, grid=(1, 1, 1)):
    """inputs/outputs: name -> array (outputs give shape and dtype); returns the outputs."""
    mem = GlobalMemory()
    args = dict(scalars or {})
    for name, a in inputs.items():
        args[name] = mem.alloc(a.nbytes)
        mem.write(args[name], a)
    for name, a in outputs.items():
        args[name] = mem.alloc(a.nbytes)
        mem.write(args[name], a)
    launch(ptx, grid, threads, args, memory=mem, shared_bytes=smem)
    return {n: mem.read(args[n], a.nbytes).view(a.dtype).reshape(a.shape) for n, a in outputs.items()}


EDGE = [0, 1, 2, 3, 31, 32, 33, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 1000, 7, 0xDEADBEEF]


def _operands():
    rng = np.random.default_rng(1)
    x = np.array((EDGE * 5)[:N], dtype=np.uint32)
    y = rng.integers(0, 2 ** 32, N, dtype=np.uint64).astype(np.uint32)
    y[:len(EDGE)] = EDGE[::-1]
    y[::5] = rng.integers(0, 40, len(y[::5]))
    return x, y


def s32(v):
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def tdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


INT_BINARY = {
    "add.u32": lambda a, b: a + b,
    "sub.u32": lambda a, b: a - b,
    "mul.lo.u32": lambda a, b: a * b,
    "mul.lo.s32": lambda a, b: s32(a) * s32(b),
    "mul.hi.u32": lambda a, b: (a * b) >> 32,
    "div.u32": lambda a, b: a // b if b else None,
    "rem.u32": lambda a, b: a % b if b else None,
    "div.s32": lambda a, b: tdiv(s32(a), s32(b)) if b else None,
    "rem.s32": lambda a, b: s32(a) - tdiv(s32(a), s32(b)) * s32(b) if b else None,
    "min.u32": min, "max.u32": max,
    "min.s32": lambda a, b: min(s32(a), s32(b)), "max.s32": lambda a, b: max(s32(a), s32(b)),
    "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b, "xor.b32": lambda a, b: a ^ b,
    "shl.b32": lambda a, b: a << b if b < 32 else 0,
    "shr.u32": lambda a, b: a >> b if b < 32 else 0,
    "shr.b32": lambda a, b: a >> b if b < 32 else 0,
    "shr.s32": lambda a, b: s32(a) >> min(b, 31),
}


@pytest.mark.parametrize("opcode", list(INT_BINARY))
def test_integer_binary(opcode):
    x, y = _operands()
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd1", "y", 4), pointer("%rd2", "out", 4),
                      "    ld.global.b32 %r1, [%rd0];", "    ld.global.b32 %r2, [%rd1];",
                      f"    {opcode} %r3, %r1, %r2;", "    st.global.b32 [%rd2], %r3;"])
    ptx = module(body, [("x", "u64"), ("y", "u64"), ("out", "u64")])
    got = run(ptx, {"x": x, "y": y}, {"out": np.zeros(N, np.uint32)})["out"]
    for i in range(N):
        want = INT_BINARY[opcode](int(x[i]), int(y[i]))
        if want is not None:  # division by zero is undefined in PTX
            want &= 0xFFFFFFFF
            assert int(got[i]) == want, f"{opcode}({x[i]:#x}, {y[i]:#x}) = {got[i]:#x}, want {want:#x}"


@pytest.mark.parametrize("opcode,fn", [
    ("mad.lo.u32", lambda a, b, c: a * b + c),
    ("mad.lo.s32", lambda a, b, c: s32(a) * s32(b) + s32(c)),
])
def test_integer_mad(opcode, fn):
    x, y = _operands()
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd1", "y", 4), pointer("%rd2", "out", 4),
                      "    ld.global.b32 %r1, [%rd0];", "    ld.global.b32 %r2, [%rd1];",
                      f"    {opcode} %r3, %r1, %r2, %r1;", "    st.global.b32 [%rd2], %r3;"])
    got = run(module(body, [("x", "u64"), ("y", "u64"), ("out", "u64")]), {"x": x, "y": y},
              {"out": np.zeros(N, np.uint32)})["out"]
    assert [int(v) for v in got] == [fn(int(a), int(b), int(a)) & 0xFFFFFFFF for a, b in zip(x, y)]


def test_wide_arithmetic_and_64_bit():
    x, y = _operands()
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd1", "y", 4), pointer("%rd2", "out", 32),
                      "    ld.global.b32 %r1, [%rd0];", "    ld.global.b32 %r2, [%rd1];",
                      "    mul.wide.u32 %rd3, %r1, %r2;",
                      "    mad.wide.u32 %rd4, %r1, %r2, %rd3;",
                      "    add.s64 %rd5, %rd4, -1;",
                      "    st.global.v2.b64 [%rd2], {%rd3, %rd4};", "    st.global.b64 [%rd2+16], %rd5;"])
    got = run(module(body, [("x", "u64"), ("y", "u64"), ("out", "u64")]), {"x": x, "y": y},
              {"out": np.zeros((N, 4), np.uint64)})["out"]
    for i in range(N):
        p = int(x[i]) * int(y[i])
        assert [int(v) for v in got[i, :3]] == [p, 2 * p % 2 ** 64, (2 * p - 1) % 2 ** 64]


@pytest.mark.parametrize("opcode,fn", [
    ("not.b32", lambda a: ~a), ("neg.s32", lambda a: -s32(a)), ("abs.s32", lambda a: abs(s32(a))),
])
def test_integer_unary(opcode, fn):
    x, _ = _operands()
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd2", "out", 4), "    ld.global.b32 %r1, [%rd0];",
                      f"    {opcode} %r3, %r1;", "    st.global.b32 [%rd2], %r3;"])
    got = run(module(body, [("x", "u64"), ("out", "u64")]), {"x": x}, {"out": np.zeros(N, np.uint32)})["out"]
    assert [int(v) for v in got] == [fn(int(a)) & 0xFFFFFFFF for a in x]


CMP = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
       "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


@pytest.mark.parametrize("rel", list(CMP))
@pytest.mark.parametrize("t", ["u32", "s32"])
def test_setp_integers_and_selp(rel, t):
    x, y = _operands()
    y[::3] = x[::3]
    conv = s32 if t == "s32" else int
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd1", "y", 4), pointer("%rd2", "out", 4),
                      "    ld.global.b32 %r1, [%rd0];", "    ld.global.b32 %r2, [%rd1];",
                      f"    setp.{rel}.{t} %p1, %r1, %r2;", "    selp.b32 %r3, 7, 0xFFFFFFFF, %p1;",
                      "    st.global.b32 [%rd2], %r3;"])
    got = run(module(body, [("x", "u64"), ("y", "u64"), ("out", "u64")]), {"x": x, "y": y},
              {"out": np.zeros(N, np.uint32)})["out"]
    assert [int(v) for v in got] == [7 if CMP[rel](conv(int(a)), conv(int(b))) else 0xFFFFFFFF
                                    for a, b in zip(x, y)]


FCMP = {
    "lt": lambda a, b: a < b, "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b and not (np.isnan(a) or np.isnan(b)),
    "neu": lambda a, b: not a == b, "equ": lambda a, b: a == b or np.isnan(a) or np.isnan(b),
    "ltu": lambda a, b: a < b or np.isnan(a) or np.isnan(b),
    "nan": lambda a, b: np.isnan(a) or np.isnan(b), "num": lambda a, b: not (np.isnan(a) or np.isnan(b)),
}


def _floats():
    rng = np.random.default_rng(2)
    a = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    a[:8] = [np.nan, 1, 0.0, -0.0, np.inf, 2, np.nan, 3e38]
    b[:8] = [1, np.nan, -0.0, 0.0, np.inf, 2, np.nan, 3e38]
    return a, b


@pytest.mark.parametrize("rel", list(FCMP))
def test_setp_f32_with_nan(rel):
    a, b = _floats()
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd1", "y", 4), pointer("%rd2", "out", 4),
                      "    ld.global.f32 %f1, [%rd0];", "    ld.global.f32 %f2, [%rd1];",
                      f"    setp.{rel}.f32 %p1, %f1, %f2;", "    selp.b32 %r3, 1, 0, %p1;",
                      "    st.global.b32 [%rd2], %r3;"])
    got = run(module(body, [("x", "u64"), ("y", "u64"), ("out", "u64")]), {"x": a, "y": b},
              {"out": np.zeros(N, np.uint32)})["out"]
    assert [bool(v) for v in got] == [bool(FCMP[rel](x, y)) for x, y in zip(a, b)]


def test_float_arithmetic_rounds_once():
    a, b = _floats()
    c = (np.random.default_rng(3).standard_normal(N) * 1e-3).astype(np.float32)
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd1", "y", 4), pointer("%rd3", "z", 4),
                      pointer("%rd2", "out", 16),
                      "    ld.global.f32 %f1, [%rd0];", "    ld.global.f32 %f2, [%rd1];",
                      "    ld.global.f32 %f3, [%rd3];",
                      "    add.f32 %f4, %f1, %f2;", "    mul.f32 %f5, %f1, %f2;", "    sub.f32 %f6, %f1, %f2;",
                      "    fma.rn.f32 %f7, %f1, %f2, %f3;",
                      "    st.global.v4.f32 [%rd2], {%f4, %f5, %f6, %f7};"])
    got = run(module(body, [("x", "u64"), ("y", "u64"), ("z", "u64"), ("out", "u64")]),
              {"x": a, "y": b, "z": c}, {"out": np.zeros((N, 4), np.float32)})["out"]
    with np.errstate(all="ignore"):
        want = np.stack([a + b, a * b, a - b, (a.astype(np.float64) * b + c).astype(np.float32)], axis=1)
    np.testing.assert_array_equal(got, want)


def test_immediates_hex_float_large_negative():
    body = "\n".join([pointer("%rd2", "out", 16),
                      "    mov.f32 %f1, 0f3FC00000;",           # 1.5
                      "    mov.b32 %r1, 4294966272;",           # 0xFFFFFC00
                      "    mov.b32 %r2, -1;",
                      "    add.u32 %r3, %r1, 0x10;",
                      "    mov.b32 %r4, %f1;",
                      "    st.global.v4.b32 [%rd2], {%r4, %r1, %r2, %r3};"])
    got = run(module(body, [("out", "u64")]), {}, {"out": np.zeros((N, 4), np.uint32)})["out"]
    assert [int(v) for v in got[5]] == [0x3FC00000, 0xFFFFFC00, 0xFFFFFFFF, 0xFFFFFC10]


def _tf32_rna_reference(v: float) -> float:
    if not np.isfinite(v) or v == 0:
        return v
    m, e = np.frexp(v)
    return float(np.ldexp(np.sign(m) * np.floor(abs(m) * 2 ** 11 + 0.5) / 2 ** 11, e))


def test_conversions():
    rng = np.random.default_rng(4)
    a = (rng.standard_normal(N) * 100).astype(np.float32)
    a[:6] = [1 + 2 ** -11, 1 + 3 * 2 ** -12, -(1 + 2 ** -11), 65520.0, 1e-6, -2.5]  # ties, overflow
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd2", "out", 32),
                      "    ld.global.f32 %f1, [%rd0];",
                      "    mov.b32 %r1, %f1;",
                      "    cvt.rna.tf32.f32 %r2, %r1;",
                      "    cvt.rn.f16.f32 %r3, %f1;",
                      "    cvt.rn.bf16.f32 %r4, %f1;",
                      "    cvt.f32.f16 %f2, %r3;",
                      "    cvt.f32.bf16 %f3, %r4;",
                      "    cvt.rzi.s32.f32 %r5, %f1;",
                      "    cvt.rn.f32.s32 %f4, %r5;",
                      "    mov.b32 %r6, %f2;", "    mov.b32 %r7, %f3;", "    mov.b32 %r8, %f4;",
                      "    st.global.v4.b32 [%rd2], {%r2, %r3, %r4, %r5};",
                      "    st.global.v4.b32 [%rd2+16], {%r6, %r7, %r8, %r1};"])
    got = run(module(body, [("x", "u64"), ("out", "u64")]), {"x": a}, {"out": np.zeros((N, 8), np.uint32)})["out"]
    with np.errstate(over="ignore"):
        f16 = a.astype(np.float16)
    tf32 = got[:, 0].view(np.float32)
    assert [float(v) for v in tf32] == [_tf32_rna_reference(float(v)) for v in a]
    assert (got[:, 0] & 0x1FFF == 0).all()
    np.testing.assert_array_equal(got[:, 1], f16.view(np.uint16))       # high half zero
    np.testing.assert_array_equal(got[:, 2], a.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(got[:, 3].view(np.int32), np.trunc(a).astype(np.int32))
    np.testing.assert_array_equal(got[:, 4].view(np.float32), f16.astype(np.float32))
    np.testing.assert_array_equal(got[:, 5].view(np.float32), a.astype(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(got[:, 6].view(np.float32), np.trunc(a))


def test_special_registers_and_grid():
    body = "\n".join([
        "    ld.param.u64 %rd0, [out];", "    cvta.to.global.u64 %rd0, %rd0;",
        "    mov.u32 %r1, %tid.x;", "    mov.u32 %r2, %ctaid.x;", "    mov.u32 %r3, %nctaid.x;",
        "    mov.u32 %r4, %laneid;", "    mov.u32 %r5, %warpid;", "    mov.u32 %r6, %ntid.x;",
        "    mad.lo.u32 %r7, %r2, %r6, %r1;",
        "    mul.wide.u32 %rd1, %r7, 16;", "    add.s64 %rd2, %rd0, %rd1;",
        "    st.global.v4.b32 [%rd2], {%r3, %r4, %r5, %r7};"])
    got = run(module(body, [("out", "u64")]), {}, {"out": np.zeros((3 * N, 4), np.uint32)}, grid=(3, 1, 1))["out"]
    g = np.arange(3 * N)
    np.testing.assert_array_equal(got, np.stack([np.full(3 * N, 3), g % 32, (g % N) // 32, g], axis=1))


def test_narrow_and_vector_loads():
    x = np.arange(4 * N, dtype=np.uint32) * 0x10001 + 0x8000
    body = "\n".join([pointer("%rd0", "x", 16), pointer("%rd2", "out", 16),
                      "    ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd0];",
                      "    ld.global.b16 %r5, [%rd0+2];",          # zero-extended
                      "    ld.global.s16 %r6, [%rd0];",            # sign-extended
                      "    ld.global.v2.b32 {%r7, %r8}, [%rd0+8];",
                      "    st.global.b16 [%rd2], %r5;", "    st.global.b16 [%rd2+2], %r6;",
                      "    st.global.b32 [%rd2+4], %r6;", "    st.global.v2.b32 [%rd2+8], {%r8, %r1};"])
    got = run(module(body, [("x", "u64"), ("out", "u64")]), {"x": x}, {"out": np.zeros((N, 4), np.uint32)})["out"]
    w = x.reshape(N, 4)
    lo16 = (w[:, 0] & 0xFFFF).astype(np.int64)
    sign = np.where(lo16 >= 0x8000, lo16 - 0x10000, lo16) & 0xFFFFFFFF
    np.testing.assert_array_equal(got[:, 0], (w[:, 0] >> 16) | ((w[:, 0] & 0xFFFF) << 16))
    np.testing.assert_array_equal(got[:, 1], sign)
    np.testing.assert_array_equal(got[:, 2], w[:, 3])
    np.testing.assert_array_equal(got[:, 3], w[:, 0])


def test_predicated_memory_and_loop():
    """A counted loop (uniform bra.uni) and a guarded store: threads >= n store nothing."""
    body = "\n".join([pointer("%rd2", "out", 4),
                      "    ld.param.u32 %r9, [n];", "    mov.u32 %r1, %tid.x;", "    mov.u32 %r2, 0;",
                      "    mov.u32 %r3, 0;",
                      "$loop:",
                      "    add.u32 %r2, %r2, %r1;", "    add.u32 %r3, %r3, 1;",
                      "    setp.lt.u32 %p1, %r3, 5;", "    @%p1 bra.uni $loop;",
                      "    setp.lt.u32 %p2, %r1, %r9;", "    @%p2 st.global.b32 [%rd2], %r2;",
                      "    @!%p2 bra $skip;",   # uniform here: not taken for n = 64
                      "    st.global.b32 [%rd2], %r2;", "$skip:"])
    ptx = module(body, [("out", "u64"), ("n", "u32")])
    out = np.full(N, 99, np.uint32)
    got = run(ptx, {}, {"out": out}, scalars={"n": 64})["out"]
    np.testing.assert_array_equal(got, 5 * np.arange(N))
    got = run(ptx.replace("    @!%p2 bra $skip;\n", ""), {}, {"out": out}, scalars={"n": 40})["out"]
    np.testing.assert_array_equal(got, 5 * np.arange(N))   # the unguarded store writes all


# ---- tensor cores ---------------------------------------------------------------------------------

def _pack(frag, matrix, dtype):
    """(32, regs) words holding `matrix` (float64) in `frag`'s layout, as arch says."""
    from tilegen.arch.dtypes import numpy_dtype

    t = frag.table()
    vals = np.asarray(matrix)[t[..., 0], t[..., 1]]
    nd = np.dtype(np.float32) if dtype == "tf32" else numpy_dtype(dtype)
    raw = vals.astype(nd).view(f"u{nd.itemsize}").astype(np.uint64)
    bits = 8 * nd.itemsize
    return (raw << (bits * np.arange(frag.elems, dtype=np.uint64))).sum(-1).astype(np.uint32)


def _mma_kernel(atom, warps):
    ra, rb, rc = atom.a.regs, atom.b.regs, atom.c.regs
    regs = lambda p, n: "{" + ", ".join(f"%r{p + i}" for i in range(n)) + "}"  # noqa: E731
    lines = [pointer("%rd0", "a", 4 * ra), pointer("%rd1", "b", 4 * rb), pointer("%rd2", "c", 4 * rc),
             pointer("%rd3", "d", 4 * rc)]
    lines += [f"    ld.global.b32 %r{10 + i}, [%rd0+{4 * i}];" for i in range(ra)]
    lines += [f"    ld.global.b32 %r{20 + i}, [%rd1+{4 * i}];" for i in range(rb)]
    lines += [f"    ld.global.b32 %r{30 + i}, [%rd2+{4 * i}];" for i in range(rc)]
    lines.append(f"    {atom.instruction} {regs(40, rc)}, {regs(10, ra)}, {regs(20, rb)}, {regs(30, rc)};")
    lines += [f"    st.global.b32 [%rd3+{4 * i}], %r{40 + i};" for i in range(rc)]
    return module("\n".join(lines), [("a", "u64"), ("b", "u64"), ("c", "u64"), ("d", "u64")],
                  threads=32 * warps, target="sm_89")


@pytest.mark.parametrize("name", list(MMA_ATOMS))
def test_mma_every_atom_two_warps(name):
    atom = MMA_ATOMS[name]
    rng = np.random.default_rng(5)
    lim = 4 if atom.a_type.bits == 8 else 8
    mats = [[rng.integers(-lim, lim + 1, size=shape).astype(np.float64) for shape in
             ((atom.m, atom.k), (atom.k, atom.n), (atom.m, atom.n))] for _ in range(2)]
    a = np.concatenate([_pack(atom.a, m[0], atom.a_type.name) for m in mats])
    b = np.concatenate([_pack(atom.b, m[1], atom.b_type.name) for m in mats])
    c = np.concatenate([_pack(atom.c, m[2], atom.acc_type.name) for m in mats])
    got = run(_mma_kernel(atom, 2), {"a": a, "b": b, "c": c}, {"d": np.zeros((64, atom.c.regs), np.uint32)},
              threads=64)["d"]
    for w, (A, B, C) in enumerate(mats):
        want = _pack(atom.c, A @ B + C, atom.acc_type.name)
        np.testing.assert_array_equal(got[32 * w:32 * w + 32], want, err_msg=f"{name}, warp {w}")


def test_mma_tf32_ignores_low_mantissa_bits():
    atom = MMA_ATOMS["m16n8k8.tf32.f32"]
    rng = np.random.default_rng(6)
    A = rng.integers(-8, 9, (16, 8)).astype(np.float64)
    B = rng.integers(-8, 9, (8, 8)).astype(np.float64)
    a = _pack(atom.a, A, "tf32") | np.uint32(0x1FFF)      # junk in the 13 bits the hardware drops
    b = _pack(atom.b, B, "tf32") | np.uint32(0x1000)
    c = _pack(atom.c, np.zeros((16, 8)), "f32")
    got = run(_mma_kernel(atom, 1), {"a": a, "b": b, "c": c}, {"d": np.zeros((32, 4), np.uint32)}, threads=32)["d"]
    np.testing.assert_array_equal(got, _pack(atom.c, A @ B, "f32"))


def _matrix_kernel(op, rows_order):
    """Shared tile of 8*num rows x 16 bytes (row r at slot rows_order[r]); lane l addresses row l."""
    num = op.num
    lines = [pointer("%rd0", "tile", 16), "    mov.u32 %r1, %tid.x;", "    mov.u32 %r2, smem;",
             "    add.u32 %r2, %r2, 1023;", "    and.b32 %r2, %r2, -1024;",
             "    mad.lo.u32 %r3, %r1, 16, %r2;"]
    if op.op == "ldmatrix":
        lines += ["    ld.global.v4.b32 {%r4, %r5, %r6, %r7}, [%rd0];",
                  "    st.shared.v4.b32 [%r3], {%r4, %r5, %r6, %r7};", "    bar.sync 0;"]
    lines += [pointer("%rd1", "slot", 4), "    ld.global.u32 %r8, [%rd1];", "    mad.lo.u32 %r9, %r8, 16, %r2;"]
    regs = "{" + ", ".join(f"%r{20 + i}" for i in range(num)) + "}"
    if op.op == "ldmatrix":
        lines += [f"    {op.instruction} {regs}, [%r9];", pointer("%rd2", "out", 4 * num)]
        lines += [f"    st.global.b32 [%rd2+{4 * i}], %r{20 + i};" for i in range(num)]
    else:
        lines += [pointer("%rd2", "regs", 4 * num)]
        lines += [f"    ld.global.b32 %r{20 + i}, [%rd2+{4 * i}];" for i in range(num)]
        lines += [f"    {op.instruction} [%r9], {regs};", "    bar.sync 0;",
                  "    ld.shared.v4.b32 {%r4, %r5, %r6, %r7}, [%r3];", pointer("%rd3", "out", 16),
                  "    st.global.v4.b32 [%rd3], {%r4, %r5, %r6, %r7};"]
    return module("\n".join(lines), [("tile", "u64"), ("slot", "u64"), ("regs", "u64"), ("out", "u64")],
                  threads=32, smem=True, target="sm_90")


@pytest.mark.parametrize("key", list(LDMATRIX), ids=lambda k: f"x{k[0]}{'.trans' if k[1] else ''}")
def test_ldmatrix_stmatrix(key):
    rng = np.random.default_rng(7)
    num = key[0]
    perm = rng.permutation(32)                    # the slot each lane's row address points to
    tile = rng.integers(0, 2 ** 16, (32, 8)).astype(np.uint16)   # 32 slots of 8 halves
    ld = LDMATRIX[key]
    got = run(_matrix_kernel(ld, perm), {"tile": tile.view(np.uint32).reshape(32, 4), "slot": perm.astype(np.uint32),
                                          "regs": np.zeros(32, np.uint32)},
              {"out": np.zeros((32, num), np.uint32)}, threads=32, smem=2048)["out"]
    stack = tile[perm[:8 * num]]                  # row i of the stack is the slot lane i addresses
    t = ld.fragment.table()
    want = stack[t[..., 0], t[..., 1]].astype(np.uint32)
    np.testing.assert_array_equal(got, want[..., 0] | (want[..., 1] << 16))
    st = STMATRIX[key]
    regs = rng.integers(0, 2 ** 32, (32, num), dtype=np.uint64).astype(np.uint32)
    got = run(_matrix_kernel(st, perm), {"tile": np.zeros((32, 4), np.uint32), "slot": perm.astype(np.uint32),
                                          "regs": regs}, {"out": np.zeros((32, 4), np.uint32)},
              threads=32, smem=2048)["out"].view(np.uint16)
    halves = np.stack([regs & 0xFFFF, regs >> 16], axis=-1)
    t = st.fragment.table()
    want = np.zeros((32, 8), np.uint16)           # slots nobody stores to stay zero
    stack = np.zeros((8 * num, 8), np.uint16)
    stack[t[..., 0], t[..., 1]] = halves
    want[perm[:8 * num]] = stack
    np.testing.assert_array_equal(got, want)


def test_unsupported_opcode_names_the_line():
    ptx = module("    mov.u32 %r1, %tid.x;\n    popc.b32 %r2, %r1;", [("out", "u64")])
    with pytest.raises(SimError) as e:
        run(ptx, {}, {"out": np.zeros(1, np.uint32)})
    assert "popc.b32" in str(e.value) and e.value.line == ptx.splitlines().index("    popc.b32 %r2, %r1;") + 1


def test_float_immediate_struct():
    # 0f immediates are the exact bits, not a decimal approximation
    assert struct.unpack("<f", struct.pack("<I", 0x3DCCCCCD))[0] == np.float32(0.1)


def test_packing_conversions():
    rng = np.random.default_rng(11)
    a = (rng.standard_normal(N) * 10).astype(np.float32)
    b = (rng.standard_normal(N) * 10).astype(np.float32)
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd1", "y", 4), pointer("%rd2", "out", 8),
                      "    ld.global.f32 %f1, [%rd0];", "    ld.global.f32 %f2, [%rd1];",
                      "    cvt.rn.bf16x2.f32 %r1, %f1, %f2;", "    cvt.rn.f16x2.f32 %r2, %f1, 0f00000000;",
                      "    st.global.v2.b32 [%rd2], {%r1, %r2};"])
    got = run(module(body, [("x", "u64"), ("y", "u64"), ("out", "u64")]), {"x": a, "y": b},
              {"out": np.zeros((N, 2), np.uint32)})["out"]
    bf = lambda v: v.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)  # noqa: E731
    np.testing.assert_array_equal(got[:, 0], (bf(a) << 16) | bf(b))     # a in the upper half
    np.testing.assert_array_equal(got[:, 1], a.astype(np.float16).view(np.uint16).astype(np.uint32) << 16)


def test_guarded_instructions_keep_old_values():
    """Threads whose guard is false neither write their destination nor touch memory."""
    x = np.arange(N, dtype=np.uint32) + 100
    body = "\n".join([pointer("%rd0", "x", 4), pointer("%rd2", "out", 16),
                      "    mov.u32 %r1, %tid.x;", "    and.b32 %r9, %r1, 1;", "    setp.eq.u32 %p1, %r9, 1;",
                      "    mov.b32 %r2, 5;", "    mov.b32 %r3, 6;", "    mov.b32 %r4, 7;", "    mov.b32 %r5, 8;",
                      "    @%p1 add.u32 %r2, %r1, 1000;",
                      "    @!%p1 ld.global.b32 %r3, [%rd0];",
                      "    @%p1 mov.b32 %r4, %r1;",
                      "    @%p1 selp.b32 %r5, 1, 2, %p1;",
                      "    st.global.v4.b32 [%rd2], {%r2, %r3, %r4, %r5};"])
    got = run(module(body, [("x", "u64"), ("out", "u64")]), {"x": x}, {"out": np.zeros((N, 4), np.uint32)})["out"]
    odd = np.arange(N) % 2 == 1
    np.testing.assert_array_equal(got[:, 0], np.where(odd, np.arange(N) + 1000, 5))
    np.testing.assert_array_equal(got[:, 1], np.where(odd, 6, x))
    np.testing.assert_array_equal(got[:, 2], np.where(odd, np.arange(N), 7))
    np.testing.assert_array_equal(got[:, 3], np.where(odd, 1, 8))
