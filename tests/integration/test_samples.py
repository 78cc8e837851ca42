"""Parallel sampling (workbench/samples.py): n samples of one prompt from one prefill, best_of
ranked by mean logprob per token, one stream of events tagged with the sample index."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench import samples
from workbench.errors import InvalidOption

pytestmark = pytest.mark.model

PROMPT = "Write one sentence about the sea, the wind and the boats in the harbour. " * 8
SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "response_tokens": 8}


@pytest.mark.load(n_seq_max=4, deterministic=True)
def test_n_samples_share_one_prefill_and_each_is_its_seeds_reply(fresh_model):
    m = fresh_model
    res = wb.complete(m, PROMPT, n=4, seed=100, **SAMPLING)
    assert [r.stats.seed for r in res] == [100, 101, 102, 103]
    assert [r.stats.cache_hit_kind for r in res] == ["cold", "shared", "shared", "shared"]
    n_prompt = res[0].stats.prompt_tokens
    assert [r.stats.prefilled_tokens for r in res] == [n_prompt, 1, 1, 1]   # the prompt computed once
    alone = [wb.complete(m, PROMPT, seed=s, cache=False, **SAMPLING).tokens for s in (100, 101, 102, 103)]
    assert [r.tokens for r in res] == alone
    assert len({r.tokens for r in res}) > 1      # samples, not one reply four times


@pytest.mark.load(n_seq_max=4)
def test_best_of_keeps_the_n_of_highest_mean_logprob(fresh_model):
    m = fresh_model
    every = wb.complete(m, PROMPT, n=4, seed=7, logprobs=0, **SAMPLING)
    kept = wb.complete(m, PROMPT, n=2, best_of=4, seed=7, **SAMPLING)
    ranked = sorted(every, key=samples.score, reverse=True)[:2]
    assert [r.tokens for r in kept] == [r.tokens for r in ranked]
    assert samples.score(kept[0]) >= samples.score(kept[1]) > -float("inf")


@pytest.mark.load(n_seq_max=4)
def test_a_sample_stream_tags_every_event_with_its_sample(fresh_model):
    s = wb.stream(fresh_model, PROMPT, n=3, seed=1, **SAMPLING)
    events = list(s)
    ends = [e.index for e in events if isinstance(e.event, wb.Done)]
    assert sorted(ends) == [0, 1, 2] and s.ended
    res = s.result()
    for i, r in enumerate(res):
        text = "".join(e.event.text for e in events if e.index == i and isinstance(e.event, wb.Token))
        assert text == r.reply
    assert [len(r.tokens) for r in res] == [8, 8, 8]


@pytest.mark.load(n_seq_max=4)
def test_chat_samples(fresh_model):
    # a prompt past WAIT_MIN_TOKENS (64): the later samples wait for the first's prefill however
    # the loop's ticks fall (a shorter one is shared only when its prefill is already done)
    msgs = [{"role": "user", "content": PROMPT + "Name a colour."}]
    res = wb.chat(fresh_model, msgs, n=3, seed=5, **SAMPLING)
    assert len(res) == 3 and all(isinstance(r, wb.ChatResult) for r in res)
    assert [r.stats.cache_hit_kind for r in res][1:] == ["shared", "shared"]


def test_bad_counts_name_the_option(model):
    for kwargs, key in (({"n": 0}, "n"), ({"n": 17}, "n"), ({"n": 3, "best_of": 2}, "best_of"),
                        ({"n": True}, "n"), ({"best_of": "4"}, "best_of")):
        with pytest.raises(InvalidOption) as e:
            wb.complete(model, "Hi", **kwargs)
        assert e.value.key == key, kwargs
    with pytest.raises(InvalidOption) as e:
        wb.stream(model, "Hi", n=0)
    assert e.value.key == "n"
    assert wb.requests() == []      # nothing was submitted
