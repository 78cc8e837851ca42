"""Scale-out on Ray: replicas (actors owning one engine each) behind a cache-aware router.

    import workbench as wb
    c = wb.cluster.start(replicas=2, router="cache_affinity", n_ctx=2048)
    c.complete("Hello").reply
    c.decisions()            # each request: chosen replica, probed prefixes and loads, reason
    c.shutdown()

Modules: launch (Ray and the actors), replica (the actor), members (the driver's view of
one replica: up/down, load), routers and prefixtree (the strategies), routing (sessions,
probes, the decisions log), stream (a remote request as a Stream, faults), wire (what
crosses the boundary), views (DataFrames and a plot). docs/cluster.md says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .cluster import Cluster
from .routers import (ROUTERS, CacheAffinity, Decision, LeastLoaded, PowerOfTwo, PrefixTreeRouter, ReplicaFacts,
                      RoundRobin, RouteRequest, make_router)
from .stream import ClusterChatStream, ClusterStream

_current: Cluster | None = None


def start(replicas: int = 2, model: str | None = None, router: Any = "cache_affinity", *,
          router_options: dict[str, Any] | None = None, threads: int = 1, max_restarts: int = 1,
          address: str | None = None, num_cpus: int | None = None, node_ip_address: str | None = None,
          cache_tiers: Sequence[Mapping[str, Any]] | None = None, cache_sync: str = "auto",
          ready_timeout_s: float = 180.0, **load: Any) -> Cluster:
    """Start ``replicas`` actors, each loading ``model`` (default: the default model) with
    ``threads`` threads and the other load_model options in ``load``, behind ``router``
    (a name in ROUTERS with ``router_options``, a router object, or a function).

    Without ``address`` and with no Ray running, a local Ray is started with ``num_cpus``
    (default replicas x threads) on ``node_ip_address`` (default '127.0.0.1': its node
    advertises loopback and its services are not offered to the network; give this
    machine's network address to let other machines join it) and stopped by
    :meth:`Cluster.shutdown`. ``cache_tiers``
    (as configure_cache takes them) give every replica the same tiers: a shm or disk root
    they share is a shared tier: with ``cache_sync='auto'`` a replica adopts the rows the
    others published there before each lookup; ``'manual'``: only at Cluster.sync_cache.
    ``storage`` and ``chunk_size`` in ``load`` are configure_cache's (default: chunk storage,
    chunks of 64; ``storage='rows'`` for whole rows), checked before Ray starts; a shared
    tier works in both (docs/cluster.md). Ray restarts a dead replica up to
    ``max_restarts`` times (-1: always).
    """
    from . import launch

    launch.check_options(replicas, threads, max_restarts, num_cpus, address, ready_timeout_s, cache_tiers, cache_sync,
                         node_ip_address)
    chosen = make_router(router, router_options)
    opts = launch.load_options(model, threads, load, local=address is None)
    started = launch.init_ray(address, num_cpus or replicas * threads, node_ip_address)
    try:
        members = launch.start_members(replicas, threads, max_restarts, opts, cache_tiers, ready_timeout_s, cache_sync)
    except BaseException:
        if started:
            import ray

            ray.shutdown()
        raise
    global _current
    _current = Cluster(members, chosen, started, cache_tiers, cache_sync)
    return _current


def current() -> Cluster | None:
    """The cluster started last in this process (what the %wb cluster commands use)."""
    return _current if _current is not None and not _current.closed else None


__all__ = ["ROUTERS", "CacheAffinity", "Cluster", "ClusterChatStream", "ClusterStream", "Decision", "LeastLoaded",
           "PowerOfTwo", "PrefixTreeRouter", "ReplicaFacts", "RoundRobin", "RouteRequest", "current", "make_router",
           "start"]
