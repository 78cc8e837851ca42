"""Memory pressure: cache bytes go first, then (opt-in) the least recently active idle model."""

from __future__ import annotations

import time

import pytest

import workbench as wb
from workbench.errors import InvalidOption

pytestmark = pytest.mark.model


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


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
    assert wait_for(lambda: wb.pressure().get("cache_bytes_evicted", 0) > 0)
    assert wb.list_tiers()[0]["used_bytes"] < ram_before
    seen = wb.pressure()
    assert seen["sources"]["callback"]["fraction"] == 0.95 and seen["models_unloaded"] == 0
    assert wb.model_info(model)["phase"] in ("idle", "generating", "prefilling")   # never unloaded


def test_unload_the_idle_model_only_when_opted_in(model_path, monitor):
    old = wb.load_model(model_path=str(model_path), model_id="old-idle", n_seq_max=1)
    wb.complete(old, "hi", response_tokens=2)
    wb.load_model(model_path=str(model_path), model_id="new-idle", n_seq_max=1)
    for other in {m["model_id"] for m in wb.list_models()} - {old}:
        wb.complete(other, "hi", response_tokens=2)      # everyone else was active more recently
    try:
        monitor(sources=[lambda: (99, 100)], interval_s=1.0, unload_models=True)   # one poll, then we stop it
        assert wait_for(lambda: wb.pressure().get("models_unloaded", 0) >= 1)
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
        assert wait_for(lambda: wb.pressure()["sources"].get("system") is not None)
        assert 0 < wb.pressure()["sources"]["system"]["fraction"] < 1
    finally:
        wb.stop_pressure_monitor()
