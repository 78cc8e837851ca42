"""add_tier / remove_tier in chunk storage (cache/chunk_tier_admin.py) through the public calls,
on real files; payloads are stand-in bytes (the store treats them as opaque)."""

from __future__ import annotations

from pathlib import Path

import pytest

import workbench as wb
from workbench.cache import CacheNamespace, keys, shared
from workbench.cache.chunk_tier_admin import default_root
from workbench.cache.chunked import ChunkedCache
from workbench.errors import InvalidOption

NS = CacheNamespace("cd" * 32)
CS = 16
PREFIX = list(range(40))
ROWS = [PREFIX + [100 + i] * (5 + 7 * i) for i in range(4)]   # four rows over one 40-token prefix


def pieces(tokens: list[int], first: int) -> list[bytes]:
    return [k * (40 + i) for i, k in enumerate(keys.chunk_keys(NS.digest(), tokens, CS))][first:]


def cache() -> ChunkedCache:
    c = shared.shared_cache()
    assert isinstance(c, ChunkedCache)
    return c


def save_all() -> list[str]:
    c = cache()
    out = [c.put(NS, t, pieces(t, c.missing(NS, t))) for t in ROWS]
    assert all(out)
    return [k for k in out if k is not None]


def served(tokens: list[int]) -> bool:
    """The row of ``tokens`` is held and reads back its own payloads."""
    c = cache()
    hit = c.match_key(NS, tokens, keys.row_key(NS.digest(), tokens))
    return hit is not None and c.read(hit) == [p for p in pieces(tokens, 0)][:len(hit.chunks)]


def files(root: Path, suffix: str) -> set[str]:
    return {p.name for p in root.iterdir() if p.name.endswith(suffix)}


@pytest.fixture(autouse=True)
def default_cache():
    wb.configure_cache([{"kind": "ram"}], chunk_size=CS)
    yield
    wb.configure_cache([{"kind": "ram"}])


def test_the_default_cache_stores_chunks_of_64_in_one_ram_tier():
    wb.configure_cache([{"kind": "ram"}])
    info = wb.cache_info()
    assert (info["storage"], info["chunk_size"]) == ("chunks", 64)
    assert [(t["kind"], t["budget_bytes"]) for t in info["tiers"]] == [("ram", 1 << 30)]


def test_a_disk_tier_added_under_the_lone_ram_tier_takes_its_chunks_and_survives_a_restart(tmp_path):
    save_all()
    before = {c["key"] for c in wb.cache_chunks()}
    added = wb.add_tier("disk", root=str(tmp_path / "d"))
    assert added["name"] == "disk" and [t["name"] for t in wb.list_tiers()] == ["ram", "disk"]
    assert {c["key"] for c in wb.cache_chunks()} == before          # nothing lost
    assert all(c["tiers"] == ["ram", "disk"] for c in wb.cache_chunks())   # RAM keeps copies
    assert files(tmp_path / "d", ".kvc") == {k + ".kvc" for k in before}
    assert len(files(tmp_path / "d", ".kvm")) == len(ROWS)
    assert all(served(t) for t in ROWS)
    wb.configure_cache([{"kind": "disk", "root": str(tmp_path / "d")}], chunk_size=CS)   # a restart
    assert len(wb.cache_rows()) == len(ROWS) and all(served(t) for t in ROWS)


def test_chunks_a_small_new_tier_cannot_take_leave_with_their_rows_leaves_first(tmp_path):
    save_all()
    sizes = {c["key"]: c["size_bytes"] for c in wb.cache_chunks()}
    budget = sum(sorted(sizes.values())[:4]) + 4096          # the prefix's chunks and a little more
    wb.add_tier("disk", root=str(tmp_path / "d"), budget_bytes=budget)
    disk = next(t for t in wb.list_tiers() if t["name"] == "disk")
    assert disk["used_bytes"] <= budget
    kept = [t for t in ROWS if served(t)]
    assert 0 < len(kept) < len(ROWS) and len(wb.cache_rows()) == len(kept)
    on_disk = files(tmp_path / "d", ".kvc")
    assert {c["key"] + ".kvc" for c in wb.cache_chunks()} == on_disk   # none only in memory
    prefix_chunks = [k.hex() for k in keys.chunk_keys(NS.digest(), PREFIX, CS)[:2]]
    assert all(k + ".kvc" in on_disk for k in prefix_chunks)          # parents first


def test_tiers_keep_their_order_one_of_each_kind(tmp_path):
    with pytest.raises(InvalidOption, match="kind"):
        wb.add_tier("ram", name="r2")
    with pytest.raises(InvalidOption, match="position"):
        wb.add_tier("disk", root=str(tmp_path / "d"), position=0)      # disk goes below RAM
    generation = cache().tier_generation
    wb.add_tier("disk", root=str(tmp_path / "d"))
    assert cache().tier_generation == generation + 1     # what caches the tiers' roots keys on
    with pytest.raises(InvalidOption, match="kind"):
        wb.add_tier("disk", name="d2", root=str(tmp_path / "d2"))
    wb.add_tier("shm", root=str(tmp_path / "s"), position=1)
    assert [t["kind"] for t in wb.list_tiers()] == ["ram", "shm", "disk"]
    with pytest.raises(InvalidOption, match="tier"):
        wb.remove_tier("nope")


def test_removing_the_only_persistent_tier_keeps_what_ram_holds_and_its_files(tmp_path):
    root = tmp_path / "d"
    wb.configure_cache([{"kind": "ram", "budget_bytes": 10_000}, {"kind": "disk", "root": str(root)}], chunk_size=CS)
    save_all()
    kept_files = files(root, ".kvc") | files(root, ".kvm")
    in_ram = {c["key"] for c in wb.cache_chunks() if "ram" in c["tiers"]}
    whole_in_ram = [t for t in ROWS if {k.hex() for k in cache().match_key(
        NS, t, keys.row_key(NS.digest(), t)).chunks} <= in_ram]
    left = wb.remove_tier("disk")
    kept = [t for t in ROWS if served(t)]
    assert left == len(ROWS) - len(kept) and len(wb.cache_rows()) == len(kept)
    assert kept and all(t in whole_in_ram for t in kept)    # the rest: RAM now holds the manifests too
    ram = wb.list_tiers()[0]
    assert ram["used_bytes"] <= ram["budget_bytes"]
    assert files(root, ".kvc") | files(root, ".kvm") == kept_files    # not purged: the files stay
    wb.add_tier("disk", root=str(root))                               # and come back whole
    assert len(wb.cache_rows()) == len(ROWS) and all(served(t) for t in ROWS)
    assert wb.remove_tier("ram") == 0 and all(served(t) for t in ROWS)  # RAM held copies only
    assert [t["name"] for t in wb.list_tiers()] == ["disk"]
    wb.configure_cache([{"kind": "ram"}], chunk_size=CS)
    with pytest.raises(InvalidOption, match="tier"):
        wb.remove_tier("ram")                        # a chunked cache keeps one tier


def test_removing_the_last_tier_rehomes_manifests_and_purge_deletes_its_files(tmp_path):
    shm, disk = tmp_path / "s", tmp_path / "d"
    wb.configure_cache([{"kind": "shm", "root": str(shm)}], chunk_size=CS)
    save_all()                                       # chunks and manifests in shm
    wb.add_tier("disk", root=str(disk), budget_bytes=None)
    wb.evict_bytes(10**9, "shm")                     # everything demoted to disk
    assert all(c["tiers"] == ["disk"] for c in wb.cache_chunks())
    assert wb.remove_tier("shm", purge=True) == 0    # only manifests lived there: rewritten in disk
    assert files(shm, ".kvc") == set() and files(shm, ".kvm") == set()
    assert len(files(disk, ".kvm")) == len(ROWS)
    wb.configure_cache([{"kind": "disk", "root": str(disk)}], chunk_size=CS)   # a restart
    assert len(wb.cache_rows()) == len(ROWS) and all(served(t) for t in ROWS)


def test_a_directory_tier_without_a_root_gets_the_chunk_directory_in_both_storages(tmp_path, monkeypatch):
    """Its default is beside, never inside, the directory version 1 row files were kept in
    (a chunk directory's scan deletes row files); whole rows use the same directory, so a
    cache switched between the storages adopts what the other saved."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    info = wb.configure_cache([{"kind": "disk"}], chunk_size=CS)
    root = Path(info["tiers"][0]["root"])
    assert root == default_root("disk", "disk") and root.parent.name == "kv-chunks"
    assert tmp_path / "xdg" in root.parents
    assert Path(wb.configure_cache([{"kind": "disk"}], storage="rows")["tiers"][0]["root"]) == root


def test_cache_info_names_the_storage_in_both():
    assert wb.cache_info()["storage"] == "chunks"
    wb.configure_cache([{"kind": "ram"}], storage="rows")
    assert wb.cache_info()["storage"] == "rows"


def test_a_chain_shorter_than_a_row_worth_keeping_is_a_miss():
    """A prompt agreeing with stored chunks on fewer than 16 leading tokens (a template's
    opening) is cold, as with whole rows; from 16 on the chain serves it (partial)."""
    save_all()
    c = cache()
    assert c.lookup(NS, PREFIX[:10] + [999] * 30) is None
    assert c.cached_prefix_len(NS, PREFIX[:10] + [999] * 30) == 0
    hit = c.lookup(NS, PREFIX[:20] + [999] * 30)
    assert hit is not None and hit.key is None and hit.n_tokens == 20
    counters = c.counters()
    assert (counters["misses_cold"], counters["hits_partial"]) == (1, 1)


def test_a_directory_saved_in_one_storage_is_adopted_by_the_other(tmp_path):
    """Chunks are content-addressed whatever the chunk size: a cache switched from chunks of
    16 to whole rows over the same directory (or back) adopts and serves every row."""
    from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore

    fp, root = bytes(32), tmp_path / "d"

    def put(store: ChunkStore, tokens: list[int]) -> None:
        plan = store.plan(NS.digest(), tokens)
        assert store.put_row(NS.digest(), fp, tokens, [k * 40 for k in plan.keys[plan.first:]])

    rows = {16: ROWS[:2], WHOLE_ROWS: ROWS[2:]}
    for size in (16, WHOLE_ROWS):
        store = ChunkStore(root, chunk_size=size)
        store.scan()
        for t in rows[size]:
            put(store, t)
    for size in (16, WHOLE_ROWS):
        fresh = ChunkStore(root, chunk_size=size)
        assert fresh.scan() == {}
        assert sorted(fresh.rows) == sorted(keys.row_key(NS.digest(), t) for t in ROWS)
        for t in ROWS:
            m, served_by, got = fresh.read_row(keys.row_key(NS.digest(), t))
            assert m.n_tokens == len(t) and got == [k * 40 for k in served_by]
