"""Draft-model speculation on the real default model as both target and draft (the same
vocabulary): the target never waits for the draft model, and p_min cuts drafts where the
draft model is unsure. What a user notices: the reply is plain greedy decoding's, a busy
draft model does not slow the target down, and p_min changes how much is drafted.

A draft model as fast as its target never gets ahead of it (the target decodes plainly
while a draft is out, and has emitted the draft's tokens itself by the time it is back).
Drafts come back in time where the target is the slower: here, while its decodes also
carry another request's long prefill in chunks of n_batch 128.
"""

from __future__ import annotations

import time

import pytest

import workbench as wb
from workbench.errors import InvalidOption

from .test_speculative import top2_gap

pytestmark = pytest.mark.model

CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n")
COPY = f"<|im_start|>user\nCopy this code exactly:\n{CODE}<|im_end|>\n<|im_start|>assistant\n"
STORY = ("<|im_start|>user\nWrite a long story about a dragon who learns to bake bread.<|im_end|>\n"
         "<|im_start|>assistant\n")


LONG = "The quick brown fox jumps over the lazy dog. " * 100     # about 1,000 tokens to prefill


@pytest.fixture(scope="module")
def target(model_path):
    mid = wb.load_model(model_path=str(model_path), model_id="spec-draft-target", n_seq_max=2, n_ctx=4096,
                        n_batch=128)
    yield mid
    wb.unload(mid)


@pytest.fixture(scope="module")
def drafter(model_path):
    """The default model again, one sequence: whatever occupies it keeps drafts from coming."""
    mid = wb.load_model(model_path=str(model_path), model_id="spec-draft-drafter", n_seq_max=1, n_ctx=4096)
    yield mid
    wb.unload(mid)


def test_a_busy_draft_model_does_not_hold_the_target_back(target, drafter):
    plain = wb.complete(target, STORY, response_tokens=24)
    # the draft model's only sequence is busy for far longer than the target's reply takes
    blocker = wb.stream(drafter, STORY, response_tokens=3000, ignore_eos=True, cache=False)
    try:
        t0 = time.perf_counter()
        r = wb.complete(target, STORY, response_tokens=24, speculative={"draft": drafter, "adaptive": False})
        took = time.perf_counter() - t0
        s = r.stats.speculative
        assert r.tokens == plain.tokens
        assert s["draft_not_ready"] >= 20 and s["drafted"] == 0     # every step decoded plainly, none waited
        assert not blocker.wait(0), f"the target took {took:.1f} s: as long as the draft model's whole reply"
    finally:
        blocker.cancel()
        blocker.result()
    # its drafting session ended with it, though its draft request was queued behind the blocker
    assert wb.sessions(drafter) == [] and wb.model_info(drafter)["available_seqs"] == 1


def while_busy(target: str, prompt: str, n: int, spec: dict) -> wb.CompletionResult:
    """A speculative request while the target also prefills LONG for another request."""
    s = wb.stream(target, prompt, response_tokens=n, speculative=spec)
    other = wb.stream(target, LONG, response_tokens=1, cache=False)
    try:
        return s.result()
    finally:
        other.result()


def same_or_near_tie(model_path, target: str, prompt: str, plain: tuple, got: tuple) -> None:
    """Equal, or they part where the target's top two logits are within 0.5 (a verify row
    that shared a micro-batch with the prefill chunk: batch non-invariance, docs/speculative.md)."""
    if got == plain:
        return
    i = next((i for i, (a, b) in enumerate(zip(plain, got)) if a != b), min(len(plain), len(got)))
    gap = top2_gap(model_path, wb.tokenize(target, prompt) + list(plain[:i]))
    print(f"diverges at token {i}: top-2 logit gap {gap:.4f}")
    assert gap < 0.5, (i, gap)


def test_drafts_that_come_back_are_accepted_and_the_reply_is_plain_greedy(target, drafter):
    plain = wb.complete(target, COPY, response_tokens=48)
    r = while_busy(target, COPY, 48, {"draft": drafter, "n_max": 8, "adaptive": False})
    s = r.stats.speculative
    assert r.tokens == plain.tokens and r.finish_reason == plain.finish_reason
    assert s["accepted"] > 10 and s["acceptance"] > 0.8 and max(s["draft_lengths"]) <= 8   # measured: 39 of 39
    assert s["draft_failures"] == 0
    assert wb.sessions(drafter) == []


def test_p_min_drafts_only_what_the_draft_model_is_sure_of(target, drafter, model_path):
    plain = wb.complete(target, STORY, response_tokens=48)
    runs = {}
    for p_min in (0.0, 0.6, 1.0):
        r = while_busy(target, STORY, 48, {"draft": drafter, "n_max": 8, "adaptive": False, "p_min": p_min})
        same_or_near_tie(model_path, target, STORY, plain.tokens, r.tokens)
        runs[p_min] = r.stats.speculative
    # no token has probability 1 exactly: p_min 1 drafts nothing; 0.6 cuts drafts short
    assert runs[1.0]["drafted"] == 0 and runs[1.0]["draft_not_ready"] > 0
    mean = {p: s["drafted"] / s["steps"] for p, s in runs.items() if s["steps"]}
    assert 0.0 in mean and mean.get(0.6, 0.0) < mean[0.0], runs
    print({p: (s["steps"], s["drafted"], s["accepted"]) for p, s in runs.items()})


def test_bad_p_min_is_named(target, drafter):
    for bad in (-0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(InvalidOption, match="p_min"):
            wb.complete(target, "Hello", speculative={"draft": drafter, "p_min": bad})
    with pytest.raises(InvalidOption, match="p_min"):
        wb.complete(target, "Hello", speculative={"ngram": "simple", "p_min": 0.5})
