"""Fragment arithmetic (tilegen/dsl/fragment_ops.py): every primitive on the emulator
against numpy, the accumulator -> A operand identity from tilegen.arch's maps, the shfl
emulation, and mistakes reported at the user's line."""
import inspect

import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from tilegen.arch.dtypes import numpy_dtype
from tilegen.arch.mma import MMA_ATOMS
from tilegen.errors import DSLError
from tilegen.ir.lower.elementwise import accumulator_layout, operand_plan
from tilegen.sim import GlobalMemory, run_kernel

F16 = "m16n8k16.f16.f32"
BF16 = "m16n8k16.bf16.f32"
INF = float("inf")


# -- the hardware facts, from tilegen.arch -----------------------------------------------------
@pytest.mark.parametrize("name", [F16, BF16])
def test_accumulator_registers_are_the_a_registers_of_the_next_k_step(name):
    """m16n8k16: A register 0 of k-step j = C atom 2j (c0, c1), register 1 = C atom 2j (c2, c3),
    register 2 = C atom 2j+1 (c0, c1), register 3 = C atom 2j+1 (c2, c3), lane by lane."""
    atom = MMA_ATOMS[name]
    expected = {0: (0, (0, 1)), 1: (0, (2, 3)), 2: (1, (0, 1)), 3: (1, (2, 3))}
    for j in range(4):  # k-steps of a 64-column accumulator
        for lane in range(32):
            for r, (atom_off, (c_lo, c_hi)) in expected.items():
                for e, c_reg in enumerate((c_lo, c_hi)):
                    a_row, a_k = atom.a.coord(lane, r, e)
                    c_row, c_col = atom.c.coord(lane, c_reg, 0)
                    assert (a_row, 16 * j + a_k) == (c_row, 8 * (2 * j + atom_off) + c_col)
    assert operand_plan(atom, atom) == (((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1)), ((1, 2), (1, 3)))


def test_operand_plan_for_k8_atoms_and_its_refusals():
    k8 = MMA_ATOMS["m16n8k8.f16.f32"]
    assert operand_plan(k8, k8) == (((0, 0), (0, 1)), ((0, 2), (0, 3)))
    with pytest.raises(ValueError, match="only 16-bit A operands"):
        operand_plan(MMA_ATOMS["m16n8k8.tf32.f32"], MMA_ATOMS["m16n8k8.tf32.f32"])
    with pytest.raises(ValueError, match="f32"):
        operand_plan(MMA_ATOMS["m16n8k16.f16.f16"], MMA_ATOMS[F16])


def test_accumulator_rows_are_quads():
    lay = accumulator_layout(MMA_ATOMS[F16])
    assert lay.slot == (0, 0, 1, 1) and lay.row_base == (0, 0, 8, 8) and lay.col_base == (0, 1, 0, 1)
    assert lay.shuffle_masks == (1, 2)  # the 4 lanes of a quad share a row


# -- a one-warp lab: X and Y as accumulators (X @ I), an op, the result stored ----------------
def _padded_k(tn):
    return max(16, -(-8 * tn // 16) * 16)


@tg.kernel
def lab(body, tiles=(1, 2), atom=F16, dtype="f16"):
    tm, tn = tiles
    KP, NP = _padded_k(tn), max(8 * tn, 16)
    tg.launch(threads=32, grid=(1, 1, 1))
    X = tg.tensor("X", dtype, ("M", "K"))
    Y = tg.tensor("Y", dtype, ("M", "K"))
    eye = tg.tensor("I", dtype, ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    s = tg.scalar("s")
    n = tg.scalar("n", "u32")
    r0 = tg.scalar("r0", "u32")
    sX = tg.shared("sX", dtype, 16 * tm, KP, stages=2, swizzle="none")
    sI = tg.shared("sI", dtype, KP, NP, swizzle="none")
    tg.copy_async(sX[0], X.block(0, 0))
    tg.copy_async(sX[1], Y.block(0, 0))
    tg.copy_async(sI[0], eye.block(0, 0))
    tg.commit()
    tg.wait(0)
    tg.barrier()
    a = tg.fragment(atom, "A", (tm, 1))
    b = tg.fragment(atom, "B", (1, tn))
    x, y = tg.fragment(atom, "C", tiles, name="x"), tg.fragment(atom, "C", tiles, name="y")
    for acc, stage in ((x, 0), (y, 1)):
        for kk in range(KP // 16):
            tg.load(a, sX[stage], 0, 16 * kk)
            tg.load(b, sI[0], 16 * kk, 0)
            tg.mma(acc, a, b)
    env = dict(s=s, n=n, r0=r0, atom=atom, tiles=tiles, eye=sI, b=b)
    out = body(x, y, env)
    if isinstance(out, tg.RowVector):
        out = tg.add(tg.fragment(atom, "C", tiles), out)  # one value per row, broadcast
    tg.store(C.block(0, 0), out)


def run_lab(body, tiles=(1, 2), s=0.75, n=5, r0=0, dtype="f16", atom=F16, seed=0, X=None, Y=None):
    """(result, X, Y) with X, Y the (16 tm) x (8 tn) inputs as float64."""
    tm, tn = tiles
    M, N, KP = 16 * tm, 8 * tn, _padded_k(tn)
    nd = numpy_dtype(dtype)
    rng = np.random.default_rng(seed)
    if X is None:
        X = rng.standard_normal((M, N))
    if Y is None:
        Y = rng.choice([-1.0, 1.0], (M, N)) * (1.0 + rng.random((M, N)))  # away from zero
    Xp, Yp = np.zeros((M, KP), nd), np.zeros((M, KP), nd)
    Xp[:, :N], Yp[:, :N] = X, Y
    eye = np.eye(KP, N, dtype=nd)
    k = tilegen.compile(lab, body=body, tiles=tiles, atom=atom, dtype=dtype)
    mem = GlobalMemory()
    ptrs = {}
    for name, arr in (("X", Xp), ("Y", Yp), ("I", eye), ("C", np.full((M, N), np.nan, np.float32))):
        ptrs[name] = mem.alloc(arr.nbytes)
        mem.write(ptrs[name], arr.tobytes())
    args = {"M": M, "K": KP, "N": N, "s": s, "n": n, "r0": r0,
            "X_ptr": ptrs["X"], "X_ld": KP, "Y_ptr": ptrs["Y"], "Y_ld": KP, "I_ptr": ptrs["I"], "I_ld": N,
            "C_ptr": ptrs["C"], "C_ld": N}
    run_kernel(k, args, {}, memory=mem)
    out = np.frombuffer(mem.read(ptrs["C"], M * N * 4), np.float32).reshape(M, N)
    return out, Xp[:, :N].astype(np.float64), Yp[:, :N].astype(np.float64)


def _softmax(X):
    p = np.exp(X - X.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def _rows(v, like):
    return np.broadcast_to(v[:, None], like.shape)


ELEMENTWISE = {
    "add": (lambda x, y, e: tg.add(x, y), lambda X, Y, s: X + Y),
    "sub": (lambda x, y, e: tg.sub(x, y), lambda X, Y, s: X - Y),
    "mul": (lambda x, y, e: tg.mul(x, y), lambda X, Y, s: X * Y),
    "div": (lambda x, y, e: tg.div(x, y), lambda X, Y, s: X / Y),
    "maximum": (lambda x, y, e: tg.maximum(x, y), lambda X, Y, s: np.maximum(X, Y)),
    "scale_float": (lambda x, y, e: tg.scale(x, e["s"]), lambda X, Y, s: X * s),
    "scale_const": (lambda x, y, e: tg.scale(x, -2.5), lambda X, Y, s: X * -2.5),
    "const_minus": (lambda x, y, e: tg.sub(1.5, x), lambda X, Y, s: 1.5 - X),
    "div_const": (lambda x, y, e: tg.div(x, 3.0), lambda X, Y, s: X / 3.0),
    "float_times_const": (lambda x, y, e: tg.mul(x, tg.mul(e["s"], 4.0)), lambda X, Y, s: X * (s * 4.0)),
    "exp": (lambda x, y, e: tg.exp(x), lambda X, Y, s: np.exp(X)),
    "exp2": (lambda x, y, e: tg.exp2(x), lambda X, Y, s: np.exp2(X)),
    "row_max": (lambda x, y, e: tg.row_max(x), lambda X, Y, s: _rows(X.max(1), X)),
    "row_sum": (lambda x, y, e: tg.row_sum(x), lambda X, Y, s: _rows(X.sum(1), X)),
    "minus_row_max": (lambda x, y, e: tg.sub(x, tg.row_max(y)), lambda X, Y, s: X - Y.max(1)[:, None]),
    "times_row_sum": (lambda x, y, e: tg.mul(x, tg.row_sum(y)), lambda X, Y, s: X * Y.sum(1)[:, None]),
    "over_row_max": (lambda x, y, e: tg.div(x, tg.row_max(y)), lambda X, Y, s: X / Y.max(1)[:, None]),
    "row_ops": (lambda x, y, e: tg.add(tg.mul(tg.row_max(x), 2.0), tg.row_sum(y)),
                lambda X, Y, s: _rows(2 * X.max(1) + Y.sum(1), X)),
    "softmax": (lambda x, y, e: tg.div(tg.exp(tg.sub(x, tg.row_max(x))), tg.row_sum(tg.exp(tg.sub(x, tg.row_max(x))))),
                lambda X, Y, s: _softmax(X)),
    # the same ops written with Python's operators
    "operators": (lambda x, y, e: (x * 2.0 + 1.0) / 4.0 - y * e["s"], lambda X, Y, s: (X * 2 + 1) / 4 - Y * s),
    "reflected": (lambda x, y, e: 1.5 - 2.0 / (3.0 + x * x) + -y, lambda X, Y, s: 1.5 - 2 / (3 + X * X) - Y),
    "operators_rows": (lambda x, y, e: x - tg.row_max(x) * 0.5 + tg.row_sum(y) / 8.0,
                       lambda X, Y, s: X - 0.5 * X.max(1)[:, None] + Y.sum(1)[:, None] / 8),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_fragment_ops_match_numpy(name):
    body, ref = ELEMENTWISE[name]
    out, X, Y = run_lab(body, tiles=(1, 2))
    np.testing.assert_allclose(out, ref(X, Y, 0.75), rtol=2e-6, atol=1e-6)


@tg.kernel
def _specials():
    """C's values of X and Y taken as they are (accumulate from f32 tensors, no product), then
    maximum, row_max and a row_max subtracted, stored."""
    tg.launch(threads=32, grid=(1, 1, 1))
    X, Y = tg.tensor("X", "f32", ("M", "N")), tg.tensor("Y", "f32", ("M", "N"))
    MAX, SUB = tg.tensor("MAX", "f32", ("M", "N")), tg.tensor("SUB", "f32", ("M", "N"))
    ROW = tg.tensor("ROW", "f32", ("M", "ONE"))
    x, y = tg.fragment(F16, "C", (1, 2)), tg.fragment(F16, "C", (1, 2))
    tg.accumulate(x, X.block(0, 0))
    tg.accumulate(y, Y.block(0, 0))
    tg.store(MAX.block(0, 0), tg.maximum(x, y))
    tg.store(ROW.block(0, 0), tg.row_max(x))
    tg.store(SUB.block(0, 0), tg.sub(x, tg.row_max(y)))


def test_nan_and_inf_go_through_max_as_in_numpy():
    """A NaN on either side of maximum, or anywhere in a row, is the result, as numpy's np.maximum
    and max give (plain max.f32 returned the other operand); infinities stay infinities."""
    rng = np.random.default_rng(5)
    X, Y = rng.standard_normal((16, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    X[0, 3], X[2, 0], X[5, 7], X[9, 9], X[11, 2] = np.nan, np.inf, -np.inf, np.nan, np.inf
    Y[4, 1], Y[0, 0], Y[2, 5], Y[5, 7] = np.nan, -np.inf, np.nan, np.inf
    mem = GlobalMemory()
    ptrs = {}
    for name, arr in (("X", X), ("Y", Y), ("MAX", np.zeros((16, 16), np.float32)),
                      ("SUB", np.zeros((16, 16), np.float32)), ("ROW", np.zeros(16, np.float32))):
        ptrs[name] = mem.alloc(arr.nbytes)
        mem.write(ptrs[name], arr.tobytes())
    args = {"M": 16, "N": 16, "ONE": 1, **{f"{n}_ptr": p for n, p in ptrs.items()},
            **{f"{n}_ld": 16 for n in ("X", "Y", "MAX", "SUB")}, "ROW_ld": 1}
    k = tilegen.compile(_specials)
    run_kernel(k, {n: args[n] for n, _ in k.params}, {}, memory=mem)
    got = {n: np.frombuffer(mem.read(ptrs[n], a.nbytes), np.float32).reshape(a.shape)
           for n, a in (("MAX", X), ("SUB", X), ("ROW", X[:, 0]))}
    with np.errstate(invalid="ignore"):
        want = {"MAX": np.maximum(X, Y), "ROW": X.max(1), "SUB": X - Y.max(1)[:, None]}
    for name, w in want.items():
        assert np.isnan(w).any(), name
        np.testing.assert_array_equal(got[name], w, err_msg=name)   # (NaN where NaN, inf where inf)


@pytest.mark.parametrize("tiles", [(1, 1), (2, 3), (1, 8)])
def test_row_reductions_cover_every_column_of_every_m_atom(tiles):
    out, X, Y = run_lab(lambda x, y, e: tg.add(tg.row_max(x), tg.mul(tg.row_sum(y), 1000.0)), tiles=tiles, seed=3)
    np.testing.assert_allclose(out, _rows(X.max(1) + 1000 * Y.sum(1), X), rtol=1e-6)


MASKS = {
    "col_bound": (lambda e: (lambda r, c: c >= e["n"]), lambda r, c, n, r0: c >= n),
    "causal": (lambda e: (lambda r, c: (c > r) | (c >= e["n"])), lambda r, c, n, r0: (c > r) | (c >= n)),
    "band": (lambda e: (lambda r, c: ~((r - c <= 2) & (c - r <= 1))),
             lambda r, c, n, r0: ~((r - c <= 2) & (c - r <= 1))),
    "equal": (lambda e: (lambda r, c: r == c + 1), lambda r, c, n, r0: r == c + 1),
    "not_equal_rows": (lambda e: (lambda r, c: (r != 3) & (r < e["r0"] + 7)),
                       lambda r, c, n, r0: (r != 3) & (r < r0 + 7)),
    "int_on_left": (lambda e: (lambda r, c: 4 <= c), lambda r, c, n, r0: 4 <= c),
    # a runtime size on the left (docs/dsl.md's causal + ragged mask): it had raised a DSLError
    "size_on_left": (lambda e: (lambda r, c: (c > r) | (e["n"] <= c)), lambda r, c, n, r0: (c > r) | (n <= c)),
}


@pytest.mark.parametrize("name", list(MASKS))
def test_mask_matches_numpy(name):
    cond, ref = MASKS[name]
    n, r0 = 11, 5
    out, X, _ = run_lab(lambda x, y, e: tg.mask(x, e["r0"], 3, cond(e), -INF), tiles=(2, 2), n=n, r0=r0)
    r, c = np.meshgrid(np.arange(32) + r0, np.arange(16) + 3, indexing="ij")
    want = np.where(ref(r, c, n, r0), -np.inf, X)
    assert np.array_equal(out, want.astype(np.float32))


def test_masked_softmax_ignores_masked_columns():
    n = 13

    def body(x, y, e):
        s = tg.mask(x, 0, 0, lambda r, c: c >= e["n"], -INF)
        p = tg.exp(tg.sub(s, tg.row_max(s)))
        return tg.div(p, tg.row_sum(p))
    out, X, _ = run_lab(body, tiles=(1, 4), n=n)
    p = np.exp(X[:, :n] - X[:, :n].max(1, keepdims=True))
    np.testing.assert_allclose(out[:, :n], p / p.sum(1, keepdims=True), rtol=2e-6)
    assert (out[:, n:] == 0).all()


@pytest.mark.parametrize("dtype,atom", [("f16", F16), ("bf16", BF16)])
def test_to_operand_rounds_and_feeds_the_next_mma(dtype, atom):
    """P = x / 3 as A operands, times the identity: every element comes back, rounded."""
    def body(x, y, e):
        p = tg.mul(x, 1.0 / 3.0)
        out = tg.fragment(e["atom"], "C", e["tiles"])
        for kk, pk in enumerate(tg.to_operand(p, "A")):
            tg.load(e["b"], e["eye"][0], 16 * kk, 0)
            tg.mma(out, pk, e["b"])
        return out
    out, X, _ = run_lab(body, tiles=(2, 4), dtype=dtype, atom=atom)
    want = (X.astype(np.float32) * np.float32(1.0 / 3.0)).astype(numpy_dtype(dtype)).astype(np.float32)
    assert np.array_equal(out, want)


def test_assign_out_and_row_vectors_carry_state_through_a_loop():
    """acc doubles n times in place; m keeps the running max of every step's row max."""
    def body(x, y, e):
        acc = tg.fragment(e["atom"], "C", e["tiles"], name="acc")
        tg.assign(acc, x)
        m = tg.row_vector(x, -INF, name="m")
        for _ in tg.range(0, e["n"]):
            tg.mul(acc, 2.0, out=acc)
            tg.maximum(m, tg.row_max(tg.mul(acc, -1.0)), out=m)
        return tg.add(acc, m)
    n = 3
    out, X, _ = run_lab(body, tiles=(1, 2), n=n)
    steps = np.stack([X * 2.0 ** i for i in range(1, n + 1)])
    m = (-steps).max(axis=(0, 2))
    np.testing.assert_allclose(out, X * 2.0 ** n + m[:, None], rtol=1e-6)


def test_row_vector_fill_from_a_float_and_assign_broadcast():
    def body(x, y, e):
        rv = tg.row_vector(x, e["s"])
        f = tg.fragment(e["atom"], "C", e["tiles"])
        tg.assign(f, rv)
        return tg.add(f, tg.exp(tg.row_vector(x, 0.0)))
    out, X, _ = run_lab(body, s=2.25)
    assert (out == 3.25).all()


def test_ir_and_ptx_show_the_ops():
    def body(x, y, e):
        s = tg.mask(x, 0, 0, lambda r, c: c >= e["n"], -INF)
        return tg.div(tg.exp(tg.sub(s, tg.row_max(s))), 2.0)
    k = tilegen.compile(lab, body=body)
    for text in ("= mask(x at (0, 0): -inf where c >= %n)", "= row_max(", "= sub(", "= exp(", "= div("):
        assert text in k.ir
    assert "test_fragment_ops.py:" in k.ir
    for op in ("shfl.sync.bfly.b32", "ex2.approx.ftz.f32", "max.NaN.f32", "selp.f32", "setp.ge.s32", "div.rn.f32"):
        assert op in k.ptx


# -- shfl.sync on the emulator -----------------------------------------------------------------
SHFL_PTX = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry shfl(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [out];
    mov.u32 %r0, %tid.x;
    mul.lo.u32 %r1, %r0, 7;
    shfl.sync.MODE.b32 %r2, %r1, B, C, 0xffffffff;
    mul.wide.u32 %rd1, %r0, 4;
    add.s64 %rd2, %rd0, %rd1;
    st.global.u32 [%rd2], %r2;
    ret;
}
"""


def _shfl_reference(mode, b, c, threads=64):
    out = []
    for tid in range(threads):
        lane, base = tid % 32, tid - tid % 32
        seg, clamp = (c >> 8) & 31, c & 31
        max_lane, min_lane = (lane & seg) | (clamp & ~seg), lane & seg
        j, ok = {"bfly": (lane ^ b, (lane ^ b) <= max_lane), "up": (lane - b, lane - b >= max_lane),
                 "down": (lane + b, lane + b <= max_lane),
                 "idx": (min_lane | (b & ~seg), (min_lane | (b & ~seg)) <= max_lane)}[mode]
        out.append(7 * (base + (j if ok else lane)))
    return np.array(out, np.uint32)


@pytest.mark.parametrize("mode,b,width", [("bfly", 1, 32), ("bfly", 2, 32), ("bfly", 16, 32), ("bfly", 8, 8),
                                          ("up", 3, 32), ("up", 2, 8), ("down", 5, 32), ("down", 1, 4),
                                          ("idx", 9, 32), ("idx", 3, 8)])
def test_shfl_sync_follows_the_isa(mode, b, width):
    from tilegen.sim import launch

    c = ((32 - width) << 8) | (0 if mode == "up" else 31)
    mem = GlobalMemory()
    out = mem.alloc(64 * 4)
    launch(SHFL_PTX.replace("MODE", mode).replace("B,", f"{b},").replace("C,", f"{c},"), (1, 1, 1), 64,
           {"out": out}, memory=mem)
    got = np.frombuffer(mem.read(out, 256), np.uint32)
    assert np.array_equal(got, _shfl_reference(mode, b, c))
    if mode == "bfly" and width == 32:  # the plain butterfly: lane ^ b
        assert np.array_equal(got, 7 * (np.arange(64) ^ b))


# -- mistakes point at the user's line ---------------------------------------------------------
def _line_of(fn, text):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(src) if text in line)


def bad_exp_of_operand(x, y, e):
    a = tg.fragment(e["atom"], "A", (1, 1))
    return tg.exp(a)  # an A fragment


def bad_shapes(x, y, e):
    z = tg.fragment(e["atom"], "C", (1, 1))
    return tg.add(x, z)  # (1, 2) + (1, 1)


def bad_python_and(x, y, e):
    return tg.mask(x, 0, 0, lambda r, c: c >= 3 and r < 5, -INF)  # `and`


def bad_condition(x, y, e):
    return tg.mask(x, 0, 0, lambda r, c: 3, -INF)  # not a comparison


def bad_tf32(x, y, e):
    return tg.to_operand(x, "A", atom="m16n8k8.tf32.f32")  # not 16-bit


def bad_rows(x, y, e):
    two = tg.fragment(e["atom"], "C", (2, 2))
    return tg.sub(x, tg.row_max(two))  # 32 rows against 16


def bad_out(x, y, e):
    rv = tg.row_vector(x, 0.0)
    return tg.exp(x, out=rv)  # a fragment into a row vector


def bad_f16_accumulator(x, y, e):
    h = tg.fragment("m16n8k16.f16.f16", "C", (1, 2))
    return tg.row_max(h)  # f16x2 accumulator


def bad_operand_b(x, y, e):
    return tg.to_operand(x, "B")  # only A


def bad_value(x, y, e):
    return tg.add(x, "1.0")  # a string


@pytest.mark.parametrize("body,marker,message", [
    (bad_exp_of_operand, "an A fragment", "takes accumulator fragments (operand 'C')"),
    (bad_shapes, "(1, 2) + (1, 1)", "fragments of different shapes"),
    (bad_python_and, "`and`", "combine conditions with & and |"),
    (bad_condition, "not a comparison", "must return a comparison of the coordinates"),
    (bad_tf32, "not 16-bit", "only 16-bit A operands (f16, bf16)"),
    (bad_rows, "32 rows against 16", "does not match the 16 rows"),
    (bad_out, "a fragment into a row vector", "out= must be a fragment"),
    (bad_f16_accumulator, "f16x2 accumulator", "needs an f32 accumulator"),
    (bad_operand_b, "only A", "allowed: 'A'"),
    (bad_value, "a string", "expected an accumulator fragment, a row vector, a number"),
])
def test_mistakes_point_at_the_users_line(body, marker, message):
    with pytest.raises(DSLError) as e:
        tilegen.compile(lab, body=body)
    assert f"test_fragment_ops.py:{_line_of(body, marker)}:" in str(e.value)
    assert message in str(e.value)


@tg.kernel
def unbatched_block():
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.batched_tensor("A", "f16", ("M", "K"))
    A.block(0, 0)  # forgot .batch(b)


def test_batched_tensor_needs_a_batch_index():
    with pytest.raises(DSLError, match=r"test_fragment_ops\.py:\d+: A is batched: take one matrix with A\.batch"):
        tilegen.compile(unbatched_block)


def test_scalar_arithmetic_folds_numbers_and_emits_for_floats():
    @tg.kernel
    def scalars():
        tg.launch(threads=32, grid=(1, 1, 1))
        s = tg.scalar("s")
        assert tg.mul(2.0, 3.0) == 6.0 and tg.exp2(3.0) == 8.0
        assert isinstance(tg.mul(s, 2.0), tg.Float) and isinstance(tg.exp(s), tg.Float)
        n = tg.scalar("n", "u32")
        assert isinstance(tg.maximum(n, 3), tg.Int)
        assert tg.maximum(float("nan"), 1.0) != tg.maximum(float("nan"), 1.0)   # folded as np.maximum: NaN
        assert tg.maximum(1.0, float("nan")) != tg.maximum(1.0, float("nan"))
    k = tilegen.compile(scalars)
    assert "mul.f32" in k.ptx and "ex2.approx.ftz.f32" in k.ptx and "max.u32" in k.ptx


def test_an_int_and_a_fragment_do_not_mix_in_maximum():
    @tg.kernel
    def mixed():
        tg.launch(threads=32, grid=(1, 1, 1))
        x = tg.fragment(F16, "C", (1, 1))
        tg.maximum(x, tg.scalar("n", "u32"))
    with pytest.raises(DSLError, match=r"maximum: a kernel integer \(Int\) and a Fragment do not mix"):
        tilegen.compile(mixed)


# -- the float instructions fragment arithmetic emits, on the emulator ----------------------------
FLOAT_PTX = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry floats(.param .u64 x, .param .u64 y, .param .u64 out)
{
    .reg .f32 %f<12>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<12>;
    .reg .pred %p<2>;
    ld.param.u64 %rd0, [x];
    ld.param.u64 %rd1, [y];
    ld.param.u64 %rd2, [out];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd3, %r0, 4;
    add.s64 %rd4, %rd0, %rd3;
    add.s64 %rd5, %rd1, %rd3;
    ld.global.f32 %f0, [%rd4];
    ld.global.f32 %f1, [%rd5];
    ex2.approx.ftz.f32 %f2, %f0;
    max.f32 %f3, %f0, %f1;
    div.rn.f32 %f4, %f0, %f1;
    setp.gt.f32 %p0, %f0, %f1;
    selp.f32 %f5, 0fFF800000, %f0, %p0;
    mul.wide.u32 %rd6, %r0, 16;
    add.s64 %rd7, %rd2, %rd6;
    st.global.v4.f32 [%rd7], {%f2, %f3, %f4, %f5};
    ret;
}
"""


def test_float_instructions_of_fragment_arithmetic_on_the_emulator():
    from tilegen.sim import launch

    x = np.array([-np.inf, -130.0, -126.5, 0.0, 1.5, np.inf, np.nan, 3.0] * 4, np.float32)
    y = np.array([1.0, 2.0, -1.0, np.nan, 0.5, 1.0, 2.0, 7.0] * 4, np.float32)
    mem = GlobalMemory()
    px, py, po = mem.alloc(128), mem.alloc(128), mem.alloc(512)
    mem.write(px, x.tobytes())
    mem.write(py, y.tobytes())
    launch(FLOAT_PTX, (1, 1, 1), 32, {"x": px, "y": py, "out": po}, memory=mem)
    got = np.frombuffer(mem.read(po, 512), np.float32).reshape(32, 4)
    with np.errstate(all="ignore"):
        ex2 = np.exp2(x)
        ex2[np.abs(ex2) < 2.0 ** -126] = 0  # .ftz: 2^-130 is subnormal, flushed
        want = np.stack([ex2, np.fmax(x, y), x / y, np.where(x > y, -np.inf, x)], axis=1).astype(np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    assert got[2, 0] == 0 and got[0, 0] == 0 and got[3, 1] == 0  # ex2(-126.5) flushed; ex2(-inf) = 0; max(0, NaN) = 0


def test_fragments_are_not_compared_as_a_whole():
    """Python's max(x, 0.0) compares: it is refused with what to write instead (it had been a
    TypeError from Python)."""
    with pytest.raises(DSLError, match=r"fragments are not compared as a whole .* tilegen.dsl.maximum\(x, y\)"):
        run_lab(lambda x, y, e: max(x, 0.0))
