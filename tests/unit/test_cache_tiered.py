"""TieredCache: demotion, promotion, budgets, pins, lookups, corruption, scan."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from workbench.cache import keys
from workbench.cache.keys import CacheNamespace
from workbench.cache.tiered import TieredCache
from workbench.cache.tiers import DiskTier, RamTier, ShmTier
from workbench.cache.types import Match, SaveReason

NS = CacheNamespace("ab" * 32)
NS_B = CacheNamespace("ab" * 32, scope="tenant-b")
ROW = 100  # payload bytes of the rows below


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def three_tiers(
    tmp_path: Path, ram: int = 2 * ROW, shm: int | None = 10_000, disk: int | None = None
) -> TieredCache:
    return TieredCache(
        [
            RamTier("ram", ram),
            ShmTier("shm", tmp_path / "shm", shm),
            DiskTier("disk", tmp_path / "disk", disk),
        ],
        policy="lru", clock=Clock(),
    )


def put(cache: TieredCache, n: int, ns: CacheNamespace = NS, size: int = ROW, **kw: object) -> str:
    key = cache.put(ns, list(range(1, n + 1)), bytes([n % 256]) * size, **kw)  # type: ignore[arg-type]
    assert key is not None
    return key


def tiers_of(cache: TieredCache) -> dict[str, list[str]]:
    return {r["key"]: r["tiers"] for r in cache.rows()}


def test_eviction_demotes_to_the_next_tier(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path)
    a, b, c = put(cache, 1), put(cache, 2), put(cache, 3)
    assert tiers_of(cache) == {a: ["shm"], b: ["ram"], c: ["ram"]}
    assert (tmp_path / "shm" / f"{a}.kv").exists()
    counters = cache.counters()
    assert counters["evictions_ram"] == 1 and counters["demotions_ram"] == 1
    assert counters["bytes_ram"] == 2 * ROW and counters["rows_shm"] == 1
    assert cache.get(a) == bytes([1]) * ROW


def test_demotion_cascades_and_the_last_tier_drops(tmp_path: Path) -> None:
    one_file = ROW + 200  # header + tokens + payload
    cache = three_tiers(tmp_path, ram=ROW, shm=one_file, disk=one_file)
    a, b, c, d = (put(cache, n) for n in (1, 2, 3, 4))
    assert tiers_of(cache) == {b: ["disk"], c: ["shm"], d: ["ram"]}
    assert a not in cache and cache.counters()["drops"] == 1
    assert not (tmp_path / "shm" / f"{a}.kv").exists() and not (tmp_path / "disk" / f"{a}.kv").exists()
    assert cache.lookup(NS, [1, 9]) is None  # the dropped row is gone from the index too
    assert cache.lookup(NS, [1, 2, 3, 9]) == Match(c, 3, "shm")


def test_hit_in_a_lower_tier_promotes_and_keeps_the_lower_copy(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path)
    a, b, c = put(cache, 1), put(cache, 2), put(cache, 3)
    shm_file = tmp_path / "shm" / f"{a}.kv"
    inode = shm_file.stat().st_ino
    assert cache.get(a) == bytes([1]) * ROW
    assert tiers_of(cache) == {a: ["ram", "shm"], b: ["shm"], c: ["ram"]}  # b made room for a
    assert cache.counters()["promotions"] == 1
    # evicting a from RAM again drops only the RAM copy: the shm file is not rewritten
    demotions = cache.counters()["demotions_ram"]
    put(cache, 4)
    put(cache, 5)
    assert tiers_of(cache)[a] == ["shm"]
    assert cache.counters()["demotions_ram"] == demotions + 1  # only c was written down
    assert shm_file.stat().st_ino == inode


def test_reads_never_remove_a_row(tmp_path: Path) -> None:
    cache = TieredCache([DiskTier("disk", tmp_path, None)], policy="lru")
    key = put(cache, 4)
    for _ in range(3):
        assert cache.get(key) == bytes([4]) * ROW
    assert (tmp_path / f"{key}.kv").exists() and key in cache


def test_budgets_hold_after_many_puts(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path, ram=1_000, shm=3_000, disk=6_000)
    rng = random.Random(3)
    for n in range(1, 120):
        put(cache, n, size=rng.randrange(10, 400))
        if rng.random() < 0.3:
            k = rng.choice(cache.keys())
            assert cache.get(k) is not None
    counters = cache.counters()
    for tier, budget in (("ram", 1_000), ("shm", 3_000), ("disk", 6_000)):
        assert 0 < counters[f"bytes_{tier}"] <= budget
    for tier in ("shm", "disk"):
        on_disk = sum(p.stat().st_size for p in (tmp_path / tier).iterdir())
        assert on_disk == counters[f"bytes_{tier}"]
    for key in cache.keys():  # without promotion: promoting would evict rows under our feet
        assert cache.get(key, promote=False) is not None


def test_row_too_large_for_a_tier_skips_it(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path, ram=50, shm=10_000)
    big = put(cache, 1, size=ROW)
    assert tiers_of(cache) == {big: ["shm"]}
    assert cache.put(NS, [7], b"x" * 20_000, tier="shm") is not None  # disk is unbounded
    small = TieredCache([RamTier("ram", 10)])
    assert small.put(NS, [1], b"x" * 11) is None
    assert small.counters()["saves_too_large"] == 1


def test_put_into_a_named_tier(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path)
    key = put(cache, 3, tier="disk")
    assert tiers_of(cache) == {key: ["disk"]}
    with pytest.raises(ValueError, match="no tier named 'tape'"):
        put(cache, 4, tier="tape")


def test_lookup_counts_hit_kinds_and_reports_the_tier(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path)
    key = put(cache, 5)
    assert cache.lookup(NS, [1, 2, 3, 4, 5]) == Match(key, 5, "ram")
    assert cache.lookup(NS, list(range(1, 40))) == Match(key, 5, "ram")
    assert cache.lookup(NS, [2, 3]) is None
    assert cache.lookup(NS_B, [1, 2, 3, 4, 5]) is None  # another scope never reuses a row
    counters = cache.counters()
    assert (counters["hits_exact"], counters["hits_partial"], counters["misses_cold"]) == (1, 1, 2)
    assert counters["lookup_ns"] > 0
    assert cache.cached_prefix_len(NS, list(range(1, 9))) == 5
    assert cache.counters()["hits_partial"] == 1  # a probe does not count


def test_duplicate_put_and_key_collision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TieredCache([RamTier("ram", 10_000)])
    a = put(cache, 3)
    assert put(cache, 3) == a and len(cache) == 1
    assert cache.counters()["saves_duplicate"] == 1
    monkeypatch.setattr(keys, "row_key_from_bytes", lambda ns, raw: a)  # every row gets key a
    assert cache.put(NS, [9, 9], b"other") is None
    assert cache.counters()["key_collisions"] == 1
    assert cache.get(a) == bytes([3]) * ROW
    assert cache.lookup(NS, [9, 9, 9]) is None


def test_agent_prefix_pin_is_one_per_namespace(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path, ram=10_000)
    p1 = put(cache, 10, reason="agent_prefix")
    other = put(cache, 11, ns=NS_B, reason=SaveReason.AGENT_PREFIX)
    pinned = {r["key"]: r["pinned"] for r in cache.rows()}
    assert pinned == {p1: True, other: True}
    p2 = put(cache, 12, reason="agent_prefix")
    pinned = {r["key"]: r["pinned"] for r in cache.rows()}
    assert pinned == {p1: False, other: True, p2: True}
    assert cache.pin(p1) == p2 and not {r["key"]: r["pinned"] for r in cache.rows()}[p2]
    assert cache.unpin(p1) and not cache.unpin(p1)
    assert cache.counters()["saves_agent_prefix"] == 3
    with pytest.raises(ValueError, match="unknown save reason"):
        cache.put(NS, [1], b"x", reason="lunch")


def test_pins_survive_a_restart(tmp_path: Path) -> None:
    cache = TieredCache([DiskTier("disk", tmp_path, None)], clock=Clock())
    put(cache, 10, reason="agent_prefix")
    newest = put(cache, 20, reason="agent_prefix")
    plain = put(cache, 30)
    fresh = TieredCache([DiskTier("disk", tmp_path, None)])
    fresh.scan()
    pinned = {r["key"]: r["pinned"] for r in fresh.rows()}
    assert [k for k, v in pinned.items() if v] == [newest]
    assert not pinned[plain]


def test_corrupt_file_is_rejected_on_get(tmp_path: Path) -> None:
    cache = TieredCache([DiskTier("disk", tmp_path, None)])
    key = put(cache, 6)
    path = tmp_path / f"{key}.kv"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    assert cache.get(key) is None
    counters = cache.counters()
    assert counters["rejected_payload_checksum"] == 1 and counters["get_misses"] == 1
    assert not path.exists() and key not in cache
    assert cache.lookup(NS, list(range(1, 7))) is None


def test_file_removed_behind_our_back_is_a_miss(tmp_path: Path) -> None:
    cache = TieredCache([DiskTier("disk", tmp_path, None)])
    key = put(cache, 6)
    os.unlink(tmp_path / f"{key}.kv")
    assert cache.get(key) is None and key not in cache


def test_remove_deletes_every_copy(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path)
    a = put(cache, 1)
    put(cache, 2)
    put(cache, 3)
    cache.get(a)  # now in ram and shm
    assert cache.remove(a) and not cache.remove(a)
    assert not (tmp_path / "shm" / f"{a}.kv").exists()
    assert a not in cache and cache.get(a) is None


def test_evict_bytes_frees_the_top_tier(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path, ram=5 * ROW)
    keys_ = [put(cache, n) for n in range(1, 6)]
    assert cache.evict_bytes(2 * ROW + 1) == 3 * ROW
    assert cache.counters()["bytes_ram"] == 2 * ROW
    assert [tiers_of(cache)[k] for k in keys_] == [["shm"]] * 3 + [["ram"]] * 2
    assert cache.evict_bytes(10, tier="shm") > 0
    assert tiers_of(cache)[keys_[0]] == ["disk"]


def test_tier_management(tmp_path: Path) -> None:
    cache = TieredCache([RamTier("ram", ROW)], policy="lru")
    cache.add_tier(DiskTier("disk", tmp_path, None), "lfu")
    with pytest.raises(ValueError, match="already exists"):
        cache.add_tier(RamTier("ram", 1))
    assert [(t["name"], t["policy"]) for t in cache.list_tiers()] == [("ram", "lru"), ("disk", "lfu")]
    a, b = put(cache, 1), put(cache, 2)
    assert tiers_of(cache) == {a: ["disk"], b: ["ram"]}
    assert cache.remove_tier("disk") == 1  # a lived only there
    assert a not in cache and (tmp_path / f"{a}.kv").exists()  # files stay without purge
    info = cache.info()
    assert info["rows"] == 1 and [t["name"] for t in info["tiers"]] == ["ram"]
    assert cache.remove_tier("ram") == 1 and len(cache) == 0


def test_scan_enforces_the_budget(tmp_path: Path) -> None:
    cache = TieredCache([DiskTier("disk", tmp_path, None)], clock=Clock(), policy="lru")
    keys_ = [put(cache, n) for n in range(1, 6)]
    newest_two = sum((tmp_path / f"{k}.kv").stat().st_size for k in keys_[-2:])
    fresh = TieredCache([DiskTier("disk", tmp_path, newest_two)], policy="lru")
    fresh.scan()
    assert sorted(fresh.keys()) == sorted(keys_[-2:])  # the oldest were dropped
    assert len(os.listdir(tmp_path)) == 2


def test_rows_view(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path)
    key = put(cache, 4, reason="cold")
    cache.get(key)
    cache.set_live(key)
    (row,) = cache.rows()
    assert row["key"] == key and row["key_preview"] == key[:12]
    assert (row["n_tokens"], row["bytes"], row["tier"], row["reason"]) == (4, ROW, "ram", "cold")
    assert (row["hits"], row["pinned"], row["live"]) == (1, False, True)
    assert row["last_hit_at"] is not None and row["score"] == row["last_hit_at"]  # LRU score
    assert not cache.set_live("00" * 16)


def test_engine_time_totals_live_with_the_counters() -> None:
    cache = TieredCache([RamTier("ram", None)])
    cache.record_ns("pack_ns", 1_500)
    with cache.timed("unpack_ns"):
        time.sleep(0.002)
    counters = cache.counters()
    assert counters["pack_ns"] == 1_500 and 2_000_000 <= counters["unpack_ns"] < 2_000_000_000
    assert counters["bytes_ram"] == 0 and counters["rows"] == 0


def test_concurrent_use_keeps_invariants(tmp_path: Path) -> None:
    cache = three_tiers(tmp_path, ram=800, shm=2_000, disk=4_000)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(150):
                n = rng.randrange(1, 40)
                tokens = list(range(1, n + 1))
                op = rng.random()
                if op < 0.5:
                    cache.put(NS, tokens, bytes([n]) * rng.randrange(20, 200))
                elif op < 0.9:
                    match = cache.lookup(NS, tokens)
                    if match is not None:
                        payload = cache.get(match.key)
                        assert payload is None or set(payload) == {match.n_tokens}
                else:
                    cache.evict_bytes(rng.randrange(1, 300))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    counters = cache.counters()
    for tier, budget in (("ram", 800), ("shm", 2_000), ("disk", 4_000)):
        assert counters[f"bytes_{tier}"] <= budget
    for tier in ("shm", "disk"):
        names = os.listdir(tmp_path / tier)
        assert not [n for n in names if ".tmp." in n]
        assert sum((tmp_path / tier / n).stat().st_size for n in names) == counters[f"bytes_{tier}"]
    for key in cache.keys():
        assert cache.get(key, promote=False) is not None


def test_lookups_wait_for_a_queued_save_that_would_serve_them(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A request right after the one that saved must not race the writer pool: a queued
    row that is a longer prefix (or the parent_key asked for) is waited for, briefly."""
    import time

    cache = TieredCache([DiskTier("disk", tmp_path / "disk", None)], policy="lru")
    gate = threading.Event()
    write = DiskTier.write

    def slow_write(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        gate.wait(5)                          # the writer is busy until the test says so
        return write(self, *args, **kwargs)

    monkeypatch.setattr(DiskTier, "write", slow_write)
    short = list(range(1, 21))
    assert cache.put_async(NS, short, b"s" * ROW)
    prompt = short + [99, 98]
    # nothing stored yet; an unrelated prompt or another namespace does not wait
    assert cache.wait_for_queued(NS, [7, 7, 7], timeout=0.05) is False
    assert cache.wait_for_queued(NS_B, prompt, timeout=0.05) is False
    threading.Timer(0.1, gate.set).start()
    started = time.perf_counter()
    assert cache.wait_for_queued(NS, prompt, timeout=5) is True
    assert time.perf_counter() - started < 4
    match = cache.lookup(NS, prompt)
    assert match is not None and match.n_tokens == len(short)
    assert cache.wait_for_queued(NS, prompt, timeout=0.05) is False   # stored: nothing to wait for
    # a queued row no longer than what is stored is not worth waiting for, unless it is the key asked for
    gate.clear()
    same = list(range(1, 11))
    assert cache.put_async(NS, same, b"t" * ROW)
    key = keys.row_key(NS.digest(), same)
    assert cache.wait_for_queued(NS, prompt, timeout=0.05) is False
    threading.Timer(0.1, gate.set).start()
    assert cache.wait_for_queued(NS, prompt, key=key, timeout=5) is True and key in cache
    assert cache.counters()["queued_wait_ns"] > 0


def test_a_scan_racing_a_put_does_not_adopt_the_row_being_committed(tmp_path: Path) -> None:
    """A peer rescan (cluster `cache_sync='auto'`) that meets a row this process has published
    but not yet committed leaves it to the put: counted once, `live` kept, admitted once."""
    class ScanningDisk(DiskTier):
        cache: TieredCache | None = None

        def write(self, meta, payload):  # type: ignore[no-untyped-def]
            size = super().write(meta, payload)
            if self.cache is not None:  # the file is published; the put has not committed yet
                self.cache.scan()
            return size

    disk = ScanningDisk("disk", tmp_path / "disk", None)
    cache = TieredCache([disk], policy="lru")
    disk.cache = cache
    key = cache.put(CacheNamespace("ab" * 32), [1, 2, 3], b"p" * 64, live=True)
    assert key is not None and len(cache) == 1
    (row,) = cache.rows()
    assert row["live"] is True
    assert cache.counters()["bytes_disk"] == (tmp_path / "disk" / f"{key}.kv").stat().st_size


def test_a_live_mark_taken_off_while_the_save_is_queued_holds_when_it_lands(tmp_path: Path) -> None:
    """end_session while its session's last save is still being written: the row must not
    land live (protected from eviction for ever)."""
    release = threading.Event()

    class SlowDisk(DiskTier):
        def write(self, meta, payload):  # type: ignore[no-untyped-def]
            release.wait(10)
            return super().write(meta, payload)

    cache = TieredCache([SlowDisk("disk", tmp_path / "disk", None)], policy="lru")
    ns, tokens = CacheNamespace("ab" * 32), [4, 5, 6]
    assert cache.put_async(ns, tokens, b"p" * 64, live=True)
    key = keys.row_key(ns.digest(), tokens)
    assert key not in cache and cache.set_live(key, False)  # deferred: the save is queued
    release.set()
    assert cache.wait_for_saves(10)
    (row,) = cache.rows()
    assert row["key"] == key and row["live"] is False
