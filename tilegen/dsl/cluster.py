"""Thread-block clusters (sm_90, ptx.md 6.9): CTAs launched together on neighbouring
multiprocessors, which can arrive on each other's mbarriers and receive one TMA copy at once.

    tilegen.dsl.launch(threads=384, grid=(...), cluster=(2, 1, 1))
    rank = tilegen.dsl.cluster_rank()                  # 0 or 1 in a 2-CTA cluster
    tilegen.dsl.tma_load(sB[s], B.block(k0, n0), full[s], multicast=0b11, part=rank, parts=2)
    tilegen.dsl.arrive(empty[s], cta=1 - rank)         # release the stage in the peer too
    tilegen.dsl.cluster_sync()                         # every thread of every CTA

A cluster kernel's mbarriers are published to the whole cluster before the body runs, and
its CTAs leave together (the lowering adds both cluster barriers), so no peer arrives on or
copies into a CTA that has not started or has already left.
"""
from __future__ import annotations

from ..ir import tile as T
from .primitives import tile_op
from .scalars import Int
from .trace import current, fail


def _in_cluster(what: str):
    tr = current()
    if tr.kernel.cluster == (1, 1, 1):
        fail(f"{what}: the kernel has no cluster; launch it with tilegen.dsl.launch(..., cluster=(2, 1, 1))")


def cluster_rank() -> Int:
    """This CTA's rank in its cluster (0 .. CTAs per cluster - 1; %cluster_ctarank)."""
    _in_cluster("cluster_rank()")
    return Int(current().builder.special("%cluster_ctarank", "cta_rank"))


def cluster_id(axis: str = "x") -> Int:
    """The cluster's index in the grid along `axis` (%clusterid)."""
    _in_cluster("cluster_id()")
    if axis not in ("x", "y", "z"):
        fail(f"cluster_id axis {axis!r}; allowed: x, y, z")
    return Int(current().builder.special(f"%clusterid.{axis}", f"cluster_{axis}"))


def num_clusters(axis: str = "x") -> Int:
    """Clusters in the grid along `axis` (%nclusterid)."""
    _in_cluster("num_clusters()")
    if axis not in ("x", "y", "z"):
        fail(f"num_clusters axis {axis!r}; allowed: x, y, z")
    return Int(current().builder.special(f"%nclusterid.{axis}", f"nclusters_{axis}"))


def cluster_sync():
    """Every thread of every CTA of the cluster arrives, then waits for the others."""
    _in_cluster("cluster_sync()")
    tile_op(T.ClusterSync())


def cluster_size() -> int:
    """CTAs per cluster of the kernel being traced (1 without a cluster)."""
    x, y, z = current().kernel.cluster
    return x * y * z


__all__ = ["cluster_rank", "cluster_id", "num_clusters", "cluster_sync", "cluster_size"]
