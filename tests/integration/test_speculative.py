"""Speculative decoding on the real default model: what a user notices.

Greedy speculative output is plain greedy output; n-gram drafts are accepted on a reply
that repeats its prompt; stop sequences, response_tokens, cancel and sessions behave as
without speculation; draft_tokens / verify answer erllama's questions and name bad input.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
from typing import Any

import pytest

import workbench as wb
from workbench import _native
from workbench.errors import InvalidOption, NotLoaded, UnknownOption
from workbench.options import LoadConfig, build

pytestmark = pytest.mark.model

CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n")
COPY = f"<|im_start|>user\nCopy this code exactly:\n{CODE}<|im_end|>\n<|im_start|>assistant\n"
# short keys so drafts are frequent on free text too: the equality test must verify drafts
EAGER = {"ngram": "simple", "size_n": 2, "size_m": 8, "adaptive": False}
STORY = ("<|im_start|>user\nWrite a long story about a dragon who learns to bake bread.<|im_end|>\n"
         "<|im_start|>assistant\n")


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = [
    COPY,
    chat("Repeat this sentence three times: the quick brown fox jumps over the lazy dog."),
    chat("List the numbers from one to twenty in words, separated by commas."),
    chat("Write a short poem about the sea."),
    chat("Explain what a hash table is."),
    "Once upon a time, in a small village by the river,",
    chat("Translate to French: I like apples. I like pears. I like apples and pears."),
    chat("Write a Python function that returns the factorial of n, then call it for 1, 2 and 3."),
]


@pytest.fixture(scope="module")
def spec_model(model_path):
    mid = wb.load_model(model_path=str(model_path), model_id="speculative-test", n_seq_max=4)
    yield mid
    wb.unload(mid)


def top2_gap(model_path, tokens: list[int]) -> float:
    """The target's top-2 logit gap after ``tokens`` (decoded alone, a fresh context)."""
    m = _native.Model(str(model_path), 0, True, False)
    ctx = _native.Context(m, build(LoadConfig, {"n_ctx": 1024, "n_seq_max": 1}).context_params(m.n_ctx_train))
    try:
        n = len(tokens)
        assert ctx.decode(tokens, list(range(n)), [0] * n, [0] * (n - 1) + [1], 0.0) == 0
        (_, a), (_, b) = _native.top_logits(ctx, n - 1, 2)
        return a - b
    finally:
        ctx.close()
        m.close()


def test_greedy_speculative_output_is_plain_greedy_output(spec_model, model_path):
    equal, drafted, report = 0, 0, []
    for prompt in PROMPTS:
        plain = wb.complete(spec_model, prompt, response_tokens=64)
        spec = wb.complete(spec_model, prompt, response_tokens=64, speculative=EAGER)
        drafted += spec.stats.speculative["drafted"]
        if spec.tokens == plain.tokens:
            equal += 1
            continue
        i = next(i for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens)) if a != b)
        gap = top2_gap(model_path, wb.tokenize(spec_model, prompt) + list(plain.tokens[:i]))
        report.append(f"prompt {PROMPTS.index(prompt)} diverges at token {i}: top-2 logit gap {gap:.4f}")
    print("\n".join(report) or "all 8 prompts equal")
    assert drafted > 100, "the drafts must actually be verified for this to mean anything"
    assert equal >= 7, report


def test_ngram_drafts_are_accepted_on_a_reply_that_repeats_the_prompt(spec_model):
    before = wb.counters()
    for kind in ("simple", "map_k", "cache"):
        r = wb.complete(spec_model, COPY, response_tokens=96,
                        speculative={"ngram": kind, "size_n": 3, "adaptive": False})
        s = r.stats.speculative
        assert s["kind"] == {"simple": "ngram-simple", "map_k": "ngram-map-k", "cache": "ngram-cache"}[kind]
        assert s["accepted"] > 0 and 0 < s["acceptance"] <= 1 and s["accepted"] <= s["drafted"]
        assert sum(n * c for n, c in s["draft_lengths"].items()) == s["drafted"] and s["steps"] > 0
        assert s["accepted_by_position"][0] >= s["accepted_by_position"][-1]
        assert sum(s["accepted_by_position"]) == s["accepted"]
        assert s["acceptance"] == s["accepted"] / s["drafted"]      # exactly: the rate over verified drafts
        assert s["verify_s"] > 0 and s["draft_s"] >= 0
        # the reply copies the code: most of what was generated came from accepted drafts
        assert CODE.split("\n")[0] in r.reply
    after = wb.counters()
    assert after["spec_accepted"] > before["spec_accepted"] and after["spec_drafted"] > before["spec_drafted"]
    assert wb.complete(spec_model, COPY, response_tokens=8).stats.speculative is None


def test_adaptive_speculation_turns_itself_off_where_drafts_are_poor(spec_model):
    plain = wb.complete(spec_model, STORY, response_tokens=128)
    # the policy decides on measured step times: on a loaded machine one run's timings may not
    # show it yet, so up to 3 runs (each must still give the plain reply); a policy that never
    # turns off fails all three
    for _ in range(3):
        r = wb.complete(spec_model, STORY, response_tokens=128, speculative={"ngram": "simple", "size_n": 2})
        s = r.stats.speculative
        assert r.tokens == plain.tokens
        if s["decisions"]["off"] >= 1:
            break
    assert s["adaptive"] and s["decisions"]["off"] >= 1 and s["off_steps"] > 0
    assert s["plain_steps"] > len(r.tokens) // 2      # most steps decoded without a draft
    assert s["steps"] < 16 and s["plain_step_s"] > 0
    fixed = wb.complete(spec_model, STORY, response_tokens=128,
                        speculative={"ngram": "simple", "size_n": 2, "adaptive": False}).stats.speculative
    assert fixed["off_steps"] == 0 and fixed["decisions"] == {"off": 0, "on": 0, "probes": 0}


def test_accepted_draft_tokens_are_marked_in_the_stream(spec_model):
    spec = {"ngram": "simple", "size_n": 4, "size_m": 16, "adaptive": False}
    plain = [ev for ev in wb.stream(spec_model, COPY, response_tokens=64) if isinstance(ev, wb.TokenId)]
    events = list(wb.stream(spec_model, COPY, response_tokens=64, speculative=spec))
    ids = [ev for ev in events if isinstance(ev, wb.TokenId)]
    done = events[-1]
    assert isinstance(done, wb.Done) and [e.id for e in ids] == [e.id for e in plain] == list(done.tokens)
    assert not any(e.draft for e in plain) and wb.TokenId(5) == wb.TokenId(5, False)
    marked = sum(e.draft for e in ids)
    s = done.stats.speculative
    assert 0 < marked == s["accepted"] < len(ids)
    # the acceptance from the stream's own counts: tokens marked accepted over draft tokens verified
    assert s["acceptance"] == marked / sum(n * c for n, c in s["draft_lengths"].items())


def test_stop_sequences_and_response_tokens_cut_an_accepted_run_as_plain_decoding_does(spec_model):
    spec = {"ngram": "simple", "size_n": 3}
    plain = wb.complete(spec_model, COPY, response_tokens=96, stop_sequences=["def mul"])
    fast = wb.complete(spec_model, COPY, response_tokens=96, stop_sequences=["def mul"], speculative=spec)
    assert fast.finish_reason == plain.finish_reason == "stop" and fast.stop_sequence == "def mul"
    assert fast.reply == plain.reply and "def mul" not in fast.reply and fast.tokens == plain.tokens
    plain = wb.complete(spec_model, COPY, response_tokens=40)
    for n in (1, 2, 17, 40):
        r = wb.complete(spec_model, COPY, response_tokens=n, speculative=spec)
        assert r.finish_reason == "length" and list(r.tokens) == list(plain.tokens[:n])


def test_cancel_mid_speculation_ends_the_request_and_leaves_the_model_sound(spec_model):
    plain = wb.complete(spec_model, COPY, response_tokens=80)
    s = wb.stream(spec_model, COPY, response_tokens=200, speculative={"ngram": "simple", "size_n": 3})
    seen = 0
    for ev in s:
        if isinstance(ev, wb.TokenId):
            seen += 1
            if seen == 30:
                s.cancel()
        if isinstance(ev, wb.Done):
            assert ev.finish_reason == "cancelled" and 30 <= len(ev.tokens) < 200
    assert wb.complete(spec_model, COPY, response_tokens=80).tokens == plain.tokens
    assert wb.model_info(spec_model)["available_seqs"] == 4


def test_a_session_keeps_accepted_tokens_only(spec_model):
    spec = {"ngram": "simple", "size_n": 3}
    a = wb.complete(spec_model, COPY, response_tokens=60, session_id="plain-s")
    b = wb.complete(spec_model, COPY, response_tokens=60, session_id="spec-s", speculative=spec)
    held = {s["session_id"]: s["tokens"] for s in wb.sessions(spec_model)}
    assert a.tokens == b.tokens and held["spec-s"] == held["plain-s"]
    more = wb.tokenize(spec_model, "\nAgain, please.", add_special=False)
    na = wb.continue_session(spec_model, "plain-s", more, response_tokens=24)
    nb = wb.continue_session(spec_model, "spec-s", more, response_tokens=24, speculative=spec)
    assert na.tokens == nb.tokens
    wb.end_session(spec_model, "plain-s")
    wb.end_session(spec_model, "spec-s")


def test_draft_tokens_and_verify_agree_with_greedy_generation(spec_model):
    prefix = wb.tokenize(spec_model, "The capital of France is")
    plain = list(wb.complete(spec_model, prefix, response_tokens=7).tokens)
    draft = wb.draft_tokens(spec_model, prefix, max=6)
    assert draft == plain[:6]
    assert wb.verify(spec_model, prefix, draft, 6) == {"accepted": 6, "next": plain[6]}
    wrong = draft[:3] + [(draft[3] + 1) % 49152] + draft[4:]
    assert wb.verify(spec_model, prefix, wrong, 6) == {"accepted": 3, "next": draft[3]}
    assert wb.verify(spec_model, prefix, draft, 2) == {"accepted": 2, "next": draft[2]}
    # an ended reply: the argmax after all of it is end-of-generation
    done = wb.complete(spec_model, chat("Say yes."), response_tokens=32)
    assert done.finish_reason == "stop"
    assert wb.verify(spec_model, wb.tokenize(spec_model, chat("Say yes.")), list(done.tokens)) == {
        "accepted": len(done.tokens), "next": "eos"}
    # shorter at the end of generation, and no KV or cache row left behind
    reply = wb.tokenize(spec_model, chat("Say yes.")) + list(done.tokens)
    assert len(wb.draft_tokens(spec_model, reply[:-1], max=8)) <= 1
    fresh = wb.tokenize(spec_model, "The capital of Italy is")
    wb.verify(spec_model, fresh, draft)
    wb.draft_tokens(spec_model, fresh, max=4)
    assert wb.cached_prefix_len(spec_model, fresh + draft) == 0
    assert wb.model_info(spec_model)["available_seqs"] == 4


def test_verify_runs_while_the_model_serves_another_request(spec_model):
    prefix = wb.tokenize(spec_model, "The capital of France is")
    draft = wb.draft_tokens(spec_model, prefix, max=4)
    s = wb.stream(spec_model, COPY, response_tokens=64)
    answers = [wb.verify(spec_model, prefix, draft) for _ in range(3)]
    assert s.result().finish_reason in ("stop", "length")
    assert all(a["accepted"] == 4 for a in answers)


def test_bad_speculative_input_is_named(spec_model):
    prefix = wb.tokenize(spec_model, "Hello")
    cases = [
        (lambda: wb.verify(spec_model, [], [1], 1), InvalidOption, "prefix_tokens"),
        (lambda: wb.verify(spec_model, prefix, [1, 2], 0), InvalidOption, "'k'"),
        (lambda: wb.verify(spec_model, prefix, [1, 2], 3), InvalidOption, "'k'"),
        (lambda: wb.verify(spec_model, prefix, [], 1), InvalidOption, "candidates"),
        (lambda: wb.verify(spec_model, prefix, [10**9], 1), InvalidOption, "candidates"),
        (lambda: wb.draft_tokens(spec_model, [], max=2), InvalidOption, "prefix_tokens"),
        (lambda: wb.draft_tokens(spec_model, prefix, max=0), InvalidOption, "'max'"),
        (lambda: wb.draft_tokens(spec_model, prefix, response_tokens=2), UnknownOption, "response_tokens"),
        (lambda: wb.complete(spec_model, prefix, speculative={"ngram": "simple", "n_maxx": 2}), UnknownOption,
         "n_maxx"),
        (lambda: wb.complete(spec_model, prefix, speculative={"ngram": "bigram"}), InvalidOption, "bigram"),
        (lambda: wb.complete(spec_model, prefix, speculative={"ngram": "simple", "n_max": 0}), InvalidOption,
         "n_max"),
        (lambda: wb.complete(spec_model, prefix, speculative={"n_max": 4}), InvalidOption, "exactly one"),
        (lambda: wb.complete(spec_model, prefix, speculative={"ngram": "simple", "n_min": 9, "n_max": 4}),
         InvalidOption, "n_min"),
        (lambda: wb.complete(spec_model, prefix, speculative="ngram"), InvalidOption, "speculative"),
        (lambda: wb.complete(spec_model, prefix, speculative={"draft": spec_model}), InvalidOption, "another"),
        (lambda: wb.complete(spec_model, prefix, speculative={"draft": "no-such-model"}), NotLoaded,
         "no-such-model"),
        (lambda: wb.complete(spec_model, prefix, speculative={"draft": "x", "ngram": "simple"}), InvalidOption,
         "exactly one"),
        (lambda: wb.complete(spec_model, prefix, speculative={"ngram": "simple", "p_min": 0.5}), InvalidOption,
         "p_min"),
    ]
    for call, err, says in cases:
        with pytest.raises(err, match=says):
            call()
    assert wb.complete(spec_model, prefix, response_tokens=4).finish_reason in ("stop", "length")


# --- a draft model -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def draft_model(model_path):
    """A second instance of the default model: the same vocabulary, so every draft token
    is the target's own argmax up to batch non-invariance."""
    mid = wb.load_model(model_path=str(model_path), model_id="speculative-draft", n_seq_max=2)
    yield mid
    wb.unload(mid)


def test_a_draft_models_greedy_drafts_change_nothing(spec_model, draft_model):
    # a draft model as fast as the target seldom gets a draft back in time (the target does
    # not wait for it): test_speculative_draft.py has the target busy so that drafts arrive
    for prompt in PROMPTS[:3]:
        plain = wb.complete(spec_model, prompt, response_tokens=48)
        r = wb.complete(spec_model, prompt, response_tokens=48, speculative={"draft": draft_model, "n_max": 6,
                                                                                   "adaptive": False})
        s = r.stats.speculative
        assert r.tokens == plain.tokens and r.finish_reason == plain.finish_reason
        assert s["kind"] == f"draft:{draft_model}" and s["draft_s"] > 0 and s["draft_failures"] == 0
        assert s["drafted"] == 0 or (s["acceptance"] > 0.8 and max(s["draft_lengths"]) <= 6)
    # its drafting sessions end with the request: the draft model's sequences are free again
    assert wb.sessions(draft_model) == [] and wb.model_info(draft_model)["available_seqs"] == 2


def test_a_draft_model_that_is_unloaded_mid_way_leaves_plain_decoding(spec_model, model_path):
    mid = wb.load_model(model_path=str(model_path), model_id="speculative-gone", n_seq_max=1)
    plain = wb.complete(spec_model, COPY, response_tokens=40)
    s = wb.stream(spec_model, COPY, response_tokens=40, speculative={"draft": mid})
    wb.unload(mid)
    r = s.result()
    assert r.tokens == plain.tokens


@pytest.mark.heavy
def test_a_draft_model_with_another_vocabulary_is_refused_at_the_first_request(spec_model):
    from .heavy_models import QWEN_CODER_05B, fetch_chunked

    qwen = wb.load_model(model_path=str(fetch_chunked(QWEN_CODER_05B)), model_id="qwen-draft", n_seq_max=1)
    try:
        with pytest.raises(InvalidOption, match="vocabulary"):
            wb.complete(spec_model, "Hello", speculative={"draft": qwen})
    finally:
        wb.unload(qwen)


# --- temperature > 0: the output is distributed as plain sampling's -----------------------------

def chi_square_p(a: collections.Counter, b: collections.Counter, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Two-sample chi-square homogeneity test over the categories of a and b (those with an
    expected count under ``min_expected`` pooled into one); (statistic, p-value by the
    Wilson-Hilferty approximation, degrees of freedom)."""
    na, nb = sum(a.values()), sum(b.values())
    rows: dict[object, list[int]] = collections.defaultdict(lambda: [0, 0])
    for key in set(a) | set(b):
        big = (a[key] + b[key]) * min(na, nb) / (na + nb) >= min_expected
        rows[key if big else "pooled"][0] += a[key]
        rows[key if big else "pooled"][1] += b[key]
    stat = 0.0
    for oa, ob in rows.values():
        for obs, n in ((oa, na), (ob, nb)):
            exp = (oa + ob) * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    df = max(1, len(rows) - 1)
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return stat, 0.5 * math.erfc(z / math.sqrt(2)), df


def test_sampled_speculative_tokens_follow_the_plain_distribution(spec_model):
    n, positions = 300, (3, 6, 9)
    spec = {"ngram": "simple", "size_n": 2, "size_m": 8, "adaptive": False}
    plain: dict[int, collections.Counter] = {i: collections.Counter() for i in positions}
    fast: dict[int, collections.Counter] = {i: collections.Counter() for i in positions}
    accepted = 0

    def draw(seed: int) -> tuple[Any, Any]:   # distinct seeds on each side: two samples, not one replayed
        a = wb.complete(spec_model, COPY, response_tokens=10, temperature=1.5, top_k=3, seed=seed)
        b = wb.complete(spec_model, COPY, response_tokens=10, temperature=1.5, top_k=3, seed=10**6 + seed,
                        speculative=spec)
        return a, b

    # four at a time (the model's n_seq_max): the engine batches them, the draws stay independent
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pairs = list(pool.map(draw, range(n)))
    for a, b in pairs:
        accepted += b.stats.speculative["accepted"]
        for i in positions:
            plain[i][a.tokens[i] if len(a.tokens) > i else -1] += 1
            fast[i][b.tokens[i] if len(b.tokens) > i else -1] += 1
    assert accepted > 100, "drafts must be accepted under sampling for this to test the rule"
    for i in positions:
        stat, p, df = chi_square_p(plain[i], fast[i])
        print(f"token {i}: chi-square {stat:.1f}, df {df}, p {p:.3f}")
        assert p > 0.001 / len(positions), (i, plain[i].most_common(5), fast[i].most_common(5))
