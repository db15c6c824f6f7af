"""Thread-block clusters (sm_90): the DSL's launch(cluster=), cluster_rank, arrive(cta=),
tma_load(multicast=, part=, parts=) and cluster_sync; their PTX; the grid in whole clusters;
and the emulator running a cluster's CTAs side by side, with the protocol mistakes of a
multicasting pipeline planted one at a time into ladder step 9."""
import copy

import numpy as np
import pytest

import tilegen
import tilegen.dsl as tg
from ladder_util import common, planted
from ptxas_util import assert_assembles, needs_ptxas
from tilegen.errors import DSLError
from tilegen.ir.grid import LaunchGrid, SM_COUNT, Size
from tilegen.sim import SimError



def step9_with(*edits):
    """Ladder step 9's kernel with each (old, new) of `edits` replaced in its source."""
    return planted("step9_cluster", "step9", *edits)


@pytest.fixture(scope="module")
def step9():
    return step9_with()


def test_cluster_kernel_ptx(step9):
    ptx = step9.ptx
    assert ".reqnctapercluster 2, 1, 1" in ptx and step9.cluster == (2, 1, 1)
    assert ptx.count(".multicast::cluster") == 2                  # this CTA's 2 of B's 4 panels
    assert ptx.count("complete_tx::bytes [") == 1                 # A: one box, not multicast
    assert "mapa.shared::cluster.u32" in ptx and "mbarrier.arrive.shared::cluster.b64" in ptx
    # the barriers are published to the cluster before the body; the CTAs leave together
    first, last = ptx.index("barrier.cluster.arrive"), ptx.rindex("barrier.cluster.arrive")
    assert first < ptx.index("%cluster_ctarank") and first < ptx.index("cp.async.bulk.tensor")
    assert last > ptx.rindex("mbarrier.arrive") and ptx[last:].count("barrier.cluster.wait") == 1
    assert "in clusters of (2, 1, 1)" in str(step9.launch_grid)


@needs_ptxas
def test_cluster_kernel_assembles(step9):
    assert_assembles(step9.ptx, "sm_90a")


@pytest.mark.parametrize("M, N, K", [(300, 520, 200), (130, 260, 64 * 9 + 3), (512, 256, 64), (1, 1, 1)])
def test_step9_runs_on_the_emulator(step9, M, N, K):
    err, bound, _ = common.check(step9, M, N, K, device="sim", seed=3)
    assert err <= bound


def test_the_grid_is_whole_clusters():
    g = LaunchGrid((Size("M") * 3, 1, 1), (2, 1, 1))
    f = g.evaluator()
    assert f({"M": 1}, 132) == (4, 1, 1) and f({"M": 2}, 132) == (6, 1, 1)
    assert LaunchGrid.from_data(g.to_data()) == g
    assert LaunchGrid.from_data(LaunchGrid((SM_COUNT, 1, 1)).to_data()).cluster == (1, 1, 1)   # older entries
    assert g.evaluator(("M",))(3, 132) == (10, 1, 1)
    with pytest.raises(ValueError, match="cluster"):
        LaunchGrid.from_data(g.to_data()[:3] + [["cluster", 0, 1, 1]])


def test_cluster_kernels_round_trip_through_the_disk_cache(step9):
    from tilegen.compiler.cache import kernel_from_payload, kernel_payload
    again = kernel_from_payload(kernel_payload(step9), None)
    assert again.cluster == (2, 1, 1) and again.grid({"M": 300, "N": 520, "K": 8}, 3) == (4, 1, 1)


# ---- planted protocol mistakes: each is caught by the emulator, with what and where ---------------

REMOTE = '            tg.arrive(empty[stage], cta=peer, one_per="warpgroup")\n'
PLANTED = {
    "consumers do not release the stage to the peer's producer": (
        [(REMOTE, "")], "deadlock", "2 of its 4 arrivals have not come"),
    "the producer waits only for its own consumers": (
        [(REMOTE, ""), ("arrivals=PAIR * 2)", "arrivals=2)")], "pending", "(the multicast into CTA rank 1)"),
    "the multicast leaves the peer out": (
        [("multicast=0b11, part=rank", "multicast=1, part=rank")], "deadlock", "of full[0], which can never complete"),
    "both CTAs load the same half of B": (
        [("part=rank, parts=PAIR", "part=0, parts=PAIR")], "pending", "a TMA copy writes shared memory a TMA copy"),
    "the announced bytes miss half of B": (
        [("expect_bytes=sA.stage_bytes + sB.stage_bytes", "expect_bytes=sA.stage_bytes + sB.stage_bytes // 2")],
        "war", "(the multicast into CTA rank 1)"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_cluster_mistakes_are_caught(name):
    edits, kind, says = PLANTED[name]
    kernel = step9_with(*edits)
    with pytest.raises(SimError) as e:
        common.check(kernel, 300, 520, 64 * 9 + 3, device="sim", seed=1)
    assert e.value.kind == kind, str(e.value)
    assert says in str(e.value)
    assert e.value.line is not None


def _without_cluster_barrier(kernel, which: int):
    """The kernel with its `which`-th cluster barrier (arrive + wait) taken out of the PTX."""
    lines = kernel.ptx.split("\n")
    at = [i for i, line in enumerate(lines) if "barrier.cluster.arrive" in line][which]
    assert "barrier.cluster.wait" in lines[at + 1]
    out = copy.copy(kernel)
    out.ptx = "\n".join(lines[:at] + lines[at + 2:])
    return out


@pytest.mark.parametrize("which, kind, says", [
    (0, "mbarrier", "of CTA rank 1 before that CTA initialised it"),
    (-1, "cluster", "after it exited: a CTA must not exit while its peers may still access its shared memory"),
])
def test_missing_cluster_barriers_are_caught(step9, which, kind, says):
    with pytest.raises(SimError) as e:
        common.check(_without_cluster_barrier(step9, which), 300, 520, 200, device="sim", seed=1)
    assert e.value.kind == kind and says in str(e.value), str(e.value)


# ---- the emulator on hand-written cluster PTX --------------------------------------------------------

_PTX = """
.version 8.0
.target sm_90a
.address_size 64
.shared .align 8 .b8 bar[8];
.visible .entry k(.param .u64 out)
.reqntid 32, 1, 1
.reqnctapercluster 2, 1, 1
{
  .reg .b32 %r<8>; .reg .b64 %rd<4>; .reg .pred %p<4>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %cluster_ctarank;
  mov.u32 %r2, %tid.x;
  setp.eq.u32 %p1, %r2, 0;
  mov.u32 %r3, bar;
  @%p1 mbarrier.init.shared::cta.b64 [%r3], 32;
  barrier.cluster.arrive;
  barrier.cluster.wait;
  xor.b32 %r4, %r1, 1;
  mapa.shared::cluster.u32 %r5, %r3, %r4;
  PEER_ARRIVE
  WAIT
  barrier.cluster.arrive;
  barrier.cluster.wait;
  mov.u32 %r6, %clusterid.x;
  mul.wide.u32 %rd2, %r1, 4;
  mul.wide.u32 %rd3, %r6, 8;
  add.u64 %rd2, %rd2, %rd3;
  add.u64 %rd2, %rd1, %rd2;
  @%p1 st.global.u32 [%rd2], %r1;
  ret;
}
"""
_ARRIVE = "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r5];"
_WAIT = "L: mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r3], 0;\n  @!%p2 bra L;"


def _run(ptx, grid=4):
    from tilegen.sim import GlobalMemory, launch
    mem = GlobalMemory()
    out = mem.alloc(4 * grid)
    mem.write(out, np.full(grid, 77, np.uint32).view(np.uint8))
    launch(ptx, (grid, 1, 1), 32, {"out": out}, memory=mem, shared_bytes=0)
    return np.frombuffer(bytes(mem.read(out, 4 * grid)), np.uint32)


def test_peers_arrive_on_each_others_barriers():
    """Each CTA's 32 threads arrive on the peer's barrier, then wait on their own: only the
    peer's arrivals can complete it, so the run needs both CTAs side by side."""
    got = _run(_PTX.replace("PEER_ARRIVE", _ARRIVE).replace("WAIT", _WAIT))
    assert got.tolist() == [0, 1, 0, 1]   # each CTA wrote its rank


def test_a_wait_only_a_missing_peer_could_complete_is_a_deadlock():
    with pytest.raises(SimError) as e:
        _run(_PTX.replace("PEER_ARRIVE", f"@!%p1 {_ARRIVE}").replace("WAIT", _WAIT))   # thread 0 skips it
    assert e.value.kind == "deadlock" and "1 of its 32 arrivals have not come" in str(e.value)


def test_a_cluster_barrier_one_cta_skips_is_a_deadlock():
    ptx = _PTX.replace("PEER_ARRIVE", "").replace("WAIT", "")
    ptx = ptx.replace("  barrier.cluster.arrive;\n  barrier.cluster.wait;\n  mov.u32 %r6",
                      "  setp.eq.u32 %p3, %r1, 0;\n  @%p3 bra SKIP;\n  barrier.cluster.arrive;\n  barrier.cluster.wait;\n"
                      "SKIP:\n  mov.u32 %r6")
    with pytest.raises(SimError) as e:
        _run(ptx)
    assert e.value.kind == "deadlock" and "the cluster barrier waits" in str(e.value)


def test_the_grid_must_be_whole_clusters_on_the_emulator():
    with pytest.raises(SimError, match="not a whole number of clusters"):
        _run(_PTX.replace("PEER_ARRIVE", "").replace("WAIT", ""), grid=3)


# ---- the DSL's refusals ------------------------------------------------------------------------------

def _traced(body, cluster=(1, 1, 1), target="sm_90a"):
    @tg.kernel
    def k():
        tg.launch(threads=128, grid=(2, 1, 1), cluster=cluster)
        body()
    return tilegen.compile(k, target=target)


@pytest.mark.parametrize("body, cluster, says", [
    (lambda: tg.cluster_rank(), (1, 1, 1), "the kernel has no cluster"),
    (lambda: tg.cluster_sync(), (1, 1, 1), "the kernel has no cluster"),
    (lambda: tg.arrive(tg.mbarrier("b")[0], cta=1), (1, 1, 1), "the kernel has no cluster"),
    (lambda: tg.arrive(tg.mbarrier("b")[0], cta=2), (2, 1, 1), "cta=2; the cluster has ranks 0..1"),
    (lambda: tg.arrive(tg.mbarrier("b")[0], cta=1, expect_bytes=16), (2, 1, 1), "announces no bytes"),
    (lambda: tg.arrive(tg.mbarrier("b")[0], one_per="block"), (2, 1, 1), "one_per='block'"),
    (lambda: None, (3, 3, 1), "at most 8 per cluster"),
    (lambda: None, (0, 1, 1), "cluster=(0, 1, 1)"),
])
def test_cluster_refusals(body, cluster, says):
    with pytest.raises(DSLError, match=None) as e:
        _traced(body, cluster)
    assert says in str(e.value)


def test_clusters_need_sm90():
    with pytest.raises(DSLError, match="needs an sm_90 target"):
        _traced(lambda: None, (2, 1, 1), target="sm_80")


def test_multicast_refusals():
    def load(multicast=None, part=0, parts=1, cluster=(2, 1, 1)):
        def body():
            A = tg.tensor("A", "f16", ("M", "K"))
            s = tg.shared("s", "f16", 64, 64, stages=1)
            bar = tg.mbarrier("b")
            tg.tma_load(s[0], A.block(0, 0), bar[0], multicast=multicast, part=part, parts=parts)
        return _traced(body, cluster)
    with pytest.raises(DSLError, match="the kernel has no cluster"):
        load(multicast=1, cluster=(1, 1, 1))
    with pytest.raises(DSLError, match="multicast=4"):
        load(multicast=4)
    with pytest.raises(DSLError, match="parts=3 must divide"):
        load(multicast=3, parts=3)      # a 64 x 64 f16 stage: one 128-byte panel, 64 rows
    with pytest.raises(DSLError, match="part=2 of parts=2"):
        load(part=2, parts=2)


# ---- the GEMM in 2-CTA clusters (GemmSpec.cluster) on the emulator -----------------------------------

@pytest.mark.parametrize("cluster, a_layout, b_layout, dtype", [
    ((2, 1), "row", "row", "f16"),    # B multicast as halves of its panels
    ((2, 1), "row", "col", "bf16"),   # B (K-major: one panel) multicast as halves of its rows
    ((1, 2), "col", "row", "f16"),    # A multicast
    ((1, 2), "row", "col", "f16"),
])
def test_cluster_gemm_on_the_emulator(cluster, a_layout, b_layout, dtype):
    from bounds import gemm_bound, gemm_error
    from tilegen.arch.dtypes import numpy_dtype
    spec = tilegen.GemmSpec(dtype=dtype, out_dtype=dtype, instruction="wgmma", cluster=cluster, a_layout=a_layout,
                            b_layout=b_layout)
    assert spec.warp_specialized and spec.store == "tma"
    kernel = tilegen.compile(spec)
    assert ".reqnctapercluster 2, 1, 1" in kernel.ptx and kernel.ptx.count(".multicast::cluster") >= 1
    rng = np.random.default_rng(5)
    M, N, K = 300, 520, 200           # 3 emulated SMs -> 2 clusters, each walking several pairs, ragged edges
    dt = numpy_dtype(dtype)
    A = rng.standard_normal((M, K)).astype(dt)
    B = rng.standard_normal((K, N)).astype(dt)
    A, B = (np.asfortranarray(x) if lay == "col" else x for x, lay in ((A, a_layout), (B, b_layout)))
    C = kernel(A, B, out=np.full((M, N), np.nan, dt), device="sim")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert gemm_error(C, ref, A, B) <= gemm_bound(dtype, K, dtype)


def test_cluster_gemm_epilogue_and_beta_on_the_emulator():
    """A fused epilogue through the TMA-store path, and beta != 0 through the direct twin,
    both in clusters."""
    from bounds import gemm_bound, gemm_error
    spec = tilegen.GemmSpec(dtype="f16", out_dtype="f32", instruction="wgmma", cluster=(2, 1),
                            epilogue=tilegen.Epilogue(bias="col", activation="relu"))
    kernel = tilegen.compile(spec)
    assert kernel.direct_store_kernel().cluster == (2, 1, 1)
    rng = np.random.default_rng(6)
    M, N, K = 257, 100, 70
    A, B = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)
    bias, C0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
    for beta in (0.0, -1.5):
        C = kernel(A, B, out=C0.copy(), alpha=0.5, beta=beta, bias=bias, device="sim")
        ref = np.maximum(0.5 * (A.astype(np.float64) @ B.astype(np.float64)) + beta * C0 + bias, 0)
        assert gemm_error(C, ref, A, B) <= gemm_bound("f16", K, "f32"), beta


def test_cluster_spec_refusals():
    from tilegen.errors import SpecError
    with pytest.raises(SpecError, match="cluster"):
        tilegen.GemmSpec(dtype="f16", cluster=(2, 1))                       # mma.sync
    with pytest.raises(SpecError, match="warp-specialized wgmma kernel"):
        tilegen.GemmSpec(dtype="f16", instruction="wgmma", persistent=False, cluster=(2, 1))
    with pytest.raises(SpecError, match=r"\(1, 1\), \(2, 1\), \(1, 2\)"):
        tilegen.GemmSpec(dtype="f16", instruction="wgmma", cluster=(2, 2))
    spec = tilegen.GemmSpec.from_text("gemm { dtype = bf16  instruction = wgmma  cluster = 2 x 1 }")
    assert spec.cluster == (2, 1) and tilegen.GemmSpec.from_text(spec.to_text()) == spec
