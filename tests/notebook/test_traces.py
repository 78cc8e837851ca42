"""Trace generators: seeded, compact, and shaped like the workloads they name."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.lab import traces
from workbench.lab.traces import Trace


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a, b, c = (traces.multi_turn_chats(300, seed=s) for s in (1, 1, 2))
    for name in ("seg_len", "prompt_ptr", "prompt_segs", "reply_seg", "arrival_s", "session"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert a.prompt_token_ids(17) == b.prompt_token_ids(17)


def test_chat_turns_extend_the_previous_turn() -> None:
    t = traces.multi_turn_chats(500, seed=3, concurrency=8)
    last: dict[int, int] = {}
    checked = 0
    for req in t:
        prev = last.get(req.session)
        if prev is not None:
            p = t[prev]
            assert req.prompt[: len(p.prompt) + 1] == (*p.prompt, p.reply)  # previous prompt + its reply
            assert len(req.prompt) == len(p.prompt) + 2                      # + one user message
            checked += 1
        last[req.session] = req.index
    assert checked > 100
    assert np.all(np.diff(t.arrival_s) > 0)
    assert t.prompt_tokens.max() <= 8192


def test_agents_share_a_pinned_prefix() -> None:
    t = traces.agent_tasks(400, seed=4, agents=3)
    firsts = {req.prompt[0] for req in t}
    assert len(firsts) <= 3                      # every prompt starts with one of the agent prefixes
    assert (t.pin_segs == 1).all()
    assert all(t.seg_len[s] >= 1500 for s in firsts)


def test_rag_prompts_draw_popular_documents() -> None:
    t = traces.rag_queries(2_000, seed=5, documents=500, docs_per_query=3, zipf_alpha=1.2)
    docs = [d for req in t for d in req.prompt[1:4]]
    counts = np.bincount(docs)
    top = np.sort(counts)[::-1]
    assert top[0] > 20 * np.median(top[top > 0])  # Zipf: a few documents dominate
    assert all(len(set(req.prompt[1:4])) == 3 for req in t)  # distinct documents per prompt


def test_token_ids_are_deterministic_and_in_range() -> None:
    t = traces.rag_queries(50, seed=6)
    ids = t.prompt_token_ids(3)
    assert len(ids) == t.prompt_tokens[3]
    lo, hi = t.token_range
    assert min(ids) >= lo and max(ids) < hi
    # the same document gives the same tokens wherever it appears (two requests citing it)
    def at(i: int, seg: int) -> list[int]:
        segs = list(t[i].prompt)
        start = sum(int(t.seg_len[s]) for s in segs[:segs.index(seg)])
        return t.prompt_token_ids(i)[start:start + int(t.seg_len[seg])]

    doc, i, j = next((d, i, j) for i in range(len(t)) for j in range(i + 1, len(t))
                     for d in t[i].prompt[1:] if d in t[j].prompt[1:])
    assert at(i, doc) == at(j, doc) == t.segment_tokens(doc)
    other = next(d for d in t[i].prompt[1:] if d != doc)
    assert t.segment_tokens(other) != t.segment_tokens(doc)


def test_from_prompts_head_describe_merge() -> None:
    t = Trace.from_prompts([[5, 6, 7], [5, 6], [9]], sessions=[1, 1, None])
    assert len(t) == 3 and list(t.prompt_tokens) == [3, 2, 1]
    assert t.prompt_token_ids(0) == [5, 6, 7]
    assert t[2].session is None and t[0].session == 1
    h = traces.multi_turn_chats(100, seed=1).head(10)
    assert len(h) == 10 and h.describe()["requests"] == 10
    m = traces.merge(traces.multi_turn_chats(50, seed=1), traces.rag_queries(50, seed=1))
    assert len(m) == 100 and np.all(np.diff(m.arrival_s) >= 0)
    with pytest.raises(ValueError, match="non-empty"):
        Trace.from_prompts([[]])
    with pytest.raises(IndexError):
        t[3]


def test_a_100k_trace_is_compact() -> None:
    t = traces.multi_turn_chats(100_000, seed=0)
    size = sum(a.nbytes for a in (t.seg_len, t.prompt_ptr, t.prompt_segs, t.reply_seg, t.arrival_s,
                                  t.session, t.pin_segs))
    assert size < 16 << 20  # segments, not tokens: ~177M prompt tokens in a few MB
    assert t.prompt_tokens.sum() * 4 > 50 * size  # vs the prompts as int32 token ids
