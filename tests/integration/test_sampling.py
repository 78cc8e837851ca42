"""The sampling options on the real default model, as a user sees them: logprobs (checked
against the logits of the same context), min_tokens, frequency / presence penalties,
logit_bias and grammar_root; each bad value named."""

from __future__ import annotations

import collections
import math

import pytest

import workbench as wb
from workbench import _native
from workbench.engine.events import Token, TokenId
from workbench.engine.grammars import sampler_refused
from workbench.engine.kernel_rows import FA_TILE_ROWS
from workbench.errors import InvalidOption, SamplingFailed, UnknownOption
from workbench.options import LoadConfig, RequestOptions, build

pytestmark = pytest.mark.model


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


PROMPT = "The capital of France is"
POEM = chat("Write a poem about the sea.")
EMPTY_REPLY = "What is 2+2?"   # the instruct model ends at once: an empty reply
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
COPY = chat(f"Copy this code exactly:\n{CODE}")
EAGER = {"ngram": "simple", "size_n": 2, "size_m": 8, "adaptive": False}


class FreshContext:
    """The default model in a context of its own: every row's logits, or a native Sampler's."""

    def __init__(self, model_path) -> None:
        self.model = _native.Model(str(model_path), 0, True, False)
        self.ctx = _native.Context(self.model, build(LoadConfig, {"n_ctx": 1024, "n_seq_max": 1})
                                   .context_params(self.model.n_ctx_train))

    def decode(self, tokens: list[int]) -> None:
        n = len(tokens)
        assert self.ctx.decode(tokens, list(range(n)), [0] * n, [1] * n, 0.0) == 0

    def log_softmaxes_like_the_engine(self, prompt: list[int], generated: list[int]) -> list[dict[int, float]]:
        """The log-softmax before each generated token, computed on the kernels the engine
        uses (engine/kernel_rows.py): the prompt but its last token as prompt rows (tiled
        attention, padded to a tile), then each token alone on the reference kernels."""
        head = prompt[:-1]
        pad = max(0, FA_TILE_ROWS - len(head))
        rows = head + [head[-1]] * pad
        self.ctx.set_reference_kernels(False)
        assert self.ctx.decode(rows, list(range(len(rows))), [0] * len(rows), [0] * len(rows), 0.0) == 0
        self.ctx.seq_rm(0, len(head), -1)
        self.ctx.set_reference_kernels(True)
        out = []
        for i, token in enumerate([prompt[-1], *generated[:-1]]):
            assert self.ctx.decode([token], [len(head) + i], [0], [1], 0.0) == 0
            out.append(self.log_softmax(0))
        return out

    def log_softmax(self, row: int) -> dict[int, float]:
        logits = dict(_native.top_logits(self.ctx, row, self.model.n_vocab))
        top = max(logits.values())
        norm = top + math.log(sum(math.exp(v - top) for v in logits.values()))
        return {t: v - norm for t, v in logits.items()}

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


@pytest.fixture
def fresh(model_path):
    f = FreshContext(model_path)
    yield f
    f.close()


# --- logprobs -------------------------------------------------------------------------------

def test_logprobs_are_the_log_softmax_of_the_logits(model, fresh):
    events = list(wb.stream(model, PROMPT, response_tokens=12, logprobs=5))
    r = events[-1]
    assert r.logprobs is not None and len(r.logprobs) == len(r.tokens) == 12
    ids = [e for e in events if isinstance(e, TokenId)]
    assert [(e.id, e.logprob, e.top_logprobs) for e in ids] == [(lp.id, lp.logprob, lp.top) for lp in r.logprobs]
    prompt = wb.tokenize(model, PROMPT)
    wants = fresh.log_softmaxes_like_the_engine(prompt, list(r.tokens))
    for i, lp in enumerate(r.logprobs):
        want = wants[i]
        assert lp.id == r.tokens[i] and lp.logprob == pytest.approx(want[lp.id], abs=2e-3)
        assert len(lp.top) == 5 and lp.top[0].id == lp.id              # greedy: the most likely
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert [t.id for t in lp.top] == sorted(want, key=want.__getitem__, reverse=True)[:5]
        assert sum(math.exp(t.logprob) for t in lp.top) <= 1.0 + 1e-6
        assert lp.text == wb.detokenize(model, [lp.id]) or "\ufffd" in lp.text
    # a Token event carries the joint logprob of the tokens whose text it releases
    texts = [e for e in events if isinstance(e, Token)]
    assert sum(e.logprob for e in texts) == pytest.approx(sum(lp.logprob for lp in r.logprobs), abs=1e-4)


def test_the_full_distribution_sums_to_one(model_path, fresh):
    prompt = fresh.model.tokenize(PROMPT, True, True)
    fresh.decode(prompt)
    n_vocab = fresh.model.n_vocab
    sampler = _native.Sampler(fresh.model, {"temperature": 0.0, "logprobs": n_vocab})
    token = sampler.sample(fresh.ctx, len(prompt) - 1)
    logprob, top = sampler.last_logprobs()
    assert len(top) == n_vocab and top[0][0] == token and logprob == top[0][1]
    assert math.fsum(math.exp(lp) for _, lp in top) == pytest.approx(1.0, abs=1e-4)
    sampler.close()


def test_logprobs_are_taken_before_temperature(model):
    greedy = wb.complete(model, PROMPT, response_tokens=1, logprobs=4).logprobs[0]
    for seed in (1, 2, 3):
        hot = wb.complete(model, PROMPT, response_tokens=1, logprobs=4, temperature=1.5, top_k=0, seed=seed)
        lp = hot.logprobs[0]
        assert [t.id for t in lp.top] == [t.id for t in greedy.top]
        assert [t.logprob for t in lp.top] == pytest.approx([t.logprob for t in greedy.top], abs=1e-3)
        listed = {t.id: t.logprob for t in lp.top}
        if lp.id in listed:
            assert lp.logprob == pytest.approx(listed[lp.id], abs=1e-6)


def test_a_grammar_leaves_only_the_tokens_it_allows(model):
    r = wb.complete(model, chat("Is the sky blue? Answer yes or no."), grammar='root ::= "yes" | "no"',
                    logprobs=20)
    assert r.reply in ("yes", "no") and r.logprobs is not None
    first = r.logprobs[0]
    assert 0 < len(first.top) < 20                       # tokens of probability 0 are not listed
    assert all("yes".startswith(t.text) or "no".startswith(t.text) for t in first.top)
    assert math.fsum(math.exp(t.logprob) for t in first.top) == pytest.approx(1.0, abs=1e-4)


def test_logprobs_with_speculation_come_from_the_verify_rows(model):
    plain = wb.complete(model, COPY, response_tokens=40, logprobs=2)
    events = list(wb.stream(model, COPY, response_tokens=40, logprobs=2, speculative=EAGER))
    spec = events[-1]
    assert spec.stats.speculative["accepted"] > 0
    drafted = [e for e in events if isinstance(e, TokenId) and e.draft]
    assert drafted and all(e.logprob is not None and len(e.top_logprobs) == 2 for e in drafted)
    n = next((i for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens)) if a != b), len(plain.tokens))
    assert n > 10
    for a, b in zip(plain.logprobs[:n], spec.logprobs[:n]):
        assert a.id == b.id and a.logprob == pytest.approx(b.logprob, abs=2e-2)


def test_without_logprobs_nothing_is_computed(model):
    events = list(wb.stream(model, PROMPT, response_tokens=4))
    assert events[-1].logprobs is None
    assert all(e.logprob is None for e in events if isinstance(e, (Token, TokenId)))
    assert wb.complete(model, PROMPT, response_tokens=4, logprobs=0).logprobs[0].top == ()


# --- min_tokens -------------------------------------------------------------------------------

def test_min_tokens_prevents_the_empty_reply(model):
    assert wb.complete(model, EMPTY_REPLY, response_tokens=16).tokens == ()
    for extra in ({}, {"temperature": 0.7, "seed": 3}, {"logprobs": 1}):
        r = wb.complete(model, EMPTY_REPLY, response_tokens=16, min_tokens=6, **extra)
        assert len(r.tokens) >= 6 and r.reply.strip()
    assert wb.complete(model, EMPTY_REPLY, response_tokens=5, min_tokens=50).finish_reason == "length"


# --- penalties --------------------------------------------------------------------------------

def distinct(model, **opts) -> int:
    return len(collections.Counter(wb.complete(model, POEM, response_tokens=64, **opts).tokens))


@pytest.mark.parametrize("option", ["frequency_penalty", "presence_penalty"])
def test_a_penalty_varies_the_reply_and_a_negative_one_makes_it_loop(model, option):
    plain = distinct(model)
    assert distinct(model, **{option: 1.0}) > plain > distinct(model, **{option: -2.0})


@pytest.mark.parametrize("call", ["complete", "chat", "chat_stream"])
def test_a_repetition_penalty_of_zero_is_refused_naming_it(model, call):
    """0 passed validation and llama.cpp divided a seen token's positive logit by it: 2 of
    these 3 requests then failed as InvalidOption('logit_bias'), an option never given
    (issue 24)."""
    for text in (PROMPT, "Write a poem about the sea.", "List the days of the week:"):
        messages = [{"role": "user", "content": text}]
        with pytest.raises(InvalidOption) as e:
            if call == "complete":
                wb.complete(model, text, response_tokens=16, repetition_penalty=0)
            elif call == "chat":
                wb.chat(model, messages, response_tokens=16, repetition_penalty=0)
            else:
                wb.chat_stream(model, messages, response_tokens=16, repetition_penalty=0).result()
        assert (e.value.key, e.value.value) == ("repetition_penalty", 0)
        assert "in [0.01, 100.0]" in str(e.value)


def test_repetition_penalty_at_its_bounds_works(model):
    """The range's ends are usable and already total: 0.01 makes the reply loop, 100 makes
    it repeat no token."""
    assert distinct(model, repetition_penalty=0.01) <= 3
    r = wb.complete(model, POEM, response_tokens=64, repetition_penalty=100.0)
    assert len(r.tokens) > 16 and len(set(r.tokens)) == len(r.tokens)


def test_a_sampler_that_leaves_no_finite_logit_names_no_option(fresh):
    """Past validation (the native Sampler given a penalty of 0 directly), the argmax token
    seen once gets an infinite logit. The sampler says so, and the engine's error names no
    option the request lacks: SamplingFailed, not InvalidOption('logit_bias')."""
    prompt = fresh.model.tokenize(PROMPT, True, True)
    fresh.decode(prompt)
    row = len(prompt) - 1
    (top, logit), = _native.top_logits(fresh.ctx, row, 1)
    assert logit > 0
    sampler = _native.Sampler(fresh.model, {"repetition_penalty": 0.0})
    sampler.accept(top)
    with pytest.raises(ValueError) as e:
        sampler.sample(fresh.ctx, row)
    assert str(e.value).startswith("sampler: the shaped logits are not finite")
    assert isinstance(sampler_refused(build(RequestOptions, {}), e.value), SamplingFailed)
    err = sampler_refused(build(RequestOptions, {"logit_bias": {" Paris": -1.0}}), e.value)
    assert isinstance(err, SamplingFailed)     # a bias given, but not the cause


# --- logit_bias -------------------------------------------------------------------------------

def test_a_banned_token_never_appears(model):
    paris = wb.tokenize(model, " Paris", add_special=False)
    assert len(paris) == 1
    plain = wb.complete(model, PROMPT, response_tokens=16)
    assert paris[0] in plain.tokens
    for key in (" Paris", paris[0]):
        r = wb.complete(model, PROMPT, response_tokens=16, logit_bias={key: float("-inf")})
        assert paris[0] not in r.tokens and r.tokens != plain.tokens


def test_a_large_positive_bias_makes_a_token_appear(model):
    r = wb.complete(model, PROMPT, response_tokens=6, logit_bias={" banana": 30.0}, logprobs=1)
    banana = wb.tokenize(model, " banana", add_special=False)[0]
    assert r.tokens[0] == banana and "banana" in r.reply
    assert r.logprobs[0].logprob > -0.01                  # the bias is in the logprobs too


def test_a_bias_that_bans_every_token_ends_only_its_request(model):
    every = {t: float("-inf") for t in range(wb.model_info(model)["n_vocab"])}
    with pytest.raises(InvalidOption, match="logit_bias") as e:
        wb.complete(model, PROMPT, response_tokens=4, logit_bias=every)
    assert "no token can continue" in str(e.value)
    assert wb.complete(model, PROMPT, response_tokens=4).finish_reason == "length"


@pytest.mark.parametrize("constraint, words", [
    ({"grammar": 'root ::= "yes" | "no"'}, ("yes", "no")),
    ({"json_schema": {"type": "boolean"}}, ("true", "false")),
])
def test_a_bias_that_bans_what_the_grammar_allows_is_named(model, fresh, constraint, words):
    """Every token the grammar allows first is banned: the bias is the cause, not the grammar
    (it was named as InvalidOption('grammar'): issue 24)."""
    pieces = {t: fresh.model.token_to_piece(t, False).decode("utf-8", "replace") for t in range(fresh.model.n_vocab)}
    bias = {t: float("-inf") for t, p in pieces.items() if p and any(w.startswith(p) for w in words)}
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, PROMPT, response_tokens=4, logit_bias=bias, **constraint)
    assert e.value.key == "logit_bias"
    assert "the grammar some token it allows" in str(e.value)
    assert "logit_bias bans every token the grammar allows" in str(e.value)
    some = dict(list(bias.items())[:1])       # a bias that leaves the grammar a token: a reply
    assert wb.complete(model, PROMPT, response_tokens=4, logit_bias=some, **constraint).reply.strip() in words


def test_a_grammar_dead_end_is_not_blamed_on_a_bias_beside_it(model):
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, PROMPT, response_tokens=4, grammar='root ::= "a" "\\x00"',
                    logit_bias={" Paris": float("-inf")})
    assert e.value.key == "grammar" and "the grammar allows no token here" in str(e.value)


@pytest.mark.parametrize("bias, word", [
    ({" the capital": 1.0}, "exactly one token"),
    ({10**6: 1.0}, "token id of this model"),
    ({" Paris": float("inf")}, "bias"),
    ({" Paris": 101}, "bias"),
    ({" Paris": -1.0, 7042: 1.0}, "each token once"),
    ({1.5: 1.0}, "token id"),
    ([(" Paris", 1.0)], "dict"),
    ({str(i): 1.0 for i in range(50_000)}, "at most 49152 entries"),
])
def test_a_bad_logit_bias_is_named(model, bias, word):
    with pytest.raises(InvalidOption, match="logit_bias") as e:
        wb.complete(model, PROMPT, response_tokens=2, logit_bias=bias)
    assert word in str(e.value)
    assert wb.complete(model, PROMPT, response_tokens=2).finish_reason == "length"


# --- grammar_root -----------------------------------------------------------------------------

GRAMMAR = 'root ::= "no"\nanswer ::= "yes, " number\nnumber ::= [0-9]+'


def test_grammar_root_picks_the_start_rule(model):
    assert wb.complete(model, chat("Say something."), grammar=GRAMMAR).reply == "no"
    r = wb.complete(model, chat("How many legs has a cat?"), grammar=GRAMMAR, grammar_root="answer",
                    response_tokens=8)
    assert r.reply.startswith("yes, ") and r.reply[5:].isdigit()


@pytest.mark.parametrize("opts, word", [
    ({"grammar": GRAMMAR, "grammar_root": "missing"}, "a rule the grammar defines"),
    ({"grammar_root": "answer"}, "unless grammar is given"),
    ({"grammar": GRAMMAR, "grammar_root": "not a name"}, "GBNF rule name"),
])
def test_a_bad_grammar_root_is_named(model, opts, word):
    with pytest.raises(InvalidOption, match="grammar_root") as e:
        wb.complete(model, PROMPT, response_tokens=2, **opts)
    assert word in str(e.value)


# --- option values ----------------------------------------------------------------------------

@pytest.mark.parametrize("opts", [
    {"logprobs": 21}, {"logprobs": -1}, {"logprobs": True}, {"min_tokens": -1}, {"min_tokens": 1.5},
    {"frequency_penalty": 2.5}, {"presence_penalty": float("nan")}, {"frequency_penalty": "1"},
])
def test_bad_sampling_values_are_named(model, opts):
    (key,) = opts
    with pytest.raises(InvalidOption, match=key):
        wb.complete(model, PROMPT, response_tokens=2, **opts)


def test_a_misspelt_sampling_option_is_unknown(model):
    with pytest.raises(UnknownOption, match="top_logprobs"):
        wb.complete(model, PROMPT, response_tokens=2, top_logprobs=3)


def test_draft_tokens_takes_the_sampling_options(model):
    prefix = wb.tokenize(model, PROMPT)
    plain = wb.draft_tokens(model, prefix, max=4)
    banned = wb.draft_tokens(model, prefix, max=4, logit_bias={plain[0]: float("-inf")})
    assert plain and banned and banned[0] != plain[0]
    assert len(wb.draft_tokens(model, wb.tokenize(model, EMPTY_REPLY), max=4, min_tokens=3)) >= 3
