"""Chunk storage in tiers (chunk_store.py, chunk_tiers.py, chunk_tier_moves.py,
chunk_tier_scan.py): RAM, shm and disk tiers with their own budgets and policies; chunks
demoted and promoted one at a time; a chain spanning tiers restored byte for byte and
re-adopted after a restart; leaves-first where a chunk leaves the cache; a damaged shm
chunk never served; payload I/O outside the lock (a read racing an eviction is a miss,
never a wrong payload). Real files in real directories, stand-in payloads."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from waiting import wait_for

from workbench.cache import keys
from workbench.cache.chunk_backends import ChunkDir
from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX, chunk_file_size
from workbench.cache.chunk_store import ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.chunked import ChunkedCache, chunked_cache
from workbench.cache.keys import CacheNamespace
from workbench.cache.policies import get_policy
from workbench.cache.tiers import DiskTier, RamTier, ShmTier
from workbench.errors import InvalidOption

NS = bytes(range(32))
FP = bytes(32)
CS = 4
PAYLOAD = 400                                   # bytes of stand-in KV per chunk
CHUNK = chunk_file_size(CS, PAYLOAD)            # a full chunk's bytes in any tier


def payload_of(key: bytes) -> bytes:
    """A distinct stand-in payload per chunk key (a wrong chunk's bytes never match)."""
    return (key * (PAYLOAD // len(key) + 1))[:PAYLOAD]


def put(store: ChunkStore, tokens: list[int], **kw) -> str | None:
    first = store.missing(NS, tokens)
    return store.put_row(NS, FP, tokens, [payload_of(k) for k in keys.chunk_keys(NS, tokens, CS)[first:]], **kw)


def expected(store: ChunkStore, key: str) -> list[bytes]:
    return [payload_of(k) for k in store.row_chunks[key]]


def three_tiers(tmp_path: Path, ram: int, shm: int, disk: int | None, policy: str = "lru") -> ChunkStore:
    return ChunkStore(tiers=[ChunkTier.memory("ram", ram, policy),
                             ChunkTier.directory(tmp_path / "shm", "shm", shm, policy, kind="shm"),
                             ChunkTier.directory(tmp_path / "disk", "disk", disk, policy)], chunk_size=CS)


def shm_disk(tmp_path: Path, shm: int, disk: int | None, policy: str = "lru") -> ChunkStore:
    return ChunkStore(tiers=[ChunkTier.directory(tmp_path / "shm", "shm", shm, policy, kind="shm"),
                             ChunkTier.directory(tmp_path / "disk", "disk", disk, policy)], chunk_size=CS)


def chunk_files(root: Path) -> set[bytes]:
    return {bytes.fromhex(p.name[:-len(CHUNK_SUFFIX)]) for p in root.glob(f"*{CHUNK_SUFFIX}")}


def check_budgets_and_files(store: ChunkStore) -> None:
    """Each tier within its budget; a directory's accounting is its files' real sizes and
    it holds exactly the chunks its tier says (no file lost, none left behind)."""
    for t in store.tiers:
        assert t.budget is None or t.used <= t.budget, (t.name, t.used, t.budget)
        if t.persistent:
            root = t.backend.root
            assert t.used == sum(p.stat().st_size for p in root.iterdir() if ".tmp." not in p.name), t.name
            assert chunk_files(root) == set(t.sizes), t.name
    persistent = any(t.persistent for t in store.tiers)
    for c in store.chunks.values():
        assert c.parent is None or c.parent in store.chunks          # no chain lost its parent
        holders = store.holders(c.key)
        assert holders and (not persistent or any(t.persistent for t in holders))  # never only a RAM copy


def conversation(n_turns: int, base: int = 0) -> list[list[int]]:
    """A chat growing by 8 tokens (two chunks) per turn: every turn continues the last."""
    return [list(range(base, base + 8 * (i + 1))) for i in range(n_turns)]


def test_a_chain_spanning_ram_shm_and_disk_restores_byte_exact(tmp_path):
    store = three_tiers(tmp_path, ram=3 * CHUNK, shm=4 * CHUNK, disk=None)
    turns = conversation(5)                                         # 10 chunks, 5 rows
    for t in turns:
        assert put(store, t) is not None
        check_budgets_and_files(store)
    key = keys.row_key(NS, turns[-1])
    where = {c["key"]: c["tiers"] for c in store.chunk_rows()}
    chain = [k.hex() for k in store.row_chunks[key]]
    assert where[chain[0]] == ["disk"] and where[chain[-1]] == ["ram", "shm"]   # oldest on disk, newest above
    assert {t for k in chain for t in where[k]} == {"ram", "shm", "disk"}
    assert store.counters.get("demotions_shm") == 6 and store.counters.get("evictions_chunks") == 0
    _, served_by, got = store.read_row(key)
    assert got == [payload_of(k) for k in served_by] and len(got) == 10
    assert store.counters.get("chunk_reads_file") == 7 and store.counters.get("chunk_reads_ram") == 3
    check_budgets_and_files(store)
    for t in turns:                                                   # every row, from any mix of tiers
        assert store.read_row(keys.row_key(NS, t))[2] == expected(store, keys.row_key(NS, t))


def test_demotion_and_promotion_move_one_chunk_at_a_time(tmp_path):
    store = shm_disk(tmp_path, shm=4 * CHUNK + 200, disk=None)     # shm: four chunks and a manifest's room
    a, b = list(range(8)), list(range(100, 108))
    put(store, a), put(store, b)                                    # four chunks: shm holds them all
    assert all(c["tiers"] == ["shm"] for c in store.chunk_rows())
    c = list(range(200, 204))
    put(store, c)                                                   # one more chunk: the oldest goes down
    a0, a1 = keys.chunk_keys(NS, a, CS)
    assert store.holders(a0) == [store.tier("disk")] and a0 in chunk_files(tmp_path / "disk")
    assert a0 not in chunk_files(tmp_path / "shm") and store.counters.get("demotions_shm") == 1
    assert all(store.holders(k) == [store.tier("shm")] for k in keys.chunk_keys(NS, b, CS))
    # a read from disk copies the chunk up to the top tier and keeps the disk copy
    assert store.read_row(keys.row_key(NS, a))[2] == [payload_of(a0), payload_of(a1)]
    assert store.holders(a0) == [store.tier("shm"), store.tier("disk")]
    assert store.counters.get("promotions") == 1
    # making that room evicted one more from shm: b's first chunk, demoted (not a1: it was being read)
    assert store.holders(keys.chunk_keys(NS, b, CS)[0]) == [store.tier("disk")]
    assert store.counters.get("demotions_shm") == 2
    check_budgets_and_files(store)
    # evicting the promoted copy from shm again writes nothing: the disk copy stays
    written = len(chunk_files(tmp_path / "disk"))
    store.evict_bytes(store.tier("shm").used, "shm")
    assert len(chunk_files(tmp_path / "disk")) == written + 3 and not chunk_files(tmp_path / "shm")
    check_budgets_and_files(store)


def test_budgets_hold_and_chunks_leave_the_cache_leaves_first(tmp_path):
    rng = random.Random(5)
    store = three_tiers(tmp_path, ram=2 * CHUNK, shm=5 * CHUNK, disk=12 * CHUNK)
    leave = store.moves.evict_copy

    def leaves_only(tier, victim, keep, moves):
        lower = store.tiers[store.tiers.index(tier) + 1:]
        if not any(victim.key in t or t.fits(victim.size) for t in lower):
            assert store.children(victim.key) == 0, "a chunk left the cache before what continues it"
        leave(tier, victim, keep, moves)

    store.moves.evict_copy = leaves_only  # type: ignore[method-assign]
    system = list(range(8))
    for i in range(60):
        tokens = system + [1000 + i % 7] * rng.randrange(1, 14)
        assert put(store, tokens) is not None
        if rng.random() < 0.5 and store.rows:
            key = rng.choice(sorted(store.rows))
            assert store.read_row(key)[2] == expected(store, key)
        check_budgets_and_files(store)
    assert store.counters.get("evictions_chunks") > 0 and store.counters.get("demotions_shm") > 0
    assert store.counters.get("evictions_ram") > 0 and store.counters.get("drops") == 0
    tiers = {t["name"]: t for t in ChunkedCache(store).list_tiers()}
    assert [t["kind"] for t in tiers.values()] == ["ram", "shm", "disk"]
    assert all(tiers[n]["used_bytes"] <= tiers[n]["budget_bytes"] for n in tiers)


def test_a_restart_readopts_a_chain_spanning_shm_and_disk(tmp_path):
    store = shm_disk(tmp_path, shm=3 * CHUNK, disk=None)
    turns = conversation(3)
    pinned = put(store, list(range(4)), pinned=True)
    for t in turns:
        put(store, t)
    before = {c["key"]: c["tiers"] for c in store.chunk_rows()}
    assert {"shm"} < {t for v in before.values() for t in v}         # the chain spans both
    assert {tuple(v) for v in before.values()} >= {("shm",), ("disk",)}
    manifests = sorted(p.name for p in (tmp_path / "disk").glob(f"*{MANIFEST_SUFFIX}"))
    assert len(manifests) == 4 and not list((tmp_path / "shm").glob(f"*{MANIFEST_SUFFIX}"))  # all in the last tier
    fresh = shm_disk(tmp_path, shm=3 * CHUNK, disk=None)
    assert fresh.scan() == {}
    assert {c["key"]: c["tiers"] for c in fresh.chunk_rows()} == before
    assert sorted(fresh.rows) == sorted(store.rows) and fresh.rows[pinned].pinned
    for t in turns:
        key = keys.row_key(NS, t)
        assert fresh.read_row(key)[2] == expected(fresh, key)
    assert [(t.name, t.used) for t in fresh.tiers] != [] and fresh.used == store.used
    check_budgets_and_files(fresh)


def test_a_scan_adopts_both_copies_of_a_chunk_a_killed_demotion_left(tmp_path):
    store = shm_disk(tmp_path, shm=None, disk=None)
    a = list(range(8))
    put(store, a)
    shm_file = tmp_path / "shm" / f"{keys.chunk_keys(NS, a, CS)[0].hex()}{CHUNK_SUFFIX}"
    (tmp_path / "disk" / shm_file.name).write_bytes(shm_file.read_bytes())  # published below, not yet deleted above
    fresh = shm_disk(tmp_path, shm=None, disk=None)
    assert fresh.scan() == {}
    assert [t.name for t in fresh.holders(keys.chunk_keys(NS, a, CS)[0])] == ["shm", "disk"]
    assert fresh.read_row(keys.row_key(NS, a))[2] == expected(fresh, keys.row_key(NS, a))
    check_budgets_and_files(fresh)


def test_a_flipped_bit_in_a_shm_chunk_is_never_served_and_is_counted(tmp_path):
    cache = ChunkedCache(shm_disk(tmp_path, shm=3 * CHUNK, disk=None))
    store = cache._store
    ns = CacheNamespace("ab" * 32)
    tokens = list(range(16))
    ks = keys.chunk_keys(ns.digest(), tokens, CS)
    assert cache.put(ns, tokens, [payload_of(k) for k in ks]) is not None
    in_shm = [k for k in ks if store.holders(k) == [store.tier("shm")]]
    assert in_shm and any(store.holders(k) == [store.tier("disk")] for k in ks)
    path = tmp_path / "shm" / f"{in_shm[0].hex()}{CHUNK_SUFFIX}"
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x20
    path.write_bytes(bytes(raw))
    hit = cache.lookup(ns, tokens + [99])
    assert hit is not None and hit.n_tokens == 16
    assert cache.read(hit) is None                                   # not served
    assert cache.counters()["rejected_payload_checksum"] == 1 and not path.exists()
    assert cache.lookup(ns, tokens + [99]) is None or cache.lookup(ns, tokens + [99]).n_tokens < 16
    with pytest.raises(KeyError):
        store.read_chunks(ks)


def test_each_tier_calls_its_own_policy_hooks(tmp_path):
    class Recorder:
        name = "recorder"

        def __init__(self) -> None:
            self.events: list[tuple[str, str]] = []
            self.capacity: int | None = -1

        def priority(self, row, now):
            return row.seq

        def set_capacity(self, n):
            self.capacity = n

        def on_insert(self, row):
            self.events.append(("insert", row.key))

        def on_hit(self, row):
            self.events.append(("hit", row.key))

        def on_evict(self, row):
            self.events.append(("evict", row.key))

    shm_policy, disk_policy = Recorder(), Recorder()
    store = ChunkStore(tiers=[ChunkTier.directory(tmp_path / "shm", "shm", 2 * CHUNK, shm_policy, kind="shm"),
                              ChunkTier.directory(tmp_path / "disk", "disk", None, disk_policy)], chunk_size=CS)
    assert (shm_policy.capacity, disk_policy.capacity) == (2 * CHUNK, None)
    a = list(range(12))
    put(store, a[:8]), put(store, a)                                   # a third chunk: the first goes down
    k0, k1, k2 = (k.hex() for k in keys.chunk_keys(NS, a, CS))
    assert shm_policy.events == [("insert", k0), ("insert", k1), ("evict", k0), ("insert", k2)]
    assert disk_policy.events == [("insert", k0)]
    store.read_row(keys.row_key(NS, a))                                # k0 served by disk, k1 and k2 by shm
    assert ("hit", k0) in disk_policy.events and ("hit", k1) in shm_policy.events
    assert ("hit", k0) not in shm_policy.events


@pytest.mark.parametrize("policy", ["lru", "gdsf", "s3fifo"])
def test_reads_racing_puts_and_evictions_get_the_right_bytes_or_a_miss(tmp_path, policy):
    store = three_tiers(tmp_path, ram=3 * CHUNK, shm=6 * CHUNK, disk=14 * CHUNK, policy=policy)
    stop = threading.Event()
    wrong, served, written, errors = [], [0], [0], []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                put(store, [rng.randrange(4)] * 4 + [rng.randrange(50) for _ in range(rng.randrange(1, 12))])
                written[0] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                with store.lock:
                    rows = sorted(store.rows)
                    key = rng.choice(rows) if rows else None
                    chain = store.row_chunks.get(key, ()) if key else ()
                if not chain:
                    continue
                try:
                    got = store.read_chunks(chain)
                except KeyError:
                    continue                                           # evicted meanwhile: a miss
                served[0] += 1
                if got != [payload_of(k) for k in chain]:
                    wrong.append(key)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    threads += [threading.Thread(target=reader, args=(10 + i,)) for i in range(2)]
    for t in threads:
        t.start()
    rng = random.Random(1)

    def busy() -> bool:
        store.evict_bytes(CHUNK, rng.choice(["ram", "shm", "disk"]))
        return served[0] >= 150 and written[0] >= 150 or bool(errors)

    assert wait_for(busy, timeout=60)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors and not wrong and served[0] > 0
    assert store.counters.get("rejected_total") == 0
    check_budgets_and_files(store)
    moves = store.moves
    assert all(t.reserved == 0 for t in store.tiers) and not (moves.moving or moves.held or moves.staying)


def test_chunked_cache_over_shm_and_disk_tiers_and_the_orders_it_refuses(tmp_path):
    cache = chunked_cache([(RamTier("ram", 10 * CHUNK), None), (ShmTier("shm", tmp_path / "s", 4 * CHUNK), "lfu"),
                           (DiskTier("disk", tmp_path / "d", None), None)], "lru", 16)
    assert [(t["name"], t["kind"], t["policy"]) for t in cache.list_tiers()] == [
        ("ram", "ram", "lru"), ("shm", "shm", "lfu"), ("disk", "disk", "lru")]
    assert cache.chunk_size == 16
    for bad in ([(DiskTier("disk", tmp_path / "d2", None), None), (RamTier("ram", 100), None)],
                [(DiskTier("disk", tmp_path / "a", None), None), (ShmTier("shm", tmp_path / "b", None), None)],
                [(DiskTier("d1", tmp_path / "a", None), None), (DiskTier("d2", tmp_path / "b", None), None)]):
        with pytest.raises(InvalidOption, match="tiers"):
            chunked_cache(bad, "lru", 16)
    counters = cache.counters()
    assert {"bytes_ram", "bytes_shm", "bytes_disk", "rows_shm", "rows"} <= set(counters)


def test_pinned_and_live_rows_chunks_are_demoted_and_dropped_last(tmp_path):
    store = shm_disk(tmp_path, shm=5 * CHUNK, disk=6 * CHUNK)
    pinned = put(store, list(range(8)), pinned=True)                 # the oldest two chunks, pinned
    live = put(store, list(range(50, 54)))
    assert store.set_live(live)
    for base in range(100, 600, 100):                                # five rows of two chunks: shm and disk overflow
        assert put(store, list(range(base, base + 8))) is not None
        check_budgets_and_files(store)
    shm = store.tier("shm")
    protected = set(store.row_chunks[pinned]) | set(store.row_chunks[live])
    assert protected <= set(shm.sizes)                               # still in the fast tier
    assert pinned in store and live in store and store.counters.get("evictions_chunks") > 0
    assert store.counters.get("demotions_shm") >= 4


def test_a_put_writes_its_files_outside_the_lock(tmp_path):
    """While a put is inside its file write, lookups, reads and another put proceed."""
    entered, release = threading.Event(), threading.Event()

    class SlowDir(ChunkDir):
        def write_chunk(self, meta, payload):
            if meta.tokens == keys.token_bytes([9, 9, 9, 9]):
                entered.set()
                assert release.wait(30)
            return super().write_chunk(meta, payload)

    store = ChunkStore(tiers=[ChunkTier(SlowDir(tmp_path / "d"), None, get_policy("lru"))], chunk_size=CS)
    a = list(range(8))
    put(store, a)
    slow = threading.Thread(target=put, args=(store, [9, 9, 9, 9]))
    slow.start()
    try:
        assert entered.wait(30)
        done = threading.Event()

        def meanwhile() -> None:
            assert store.lookup(NS, a + [1]).n_tokens == 8
            assert store.read_row(keys.row_key(NS, a))[2] == expected(store, keys.row_key(NS, a))
            assert put(store, list(range(20, 28))) is not None
            done.set()

        other = threading.Thread(target=meanwhile)
        other.start()
        assert wait_for(done.is_set, timeout=30)                    # not stuck behind the slow write
        assert keys.row_key(NS, [9, 9, 9, 9]) not in store           # committed only once written
    finally:
        release.set()
        slow.join(30)
    assert keys.row_key(NS, [9, 9, 9, 9]) in store
    check_budgets_and_files(store)
