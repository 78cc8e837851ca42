"""POST /v1/completions through the official SDK: greedy replies equal wb.complete's token for
token, streamed or not; stop strings, n with a seed, several prompts, echo, logprobs; usage
counted from the engine's own Stats, cached tokens included."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench import samples

from .conftest import extra

pytestmark = pytest.mark.model

FRANCE = "The capital of France is"
STORY = "Once upon a time"
N = 10


def token_prompt(model: str) -> list[int]:
    return wb.tokenize(model, "The quick brown fox jumps over")


@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_greedy_completion_equals_wb_complete(model, client, kind):
    prompt = FRANCE if kind == "text" else token_prompt(model)
    want = wb.complete(model, prompt, response_tokens=N, temperature=0)
    r = client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=0)
    [choice] = r.choices
    assert choice.index == 0 and choice.text == want.reply and choice.finish_reason == want.finish_reason == "length"
    assert r.object == "text_completion" and r.model == model and r.id.startswith("cmpl-")
    assert r.usage.completion_tokens == want.stats.generated_tokens == N
    assert r.usage.prompt_tokens == want.stats.prompt_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    [facts] = extra(r)["requests"]
    assert set(facts) >= {"ref", "cache_hit_kind", "cached_tokens", "prefilled_tokens"}
    assert facts["cached_tokens"] + facts["prefilled_tokens"] == r.usage.prompt_tokens
    assert facts["cached_tokens"] == r.usage.prompt_tokens_details.cached_tokens
    assert facts["ref"] != want.ref


@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_streamed_deltas_join_to_the_greedy_reply(model, client, kind):
    prompt = STORY if kind == "text" else token_prompt(model)
    want = wb.complete(model, prompt, response_tokens=N, temperature=0)
    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    *body, last = chunks
    with_choice = [c for c in body if c.choices]
    assert "".join(c.choices[0].text for c in with_choice) == want.reply
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in with_choice][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in with_choice[:-1])
    assert last.choices == [] and last.usage.completion_tokens == N
    assert last.usage.prompt_tokens == want.stats.prompt_tokens


def test_a_stop_string_ends_the_reply_and_never_shows(model, client):
    want = wb.complete(model, FRANCE, response_tokens=N, temperature=0, stop_sequences=["."])
    assert want.finish_reason == "stop" and want.stats.generated_tokens < N   # the greedy reply has a "."
    r = client.completions.create(model=model, prompt=FRANCE, max_tokens=N, temperature=0, stop=["."])
    assert r.choices[0].text == want.reply and "." not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=model, prompt=FRANCE, max_tokens=N, temperature=0, stop=".",
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want.reply
    assert streamed[-1].choices[0].finish_reason == "stop"


@pytest.mark.load(deterministic=True, n_seq_max=2)
def test_n_choices_with_a_seed_are_reproducible(fresh_model, client):
    """Choice i samples with seed + i: each choice is what a notebook gets alone with that
    seed, and the same request gives the same choices. (Batch-invariant kernels: on the
    default ones a sampled reply may change with what shares the batch.)"""
    m = fresh_model

    def ask():
        return client.completions.create(model=m, prompt=STORY, max_tokens=6, n=2, seed=1234, temperature=1.0)

    a, b = ask(), ask()
    assert [c.index for c in a.choices] == [0, 1]
    alone = [wb.complete(m, STORY, response_tokens=6, seed=s, temperature=1.0, top_p=1.0, top_k=0).reply
             for s in (1234, 1235)]
    assert [c.text for c in a.choices] == [c.text for c in b.choices] == alone
    assert [f["seed"] for f in extra(a)["requests"]] == [1234, 1235]
    assert a.usage.completion_tokens == 12 and a.usage.prompt_tokens == 2 * len(wb.tokenize(m, STORY))
    assert len({f["ref"] for f in extra(a)["requests"]}) == 2      # a request of its own per choice


@pytest.mark.model
@pytest.mark.load(deterministic=True, n_seq_max=4)
def test_best_of_returns_the_best_choices_by_mean_logprob(fresh_model, client):
    m = fresh_model
    r = client.completions.create(model=m, prompt=STORY, max_tokens=6, n=1, best_of=3, seed=50, temperature=1.0)
    assert [c.index for c in r.choices] == [0] and r.choices[0].logprobs is None   # none asked for
    every = wb.complete(m, STORY, n=3, seed=50, logprobs=0, response_tokens=6, temperature=1.0, top_p=1.0, top_k=0)
    assert r.choices[0].text == max(every, key=samples.score).reply
    assert r.usage.completion_tokens == 18      # the three samples were generated
    assert [f["cache_hit_kind"] for f in extra(r)["requests"]] in (["cold"], ["shared"])


def test_a_list_of_prompts_gives_a_choice_per_prompt_in_order(model, client):
    prompts = [FRANCE, STORY]
    wants = [wb.complete(model, p, response_tokens=6, temperature=0) for p in prompts]
    r = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [w.reply for w in wants]
    assert r.usage.prompt_tokens == sum(w.stats.prompt_tokens for w in wants)
    assert r.usage.completion_tokens == 12


def test_echo_prepends_the_prompt(model, client):
    want = wb.complete(model, FRANCE, response_tokens=4, temperature=0)
    r = client.completions.create(model=model, prompt=FRANCE, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == FRANCE + want.reply
    ids = token_prompt(model)
    want = wb.complete(model, ids, response_tokens=4, temperature=0)
    chunks = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == wb.detokenize(model, ids) + want.reply


def test_echo_with_logprobs_gives_the_prompts_own_logprobs(model, client):
    """lm-evaluation-harness's local-completions asks for a loglikelihood this way: echo the
    prompt with logprobs and read the prompt's part. They are wb.score's (the same
    definition as wb.loglikelihood), the first token's null, then the reply's."""
    ids = wb.tokenize(model, FRANCE)
    scored = wb.score(model, ids, top=2)
    r = client.completions.create(model=model, prompt=FRANCE, max_tokens=3, temperature=0, echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    n = len(ids)
    assert lp.tokens[:n] == scored.pieces and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:n] == pytest.approx(list(scored.logprobs[1:]), abs=1e-3)
    for got, alts in zip(lp.top_logprobs[1:n], scored.top[1:]):
        assert sorted(got.values(), reverse=True) == pytest.approx([x for _, x in alts], abs=1e-3)
    assert len(lp.tokens) == n + 3 and "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[n] == len(FRANCE) and lp.text_offset[:2] == [0, len(lp.tokens[0])]
    chunks = list(client.completions.create(model=model, prompt=FRANCE, max_tokens=3, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    first = chunks[0].choices[0]
    assert first.text == FRANCE and first.logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:n], abs=1e-3)


def test_logprobs_equal_the_engines(model, client):
    want = wb.complete(model, FRANCE, response_tokens=5, temperature=0, logprobs=2)
    r = client.completions.create(model=model, prompt=FRANCE, max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == [e.text for e in want.logprobs] and "".join(lp.tokens) == r.choices[0].text
    assert lp.token_logprobs == pytest.approx([e.logprob for e in want.logprobs], abs=1e-4)
    assert len(lp.top_logprobs) == 5 and all(len(top) == 2 for top in lp.top_logprobs)
    for top, e in zip(lp.top_logprobs, want.logprobs):
        assert top == pytest.approx({t.text: t.logprob for t in e.top}, abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]


def test_cached_tokens_are_the_tokens_the_cache_served(model, client):
    """The same prompt twice: the first is prefilled whole, the second reads all but the
    last tokens from the prefix cache; usage says so, and the reply is the same."""
    prompt = " ".join(["The quick brown fox jumps over the lazy dog while the cat sleeps."] * 4)
    first, second = (client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
                     for _ in range(2))
    [f1], [f2] = extra(first)["requests"], extra(second)["requests"]
    assert first.usage.prompt_tokens == second.usage.prompt_tokens > 40
    assert first.usage.prompt_tokens_details.cached_tokens == f1["cached_tokens"] == 0
    assert f1["prefilled_tokens"] == first.usage.prompt_tokens and f1["cache_hit_kind"] == "cold"
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == f2["cached_tokens"] == second.usage.prompt_tokens - f2["prefilled_tokens"]
    assert cached > 0 and f2["cache_hit_kind"] != "cold"
    assert second.choices[0].text == first.choices[0].text
