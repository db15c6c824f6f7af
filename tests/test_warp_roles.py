"""Warp roles (warp specialization): the DSL's tilegen.role, its refusals, setmaxnreg, and
the emulator running roles side by side (one program counter per group of warps), with the
protocol mistakes of a producer / consumer pipeline planted one at a time into ladder step 6."""
import pytest

import tilegen
import tilegen.dsl as tg
from ladder_util import common, planted
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.sim import SimError



def step6_with(old: str = "", new: str = ""):
    """Ladder step 6's kernel with `old` replaced by `new` in its source."""
    return planted("step6_warp_specialized", "step6", (old, new))


@pytest.fixture(scope="module")
def step6():
    return step6_with()


def test_roles_branch_by_warp_and_move_registers(step6):
    ptx = step6.ptx
    assert "// role producer: warps 0..3" in ptx and "// role consumer: warps 4..11" in ptx
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in ptx and "setmaxnreg.inc.sync.aligned.u32 232;" in ptx
    assert ".reqntid 384, 1, 1" in ptx
    assert "role producer (warps 0..3" in step6.ir and "setmaxnreg inc 232" in step6.ir
    # every TMA copy sits in the producer role (between the two role markers)
    producer = ptx[ptx.index("// role producer"):ptx.index("// role consumer")]
    assert ptx.count("cp.async.bulk.tensor") == producer.count("cp.async.bulk.tensor") > 0


@needs_ptxas
def test_role_kernel_assembles(step6):
    assert_assembles(step6.ptx, "sm_90a")


@pytest.mark.parametrize("K", [1, 64 * 4, 64 * 9 + 3])
def test_step6_runs_on_the_emulator(step6, K):
    err, bound, _ = common.check(step6, 130, 260, K, device="sim", seed=3)
    assert err <= bound


# ---- planted protocol mistakes: each is caught by the emulator, with what and where ----------------

WAIT_EMPTY = "                    tg.mbarrier_wait(empty[s], ((kt // S) + 1) & 1)"
RELEASE = ("            tg.wgmma_wait(1)                        # k-tile kt - 1 retired: release its stage\n"
           "            with tg.if_(tg.ge(kt, 1)):\n                tg.arrive(empty[(kt - 1) % S])")
PLANTED = {
    "producer refills without waiting for the release": (WAIT_EMPTY, "                    pass", "mbarrier",
                                                         "arrives on full[0] whose phase 0 already has all its 1 arrivals"),
    "producer waits on the wrong parity": (WAIT_EMPTY, WAIT_EMPTY.replace("+ 1) & 1", ") & 1"), "mbarrier",
                                           "already has all its 1 arrivals"),
    "consumer waits on the wrong parity": ("tg.mbarrier_wait(full[s], (kt // S) & 1)",
                                           "tg.mbarrier_wait(full[s], ((kt // S) + 1) & 1)", "pending",
                                           "a TMA copy (issued at PTX line"),
    "consumer reads without waiting": ("            tg.mbarrier_wait(full[s], (kt // S) & 1)\n", "", "pending",
                                       "no mbarrier wait has seen the phase"),
    "consumer releases before its wgmmas retire": (RELEASE, "            with tg.if_(tg.ge(kt, 1)):\n"
                                                   "                tg.arrive(empty[(kt - 1) % S])\n"
                                                   "            tg.wgmma_wait(1)", "war",
                                                   "the wgmma of warpgroup 1 read these bytes"),
    "consumer releases the wrong stage": ("tg.arrive(empty[(kt - 1) % S])", "tg.arrive(empty[kt % S])", "deadlock",
                                          "meanwhile warp 0 waits for phase 0 (parity 0) of empty[0]"),
    "announced bytes short of the copies": ("expect_bytes=sA.stage_bytes + sB.stage_bytes",
                                            "expect_bytes=sA.stage_bytes", "mbarrier", "still to land"),
    "empty barrier counts half the consumers": ("arrivals=CONSUMER_THREADS", "arrivals=128", "mbarrier",
                                                "256 threads arrive on empty[0] together, but its phase 0 completed "
                                                "after 128 of them"),
    "empty barrier counts more than the consumers": ("arrivals=CONSUMER_THREADS", "arrivals=384", "deadlock",
                                                     "waits for phase 0 (parity 0) of empty[0], which can never "
                                                     "complete: 128 of its 384 arrivals have not come"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_protocol_mistakes_are_caught(name):
    old, new, kind, says = PLANTED[name]
    kernel = step6_with(old, new)
    with pytest.raises(SimError) as e:
        common.check(kernel, 130, 260, 64 * 9 + 3, device="sim", seed=1)
    assert e.value.kind == kind, str(e.value)
    assert says in str(e.value)
    assert e.value.line is not None


# ---- the DSL's refusals -------------------------------------------------------------------------------

def _traced(body, threads=256, target="sm_90a"):
    @tg.kernel
    def k():
        tg.launch(threads=threads, grid=(1, 1, 1))
        body()
    return tilegen.compile(k, target=target)


@pytest.mark.parametrize("body, says", [
    (lambda: tg.role("r", warps=(0, 9)).__enter__(), r"warps=\(0, 9\); allowed: \(first, end\) with 0 <= first < end <= 8"),
    (lambda: tg.role("r", warps=(2, 2)).__enter__(), "allowed: (first, end)"),
    (lambda: tg.role("r", warps=(0, 2), registers=40).__enter__(), "needs whole warpgroups"),
    (lambda: tg.role("r", warps=(0, 4), registers=44).__enter__(), "a multiple of 8 in 24..256"),
])
def test_bad_roles_are_refused(body, says):
    with pytest.raises(tilegen.DSLError, match=says if says.startswith("warps=") else None) as e:
        _traced(body)
    assert says.replace("\\", "") in str(e.value) or e.match(says)


def _nested():
    with tg.role("a", warps=(0, 4)):
        with tg.role("b", warps=(0, 2)):
            pass


def _copy_in_role():
    A = tg.tensor("A", "f16", ("M", "K"))
    s = tg.shared("s", "f16", 64, 64, stages=1)
    with tg.role("a", warps=(0, 4)):
        tg.copy_async(s[0], A.block(0, 0))


@pytest.mark.parametrize("body, says", [
    (_nested, "role 'b' inside the role 'a': roles do not nest"),
    (_copy_in_role, "a cooperative copy (tilegen.dsl.copy_async) inside the warp role 'a'"),
])
def test_role_misuse_is_refused(body, says):
    with pytest.raises(tilegen.DSLError) as e:
        _traced(body)
    assert says in str(e.value)


def test_a_barrier_inside_a_role_is_the_roles_own():
    @tg.kernel
    def k():
        tg.launch(threads=256, grid=(1, 1, 1))
        tg.barrier()
        with tg.role("a", warps=(0, 4)):
            tg.barrier()
        with tg.role("b", warps=(4, 8)):
            tg.barrier()
    ptx = tilegen.compile(k, target="sm_90a").ptx
    assert "bar.sync 0;" in ptx and "bar.sync 1, 128;" in ptx and "bar.sync 2, 128;" in ptx


def test_registers_need_sm90a():
    with pytest.raises(tilegen.DSLError) as e:
        _traced(lambda: tg.role("r", warps=(0, 4), registers=40).__enter__(), target="sm_90")
    assert "setmaxnreg, which needs target 'sm_90a'" in str(e.value)


def test_single_thread_ops_use_the_roles_first_thread():
    """The producer as the last warpgroup (warps 8-11; warp 8 loops): its copies and arrivals
    come from thread 256, the role's first thread (thread 0 is a consumer and never runs them)."""
    kernel = planted("step6_warp_specialized", "step6", ('warps=(0, 4)', 'warps=(8, 12)'),
                     ('warps=(4, 12)', 'warps=(0, 8)'), ("tg.lt(tg.warp_id(), 1)", "tg.lt(tg.warp_id(), 9)"),
                     ("((tg.warp_id() >> 2) - 1) * 64", "(tg.warp_id() >> 2) * 64"),
                     ("(tg.warp_id() - 4) * 16", "tg.warp_id() * 16"))
    assert "setp.eq.u32 %p" in kernel.ptx and ", 256;" in kernel.ptx
    err, bound, _ = common.check(kernel, 130, 260, 64 * 5 + 1, device="sim", seed=4)
    assert err <= bound


# ---- a branch on the warp index outside roles --------------------------------------------------

def _one_warp_multiplies(guard):
    """Two warps copy a 16 x 32 A and a 32 x 16 B into shared memory; under `guard` (of the warp
    index or the thread index) warps load fragments (ldmatrix), multiply and store C."""
    @tg.kernel
    def one_warp():
        tg.launch(threads=64, grid=(1, 1, 1))
        A = tg.tensor("A", "f16", ("M", "K"))
        B = tg.tensor("B", "f16", ("K", "N"), layout="col")
        C = tg.tensor("C", "f32", ("M", "N"))
        sA = tg.shared("sA", "f16", 16, 32, swizzle="64B")
        sB = tg.shared("sB", "f16", 16, 32, swizzle="64B", logical="col")
        tg.copy_async(sA[0], A.block(0, 0))
        tg.copy_async(sB[0], B.block(0, 0))
        tg.commit()
        tg.wait(0)
        tg.barrier()
        with tg.if_(guard()):
            a, b = tg.fragment(ATOM, "A", (1, 1)), tg.fragment(ATOM, "B", (1, 2))
            acc = tg.fragment(ATOM, "C", (1, 2))
            for kk in range(2):
                tg.load(a, sA[0], 0, kk * 16)
                tg.load(b, sB[0], kk * 16, 0)
                tg.mma(acc, a, b)
            tg.store(C.block(0, 0), acc)
    return tilegen.compile(one_warp)


ATOM = "m16n8k16.f16.f32"


def test_whole_warps_may_load_fragments_in_a_branch_of_their_own():
    """ldmatrix is .aligned per warp: a branch that keeps whole warps (warp 0 here) runs on
    the emulator, the other warp's shared reads and registers untouched; one that splits a
    warp is refused, naming a thread of the split warp."""
    import numpy as np
    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 32)).astype(np.float16)
    B = rng.standard_normal((32, 16)).astype(np.float16)
    k = _one_warp_multiplies(lambda: tg.lt(tg.warp_id(), 1))
    from tilegen.sim import GlobalMemory, run_kernel
    mem = GlobalMemory()
    ptrs = {n: mem.alloc(x.nbytes) for n, x in (("A", A), ("B", np.asfortranarray(B)), ("C", np.zeros((16, 16), np.float32)))}
    mem.write(ptrs["A"], A.tobytes())
    mem.write(ptrs["B"], np.asfortranarray(B).tobytes(order="F"))
    mem.write(ptrs["C"], np.full((16, 16), np.nan, np.float32).tobytes())
    args = {"M": 16, "N": 16, "K": 32, "A_ptr": ptrs["A"], "A_ld": 32, "B_ptr": ptrs["B"], "B_ld": 32,
            "C_ptr": ptrs["C"], "C_ld": 16}
    run_kernel(k, args, {"M": 16, "N": 16, "K": 32}, memory=mem)
    C = np.frombuffer(mem.read(ptrs["C"], 16 * 16 * 4), np.float32).reshape(16, 16)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-5)
    split = _one_warp_multiplies(lambda: tg.lt(tg.thread_id(), 16))
    with pytest.raises(SimError) as e:
        run_kernel(split, args, {"M": 16, "N": 16, "K": 32}, memory=mem)
    assert e.value.kind == "divergence" and "ldmatrix is .sync.aligned" in str(e.value) and e.value.tid == 16
