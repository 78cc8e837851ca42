"""Sessions over chunk storage (``configure_cache(storage='chunks')``), with the real default
model: test_sessions.py's sticky turns, continuations, busy and reset, idle-pin reclaim and
KV-full eviction of the least recently used idle session, and test_prefix_cache.py's evict and
restore of a session's KV, run here unchanged (imported: pytest collects them in this module,
where the cache fixtures install chunk storage); and a session's live row protected while
every other chunk is evicted."""

from __future__ import annotations

import pytest

import workbench as wb

from .test_cache_chunked_engine import chunks  # noqa: F401 - the fixture
from .test_prefix_cache import PROMPT, SYSTEM
from .test_prefix_cache import (  # noqa: F401 - collected here, over chunk storage
    test_a_session_keeps_its_kv_in_an_own_row_no_other_request_finds,
    test_evict_saves_sessions_and_they_come_back_warm,
)
from .test_sessions import (  # noqa: F401 - collected here, over chunk storage
    next_turn,
    test_a_full_kv_saves_and_frees_the_least_recently_used_idle_session,
    test_continue_session_with_and_without_expect_committed,
    test_idle_pins_are_reclaimed_least_recently_used,
    test_second_turn_is_sticky_and_equals_the_cold_reply,
    test_session_busy_and_reset_while_busy,
)

pytestmark = pytest.mark.model


@pytest.fixture(autouse=True)
def chunk_storage(chunks):  # noqa: F811 - the imported fixture
    """Every test here runs over a chunked cache in RAM (chunks of 64)."""
    chunks({"kind": "ram", "budget_bytes": 512 * 2**20})


@pytest.fixture
def ram_cache(chunk_storage):
    """test_sessions.py's RAM row cache, replaced here by chunk storage."""


@pytest.mark.load(n_seq_max=2, deterministic=True)
def test_a_sessions_live_row_outlives_evicting_every_other_chunk(fresh_model):
    """Only the session's newest row is live; its chunks (shared with its older rows) are
    protected, so evicting every unprotected chunk leaves it and takes another prompt's.
    Deterministic: there a session's live row is its ordinary finish row; the default mode's
    own rows: test_prefix_cache.test_a_session_keeps_its_kv_in_an_own_row_no_other_request_finds."""
    m = fresh_model
    r1 = wb.complete(m, PROMPT, session_id="s", response_tokens=12)
    assert wb.wait_for_saves()
    live = lambda: {r["key"] for r in wb.cache_rows() if r["live"]}  # noqa: E731
    assert live() == {r1.finish_key}
    turn2 = next_turn(PROMPT, r1.reply, "In Fahrenheit?")
    r2 = wb.complete(m, turn2, session_id="s", response_tokens=12)
    assert r2.stats.cache_hit_kind == "sticky"
    other = wb.complete(m, SYSTEM + "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n",
                        response_tokens=8)
    assert wb.wait_for_saves()
    assert live() == {r2.finish_key}
    assert other.finish_key in {r["key"] for r in wb.cache_rows()}
    ordinary = sum(c["size_bytes"] for c in wb.cache_chunks() if not c["protected"])
    assert ordinary > 0 and wb.evict_bytes(ordinary) >= ordinary
    left = {r["key"] for r in wb.cache_rows()}
    assert r2.finish_key in left and other.finish_key not in left
    assert all(c["protected"] for c in wb.cache_chunks())
    # the live row serves the session's turn once its sequence is given back
    assert wb.evict(m) == 1 and wb.model_info(m)["available_seqs"] == 2
    turn3 = next_turn(turn2, r2.reply, "And in Kelvin?")
    r3 = wb.complete(m, turn3, session_id="s", response_tokens=8)
    assert r3.stats.cache_hit_kind == "partial" and r3.stats.prompt_tokens - r3.stats.prefilled_tokens >= len(
        wb.tokenize(m, turn2))
    wb.end_session(m, "s")
    assert live() == set()
