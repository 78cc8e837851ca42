"""The chunked cache's storage (chunk_store.py, chunk_format.py): rows as manifests over
shared chunks, stored once; served only when every chunk verifies; a scan that rejects old
versions and collects orphans; eviction that takes leaves first."""

from __future__ import annotations

import os
import random
import signal
import textwrap
from pathlib import Path

import pytest
from crash_kills import kill_at_random, tmp_files

from workbench.cache import chunk_format, keys
from workbench.cache.chunk_format import CHUNK_SUFFIX, MANIFEST_SUFFIX, chunk_file_size
from workbench.cache.chunk_store import ChunkStore
from workbench.cache.format import CorruptRow
from workbench.cache.store import ROW_SUFFIX
from workbench.cache.types import SaveReason

NS = bytes(range(32))
FP = bytes(32)
CS = 4


def payloads(tokens: list[int], first: int = 0) -> list[bytes]:
    """A stand-in chunk payload per chunk: its key repeated (distinct per chunk key)."""
    return stand_ins(keys.chunk_keys(NS, tokens, CS))[first:]


def stand_ins(chunk_keys) -> list[bytes]:
    return [k * (100 + i) for i, k in enumerate(chunk_keys)]


def put(store: ChunkStore, tokens: list[int], **kw) -> str | None:
    return store.put_row(NS, FP, tokens, payloads(tokens, store.missing(NS, tokens)), **kw)


def files(root: Path, suffix: str) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.endswith(suffix))


def test_a_shared_prefix_is_stored_once_and_rows_read_back(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    turns = [list(range(n)) for n in (6, 10, 13, 20)]  # a conversation growing turn by turn
    for t in turns:
        assert put(store, t) == keys.row_key(NS, t)
    # the distinct chunks 0..4, 4..8, 8..12, 12..16, 16..20: each row's tail (4..6, 8..10,
    # 12..13) went when the next turn stored the full chunk holding the same positions
    assert len(files(store.root, CHUNK_SUFFIX)) == 5
    assert store.counters.get("tails_absorbed") == 3
    assert len(files(store.root, MANIFEST_SUFFIX)) == 4
    assert store.counters.get("chunks_shared") == 1 + 2 + 3
    for t in turns:
        m, served_by, got = store.read_row(keys.row_key(NS, t))
        own = keys.chunk_keys(NS, t, CS)
        assert served_by[:-1] == tuple(own[:-1]) and m.n_tokens == len(t)
        assert served_by[-1] == keys.chunk_keys(NS, turns[-1], CS)[len(own) - 1]  # the full chunk
        assert got == stand_ins(served_by)
    first = keys.chunk_keys(NS, turns[0], CS)[0]
    assert store.chunks[first].refcount == 4
    assert store.chunks[keys.chunk_keys(NS, turns[-1], CS)[1]].refcount == 4  # 6 (first positions), 10, 13, 20
    assert store.used == sum(p.stat().st_size for p in store.root.iterdir())


def test_lookup_finds_rows_and_chains_of_full_chunks(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    put(store, list(range(10)))
    m = store.lookup(NS, list(range(10)) + [99])
    assert m is not None and m.n_tokens == 10 and m.key == keys.row_key(NS, list(range(10)))
    # a prompt that leaves the row after 9 tokens (inside its tail chunk) resumes at token 9,
    # not at the chunk boundary before it: the two full chunks and the tail's first position
    m = store.lookup(NS, list(range(9)) + [77, 78])
    assert m is not None and (m.n_tokens, m.key) == (9, None)
    assert store.read_chunks(m.chunks) == payloads(list(range(10)))
    m = store.lookup(NS, list(range(5)) + [77, 78, 79, 80])  # leaves inside the second full chunk
    assert m is not None and m.n_tokens == 5 and store.read_chunks(m.chunks) == payloads(list(range(10)))[:2]
    assert store.lookup(NS, [77, 0, 1]) is None
    # a shorter prompt row stored later is served by the first positions of the stored tail
    assert store.missing(NS, list(range(9))) == 3
    put(store, list(range(9)))
    assert store.read_row(keys.row_key(NS, list(range(9))))[1] == tuple(keys.chunk_keys(NS, list(range(10)), CS))
    assert store.lookup(bytes(32), list(range(10))) is None  # another namespace


def test_a_row_is_served_only_when_every_chunk_verifies(tmp_path):
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    a, b = list(range(10)), list(range(8)) + [50, 51, 52]
    put(store, a), put(store, b)
    second = store._chunk_path(keys.chunk_keys(NS, a, CS)[1])
    raw = bytearray(second.read_bytes())
    raw[-1] ^= 1
    second.write_bytes(bytes(raw))
    with pytest.raises(CorruptRow, match="payload_checksum"):
        store.read_row(keys.row_key(NS, a))
    # the bad chunk went with every row naming it (both) and what continued it
    assert keys.row_key(NS, a) not in store and keys.row_key(NS, b) not in store
    assert not second.exists() and store.counters.get("rejected_payload_checksum") == 1
    assert len(store.chunks) == 1  # the first chunk: full, a servable prefix


def test_scan_adopts_verified_rows_rejects_old_versions_and_collects_orphans(tmp_path):
    root = tmp_path / "d"
    store = ChunkStore(root, chunk_size=CS)
    a = list(range(10))
    put(store, a)
    put(store, list(range(30, 40)))
    # a version-1 row file, a manifest whose chunk is gone, an orphan chain, a torn chunk
    # (what earlier releases wrote: magic WBKVROW, version 1, 160-byte header, tokens, payload)
    (root / (keys.row_key(NS, [1, 2]) + ROW_SUFFIX)).write_bytes(
        b"WBKVROW\x00" + (1).to_bytes(2, "little") + bytes(150) + keys.token_bytes([1, 2]) + b"x" * 10)
    store._chunk_path(keys.chunk_keys(NS, list(range(30, 40)), CS)[0]).unlink()
    torn = root / ("ab" * 16 + CHUNK_SUFFIX)
    torn.write_bytes(b"WBKVCHN\x00" + chunk_format.VERSION.to_bytes(2, "little") + bytes(20))
    fresh = ChunkStore(root, chunk_size=CS)
    rejected = fresh.scan()
    assert rejected == {"bad_version": 1, "missing_chunk": 1, "truncated": 1}
    assert list(fresh.rows) == [keys.row_key(NS, a)]
    assert fresh.read_row(keys.row_key(NS, a))[2] == payloads(a)
    # the other row's later chunks lost their parent: collected, not adopted
    assert fresh.counters.get("orphans_removed") == 2
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [k.hex() + CHUNK_SUFFIX for k in keys.chunk_keys(NS, a, CS)] + [keys.row_key(NS, a) + MANIFEST_SUFFIX])
    assert fresh.used == store.used - sum(
        store.chunks[k].size for k in keys.chunk_keys(NS, list(range(30, 40)), CS)) - chunk_format.manifest_size(
        10, len(keys.chunk_keys(NS, list(range(30, 40)), CS)))


def test_scan_absorbs_a_tail_a_killed_writer_left_beside_its_cover(tmp_path):
    root = tmp_path / "d"
    short, long = list(range(6)), list(range(12))
    put(ChunkStore(root, chunk_size=CS), short)
    put(ChunkStore(root, chunk_size=CS), long)  # a process that did not know the short row
    assert len(files(root, CHUNK_SUFFIX)) == 4
    fresh = ChunkStore(root, chunk_size=CS)
    assert fresh.scan() == {}
    assert len(files(root, CHUNK_SUFFIX)) == 3 and fresh.counters.get("tails_absorbed") == 1
    assert fresh.read_row(keys.row_key(NS, short))[2] == payloads(long)[:2]


def test_eviction_takes_leaves_first_and_keeps_pinned_rows(tmp_path):
    clock = iter(range(1000)).__next__
    store = ChunkStore(tmp_path / "d", chunk_size=CS, clock=lambda: float(clock()))
    sys_prompt = list(range(8))
    pinned = put(store, sys_prompt, pinned=True, reason=SaveReason.AGENT_PREFIX)
    put(store, sys_prompt + [100, 101, 102, 103, 104])
    put(store, sys_prompt + [200, 201, 202, 203, 204])
    leaves = {c.key for c in store.leaves()}
    shared = keys.chunk_keys(NS, sys_prompt, CS)
    assert not leaves & set(shared)
    freed = store.evict_bytes(1)
    assert freed > 0
    # the oldest leaf went (the first user's tail), its row with it; the shared prefix stayed
    assert keys.row_key(NS, sys_prompt + [100, 101, 102, 103, 104]) not in store
    assert all(k in store.chunks for k in shared) and pinned in store
    live = put(store, sys_prompt + [300, 301, 302, 303, 304])
    assert store.set_live(live)
    other = keys.row_key(NS, sys_prompt + [200, 201, 202, 203, 204])
    while other in store:  # older leaves first: the first user's full chunk, then the other tail
        assert store.evict_bytes(1) > 0
        assert live in store  # a live session's chunks go after every unprotected leaf
    store.evict_bytes(10**9)
    # everything else evicted before the pinned and live rows' chunks, which go last
    assert store.rows == {} and store.chunks == {}
    assert store.used == 0


def test_budget_evicts_to_make_room_never_the_row_being_written(tmp_path):
    probe = ChunkStore(tmp_path / "p", chunk_size=CS)
    put(probe, list(range(12)))
    budget = probe.used * 2 + 100
    store = ChunkStore(tmp_path / "d", budget, chunk_size=CS)
    for base in range(0, 500, 100):
        assert put(store, list(range(base, base + 12))) is not None
        assert store.used <= budget
    assert keys.row_key(NS, list(range(400, 412))) in store
    assert store.counters.get("evictions_chunks") > 0
    assert put(store, list(range(10_000, 10_000 + 200))) is None  # larger than the budget


def test_a_put_whose_chunks_went_since_missing_stores_nothing_and_raises_nothing(tmp_path):
    """``missing()`` then ``put_row`` without the lock (as every caller does): chunks evicted
    in between make the put a miss (``saves_chunks_gone``), checked under the lock, not a
    ValueError."""
    store = ChunkStore(tmp_path / "d", chunk_size=CS)
    put(store, list(range(8)))
    tokens = list(range(8)) + [1, 2]
    late = payloads(tokens, store.missing(NS, tokens))    # cut from chunk 2 on ...
    store.evict_bytes(10**9)                                # ... then everything goes
    assert store.put_row(NS, FP, tokens, late) is None
    assert store.counters.get("saves_chunks_gone") == 1 and not store.rows and not store.chunks
    assert list(store.root.iterdir()) == []                 # nothing of the row was written
    with pytest.raises(ValueError, match="payloads"):       # more payloads than chunks: the caller's bug
        store.put_row(NS, FP, tokens, payloads(tokens) + [b"x"])
    assert put(store, tokens) == keys.row_key(NS, tokens)  # cut again from missing(): stored


WRITER = textwrap.dedent(
    """
    import random, sys
    from workbench.cache import keys
    from workbench.cache.chunk_store import ChunkStore
    root, seed = sys.argv[1], int(sys.argv[2])
    NS, FP = bytes(range(32)), bytes(32)
    store = ChunkStore(root, chunk_size=4)
    store.scan()
    rng = random.Random(seed)
    print("ready", flush=True)
    while True:
        base = [rng.randrange(5) for _ in range(8)]
        tokens = base + [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
        ks = keys.chunk_keys(NS, tokens, 4)
        first = store.missing(NS, tokens)
        store.put_row(NS, FP, tokens, [k * 20_000 for k in ks[first:]])
    """
)


def test_sigkill_mid_chain_leaves_only_rows_that_verify(tmp_path):
    root = tmp_path / "d"
    rng = random.Random(7)
    for i in range(12):
        assert kill_at_random(WRITER, [str(root), str(i)], rng, 0.15) == -signal.SIGKILL
    store = ChunkStore(root, chunk_size=4)
    rejected = store.scan(tmp_ttl_s=0)
    assert rejected == {}  # a kill leaves tmp files and manifest-less chunks, never a bad file
    assert not tmp_files(root)
    assert store.rows
    for key in store.rows:
        _, served_by, got = store.read_row(key)
        assert got == [k * 20_000 for k in served_by]
    assert os.listdir(root)


def test_chunks_promote_to_ram_and_demote_one_at_a_time(tmp_path):
    a, b = list(range(8)), list(range(4)) + [50, 51, 52, 53, 54, 55, 56, 57]
    sizes = sorted(chunk_file_size(CS, len(p)) for p in payloads(a) + payloads(b)[1:])  # RAM counts file sizes
    store = ChunkStore(tmp_path / "d", chunk_size=CS, ram_budget_bytes=sum(sizes[1:]) + 10)
    put(store, a), put(store, b)  # chunks a0 (shared), a1, b1, b2: four, RAM holds three
    tiers = {c["key"]: c["tier"] for c in store.chunk_rows()}
    assert sorted(tiers.values()).count("ram") == 3
    shared = keys.chunk_keys(NS, a, CS)[0]
    assert store.counters.get("evictions_ram") == 1 and tiers[shared.hex()] == "d"  # the oldest went
    # a chain served partly from files, partly from RAM, promoting what it read
    assert store.read_row(keys.row_key(NS, a))[2] == payloads(a)
    assert store.counters.get("chunk_reads_file") == 1 and store.counters.get("chunk_reads_ram") == 1
    assert shared in store.tier("ram")
    assert store.read_row(keys.row_key(NS, a))[2] == payloads(a)
    assert store.counters.get("chunk_reads_ram") == 3
    view = {c["key"]: c for c in store.chunk_rows()}
    assert view[shared.hex()]["refcount"] == 2 and view[shared.hex()]["children"] == 2
    assert not view[shared.hex()]["leaf"] and view[keys.chunk_keys(NS, a, CS)[1].hex()]["leaf"]
    store.remove_row(keys.row_key(NS, b))
    ram = store.tier("ram")
    held = ram.backend.payloads.values()
    assert ram.used == sum(ram.sizes.values()) == sum(chunk_file_size(CS, len(p)) for p in held)


@pytest.mark.parametrize("policy", ["lru", "lfu", "frecency", "gdsf", "s3fifo",
                                    lambda row, now: -row.n_tokens])
def test_every_policy_evicts_leaves_only_within_the_budget(tmp_path, policy):
    rng = random.Random(3)
    sys_prompt = list(range(8))
    probe = ChunkStore(tmp_path / "p", chunk_size=CS)
    put(probe, sys_prompt + [100, 101, 102, 103])
    store = ChunkStore(tmp_path / "d", probe.used * 4, chunk_size=CS, policy=policy)
    evict = store.moves.evict_copy

    def leaf_only(tier, victim, keep, moves):
        assert store.children(victim.key) == 0, "evicted a chunk others depend on"
        evict(tier, victim, keep, moves)

    store.moves.evict_copy = leaf_only  # type: ignore[method-assign]
    for i in range(40):
        tokens = sys_prompt + [1000 + i] * rng.randrange(1, 9)
        assert put(store, tokens) is not None
        assert store.used <= store.budget
        if rng.random() < 0.5 and store.rows:
            store.read_row(rng.choice(sorted(store.rows)))
        # every stored chunk's parent chain is stored: nothing was evicted before its dependents
        for c in store.chunks.values():
            assert c.parent is None or c.parent in store.chunks
    assert store.counters.get("evictions_chunks") > 0
    assert keys.row_key(NS, tokens) in store  # the row just written


def test_sparse_huge_files_are_refused_without_being_read(tmp_path):
    import struct
    import time

    root = tmp_path / "d"
    store = ChunkStore(root, 10**6, chunk_size=CS)
    a = list(range(6))
    put(store, a)
    chunk = store._chunk_path(keys.chunk_keys(NS, a, CS)[0])
    raw = bytearray(chunk.read_bytes())
    huge = 40 << 30
    struct.pack_into("<Q", raw, 24, huge)  # payload length: 40 GiB
    with open(chunk, "r+b") as f:
        f.write(raw[:160])
        f.truncate(160 + 16 + huge)  # sparse
    start = time.monotonic()
    with pytest.raises(CorruptRow, match="too_large"):
        store.read_row(keys.row_key(NS, a))
    assert time.monotonic() - start < 2 and not chunk.exists()
    manifest = root / ("cd" * 16 + MANIFEST_SUFFIX)
    head = bytearray(160)
    head[:10] = b"WBKVMAN\x00" + chunk_format.VERSION.to_bytes(2, "little")
    struct.pack_into("<II", head, 20, 1 << 30, 1 << 28)  # a billion tokens
    manifest.write_bytes(bytes(head))
    with open(manifest, "r+b") as f:
        f.truncate(160 + 4 * (1 << 30) + 16 * (1 << 28))
    start = time.monotonic()
    assert ChunkStore(root, chunk_size=CS).scan()["too_large"] == 1
    assert time.monotonic() - start < 2 and not manifest.exists()


def test_a_store_in_memory_counts_and_evicts_as_one_on_disk(tmp_path):
    """root=None keeps chunks in memory with the same bookkeeping: the same puts, reads and
    budget give the same rows, chunks, bytes and evictions as files do."""
    rng = random.Random(9)
    probe = ChunkStore(None, chunk_size=CS)
    put(probe, list(range(12)))
    clocks = [iter(range(10**6)).__next__, iter(range(10**6)).__next__]
    stores = [ChunkStore(tmp_path / "d", probe.used * 3, chunk_size=CS, clock=lambda: float(clocks[0]())),
              ChunkStore(None, probe.used * 3, chunk_size=CS, clock=lambda: float(clocks[1]()))]
    for i in range(30):
        tokens = list(range(4)) + [100 + i % 5] * rng.randrange(1, 12)
        got = [put(s, tokens) for s in stores]
        assert got[0] == got[1]
        if i % 3 == 0:
            key = rng.choice(sorted(stores[0].rows))
            assert stores[0].read_row(key)[1:] == stores[1].read_row(key)[1:]
    disk, mem = stores
    assert (disk.used, sorted(disk.rows), sorted(disk.chunks)) == (mem.used, sorted(mem.rows), sorted(mem.chunks))
    assert disk.counters.get("evictions_chunks") == mem.counters.get("evictions_chunks") > 0
    assert disk.used == sum(p.stat().st_size for p in disk.root.iterdir())
    assert {c["tier"] for c in mem.chunk_rows()} == {"ram"}
    with pytest.raises(AttributeError):
        _ = mem.root
