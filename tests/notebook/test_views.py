"""pandas views: fixed columns and dtypes (also empty), meaningful indexes, and the one
hook to the engine's cache."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest

import workbench as wb
from workbench.cache import CacheNamespace
from workbench.cache.chunk_format import chunk_file_size
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.chunked import ChunkedCache
from workbench.notebook import views

from .caches import hit, put, whole_rows

NS = CacheNamespace("ab" * 32)


def hand_made_cache(root: Path) -> ChunkedCache:
    """Whole rows: a RAM tier of 1000 bytes (copies) over a directory "slow"; three rows, the
    last pinned, the first read once."""
    tick = itertools.count()
    tiers = [ChunkTier.memory("ram", 1000, "lru"), ChunkTier.directory(root / "slow", "slow", None, "lru")]
    cache = ChunkedCache(ChunkStore(tiers=tiers, chunk_size=WHOLE_ROWS, clock=lambda: float(next(tick))))
    put(cache, NS, [1, 2, 3], b"x" * 40)
    put(cache, NS, [4, 5, 6, 7], b"y" * 50)
    put(cache, NS, [7, 8], b"z" * 30, "agent_prefix")  # pinned
    hit(cache, NS, [1, 2, 3])
    return cache


def test_cache_rows_dtypes_and_eviction_order(tmp_path: Path) -> None:
    df = views.cache_rows(hand_made_cache(tmp_path))
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


def unix_time_cache(policy: str) -> ChunkedCache:
    """Rows saved one second apart at unix time ~1.8e9: raw lru/frecency scores alike."""
    now = [1.8e9]
    cache = whole_rows(None, policy, lambda: now[0])
    for n in range(2, 6):
        put(cache, NS, [n] * n, b"x" * (n << 20))
        now[0] += 1
    return cache


@pytest.mark.parametrize("policy", ["lru", "frecency"])
def test_cache_rows_can_be_ranked_by_eye(policy: str) -> None:
    df = views.cache_rows(unix_time_cache(policy))
    assert df["score"].round(-6).nunique() == 1  # what the raw column shows: 1.8e9 everywhere
    assert list(df["rank"]) == [1, 2, 3, 4] and list(df["n_tokens"]) == [2, 3, 4, 5]  # oldest goes first
    assert list(df["score_norm"]) == pytest.approx([0, 1 / 3, 2 / 3, 1])
    # ages to the snapshot's clock reading, taken one second after the last save
    assert list(df["age_s"]) == list(df["idle_s"]) == [4.0, 3.0, 2.0, 1.0]
    assert list(df["bytes"]) == [chunk_file_size(n, n << 20) for n in range(2, 6)]   # the row's chunk
    assert list(df["MiB"]) == [b / 2**20 for b in df["bytes"]]


def test_rank_counts_within_each_tier_and_protected_rows_last(tmp_path: Path) -> None:
    df = views.cache_rows(hand_made_cache(tmp_path))
    assert list(df["rank"]) == [1, 2, 3] and list(df["tiers"]) == [["ram", "slow"]] * 3
    assert df["score_norm"].between(0, 1).all()
    assert df.loc[df["rank"] == 1, "score_norm"].item() == 0.0
    # the row just hit is the latest use: idle for the one clock tick up to the snapshot
    idle = df["idle_s"]
    assert df.loc[df["hits"] == 1, "idle_s"].item() == idle.min() == 1.0
    cache = hand_made_cache(tmp_path / "again")
    key = views.cache_rows(cache).index[0]
    cache.evict_bytes(1, "ram")  # drops the next victim's RAM copy: "slow" holds it
    moved = views.cache_rows(cache)
    assert moved.loc[key, "tier"] == "slow" and moved.loc[key, "rank"] == 1
    assert list(moved.loc[moved["tier"] == "ram", "rank"]) == [1, 2]


def test_tiers_occupancy(tmp_path: Path) -> None:
    df = views.tiers(hand_made_cache(tmp_path))
    assert list(df.index) == ["ram", "slow"]
    assert df.loc["ram", "budget_bytes"] == 1000 and pd.isna(df.loc["slow", "budget_bytes"])
    assert df.loc["ram", "occupancy"] == pytest.approx(df.loc["ram", "used_bytes"] / 1000)
    assert df.loc["ram", "percent_full"] == pytest.approx(100 * df.loc["ram", "used_bytes"] / 1000)
    assert df.loc["ram", "used_MiB"] == df.loc["ram", "used_bytes"] / 2**20
    assert pd.isna(df.loc["slow", "occupancy"]) and pd.isna(df.loc["slow", "percent_full"])
    assert str(df["budget_bytes"].dtype) == "Int64" and df["used_bytes"].dtype == "int64"


def test_style_shows_units_and_short_keys(tmp_path: Path) -> None:
    cache = hand_made_cache(tmp_path)
    tiers = views.style(views.tiers(cache)).to_string()
    copies = sum(chunk_file_size(n, p) for n, p in ((3, 40), (4, 50), (2, 30)))   # the RAM copies
    assert "1000 B" in tiers and "unbounded" in tiers and f"{copies / 10:.1f}%" in tiers
    rows = views.cache_rows(cache)
    text = views.style(rows).to_string()
    assert f"{chunk_file_size(4, 50)} B" in text and rows.index[0][:12] in text and rows.index[0] not in text
    assert rows["bytes"].dtype == "int64"  # the frame keeps its numbers


def test_style_is_one_way_to_show_every_kind_of_figure() -> None:
    """Counts with separators, fractions as percents, seconds to the millisecond, unix
    times as clock times, other floats to four digits; the frame is untouched."""
    from workbench.notebook.display import clock

    df = pd.DataFrame({"n_params": pd.array([134_515_008], dtype="Int64"), "acceptance": [0.666667],
                       "ttft_s": [0.0421337], "itl_ms": [12.3456], "created_at": [1_796_286_123.456],
                       "score": [1_796_286_123.5], "ratio": [0.912399], "pinned": [True]})
    text = views.style(df).to_string()
    for shown in ("134,515,008", "66.7%", "0.042", "12.3", clock(1_796_286_123.456), clock(1_796_286_123.5),
                  "0.9124", "True"):
        assert shown in text, shown
    assert "e+09" not in text and "0.666667" not in text
    assert df["acceptance"].tolist() == [0.666667] and df["n_params"].tolist() == [134_515_008]


def test_models_give_the_parameter_count_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    infos = [{"model_id": "small", "desc": "llama 256M Q4_1", "n_params": 134_515_008},
             {"model_id": "big", "desc": "qwen2 1.5B Q8_0", "n_params": 1_543_714_304}]
    monkeypatch.setattr(wb, "list_models", lambda: infos)
    df = views.models()
    assert list(df["params"]) == ["135M", "1.5B"] and df.loc["small", "desc"] == "llama 256M Q4_1"
    assert df["n_params"].tolist() == [134_515_008, 1_543_714_304]


def test_counters_with_and_without_a_cache(tmp_path: Path) -> None:
    df = views.counters()
    assert df.index.names == ["source", "name"] and df["value"].dtype == "int64"
    assert set(df.index.get_level_values("source")) <= {"engine"}
    both = views.counters(hand_made_cache(tmp_path))
    assert both.loc[("cache", "get_hits"), "value"] == 1
    assert both.loc[("cache", "rows"), "value"] == 3


def test_empty_views_keep_their_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wb, "requests", lambda: [])
    monkeypatch.setattr(wb, "list_models", lambda: [])
    req = views.requests()
    assert len(req) == 0 and req.index.name == "ref"
    assert isinstance(req["cache_hit_kind"].dtype, pd.CategoricalDtype)
    assert list(req["cache_hit_kind"].cat.categories) == ["cold", "partial", "exact", "sticky", "continuation",
                                                          "shared"]
    assert req["prompt_tokens"].dtype == "int64"
    assert len(views.models()) == 0 and views.models().index.name == "model_id"
    assert views.models()["params"].dtype == "string"
    rows = views.cache_rows(whole_rows(1000))
    assert len(rows) == 0 and str(rows["rank"].dtype) == "Int64"
    assert rows["score_norm"].dtype == rows["MiB"].dtype == rows["age_s"].dtype == "float64"


def test_resolve_cache_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wb, "list_models", lambda: [])
    with pytest.raises(wb.errors.InvalidOption, match="0 models are loaded"):
        views.cache_rows()
    with pytest.raises(wb.errors.InvalidOption, match="a prefix cache .workbench.cache.PrefixCache. or a model id"):
        views.cache_rows(42)  # type: ignore[arg-type]
    with pytest.raises(wb.errors.NotLoaded):
        views.cache_rows("no-such-model")


@pytest.mark.model
def test_engine_views_with_the_model(model: str) -> None:
    models = views.models()
    assert model in models.index
    row = models.loc[model]
    assert row["n_vocab"] == 49152 and str(models["n_ctx"].dtype) == "Int64"
    assert row["params"] == "135M"  # SmolLM2-135M, whatever llama.cpp's desc says
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
    assert isinstance(cache, ChunkedCache) and views.resolve_cache(model) is cache  # the default storage
    # a prompt of 16+ tokens before its last: its row is saved (cache_min_tokens)
    wb.complete(model, "The quick brown fox jumps over the lazy dog, again and again and again and again.",
                response_tokens=4)
    assert wb.wait_for_saves()
    rows = views.cache_rows(model)
    assert len(rows) >= 1 and rows["bytes"].gt(0).all()
    assert views.tiers(model).index.name == "name"
