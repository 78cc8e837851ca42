"""The cluster's shared tier in chunk storage: the directory's one local Ray and its two
replicas (conftest), each given a chunk cache (chunks of 64) over one fresh disk root for
this module (the replicas' ``configure_cache`` call), their first cache back at the end.

A row computed by one replica is restored by the other with no sync call (its request's
start rescans the directory, adopt-only), under its tenant scope only; chunk files a peer
removes (an eviction: the files go, the replicas' catalogs still name them) turn the next
request cold, with the cold reply, counted; the rescan deletes nothing
(tests/unit/test_cache_chunk_peer_scan.py has the in-flight cases without Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from waiting import wait_for
from .conftest import wait_all_up

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


def tokens(seed: int, n: int) -> list[int]:
    return [1000 + (seed * 7919 + i * 31) % 30000 for i in range(n)]


@pytest.fixture(scope="module")
def root(cluster, tmp_path_factory: pytest.TempPathFactory):
    wait_all_up(cluster)  # test_cluster.py ends on a killed replica whose restart it does not await
    shared = tmp_path_factory.mktemp("cluster-chunks")
    tiers = [{"kind": "disk", "root": str(shared)}]
    before = [cluster.call_replica(m, "configure_cache", (tiers,), {"storage": "chunks", "chunk_size": 64})
              for m in cluster.members]
    yield shared
    for m, prev in zip(cluster.members, before):
        cluster.call_replica(m, "configure_cache", (prev.pop("tiers"),), prev)


def on(cluster, name: str):
    """A router sending everything to the replica ``name`` (no probe first)."""
    cluster.set_router(lambda req, reps: next(r.index for r in reps if r.name == name))


def counters(cluster, name: str) -> dict[str, int]:
    return cluster.call_replica(next(m for m in cluster.members if m.name == name), "counters", (), {})


def chunk_files(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.name.endswith(".kvc")}


def test_a_row_one_replica_computed_is_restored_by_the_other_in_chunk_storage(cluster, root, scope):
    first_name, other = (m.name for m in cluster.members)
    infos = [cluster.call_replica(m, "cache_info", (), {}) for m in cluster.members]
    assert [(i["storage"], i["chunk_size"]) for i in infos] == [("chunks", 64)] * 2
    prompt = tokens(21, 300)
    try:
        on(cluster, first_name)
        first = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
        assert first.stats.cache_hit_kind == "cold" and cluster.wait_for_saves()
        assert len(chunk_files(root)) >= 300 // 64  # published as chunks, in the shared root
        adopted = cluster.replicas().loc[other, "peer_rows"]
        on(cluster, other)
        second = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
    finally:
        cluster.set_router("cache_affinity")
    assert second.model == other and second.tokens == first.tokens  # warm == cold
    assert second.stats.cache_hit_kind in ("exact", "partial") and second.stats.prefilled_tokens <= 10
    assert cluster.replicas().loc[other, "peer_rows"] > adopted
    assert counters(cluster, other)["cache_peer_chunks_adopted"] >= 300 // 64
    assert min(cluster.cached_prefix_lens(prompt, scope).values()) >= 290
    assert max(cluster.cached_prefix_lens(prompt, scope + "-other").values()) == 0  # tenant scope holds


def test_a_probe_finds_chunks_a_peer_published_since_its_last_look(cluster, root, scope):
    prompt = tokens(22, 200)
    cluster.prefill_only(prompt, cache_scope=scope)
    assert wait_for(lambda: min(cluster.cached_prefix_lens(prompt, scope).values()) >= 199, timeout=30)


def test_chunks_a_peer_removed_turn_the_request_cold_counted(cluster, root, scope):
    first_name, other = (m.name for m in cluster.members)
    prompt = tokens(23, 260)
    try:
        on(cluster, first_name)
        before = chunk_files(root)
        first = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
        assert cluster.wait_for_saves()
        assert wait_for(lambda: min(cluster.cached_prefix_lens(prompt, scope).values()) >= 250, timeout=30)
        gone_before = counters(cluster, other).get("cache_peer_chunks_gone", 0)
        for name in chunk_files(root) - before:  # what a peer's eviction does to the directory
            (root / name).unlink()
        on(cluster, other)
        second = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
    finally:
        cluster.set_router("cache_affinity")
    assert second.model == other and second.stats.cache_hit_kind == "cold"
    assert second.tokens == first.tokens  # the cold reply, no error
    assert counters(cluster, other)["cache_peer_chunks_gone"] >= gone_before + 260 // 64


def test_start_checks_the_cache_options_before_starting_anything():
    import workbench.cluster as wc
    from workbench.errors import InvalidOption

    for opts, key in (({"storage": "blocks"}, "storage"), ({"chunk_size": 8}, "chunk_size"),
                      ({"storage": "chunks", "chunk_size": "64"}, "chunk_size")):
        with pytest.raises(InvalidOption) as e:
            wc.start(replicas=2, cache_tiers=[{"kind": "ram"}], **opts)
        assert e.value.key == key
