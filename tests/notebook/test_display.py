"""What a user sees of a table: the views' frames (and the %wb magics' tables) show their
figures in one display format in IPython, while the frames keep their raw numbers."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import workbench as wb
from workbench.cache import CacheNamespace
from workbench.cache.chunk_format import chunk_file_size
from workbench.cache.chunk_store import WHOLE_ROWS, ChunkStore
from workbench.cache.chunk_tiers import ChunkTier
from workbench.cache.chunked import ChunkedCache
from workbench.notebook import display, views
from workbench.notebook.commands import MODEL_COLUMNS, ROW_COLUMNS

from .caches import put

NS = CacheNamespace("ab" * 32)
SIX_DECIMALS = re.compile(r"\d\.\d{5,}")   # 0.912399, 10.904823, 4029.301907
RAW_UNIX_TIME = re.compile(r"1\.\d+e\+09|\b1[6-9]\d{8}\b")


ROW_BYTES = [10_904_823, 1_476_764, 300]     # each row's chunk: 10.4 MiB, 1.4 MiB, 300 B
TOKENS = [list(range(500)), list(range(1000, 1064)), [1, 2]]


def unix_clock_cache(root: Path) -> ChunkedCache:
    """A cache whose clock is the unix time (as the engine's): RAM of 24 MiB over an unbounded
    disk tier; rows of 10.4 MiB, 1.4 MiB and 300 B (each a whole-row chunk: its file's header
    and tokens count)."""
    tick = itertools.count()
    tiers = [ChunkTier.memory("ram", 24 << 20, "lru"), ChunkTier.directory(root / "disk", "disk", None, "lru")]
    cache = ChunkedCache(ChunkStore(tiers=tiers, chunk_size=WHOLE_ROWS, clock=lambda: 1_796_286_123.25 + next(tick)))
    for tokens, size in zip(TOKENS, ROW_BYTES):
        put(cache, NS, tokens, b"x" * (size - chunk_file_size(len(tokens), 0)))
    return cache


def plain_and_html(shell: Any, obj: Any) -> tuple[str, str]:
    """What IPython shows of ``obj``, with pandas' notebook settings (a terminal's 0, "as
    wide as the terminal", would elide columns under pytest)."""
    with pd.option_context("display.max_columns", 20, "display.width", 100):
        data, _ = shell.display_formatter.format(obj)
    return data["text/plain"], data.get("text/html", "")


def test_shown_formats_each_kind_of_figure() -> None:
    df = pd.DataFrame({
        "bytes": [10_904_823, 300], "budget_bytes": pd.array([25_165_824, None], dtype="Int64"),
        "occupancy": [0.912399, None], "acceptance": [1.0, 0.666667], "hit_ratio": [0.734, 0.5],
        "ttft_s": [4.029301907, 0.0121], "ttft_ms": [4029.301907, 12.13], "MiB": [10.399, 0.0003],
        "created_at": [1_796_286_123.46, 1_796_286_124.0], "score": [1_796_286_123.5, 3.0],
        "n_params": [134_515_008, 1], "ratio": [0.912399, 2.5], "reused_tokens": [160.0, None],
        "pinned": [True, False], "parent": ["ab" * 32, None],
    }, index=pd.Index(["c3" * 16, "d4" * 16], name="key"))
    text = display.shown(df)
    row = text.iloc[0]
    assert row["bytes"] == "10.4 MiB" and text.iloc[1]["bytes"] == "300 B"
    assert row["budget_bytes"] == "24.0 MiB" and text.iloc[1]["budget_bytes"] == "unbounded"
    assert row["occupancy"] == "91.2%" and text.iloc[1]["occupancy"] == "-"
    assert list(text["acceptance"]) == ["100.0%", "66.7%"] and row["hit_ratio"] == "73.4%"
    assert row["ttft_s"] == "4.029" and row["ttft_ms"] == "4,029.3" and row["MiB"] == "10.4"
    assert row["created_at"] == display.clock(1_796_286_123.46) and re.fullmatch(r"\d\d:\d\d:\d\d\.\d",
                                                                                  row["created_at"])
    assert text.iloc[1]["score"] == "3"                  # an lfu count is no clock reading
    assert row["n_params"] == "134,515,008" and row["ratio"] == "0.9124"
    assert row["reused_tokens"] == "160" and text.iloc[1]["reused_tokens"] == "-"
    assert row["pinned"] == "True" and row["parent"] == "ab" * 6
    assert list(text.index) == ["c3" * 6, "d4" * 6]    # keys cut to 12 characters
    assert df["acceptance"].tolist() == [1.0, 0.666667]  # the frame keeps its numbers


def test_views_are_marked_and_derived_frames_keep_the_mark(tmp_path: Path) -> None:
    cache = unix_clock_cache(tmp_path)
    rows = views.cache_rows(cache)
    assert display.is_table(rows) and display.is_table(rows[["tier", "bytes"]].head(2))
    assert display.is_table(views.tiers(cache)) and not display.is_table(pd.DataFrame({"a": [1]}))
    assert rows["bytes"].dtype == "int64" and "e+09" in rows.to_string()  # print(df): the raw numbers


def test_ipython_shows_a_view_with_units_and_other_frames_as_before(ip: Any, tmp_path: Path) -> None:
    cache = unix_clock_cache(tmp_path)
    plain, html = plain_and_html(ip, views.tiers(cache)[["kind", "policy", "budget_bytes", "used_bytes", "occupancy"]])
    assert "24.0 MiB" in plain and "unbounded" in plain and "25165824" not in plain
    assert not SIX_DECIMALS.search(plain) and "white-space: nowrap" in html and "24.0 MiB" in html
    plain, _ = plain_and_html(ip, views.cache_rows(cache)[["tier", "bytes", "MiB", "score", "created_at", "idle_s"]])
    assert "10.4 MiB" in plain and not RAW_UNIX_TIME.search(plain) and not SIX_DECIMALS.search(plain)
    other = pd.DataFrame({"x": [0.912399], "bytes": [25_165_824]})
    plain, html = plain_and_html(ip, other)
    assert plain == repr(other) and html == other._repr_html_()  # a user's own frame: pandas' view


def test_wb_cache_shows_a_narrow_table_and_all_columns_on_request(ip: Any, tmp_path: Path) -> None:
    ip.user_ns["nbtest_cache"] = unix_clock_cache(tmp_path)
    narrow = ip.run_cell("%wb cache --cache nbtest_cache").result
    assert list(narrow.columns) == ROW_COLUMNS and narrow.index.name == "key"
    plain, html = plain_and_html(ip, narrow)
    assert "10.4 MiB" in plain and "300 B" in plain and not SIX_DECIMALS.search(plain)
    assert not RAW_UNIX_TIME.search(plain) and max(map(len, plain.splitlines())) <= 100
    assert ">10.4 MiB<" in html
    every = ip.run_cell("%wb cache --all --cache nbtest_cache").result
    assert {"score", "created_at", "score_norm", "tiers", "MiB"} <= set(every.columns)
    plain, _ = plain_and_html(ip, every)
    assert not RAW_UNIX_TIME.search(plain) and not SIX_DECIMALS.search(plain)
    assert every["bytes"].tolist() == ROW_BYTES  # the numbers themselves, unchanged
    plain, _ = plain_and_html(ip, ip.run_cell("%wb tiers --cache nbtest_cache").result)
    assert "24.0 MiB" in plain and "unbounded" in plain and not SIX_DECIMALS.search(plain)


def test_wb_history_and_latency_show_rounded_milliseconds(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_history(model: str | None = None) -> list[dict[str, Any]]:
        return [{"ref": 1, "model": "m", "cache_scope": "", "session_id": None, "arrival": 12.5,
                 "queued_s": 0.0011963, "ttft_s": 4.029301907, "tpot_s": 0.01127088, "e2e_s": 4.656285384,
                 "itl_s": [0.011, 0.0115], "prompt_tokens": 32, "cached_tokens": 0, "prefilled_tokens": 32,
                 "generated_tokens": 40, "cache_hit_kind": "cold", "finish_reason": "length", "error": None,
                 "spec_drafted": None, "spec_accepted": None}]
    monkeypatch.setattr(wb, "history", fake_history)
    df = ip.run_cell("%wb history").result
    assert df.loc[0, "ttft_ms"] == pytest.approx(4029.301907)       # the frame: raw figures
    plain, _ = plain_and_html(ip, df)
    assert "4,029.3" in plain and "4029.301907" not in plain and not SIX_DECIMALS.search(plain)
    plain, _ = plain_and_html(ip, ip.run_cell("%wb history --latency").result)
    assert "4,029.3" in plain and not SIX_DECIMALS.search(plain)


def test_wb_models_shows_the_main_facts_and_all_on_request(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    info = {"model_id": "small", "desc": "llama 256M Q4_1", "n_params": 134_515_008, "size_bytes": 98_000_000,
            "n_ctx": 8192, "n_seq_max": 4, "available_seqs": 4, "phase": "idle", "queue_depth": 0,
            "deterministic": False, "path": "/x/small.gguf", "fingerprint": "ab" * 32}
    monkeypatch.setattr(wb, "list_models", lambda: [info])
    narrow = ip.run_cell("%wb models").result
    assert list(narrow.columns) == MODEL_COLUMNS
    plain, _ = plain_and_html(ip, narrow)
    assert "135M" in plain and "93.5 MiB" in plain and "134515008" not in plain
    every = ip.run_cell("%wb models --all").result
    assert {"path", "fingerprint", "n_params"} <= set(every.columns)
    plain, _ = plain_and_html(ip, every[["n_params", "fingerprint"]])
    assert "134,515,008" in plain and "ab" * 6 in plain and "ab" * 7 not in plain


def test_lab_replay_frames_show_shares_as_percents() -> None:
    from workbench import lab
    from workbench.lab import traces

    df = lab.replay(traces.multi_turn_chats(30, seed=0), ["lru"], ["8MiB"], workers=1)
    assert display.is_table(df)
    text = display.shown(df[["size_bytes", "hit_ratio", "prefill_saved_fraction"]])
    assert text.loc[0, "size_bytes"] == "8.0 MiB" and text.loc[0, "hit_ratio"].endswith("%")


def test_lab_by_budget_is_a_budget_by_policy_table_in_the_metrics_format() -> None:
    """A replay pivoted to one figure: a row per budget, a column per policy in the order
    the replay ran them, shown as that figure is (shares as percents, budgets in MiB)."""
    from workbench import lab
    from workbench.errors import InvalidOption
    from workbench.lab import traces

    df = lab.replay(traces.multi_turn_chats(30, seed=0), ["lru", "fifo"], ["8MiB", "16MiB"], workers=1)
    table = lab.by_budget(df, "prefill_saved_fraction")
    assert list(table.columns) == ["lru", "fifo"] and list(table.index) == [8 << 20, 16 << 20]
    assert table.loc[8 << 20, "fifo"] == df.set_index(["policy", "size_bytes"]).loc[("fifo", 8 << 20),
                                                                                     "prefill_saved_fraction"]
    text = display.shown(table)
    assert list(text.index) == ["8.0 MiB", "16.0 MiB"] and all(v.endswith("%") for v in text.to_numpy().ravel())
    assert display.is_table(table)
    with pytest.raises(InvalidOption, match="'metric'.*'nope'"):
        lab.by_budget(df, "nope")
