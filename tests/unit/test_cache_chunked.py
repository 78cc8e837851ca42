"""ChunkedCache (cache/chunked.py), the facade the engine and cache_admin use in chunk storage,
and configure_cache's storage options; payloads are stand-in bytes (the store treats them as
opaque), the engine's side is tests/integration/test_cache_chunked_engine.py."""

from __future__ import annotations

import threading

import pytest

import workbench as wb
from workbench.cache import CacheNamespace, CorruptReason, SaveReason
from workbench.cache import keys
from workbench.cache.chunk_backends import ChunkDir
from workbench.cache.chunk_store import ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.chunked import ChunkedCache
from workbench.cache.policies import get_policy
from workbench.errors import InvalidOption
from workbench.notebook import views

NS = CacheNamespace("ab" * 32)
OTHER = CacheNamespace("ab" * 32, scope="tenant-b")
CS = 4


def pieces(ns: CacheNamespace, tokens: list[int], first: int) -> list[bytes]:
    return [k * (50 + i) for i, k in enumerate(keys.chunk_keys(ns.digest(), tokens, CS))][first:]


def save(cache: ChunkedCache, tokens: list[int], ns: CacheNamespace = NS, **kw) -> str | None:
    return cache.put(ns, tokens, pieces(ns, tokens, cache.missing(ns, tokens)), **kw)


@pytest.fixture(params=["memory", "dir"])
def cache(request, tmp_path):
    root = None if request.param == "memory" else tmp_path / "chunks"
    c = ChunkedCache(ChunkStore(root, None, chunk_size=CS, ram_budget_bytes=0 if root is None else 10_000))
    yield c
    c.close()


def test_rows_share_chunks_and_lookups_count_hit_kinds(cache):
    turn1, turn2 = list(range(10)), list(range(10)) + [50, 51, 52, 53, 54]
    k1 = save(cache, turn1)
    assert cache.missing(NS, turn2) == 2          # chunks 0 and 1 (8 tokens) stored; the tail is not
    k2 = save(cache, turn2)
    assert k1 in cache and k2 in cache and len(cache) == 2
    hit = cache.lookup(NS, turn2 + [99])
    assert hit is not None and hit.key == k2 and hit.n_tokens == 15
    pieces_back = cache.read(hit)
    assert pieces_back == pieces(NS, turn2, 0)    # the row's own chunks, as stored
    assert cache.match_key(NS, turn2 + [7], k1) is not None   # a prefix of the prompt: exact
    assert cache.match_key(NS, [1, 2, 3], k1) is None
    assert cache.lookup(NS, [7, 7, 7]) is None
    partial = cache.lookup(NS, turn1 + [1, 2, 3])     # inside chunk 2 (which absorbed turn 1's tail)
    assert partial is not None and partial.n_tokens == 10
    assert cache.lookup(OTHER, turn2) is None      # another scope: nothing shared, ever
    counters = cache.counters()
    assert (counters["hits_partial"], counters["hits_exact"], counters["misses_cold"]) == (1, 2, 2)
    assert counters["chunks"] == 4 and counters["rows"] == 2
    rows = {r["key"]: r for r in cache.rows()}
    assert rows[k2]["hits"] == 1 and rows[k2]["n_chunks"] == 4
    assert rows[k2]["bytes"] > rows[k2]["own_bytes"] > 0  # three chunks shared with turn 1
    shared = [c for c in cache.chunk_rows() if c["refcount"] == 2]
    assert len(shared) == 3 and not any(c["leaf"] for c in shared)  # turn 1's tail absorbed into chunk 2
    assert cache.cached_prefix_len(NS, turn2) == 15 and cache.cached_prefix_len(OTHER, turn2) == 0


def test_a_refused_chain_is_removed_with_what_continues_it(cache):
    save(cache, list(range(10)))
    k2 = save(cache, list(range(12)) + [60])
    assert cache.reject(k2, CorruptReason.BAD_STATE)
    assert len(cache) == 0 and cache.counters()["chunks"] == 0
    assert cache.counters()["rejected_bad_state"] == 1
    assert cache.lookup(NS, list(range(12))) is None


def test_one_pin_per_namespace_and_live_rows(cache):
    a, b = save(cache, list(range(6))), save(cache, list(range(9)))
    assert a is not None and b is not None
    assert cache.pin(a) is None and cache.pin(b) == a   # the newer pin displaces the older
    assert {r["key"]: r["pinned"] for r in cache.rows()} == {a: False, b: True}
    assert cache.unpin(b) and not cache.unpin(b)
    assert cache.set_live(a) and {r["key"]: r["live"] for r in cache.rows()}[a]
    c = save(cache, list(range(100, 106)), reason=SaveReason.AGENT_PREFIX)
    assert c is not None and {r["key"]: r["pinned"] for r in cache.rows()}[c]
    with pytest.raises(KeyError):
        cache.pin("no-such-row")


def test_budget_and_evict_bytes_take_leaves(tmp_path):
    store = ChunkStore(tmp_path / "c", 8_000, chunk_size=CS, ram_budget_bytes=2_000)
    cache = ChunkedCache(store)
    for start in range(0, 60, 10):
        save(cache, list(range(start, start + 9)))
    assert store.used <= 8_000 and cache.counters()["evictions_chunks"] > 0
    tiers = {t["name"]: t for t in cache.list_tiers()}
    assert tiers["ram"]["used_bytes"] <= 2_000 and tiers["c"]["used_bytes"] == store.used
    assert cache.evict_bytes(1, "ram") > 0 and cache.list_tiers()[0]["used_bytes"] < tiers["ram"]["used_bytes"]
    before = store.used
    assert cache.evict_bytes(1) > 0 and store.used < before


def test_put_async_and_a_lookup_that_waits_for_it(cache):
    tokens = list(range(13))
    assert cache.put_async(NS, tokens, pieces(NS, tokens, 0), SaveReason.FINISH)
    cache.wait_for_queued(NS, tokens + [1], None)
    assert cache.wait_for_saves(5)
    hit = cache.lookup(NS, tokens + [1])
    assert hit is not None and hit.n_tokens == 13


def test_a_put_whose_stored_chunks_were_evicted_meanwhile_is_dropped(cache):
    save(cache, list(range(8)))
    tokens = list(range(8)) + [1, 2]
    late = pieces(NS, tokens, cache.missing(NS, tokens))   # cut from chunk 2 on ...
    cache.evict_bytes(10**9)                               # ... then everything goes
    assert cache.put(NS, tokens, late) is None and cache.counters()["saves_chunks_gone"] == 1


def test_configure_cache_validates_the_storage_options(tmp_path):
    bad = [dict(storage="blocks"), dict(storage="chunks", chunk_size=8), dict(storage="chunks", chunk_size=9000),
           dict(storage="chunks", chunk_size=True), dict(storage="chunks", chunk_size=64.0)]
    for kw in bad:
        with pytest.raises(InvalidOption):
            wb.configure_cache([{"kind": "ram"}], **kw)
    two_dirs = [{"kind": "disk", "root": str(tmp_path / "a")},
                {"kind": "disk", "name": "d2", "root": str(tmp_path / "b")}]
    for tiers in (two_dirs, [{"kind": "disk", "root": str(tmp_path / "a")}, {"kind": "ram"}]):
        with pytest.raises(InvalidOption, match="tiers"):
            wb.configure_cache(tiers, storage="chunks")
    try:
        both = [{"kind": "ram", "budget_bytes": 2**20}, {"kind": "disk", "root": str(tmp_path / "c")}]
        info = wb.configure_cache(both, storage="chunks", chunk_size=16)
        assert (info["storage"], info["chunk_size"]) == ("chunks", 16)
        assert [t["name"] for t in wb.list_tiers()] == ["ram", "disk"]
        assert wb.cache_rows() == [] and wb.cache_chunks() == []
        assert views.cache_chunks(ChunkedCache(ChunkStore(None, chunk_size=16))).empty
        with pytest.raises(InvalidOption, match="kind"):   # one tier of each kind
            wb.add_tier("ram", name="r2")
        with pytest.raises(InvalidOption, match="chunk_size"):   # whole rows take no chunk size
            wb.configure_cache([{"kind": "ram"}], storage="rows", chunk_size=64)
        info = wb.configure_cache([{"kind": "ram"}], storage="rows")
        assert (info["storage"], info["chunk_size"]) == ("rows", None)
        assert wb.cache_chunks() == []
    finally:
        wb.configure_cache([{"kind": "ram"}])


def test_a_live_mark_taken_off_while_the_save_is_queued_holds_when_it_lands(tmp_path):
    """end_session while its session's last save is still being written: the row must not
    land live (its chunks protected for ever)."""
    release = threading.Event()

    class SlowDir(ChunkDir):
        def write_chunk(self, meta, payload):
            assert release.wait(30)
            return super().write_chunk(meta, payload)

    c = ChunkedCache(ChunkStore(tiers=[ChunkTier(SlowDir(tmp_path / "d"), None, get_policy("lru"))], chunk_size=CS))
    tokens = list(range(6))
    assert c.put_async(NS, tokens, pieces(NS, tokens, 0), SaveReason.FINISH, live=True)
    key = keys.row_key(NS.digest(), tokens)
    assert key not in c and c.set_live(key, False)  # deferred: the save is queued
    release.set()
    assert c.wait_for_saves(10)
    assert [(r["key"], r["live"]) for r in c.rows()] == [(key, False)]
    c.close()


def test_rows_are_one_snapshot_with_now_and_seq(tmp_path):
    """One clock reading for every row and the view's ages from it."""
    readings = []

    def clock() -> float:
        readings.append(1000.0 + len(readings))
        return readings[-1]

    c = ChunkedCache(ChunkStore(tiers=[ChunkTier.memory("ram", None, "lru")], chunk_size=CS, clock=clock))
    for n in (5, 9, 13):
        save(c, list(range(n)))
    before = len(readings)
    rows = c.rows()
    assert len(readings) == before + 1 and {r["now"] for r in rows} == {readings[-1]}
    assert len({r["seq"] for r in rows}) == 3
    df = views.cache_rows(c)
    assert (df["age_s"] == readings[-1] - df["created_at"]).all()
    c.close()


def test_a_hit_says_which_model_saved_what_it_serves(cache, tmp_path, request):
    """A row records the id of the model that saved it (the manifest's saved-by field): a hit
    on the row names it, a chain no row names is named by the oldest row through its last
    chunk (the save that wrote it), and a directory read again after a restart keeps it."""
    first, second = list(range(12)), list(range(12)) + [50, 51, 52]
    k1 = save(cache, first, saved_by="model-a")
    k2 = save(cache, second, saved_by="model-b")
    assert cache.origin(cache.lookup(NS, second + [9]))[0] == "model-b"
    assert cache.origin(cache.lookup(NS, first + [9]))[0] == "model-a"
    chain = cache.lookup(NS, list(range(8)) + [70, 71])   # two full chunks, then a new turn
    assert chain is not None and chain.key is None and chain.n_tokens == 8
    saved_by, saved_at = cache.origin(chain)
    assert saved_by == "model-a" and saved_at == min(r["created_at"] for r in cache.rows())
    assert cache.remove(k1) and cache.remove(k2)
    assert cache.origin(chain) == (None, None)            # the rows went meanwhile
    if request.node.callspec.params["cache"] == "dir":
        save(cache, first, saved_by="model-a")
        again = ChunkedCache(ChunkStore(tmp_path / "chunks", None, chunk_size=CS, ram_budget_bytes=10_000))
        try:
            again.scan()
            assert again.origin(again.lookup(NS, first + [9]))[0] == "model-a"
        finally:
            again.close()
