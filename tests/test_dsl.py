"""The kernel DSL: a kernel written by a user (not the GEMM template) traces, compiles and runs;
mistakes raise DSLError pointing at the user's own line."""
import inspect

import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.errors import DSLError

ATOM = "m16n8k16.f16.f32"


def _tile_product(A, B, row=0, swap=False):
    """One warp's 16 x 16 product of rows row..row+15 of A (x 32) and B (32 x 16): copy both
    to shared memory, wait, ldmatrix, two mma k-steps. Python helpers trace inline. With
    swap=True the product is transposed, B^T A^T, read through .T views of the tiles."""
    sA = tg.shared("sA", "f16", 16, 32, swizzle="64B")
    sB = tg.shared("sB", "f16", 32, 16, swizzle="32B")
    tg.copy_async(sA[0], A.block(row, 0))
    tg.copy_async(sB[0], B.block(0, 0))
    tg.commit()
    tg.wait(0)
    tg.barrier()
    acc = tg.fragment(ATOM, "C", (1, 2))
    a = tg.fragment(ATOM, "A", (1, 1))
    b = tg.fragment(ATOM, "B", (1, 2))
    first, second = (sB.T, sA.T) if swap else (sA, sB)
    for kk in range(2):
        tg.load(a, first[0], 0, 16 * kk)
        tg.load(b, second[0], 16 * kk, 0)
        tg.mma(acc, a, b)
    return acc


@tg.kernel
def one_tile(stages=1):
    """C (16 x 16) = A (16 x 32) @ B (32 x 16) by one warp: copy to shared, ldmatrix, mma, store."""
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    tg.store(C.block(0, 0), _tile_product(A, B))


def _run_one_tile(k=None):
    """(C as stored, A @ B) of a one-tile kernel (one_tile unless given) on small integers."""
    from tilegen.sim import GlobalMemory, run_kernel

    k = k or tilegen.compile(one_tile)
    rng = np.random.default_rng(4)
    A = rng.integers(-3, 4, (16, 32)).astype(np.float16)
    B = rng.integers(-3, 4, (32, 16)).astype(np.float16)
    mem = GlobalMemory()
    pa, pb, pc = (mem.alloc(x.nbytes) for x in (A, B, np.zeros((16, 16), np.float32)))
    mem.write(pa, A.tobytes())
    mem.write(pb, B.tobytes())
    mem.write(pc, np.full((16, 16), np.nan, np.float32).tobytes())
    args = {"M": 16, "K": 32, "N": 16, "A_ptr": pa, "A_ld": 32, "B_ptr": pb, "B_ld": 16, "C_ptr": pc, "C_ld": 16}
    run_kernel(k, args, {"M": 16, "N": 16, "K": 32}, memory=mem)
    C = np.frombuffer(mem.read(pc, 16 * 16 * 4), np.float32).reshape(16, 16)
    return C, A.astype(np.float32) @ B.astype(np.float32)


def test_user_kernel_runs_exactly_on_the_emulator():
    C, want = _run_one_tile()
    assert np.array_equal(C, want)  # integer inputs: the mma result is exact


def test_a_kernel_that_is_no_gemm_says_how_to_launch_it_on_either_device():
    k = tilegen.compile(one_tile)
    with pytest.raises(tilegen.LaunchError, match=r"no array for B, C \(its arrays, in order: A, B, C\)"):
        k(np.zeros((16, 32), np.float16))
    with pytest.raises(tilegen.LaunchError, match=r"runs on the GPU; on the CPU emulator: tilegen\.sim\.run_kernel"):
        k.launch({}, {}, device="sim")
    # the traced function itself points to the compiled kernel's call
    with pytest.raises(DSLError, match=r"kernel = tilegen\.compile\(one_tile, \.\.\.\) .* and call the result "
                                       r"on arrays, kernel\(A, B, \.\.\., alpha=\.\.\.\) \(device='sim'"):
        one_tile()


def test_user_kernel_ir_and_ptx_are_readable():
    k = tilegen.compile(one_tile)
    assert "copy_async sA[0] <- A" in k.ir and "+= mma(a, b)" in k.ir
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in k.ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in k.ptx
    assert "test_dsl.py:" in k.ptx  # PTX comments name the kernel's own source lines


def _line_of(fn, text):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(src) if text in line)


@tg.kernel
def wrong_copy():
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    sA = tg.shared("sA", "f16", 16, 64)
    tg.copy_async(A.block(0, 0), sA[0])  # arguments swapped


@tg.kernel
def python_if_on_runtime_value():
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    if A.shape[0] > 0:  # a runtime value has no truth value at trace time
        pass


@tg.kernel
def bad_dtype():
    tg.launch(threads=32, grid=(1, 1, 1))
    tg.tensor("A", "f64", ("M", "K"))


@tg.kernel
def fragment_from_wrong_tile():
    tg.launch(threads=32, grid=(1, 1, 1))
    sA = tg.shared("sA", "bf16", 16, 64)
    a = tg.fragment(ATOM, "A", (1, 1))
    tg.load(a, sA[0], 0, 0)


@pytest.mark.parametrize("fn,marker,message", [
    (wrong_copy, "arguments swapped", "copy_async(dst=tile.stage(s), src=tensor.block(r, c))"),
    (bad_dtype, "f64", "allowed: tf32, f16, bf16"),
    (fragment_from_wrong_tile, "tg.load(a, sA[0], 0, 0)", "fragment of f16 from a bf16 tile"),
])
def test_mistakes_point_at_the_users_line(fn, marker, message):
    with pytest.raises(DSLError) as e:
        tilegen.compile(fn)
    assert f"test_dsl.py:{_line_of(fn.fn, marker)}" in str(e.value)
    assert message in str(e.value)


def test_python_if_on_a_runtime_value_is_explained():
    with pytest.raises(DSLError, match=r"test_dsl\.py:\d+: .*tilegen\.dsl\.range"):
        tilegen.compile(python_if_on_runtime_value)


def test_equality_on_a_runtime_integer_is_refused_and_eq_ne_branch_on_the_gpu():
    """`kt == 0` inside a runtime loop had been Python's identity test, answered at trace time (the
    branch never taken, silently); now it is refused with what to write, tg.eq / tg.ne branch on
    the GPU, and == of constants folds."""
    @tg.kernel
    def test_in_loop(equal=True):
        tg.launch(threads=32, grid=(1, 1, 1))
        for kt in tg.range(2):
            if (kt == 0) if equal else (kt != 0):
                pass

    for equal, op, name in ((True, "==", "eq"), (False, "!=", "ne")):
        with pytest.raises(DSLError, match=rf"`{op}` on a kernel integer .*tilegen\.dsl\.{name}\(a, b\)"):
            tilegen.compile(test_in_loop, equal=equal)

    @tg.kernel
    def counts():
        tg.launch(threads=32, grid=(1, 1, 1))
        C = tg.tensor("C", "f32", ("M", "N"))
        acc = tg.fragment(ATOM, "C", (1, 1))   # (zeros)
        assert tg.Int(3) == 3 and tg.Int(3) != 4   # (constants fold)
        for kt in tg.range(tg.size("K")):
            with tg.if_(tg.eq(kt, 1)):
                tg.add(acc, 10.0, out=acc)
            with tg.if_(tg.ne(kt, 1)):
                tg.add(acc, 1.0, out=acc)
        tg.store(C.block(0, 0), acc)

    from tilegen.sim import GlobalMemory, run_kernel

    k = tilegen.compile(counts)
    mem = GlobalMemory()
    pc = mem.alloc(16 * 8 * 4)
    run_kernel(k, {"C_ptr": pc, "C_ld": 8, "M": 16, "N": 8, "K": 4}, {"M": 16, "N": 8, "K": 4}, memory=mem)
    C = np.frombuffer(mem.read(pc, 16 * 8 * 4), np.float32)
    assert np.all(C == 13.0)   # k = 1 adds 10, k = 0, 2, 3 add 1


def test_store_takes_python_numbers_for_alpha_and_beta_and_refuses_an_fp8_output():
    """alpha=2.0, beta=0.5 as Python numbers (an AttributeError before), checked on the emulator;
    a store into an fp8 tensor is refused at trace time (it had emitted PTX ptxas rejects)."""
    from tilegen.sim import GlobalMemory, run_kernel

    @tg.kernel
    def scaled():
        tg.launch(threads=32, grid=(1, 1, 1))
        C = tg.tensor("C", "f32", ("M", "N"))
        acc = tg.fragment(ATOM, "C", (1, 1))
        tg.add(acc, 1.0, out=acc)
        tg.store(C.block(0, 0), acc, alpha=2.0, beta=0.5)

    k = tilegen.compile(scaled)
    mem = GlobalMemory()
    pc = mem.alloc(16 * 8 * 4)
    mem.write(pc, np.full(16 * 8, 4.0, np.float32).tobytes())
    run_kernel(k, {"C_ptr": pc, "C_ld": 8, "M": 16, "N": 8}, {"M": 16, "N": 8}, memory=mem)
    assert np.all(np.frombuffer(mem.read(pc, 16 * 8 * 4), np.float32) == 2.0 * 1.0 + 0.5 * 4.0)

    @tg.kernel
    def fp8_out():
        tg.launch(threads=32, grid=(1, 1, 1))
        C = tg.tensor("C", "e4m3", ("M", "N"))
        tg.store(C.block(0, 0), tg.fragment(ATOM, "C", (1, 1)))

    with pytest.raises(DSLError, match=r"store: writes f32, f16 or bf16 tensors; C is e4m3"):
        tilegen.compile(fp8_out)
    with pytest.raises(DSLError, match=r"alpha must be a number or a tilegen.dsl.scalar"):
        @tg.kernel
        def bad_alpha():
            tg.launch(threads=32, grid=(1, 1, 1))
            C = tg.tensor("C", "f32", ("M", "N"))
            tg.store(C.block(0, 0), tg.fragment(ATOM, "C", (1, 1)), alpha="2", beta=0.0)
        tilegen.compile(bad_alpha)


def test_conditions_joined_with_python_and_say_to_use_the_operators():
    @tg.kernel
    def joined():
        tg.launch(threads=32, grid=(1, 1, 1))
        M = tg.size("M")
        with tg.if_(tg.lt(M, 5) and tg.lt(M, 9)):
            pass

    with pytest.raises(DSLError, match=r"combine conditions with & and \|, not Python's and / or"):
        tilegen.compile(joined)


def test_calling_a_kernel_directly_is_explained():
    with pytest.raises(DSLError, match="tilegen.compile"):
        one_tile()


def test_missing_launch_is_explained():
    @tg.kernel
    def no_launch():
        tg.tensor("A", "f16", ("M", "K"))

    with pytest.raises(DSLError, match=r"tilegen\.dsl\.launch"):
        tilegen.compile(no_launch)


def test_unknown_compile_time_argument_is_explained():
    with pytest.raises(DSLError, match="compile-time arguments: stages"):
        tilegen.compile(one_tile, tile=3)


def test_instruction_level_ir_is_printed_too():
    k = tilegen.compile(one_tile)
    text = k.instructions
    assert "instr level" in text.splitlines()[0]
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in text and "copy_async" not in text


def test_instruction_level_ir_of_a_disk_cached_gemm(cdir, monkeypatch):
    from tilegen import compiler

    spec = tilegen.GemmSpec(dtype="f16", tile=(64, 64, 32))
    fresh = tilegen.compile(spec)
    compiler.forget()  # the next compile reads the disk cache, without tracing
    monkeypatch.setattr(compiler, "build", lambda *a, **k: pytest.fail("traced again"))
    cached = tilegen.compile(spec)
    assert cached is not fresh
    assert "mma.sync.aligned.m16n8k16" in cached.instructions
    assert cached.instructions == fresh.instructions


@tg.kernel
def branchy():
    """CTA p multiplies rows 16p..16p+15 of A; CTA 0 stores them into C, CTA 1 into D:
    a uniform branch on the CTA's position."""
    tg.launch(threads=32, grid=(2, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"))
    D = tg.tensor("D", "f32", ("M", "N"))
    row = tg.program_id() * 16
    acc = _tile_product(A, B, row)
    with tg.if_(tg.lt(tg.program_id(), 1)):
        tg.store(C.block(row, 0), acc)
    with tg.else_():
        tg.store(D.block(row, 0), acc)
    with tg.if_(tg.le(3, 2)):  # known at trace time: the block is not traced into the kernel
        tg.store(C.block(row, 0), acc)


def test_uniform_if_else_runs_one_side_per_cta():
    from tilegen.sim import GlobalMemory, run_kernel

    k = tilegen.compile(branchy)
    assert k.ptx.count("st.global") > 0 and "$else_" in k.ptx and "bra.uni" in k.ptx
    assert "if %" in k.ir and "else:" in k.ir
    rng = np.random.default_rng(5)
    A = rng.integers(-3, 4, (32, 32)).astype(np.float16)
    B = rng.integers(-3, 4, (32, 16)).astype(np.float16)
    mem = GlobalMemory()
    nan = np.full((32, 16), np.nan, np.float32)
    ptrs = {}
    for name, arr in (("A", A), ("B", B), ("C", nan), ("D", nan)):
        ptrs[name] = mem.alloc(arr.nbytes)
        mem.write(ptrs[name], arr.tobytes())
    args = {"M": 32, "K": 32, "N": 16, **{f"{n}_ptr": p for n, p in ptrs.items()},
            "A_ld": 32, "B_ld": 16, "C_ld": 16, "D_ld": 16}
    run_kernel(k, args, {"M": 32, "N": 16, "K": 32}, memory=mem)
    product = A.astype(np.float32) @ B.astype(np.float32)
    C = np.frombuffer(mem.read(ptrs["C"], 32 * 16 * 4), np.float32).reshape(32, 16)
    D = np.frombuffer(mem.read(ptrs["D"], 32 * 16 * 4), np.float32).reshape(32, 16)
    # CTA 0 took the if side only, CTA 1 the else side only
    assert np.array_equal(C[:16], product[:16]) and np.isnan(C[16:]).all()
    assert np.array_equal(D[16:], product[16:]) and np.isnan(D[:16]).all()


def test_python_truth_of_a_condition_is_explained():
    @tg.kernel
    def bad():
        tg.launch(threads=32, grid=(1, 1, 1))
        if tg.lt(tg.program_id(), 1):
            pass

    with pytest.raises(DSLError, match="tilegen.dsl.if_"):
        tilegen.compile(bad)


def test_else_without_if_is_explained():
    @tg.kernel
    def bad():
        tg.launch(threads=32, grid=(1, 1, 1))
        with tg.else_():
            pass

    with pytest.raises(DSLError, match="else_ must follow"):
        tilegen.compile(bad)


# ---- transposed views and column-major stores ------------------------------------------------

@tg.kernel
def transposed_product(c_layout, swap):
    """C = A @ B for one 16 x 16 tile; with swap=True computed as C^T = B^T A^T through .T
    views of the shared tiles, stored into C.T."""
    tg.launch(threads=32, grid=(1, 1, 1))
    A = tg.tensor("A", "f16", ("M", "K"))
    B = tg.tensor("B", "f16", ("K", "N"))
    C = tg.tensor("C", "f32", ("M", "N"), layout=c_layout)
    tg.store((C.T if swap else C).block(0, 0), _tile_product(A, B, swap=swap))


@pytest.mark.parametrize("c_layout", ["row", "col"])
@pytest.mark.parametrize("swap", [False, True])
def test_transposed_views_and_column_major_stores(c_layout, swap):
    stored, ref = _run_one_tile(tilegen.compile(transposed_product, c_layout=c_layout, swap=swap))
    C = stored.T if c_layout == "col" else stored
    assert np.abs(C - ref).max() < 1e-3 * np.abs(ref).max()


def test_residual_must_share_the_output_layout():
    @tg.kernel
    def k():
        tg.launch(threads=32, grid=(1, 1, 1))
        C = tg.tensor("C", "f32", ("M", "N"))
        R = tg.tensor("R", "f32", ("M", "N"), layout="col")
        acc = tg.fragment("m16n8k16.f16.f32", "C", (1, 1))
        tg.store(C.block(0, 0), acc, residual=R.block(0, 0))

    with pytest.raises(tilegen.DSLError) as e:
        tilegen.compile(k)
    assert "residual is col-major, the output row-major" in str(e.value)


@pytest.mark.parametrize("declare", [lambda: tg.tensor("my tensor", "f32", ("M", "K")),
                                     lambda: tg.tensor("1A", "f32", ("M", "K")),
                                     lambda: tg.tensor("A", "f32", ("M", "K k")),
                                     lambda: tg.tensor("A", "f32", ("M", "")),
                                     lambda: tg.vector("b\u00e4", "f32", "N"),
                                     lambda: tg.scalar("my alpha")])
def test_names_that_are_no_identifiers_are_refused(declare):
    """Names become PTX parameter names: a space, a leading digit or a non-ASCII letter would
    give PTX that ptxas cannot parse, so the declaration is refused at its line."""
    @tg.kernel
    def k():
        tg.launch(threads=32, grid=(1, 1, 1))
        declare()

    with pytest.raises(tilegen.DSLError, match="a name must be an ASCII identifier"):
        tilegen.compile(k)



def test_the_warp_index_is_computed_once_at_the_entry():
    """tg.warp_id() is called in the GEMM template and again inside the producer's role branch:
    one redux.sync (which ptxas reads as warp-uniform, keeping wgmma descriptors in uniform
    registers), ahead of every branch, where all threads of each warp take part."""
    spec = tilegen.GemmSpec(dtype="bf16", b_layout="col", tile=(128, 256, 64), warps=(8, 1), stages=4,
                            instruction="wgmma", target="sm_90a", persistent=True, copy="tma", store="tma")
    lines = tilegen.compile(spec).ptx.splitlines()
    redux = [i for i, line in enumerate(lines) if "redux.sync.min.u32" in line]
    first_branch = next(i for i, line in enumerate(lines) if " bra" in line)
    assert len(redux) == 1 and redux[0] < first_branch


@tg.kernel
def strided_sum(first=0):
    """C (16 x 8) = (2 a - 1) * the sum of X's 16 x 8 blocks at columns first, first + 8, ...
    (a runtime loop with a step) below W, by one warp."""
    tg.launch(threads=32, grid=(1, 1, 1))
    X = tg.tensor("X", "f32", ("R", "W"))
    C = tg.tensor("C", "f32", ("M", "N"))
    a = tg.scalar("a")
    acc = tg.fragment(ATOM, "C", (1, 1))
    for c in tg.range(first, X.shape[1], 8):
        tg.accumulate(acc, X.block(0, c))
    tg.store(C.block(0, 0), tg.scale(acc, 2.0 * a - 1.0))


def test_a_runtime_loop_with_a_step_and_float_arithmetic():
    """tg.range(start, stop, step) steps through start, start + step, ... (its trips: the
    ceiling of (stop - start) / step, W = 44 here: 6 blocks, the last ragged); a Float takes
    Python numbers and other Floats through * + - (2.0 * a - 1.0)."""
    from tilegen.sim import GlobalMemory, run_kernel

    rng = np.random.default_rng(3)
    X = rng.integers(-4, 5, (16, 44)).astype(np.float32)
    padded = np.zeros((16, 48), np.float32)
    padded[:, :44] = X
    for first, W in ((0, 44), (16, 44), (40, 44), (8, 4)):   # (the last: stop below start, no trip)
        mem = GlobalMemory()
        px, pc = mem.alloc(X.nbytes), mem.alloc(16 * 8 * 4)
        mem.write(px, X.tobytes())
        sizes = {"R": 16, "W": W, "M": 16, "N": 8}
        run_kernel(tilegen.compile(strided_sum, first=first), {**sizes, "X_ptr": px, "X_ld": 44, "C_ptr": pc,
                                                                "C_ld": 8, "a": 1.75}, sizes, memory=mem)
        C = np.frombuffer(mem.read(pc, 16 * 8 * 4), np.float32).reshape(16, 8)
        cols = padded[:, :W] if W < 44 else padded
        want = (2 * 1.75 - 1) * sum((np.pad(cols, ((0, 0), (0, 8)))[:, c:c + 8] for c in range(first, W, 8)),
                                    np.zeros((16, 8), np.float32))
        np.testing.assert_array_equal(C, want, err_msg=f"range({first}, {W}, 8)")


def _refused(body, error, message, threads=32, **compile_kw):
    """A kernel of `threads` threads whose body is body() is refused with `error` matching `message`."""
    @tg.kernel
    def bad():
        tg.launch(threads=threads, grid=(1, 1, 1))
        body()

    with pytest.raises(error, match=message):
        tilegen.compile(bad, **compile_kw)


@pytest.mark.parametrize("body, message", [
    (lambda: list(tg.range(0, 8, 0)), r"step=0\): the step must be a Python int >= 1"),
    (lambda: tg.scalar("a") * "x", "a Float combines with another Float or a Python number, not str"),
])
def test_steps_and_float_operands_that_make_no_sense_are_explained(body, message):
    _refused(body, DSLError, message)


def _relu_of(dtype: str, transposed: bool):
    @tg.kernel
    def relu16(BN=48):
        """Y = relu(X) for a 16-bit X read into an f32 fragment (X.T where transposed), Y in X's
        dtype; 32 rows per CTA (two warps), BN columns."""
        tg.launch(threads=64, grid=(tg.cdiv("M", 32), tg.cdiv("N", BN), 1))
        X = tg.tensor("X", dtype, ("N", "M") if transposed else ("M", "N"))
        Y = tg.tensor("Y", dtype, ("M", "N"))
        r0 = tg.program_id("x") * 32 + tg.warp_id() * 16
        c0 = tg.program_id("y") * BN
        x = tg.fragment(ATOM, "C", (1, BN // 8))
        tg.accumulate(x, X.T.block(r0, c0) if transposed else X.block(r0, c0))
        tg.store(Y.block(r0, c0), tg.maximum(x, 0.0))
    return tilegen.compile(relu16)


@pytest.mark.parametrize("dtype, transposed", [("f16", False), ("bf16", True)])
def test_16_bit_tensors_are_read_into_f32_fragments(dtype, transposed):
    """tg.accumulate widens f16 / bf16 elements to f32 (ragged edges add nothing), so a kernel
    on 16-bit data needs no mma: relu of a 37 x 45 matrix, exact."""
    import ml_dtypes

    from tilegen.sim import GlobalMemory, run_kernel

    np_dt = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(8)
    X = rng.standard_normal((37, 45)).astype(np_dt)
    stored = np.ascontiguousarray(X.T) if transposed else X
    mem = GlobalMemory()
    px, py = mem.alloc(stored.nbytes), mem.alloc(37 * 48 * 2)
    mem.write(px, stored.tobytes())
    mem.write(py, np.full(37 * 48, np.nan, np_dt).tobytes())
    sizes = {"M": 37, "N": 45}
    run_kernel(_relu_of(dtype, transposed), {**sizes, "X_ptr": px, "X_ld": stored.shape[1], "Y_ptr": py, "Y_ld": 48},
               sizes, memory=mem)
    Y = np.frombuffer(mem.read(py, 37 * 48 * 2), np_dt).reshape(37, 48)
    np.testing.assert_array_equal(Y[:, :45].astype(np.float32), np.maximum(X.astype(np.float32), 0))
    assert np.isnan(Y[:, 45:].astype(np.float32)).all()   # past N: untouched


@tg.kernel
def row_stats(BN=48):
    """R[:, 0] = the max and R[:, 1] = the sum of each row of a ragged 16-bit X (one warp per
    16 rows, one block of BN columns), stored as row vectors."""
    tg.launch(threads=64, grid=(tg.cdiv("M", 32), 1, 1))
    X = tg.tensor("X", "bf16", ("M", "N"))
    R = tg.tensor("R", "f32", ("M", "TWO"))
    N = X.shape[1]
    r0 = tg.program_id("x") * 32 + tg.warp_id() * 16
    x = tg.fragment(ATOM, "C", (1, BN // 8))
    tg.accumulate(x, X.block(r0, 0))
    tg.store(R.block(r0, 0), tg.row_max(tg.mask(x, r0, 0, lambda r, c: c >= N, float("-inf"))))
    tg.store(R.block(r0, 1), tg.row_sum(x))


def test_row_vectors_are_stored_down_a_column():
    """tg.store(R.block(r, c), row vector): one value per row, down column c, rows past M
    untouched, the other column untouched, one writer per row (no race on the emulator)."""
    import ml_dtypes

    from tilegen.sim import GlobalMemory, run_kernel

    rng = np.random.default_rng(9)
    X = rng.standard_normal((37, 45)).astype(ml_dtypes.bfloat16)
    k = tilegen.compile(row_stats)
    assert "= row vector" in k.ir
    mem = GlobalMemory()
    px, pr = mem.alloc(X.nbytes), mem.alloc(40 * 2 * 4)
    mem.write(px, X.tobytes())
    mem.write(pr, np.full(80, np.nan, np.float32).tobytes())
    sizes = {"M": 37, "N": 45, "TWO": 2}
    run_kernel(k, {**sizes, "X_ptr": px, "X_ld": 45, "R_ptr": pr, "R_ld": 2}, sizes, memory=mem)
    R = np.frombuffer(mem.read(pr, 80 * 4), np.float32).reshape(40, 2)
    x = X.astype(np.float32)
    np.testing.assert_array_equal(R[:37, 0], x.max(axis=1))
    np.testing.assert_allclose(R[:37, 1], x.astype(np.float64).sum(axis=1), rtol=1e-6, atol=1e-5)
    assert np.isnan(R[37:]).all()


def test_a_row_vector_goes_out_as_it_is():
    @tg.kernel
    def scaled_rows():
        tg.launch(threads=32, grid=(1, 1, 1))
        X = tg.tensor("X", "f32", ("M", "N"))
        x = tg.fragment(ATOM, "C", (1, 1))
        tg.accumulate(x, X.block(0, 0))
        tg.store(X.block(0, 0), tg.row_sum(x), activation="relu")

    with pytest.raises(DSLError, match="a row vector is stored as it is"):
        tilegen.compile(scaled_rows)


@needs_ptxas
def test_row_vector_stores_assemble():
    assert_assembles(tilegen.compile(row_stats).ptx, "sm_80")


def test_a_hopper_kernel_without_its_target_says_which_to_pass():
    """A DSL kernel using an sm_90 feature compiled for the default target (sm_80) names the
    feature and the target to pass (it had been a bare ValueError from the code generator); an
    unknown target is a DSLError listing the targets."""
    @tg.kernel
    def fenced():
        tg.launch(threads=128, grid=(1, 1, 1))
        tg.fence_proxy_async()

    with pytest.raises(tilegen.TilegenError, match=r"fence.proxy.async needs sm_90 or newer, not sm_80: .*"
                                                   r"tilegen.compile\(fn, target='sm_90a'\)"):
        tilegen.compile(fenced)
    assert "fence.proxy.async" in tilegen.compile(fenced, target="sm_90a").ptx
    with pytest.raises(DSLError, match=r"target='sm_70'; allowed: sm_80"):
        tilegen.compile(fenced, target="sm_70")



def test_a_fragment_rebound_in_a_runtime_loop_is_refused_where_used_after_it():
    """acc = tg.add(acc, 1.0) inside tilegen.dsl.range made a new fragment each trace of the body
    (traced once), so the sum after the loop was one addition whatever the trip count (1.0 for 5
    trips); its use after the loop is refused with how to carry it, and the loop written with out=
    gives the sum."""
    from tilegen.sim import GlobalMemory, run_kernel

    @tg.kernel
    def rebound():
        tg.launch(threads=32, grid=(1, 1, 1))
        C = tg.tensor("C", "f32", ("M", "N"))
        acc = tg.fragment(ATOM, "C", (1, 1))
        for _ in tg.range(tg.size("K")):
            acc = tg.add(acc, 1.0)
        tg.store(C.block(0, 0), acc)

    with pytest.raises(DSLError, match=r"the fragment 'add' was made at test_dsl.py:\d+ inside a loop or if_ body and "
                                       r"is used here, after it: .*tg.add\(acc, 1.0, out=acc\)"):
        tilegen.compile(rebound)

    @tg.kernel
    def carried():
        tg.launch(threads=32, grid=(1, 1, 1))
        C = tg.tensor("C", "f32", ("M", "N"))
        acc = tg.fragment(ATOM, "C", (1, 1))
        for _ in tg.range(tg.size("K")):
            tg.add(acc, 1.0, out=acc)
        tg.store(C.block(0, 0), acc)

    mem = GlobalMemory()
    pc = mem.alloc(16 * 8 * 4)
    run_kernel(tilegen.compile(carried), {"C_ptr": pc, "C_ld": 8, "M": 16, "N": 8, "K": 5}, {"M": 16, "N": 8, "K": 5},
               memory=mem)
    assert np.all(np.frombuffer(mem.read(pc, 16 * 8 * 4), np.float32) == 5.0)



def test_true_division_of_a_kernel_integer_says_to_use_floor_division():
    @tg.kernel
    def halves():
        tg.launch(threads=32, grid=(1, 1, 1))
        tg.size("M") / 2

    with pytest.raises(DSLError, match=r"kernel integers divide with // \(and %\)"):
        tilegen.compile(halves)


@pytest.mark.parametrize("op", ["//", "%"])
def test_a_kernel_integer_divided_by_a_constant_zero_is_refused(op):
    """// 0 had raised a ValueError from inside tilegen, % 0 compiled to x % 0 == x."""
    @tg.kernel
    def by_zero():
        tg.launch(threads=32, grid=(1, 1, 1))
        m = tg.size("M")
        m // 0 if op == "//" else m % 0

    with pytest.raises(DSLError, match=rf"test_dsl\.py:\d+: kernel integer {op} 0: the divisor is 0; allowed"):
        tilegen.compile(by_zero)


def _copy_into(rows, cols):
    A = tg.tensor("A", "f16", ("M", "K"))
    sA = tg.shared("sA", "f16", rows, cols, swizzle="32B")
    tg.copy_async(sA[0], A.block(0, 0))
    tg.commit()
    tg.wait(0)


def _load_at(row, col):
    A = tg.tensor("A", "f16", ("M", "K"))
    s = tg.shared("s", "f16", 32, 32, swizzle="64B")
    tg.copy_async(s[0], A.block(0, 0))
    tg.commit()
    tg.wait(0)
    tg.barrier()
    tg.load(tg.fragment(ATOM, "A", (1, 1)), s[0], row, col)


@pytest.mark.parametrize("body, error, message", [
    # raised from inside tilegen without the user's line or the rule before
    (lambda: _copy_into(16, 16), DSLError,
     r"test_dsl.py:\d+: copy_async into sA \(16 x 16 f16\) with 128 threads: every thread moves the same number "
     r"of 16-byte pieces, so the tile's 32 pieces must be a multiple of 128 \(a larger tile, or fewer threads\)"),
    (lambda: _load_at(3, 5), tilegen.IRError,
     r"fragment \w+ at \(3, 5\) of s: ldmatrix reads 16-byte rows of the tile, so the origin along its 32-element "
     r"rows must be a multiple of 8 \(test_dsl.py:\d+\)"),
    # accepted silently before: the second declaration or launch replaced the first
    (lambda: (tg.shared("s", "f16", 16, 16, swizzle="32B"), tg.shared("s", "f16", 16, 16, swizzle="32B")), DSLError,
     r"shared s: a shared tile of that name is already declared in this kernel"),
    (lambda: tg.shared("s", "f16", 16, 64, swizzle="128"), DSLError,
     r"shared s: swizzle='128'; allowed: '128B', '64B', '32B', 'pad', 'none'"),
    (lambda: tg.launch(threads=64, grid=(1, 1, 1)), DSLError,
     r"launch is given once per kernel; this one already set its threads and grid at test_dsl.py:\d+"),
])
def test_mistakes_that_were_silent_or_raised_from_inside_tilegen(body, error, message):
    _refused(body, error, message, threads=128)


@pytest.mark.parametrize("body, message", [
    (lambda: tg.mask(tg.fragment(ATOM, "C", (1, 1)), 0, 0, lambda r, c: c >= 8 & r < 4, 0.0),
     r"mask: & and \| bind tighter than comparisons in Python, .* \(c >= 8\) & \(r < 4\)"),
    (lambda: tg.copy_async(tg.shared("sA", "f16", 16, 64, stages=2)[2], tg.tensor("A", "f16", ("M", "K")).block(0, 0)),
     r"stage 2 of sA, which has 2 stages \(0\.\.1\); a stage index that cycles is taken modulo the stages"),
])
def test_messages_that_had_been_python_errors_or_cut_short(body, message):
    _refused(body, DSLError, message)


@pytest.mark.parametrize("body, message", [
    (lambda: list(tg.range(tg.scalar("n"))), r"expected an integer kernel value .*, got a Float \(an f32 value"),
    (lambda: list(range(tg.cdiv(tg.size("N"), 16))), r"Python's range\(\) unrolls at trace time: a loop over a "
                                                        r"runtime count is tilegen.dsl.range"),
    (lambda: tg.wgmma(tg.fragment(ATOM, "C", (1, 8)), tg.shared("sA", "f16", 64, 64)[0],
                      tg.shared("sB", "f16", 64, 64)[0], 0, 0, 0),
     r"wgmma runs on whole warpgroups of 128 threads \(warps 4g \.\. 4g \+ 3\); the CTA has 96 threads"),
])
def test_more_mistakes_said_at_the_users_line(body, message):
    _refused(body, DSLError, message, threads=96, target="sm_90a")
