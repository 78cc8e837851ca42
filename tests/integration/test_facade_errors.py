"""Bad arguments to the public calls raise a WorkbenchError naming the argument and the
value (InvalidOption), never a bare KeyError / ValueError / TypeError / pybind error, and
never go through unchecked (wait_for_saves(nan) used to be accepted)."""

from __future__ import annotations

import math

import pytest

import workbench as wb
from workbench.errors import InvalidOption, ModelFileError, UnknownRequest

pytestmark = pytest.mark.model


def refused(key, fn, *args, **kwargs):
    with pytest.raises(InvalidOption) as e:
        fn(*args, **kwargs)
    assert e.value.key == key, str(e.value)
    return e.value


def test_unknown_row_keys_name_the_key():
    e = refused("key", wb.unpin_row, "nope")
    assert e.value == "nope" and "'nope'" in str(e)
    refused("key", wb.pin_row, "nope")
    refused("key", wb.unpin_row, 5)


def test_unpin_row_returns_whether_it_was_pinned(model):
    r = wb.prefill_only(model, "A row to pin and unpin in the facade test. " * 4)
    key = r.finish_key
    assert wb.unpin_row(key) is False
    wb.pin_row(key)
    assert wb.unpin_row(key) is True and wb.unpin_row(key) is False


def test_cached_prefix_len_scope(model):
    for bad in (None, "", 5):
        e = refused("cache_scope", wb.cached_prefix_len, model, "Hello", cache_scope=bad)
        assert repr(bad) in str(e)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1, True, "1", 1e300])
def test_wait_for_saves_timeout(bad):
    e = refused("timeout_s", wb.wait_for_saves, bad)
    assert e.value is bad or e.value == bad
    assert wb.wait_for_saves(0) in (True, False) and wb.wait_for_saves(None) is True


def test_token_call_flags(model):
    refused("add_special", wb.tokenize, model, "hi", add_special=1)
    refused("parse_special", wb.tokenize, model, "hi", parse_special="no")
    refused("remove_special", wb.detokenize, model, [1], remove_special=None)
    refused("unparse_special", wb.detokenize, model, [1], unparse_special=0)


def test_session_calls(model):
    refused("session_id", wb.end_session, model, 1.5)
    refused("session_id", wb.reset_session, model, True)
    refused("cache_scope", wb.end_session, model, "s", cache_scope=None)
    refused("cache_scope", wb.reset_session, model, "s", cache_scope="")
    refused("cache_scope", wb.sessions, model, cache_scope=3)
    refused("stream", wb.continue_session, model, "s", [1], stream="yes")


def test_adapter_calls(model, tmp_path):
    for bad in (math.inf, math.nan, 10**400, True):
        refused("scale", wb.load_adapter, model, str(tmp_path / "none.gguf"), scale=bad)
    refused("path", wb.load_adapter, model, 12)
    refused("adapter", wb.unload_adapter, model, "first")
    refused("scale", wb.set_adapter_scale, model, 1, math.inf)
    for bad in ([], {}, {1}, "first", 1.5, None):              # unhashable ones reached a set lookup
        e = refused("adapter", wb.set_adapter_scale, model, bad, 1.0)
        assert repr(bad) in str(e)
        refused("adapter", wb.unload_adapter, model, bad)
    refused("adapter", wb.set_adapter_scale, model, 999, 1.0)   # an int that is no attached adapter


@pytest.mark.parametrize("bad", ["x" * 5000, "dir/" * 2000 + "a.gguf", "a\x00b.gguf", "\ud800.gguf"])
def test_unusable_model_paths(model, bad):
    """A path too long for the file system, with a NUL byte or an unencodable code point is
    a ModelFileError naming it (it was a bare OSError / ValueError from the stat)."""
    loaded = [m["model_id"] for m in wb.list_models()]
    for call in (lambda: wb.load_adapter(model, bad), lambda: wb.load_model(model_path=bad)):
        with pytest.raises(ModelFileError, match="no such file") as e:
            call()
        assert repr(bad)[:40] in str(e.value)
    assert [m["model_id"] for m in wb.list_models()] == loaded


def test_a_fifo_as_model_path_is_refused_at_once(tmp_path):
    """load_model read the training context of the file before checking it: a FIFO blocked it."""
    import os
    import time

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(ModelFileError, match="not a regular file"):
        wb.load_model(model_path=str(fifo))
    assert time.monotonic() - t0 < 5


def test_request_refs():
    for bad in ([], {}, {1}, "1", 1.5, None, True):            # unhashable ones reached a dict lookup
        e = refused("ref", wb.request_info, bad)
        assert repr(bad) in str(e)
    with pytest.raises(UnknownRequest):
        wb.request_info(10**30)


def test_request_numbers(model):
    refused("temperature", wb.complete, model, "Hi", temperature=math.inf)
    refused("top_k", wb.complete, model, "Hi", top_k=2**40)
    refused("response_tokens", wb.complete, model, "Hi", response_tokens=2**63)


@pytest.mark.parametrize("schema", [{"type": b""}, {"type": "string", "pattern": b"a+"}, {"enum": [{1, 2}]},
                                    {"maximum": math.nan}, {(1, 2): "x"}])
def test_json_schema_of_non_json_values(model, schema):
    """bytes, sets, nan and non-string keys are no JSON (a bare TypeError before)."""
    e = refused("json_schema", wb.complete, model, "JSON:", json_schema=schema)
    assert "valid JSON" in str(e)


def test_tier_calls():
    before = [t["name"] for t in wb.list_tiers()]
    refused("tier", wb.evict_bytes, 10, tier="nope")
    refused("n", wb.evict_bytes, -1)
    refused("purge", wb.remove_tier, "ram", purge="yes")
    refused("tier", wb.remove_tier, "nope")
    refused("tier", wb.remove_tier, 5)
    refused("position", wb.add_tier, "ram", name="extra", position="x")
    refused("position", wb.add_tier, "ram", name="extra", position=10**30)
    refused("name", wb.add_tier, "ram", name=5)
    refused("policy", wb.add_tier, "ram", name="extra", policy="zzz")
    refused("policy", wb.configure_cache, [{"kind": "ram"}], policy=5)
    refused("policy", wb.configure_cache, [{"kind": "ram"}], policy=None)  # was a bare TypeError
    refused("tiers[0].policy", wb.configure_cache, [{"kind": "ram", "policy": "zzz"}])
    refused("kind", wb.configure_cache, [{"kind": []}])                 # was a bare TypeError (unhashable)
    refused("kind", wb.add_tier, {"x": 1})
    refused("root", wb.configure_cache, [{"kind": "disk", "root": "tier\x00dir"}])   # was a bare ValueError
    refused("root", wb.configure_cache, [{"kind": "disk", "root": "tier\ud800"}])    # was UnicodeEncodeError
    assert [t["name"] for t in wb.list_tiers()] == before              # nothing half-added


def test_pressure_calls():
    refused("high", wb.start_pressure_monitor, high=math.nan)
    refused("timeout_s", wb.stop_pressure_monitor, timeout_s=math.inf)
    assert wb.pressure() == {"running": False}
