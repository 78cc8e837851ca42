"""Memory pressure: cache bytes go first, then (opt-in) the least recently active idle model."""

from __future__ import annotations

import threading
import time

import pytest

import workbench as wb
from workbench.errors import InvalidOption
from workbench.pressure import CallbackSource
from waiting import wait_for

pytestmark = pytest.mark.model


@pytest.fixture
def monitor():
    yield wb.start_pressure_monitor
    wb.stop_pressure_monitor()


def test_pressure_evicts_cache_bytes_first(model, monitor):
    wb.prefill_only(model, "Pressure test document. " * 30)
    ram_before = wb.list_tiers()[0]["used_bytes"]
    assert ram_before > 0
    level = {"used": 95}
    monitor(sources=[lambda: (level["used"], 100)], interval_s=0.05, high=0.9, target=0.8)
    assert wb.pressure_sources() == ["callback"]
    assert wait_for(lambda: wb.pressure().get("cache_bytes_evicted", 0) > 0, timeout=10.0)
    assert wb.list_tiers()[0]["used_bytes"] < ram_before
    seen = wb.pressure()
    assert seen["sources"]["callback"]["fraction"] == 0.95 and seen["models_unloaded"] == 0
    assert model in {m["model_id"] for m in wb.list_models()}   # cache bytes only: never unloaded


def test_pressure_frees_memory_not_the_directory_in_chunk_storage(model, monitor, tmp_path):
    """RAM copies above a disk chunk tier: pressure drops the copies (memory), and the row
    stays servable from disk; evicting the last tier would free disk bytes, not memory."""
    wb.configure_cache([{"kind": "ram", "budget_bytes": 1 << 30},
                        {"kind": "disk", "root": str(tmp_path / "chunks"), "budget_bytes": 1 << 30}])
    try:
        prompt = "Pressure test document in chunks. " * 30
        wb.prefill_only(model, prompt)
        assert wb.wait_for_saves()
        ram, disk = wb.list_tiers()
        assert ram["used_bytes"] > 0 and disk["used_bytes"] > 0
        monitor(sources=[lambda: (95, 100)], interval_s=0.05, high=0.9, target=0.8)
        assert wait_for(lambda: wb.pressure().get("cache_bytes_evicted", 0) > 0, timeout=10.0)
        wb.stop_pressure_monitor()
        ram_after, disk_after = wb.list_tiers()
        assert ram_after["used_bytes"] < ram["used_bytes"]
        assert disk_after["used_bytes"] == disk["used_bytes"]          # the chunks are all still on disk
        assert wb.complete(model, prompt, response_tokens=1).stats.cache_hit_kind == "exact"
    finally:
        wb.configure_cache([{"kind": "ram"}])


def test_unload_the_idle_model_only_when_opted_in(model_path, monitor):
    old = wb.load_model(model_path=str(model_path), model_id="old-idle", n_seq_max=1)
    wb.complete(old, "hi", response_tokens=2)
    wb.load_model(model_path=str(model_path), model_id="new-idle", n_seq_max=1)
    for other in {m["model_id"] for m in wb.list_models()} - {old}:
        wb.complete(other, "hi", response_tokens=2)      # everyone else was active more recently
    try:
        # 19 TiB over the target: more than evicting cache bytes can free, whatever rows
        # earlier tests left, so the poller must unload a model
        monitor(sources=[lambda: (99 << 40, 100 << 40)], interval_s=1.0, unload_models=True)
        assert wait_for(lambda: wb.pressure().get("models_unloaded", 0) >= 1, timeout=10.0)
        assert wb.pressure()["last_model_unloaded"] == "old-idle"
        wb.stop_pressure_monitor()
        assert wb.pressure()["running"] is False
        ids = {m["model_id"] for m in wb.list_models()}
        assert "old-idle" not in ids and "new-idle" in ids
        assert wb.pressure_sources() == []
    finally:
        for mid in ("old-idle", "new-idle"):
            if mid in {m["model_id"] for m in wb.list_models()}:
                wb.unload(mid)


def test_bad_monitor_settings():
    with pytest.raises(InvalidOption):
        wb.start_pressure_monitor(sources=["swap"])
    with pytest.raises(InvalidOption):
        wb.start_pressure_monitor(high=0.5, target=0.9)
    wb.start_pressure_monitor(sources=["system"], interval_s=0.05)
    try:
        assert wait_for(lambda: wb.pressure()["sources"].get("system") is not None, timeout=10.0)
        assert 0 < wb.pressure()["sources"]["system"]["fraction"] < 1
    finally:
        wb.stop_pressure_monitor()


# --- a poller that outlives its callbacks, and a bounded stop ---------------------------------

def test_a_raising_evictor_is_recorded_and_the_poller_goes_on(model, monitor):
    calls = []

    def evictor():
        calls.append(time.monotonic())
        raise RuntimeError("no model to unload here")

    monitor(sources=[lambda: (99, 100)], interval_s=0.02, unload_models=True, evictor=evictor)
    assert wait_for(lambda: len(calls) >= 3, timeout=10.0)  # polled again after each failure
    seen = wb.pressure()
    assert seen["running"] is True and seen["errors"] >= 3 and seen["models_unloaded"] == 0
    assert seen["last_error"].startswith("evictor: RuntimeError: no model to unload here")


def test_a_source_returning_garbage_is_recorded_and_the_others_still_count(monitor):
    class Tuple:
        name = "tuple"

        def read(self):
            return (50, 100)                    # a pair instead of a Reading: accepted

    class Garbage:
        name = "garbage"

        def read(self):
            return "full"

    monitor(sources=[Tuple(), Garbage(), lambda: (float("nan"), 100), CallbackSource(lambda: (1.0, 4.0), "floats")],
            interval_s=0.02)
    assert wait_for(lambda: wb.pressure().get("polls", 0) >= 3, timeout=10.0)
    seen = wb.pressure()
    assert seen["running"] is True
    assert seen["sources"]["tuple"] == {"used_bytes": 50, "total_bytes": 100, "fraction": 0.5}
    assert seen["sources"]["floats"]["fraction"] == 0.25
    assert seen["sources"]["garbage"] is None and seen["sources"]["callback"] is None
    assert seen["errors"] >= 2 * 3 and "source " in seen["last_error"] and "TypeError" in seen["last_error"]


def test_stop_from_inside_the_evictor_does_not_deadlock(monitor):
    done = []

    def evictor():
        done.append(wb.stop_pressure_monitor())          # from the poller's own thread

    monitor(sources=[lambda: (99, 100)], interval_s=0.02, unload_models=True, evictor=evictor)
    assert wait_for(lambda: done, timeout=5)
    assert wb.pressure() == {"running": False}
    time.sleep(0.2)
    assert len(done) == 1                                 # it stopped after that poll
    monitor(sources=[lambda: (10, 100)], interval_s=0.02)   # and a new one starts
    assert wait_for(lambda: wb.pressure().get("polls", 0) >= 2, timeout=10.0)


def test_stop_is_bounded_with_a_source_stuck_in_read(model, monitor):
    wb.prefill_only(model, "A row the stopped poller must leave alone. " * 20)
    wb.wait_for_saves()
    used = wb.list_tiers()[0]["used_bytes"]
    release, entered = threading.Event(), threading.Event()

    def stuck():
        entered.set()
        release.wait(60)
        return (99, 100)                                   # pressure, but it comes too late

    monitor(sources=[stuck], interval_s=0.02, target=0.01)
    assert entered.wait(5)
    t0 = time.monotonic()
    assert wb.stop_pressure_monitor(timeout_s=0.3) is False      # still inside the source
    assert time.monotonic() - t0 < 1.0
    assert wb.pressure() == {"running": False}
    release.set()
    time.sleep(0.3)
    assert wb.list_tiers()[0]["used_bytes"] == used                # a stopped poller evicts nothing


def test_stop_settings_are_validated():
    for bad in (float("nan"), -1, True, "1"):
        with pytest.raises(InvalidOption, match="timeout_s"):
            wb.stop_pressure_monitor(timeout_s=bad)
    for kw in ({"high": float("nan")}, {"interval_s": float("inf")}, {"interval_s": True},
               {"unload_models": 1}, {"evictor": "oldest"}, {"sources": "system"}):
        with pytest.raises(InvalidOption):
            wb.start_pressure_monitor(**kw)
    assert wb.pressure() == {"running": False}
