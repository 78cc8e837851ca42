"""pandas views: fixed columns and dtypes (also empty), meaningful indexes, and the one
hook to the engine's cache."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

import workbench as wb
from workbench.cache import CacheNamespace, RamTier, TieredCache
from workbench.notebook import views

NS = CacheNamespace("ab" * 32)


def hand_made_cache() -> TieredCache:
    tick = itertools.count()
    cache = TieredCache([RamTier("ram", 1000), RamTier("slow", None)], policy="lru", clock=lambda: float(next(tick)))
    cache.put(NS, [1, 2, 3], b"x" * 40)
    cache.put(NS, [1, 2, 3, 4], b"y" * 50)
    cache.put(NS, [7, 8], b"z" * 30, "agent_prefix")  # pinned
    cache.get(cache.lookup(NS, [1, 2, 3]).key)  # type: ignore[union-attr]
    return cache


def test_cache_rows_dtypes_and_eviction_order() -> None:
    df = views.cache_rows(hand_made_cache())
    assert df.index.name == "key" and len(df) == 3
    expected = {"n_tokens": "int64", "bytes": "int64", "hits": "int64", "pinned": "bool", "live": "bool",
                "score": "float64", "created_at": "float64", "last_hit_at": "float64"}
    for col, dtype in expected.items():
        assert df[col].dtype == dtype, col
    assert df["tier"].dtype == "string" and isinstance(df["reason"].dtype, pd.CategoricalDtype)
    # next victim first: unpinned by score (LRU: [1..4] was used before the hit on [1,2,3]), pinned last
    assert list(df["n_tokens"]) == [4, 3, 2]
    assert list(df["pinned"]) == [False, False, True]
    assert df["reason"].iloc[-1] == "agent_prefix"


def test_tiers_occupancy() -> None:
    df = views.tiers(hand_made_cache())
    assert list(df.index) == ["ram", "slow"]
    assert df.loc["ram", "budget_bytes"] == 1000 and pd.isna(df.loc["slow", "budget_bytes"])
    assert df.loc["ram", "occupancy"] == pytest.approx(df.loc["ram", "used_bytes"] / 1000)
    assert pd.isna(df.loc["slow", "occupancy"])
    assert str(df["budget_bytes"].dtype) == "Int64" and df["used_bytes"].dtype == "int64"


def test_counters_with_and_without_a_cache() -> None:
    df = views.counters()
    assert df.index.names == ["source", "name"] and df["value"].dtype == "int64"
    assert set(df.index.get_level_values("source")) <= {"engine"}
    both = views.counters(hand_made_cache())
    assert both.loc[("cache", "get_hits"), "value"] == 1
    assert both.loc[("cache", "rows"), "value"] == 3


def test_empty_views_keep_their_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wb, "requests", lambda: [])
    monkeypatch.setattr(wb, "list_models", lambda: [])
    req = views.requests()
    assert len(req) == 0 and req.index.name == "ref"
    assert isinstance(req["cache_hit_kind"].dtype, pd.CategoricalDtype)
    assert list(req["cache_hit_kind"].cat.categories) == ["cold", "partial", "exact", "sticky", "continuation"]
    assert req["prompt_tokens"].dtype == "int64"
    assert len(views.models()) == 0 and views.models().index.name == "model_id"


def test_resolve_cache_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wb, "list_models", lambda: [])
    with pytest.raises(wb.errors.InvalidOption, match="0 models are loaded"):
        views.cache_rows()
    with pytest.raises(wb.errors.InvalidOption, match="a TieredCache or a model id"):
        views.cache_rows(42)  # type: ignore[arg-type]
    with pytest.raises(wb.errors.NotLoaded):
        views.cache_rows("no-such-model")


@pytest.mark.model
def test_engine_views_with_the_model(model: str) -> None:
    models = views.models()
    assert model in models.index
    row = models.loc[model]
    assert row["n_vocab"] == 49152 and str(models["n_ctx"].dtype) == "Int64"
    assert models["has_chat_template"].dtype == "boolean"

    s = wb.stream(model, "Count slowly from one to fifty:", response_tokens=200, ignore_eos=True)
    try:
        req = views.requests()
        mine = req.loc[s.ref]
        assert mine["model"] == model and mine["prompt_tokens"] > 5
        assert req["age_s"].dtype == "float64" and str(req["seq"].dtype) == "Int64"
    finally:
        wb.cancel(s)
        s.result()

    wb.complete(model, "Hello", response_tokens=2, session_id="nbtest-view")
    try:
        sess = views.sessions(model)
        assert "nbtest-view" in sess.index
        assert sess.loc["nbtest-view", "tokens"] > 0 and sess["tokens"].dtype == "int64"
    finally:
        wb.end_session(model, "nbtest-view")


@pytest.mark.model
def test_a_model_without_the_cache_says_so(model_path) -> None:
    m = wb.load_model(model_path=str(model_path), model_id="nbtest-nocache", n_seq_max=1, cache=False)
    try:
        with pytest.raises(wb.errors.InvalidOption, match="cache=False"):
            views.cache_rows(m)
    finally:
        wb.unload(m)


@pytest.mark.model
def test_the_views_find_the_engine_cache(model: str) -> None:
    cache = views.model_cache(model)
    assert isinstance(cache, TieredCache) and views.resolve_cache(model) is cache
    wb.complete(model, "The quick brown fox jumps over the lazy dog, again and again and again.",
                response_tokens=4)
    rows = views.cache_rows(model)
    assert len(rows) >= 1 and rows["bytes"].gt(0).all()
    assert views.tiers(model).index.name == "name"
