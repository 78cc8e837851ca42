"""Scoring a text: wb.score (every token's logprob given the tokens before it),
wb.loglikelihood (lm-evaluation-harness's contract, shared contexts computed once) and
wb.perplexity (llama-perplexity's method and number, checked against the tool itself)."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import workbench as wb
from workbench.errors import ContextOverflow, InvalidOption

pytestmark = pytest.mark.model

TEXT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome."
LICENSES = Path(__file__).parent / "data" / "licenses.txt"   # GPL-3.0 and Apache-2.0, verbatim: ~10k tokens
CHUNKS = 6    # of 512 tokens against llama-perplexity here; bench/bench_eval.py runs all 19


@pytest.fixture(scope="module")
def exact(model_path):
    """The default model in deterministic mode: batch-invariant kernels, so a row's logits do
    not depend on what else the decode carried (how many rows, cached or computed KV)."""
    mid = wb.load_model(model_path=str(model_path), model_id="scoring-deterministic", deterministic=True)
    yield mid
    wb.unload(mid)


def test_score_gives_each_tokens_logprob_rank_and_alternatives(model):
    r = wb.score(model, TEXT, top=5)
    n = len(r.tokens)
    assert r.tokens == wb.tokenize(model, TEXT, parse_special=False) and n > 15
    assert math.isnan(r.logprobs[0]) and r.ranks[0] == 0 and r.n_scored == n - 1
    assert (r.logprobs[1:] < 0).all() and (r.ranks[1:] >= 1).all()
    for i in range(1, n):
        ids = [t for t, _ in r.top[i]]
        lps = [lp for _, lp in r.top[i]]
        assert lps == sorted(lps, reverse=True) and sum(math.exp(x) for x in lps) <= 1 + 1e-5
        if r.ranks[i] <= 5:      # the token is among the alternatives, at its rank, with its logprob
            assert ids[r.ranks[i] - 1] == r.tokens[i] and lps[r.ranks[i] - 1] == pytest.approx(r.logprobs[i], abs=1e-5)
        else:
            assert r.tokens[i] not in ids and lps[-1] >= r.logprobs[i]
    assert r.perplexity == pytest.approx(math.exp(-np.nanmean(r.logprobs)))
    df = r.to_frame()
    assert list(df["token"]) == r.tokens and df["surprise_bits"].iloc[1] == pytest.approx(-r.logprobs[1] / math.log(2))
    assert "".join(df["piece"]) == wb.detokenize(model, r.tokens, unparse_special=True)
    [ax] = r.plot().axes
    bars = ax.patches
    assert len(bars) == n - 1 and [b.get_height() for b in bars] == pytest.approx(list(df["surprise_bits"][1:]))
    assert [t.get_text() for t in ax.get_xticklabels()][1] == r.pieces[1]


def test_the_top_alternative_is_what_greedy_decoding_picks(exact):
    r = wb.score(exact, TEXT, top=1)
    for i in (4, 9, 14):
        want = wb.complete(exact, r.tokens[:i], response_tokens=1, temperature=0, cache=False).tokens[0]
        assert r.top[i][0][0] == want


def test_scores_equal_the_sampler_logprobs_of_the_same_rows(exact):
    """A generation's logprobs (the sampler's log-softmax, greedy: no shaping) and the score
    of the same prompt + reply agree: one definition of a token's logprob. Not to the last
    bit: the generation computed its reply's KV one row per decode and its logits on one row,
    the score in one 17-row decode, and the rows' logits then differ by up to ~2e-3 here even
    with deterministic=True (measured; docs/scoring.md)."""
    c = wb.complete(exact, TEXT[:40], response_tokens=6, temperature=0, ignore_eos=True, logprobs=0, cache=False)
    prompt = wb.tokenize(exact, TEXT[:40])
    r = wb.score(exact, prompt + list(c.tokens), cache=False)
    got = r.logprobs[len(prompt):]
    assert got == pytest.approx([lp.logprob for lp in c.logprobs], abs=1e-2)
    assert (r.ranks[len(prompt):] == 1).all()


def test_long_texts_are_scored_in_windows_each_token_once(exact):
    tokens = wb.tokenize(exact, LICENSES.read_text()[:3000], parse_special=False)
    whole = wb.score(exact, tokens, cache=False)
    windowed = wb.score(exact, tokens, window=256, overlap=64, cache=False)
    assert windowed.windows == math.ceil((len(tokens) - 256) / (256 - 64)) + 1
    assert windowed.n_scored == whole.n_scored == len(tokens) - 1
    assert windowed.logprobs[1:256] == pytest.approx(whole.logprobs[1:256], abs=1e-4)   # the first window
    assert np.abs(windowed.logprobs[256:] - whole.logprobs[256:]).mean() < 0.5             # less context after


def test_loglikelihood_is_the_sum_of_the_continuations_scores_and_knows_greedy(exact):
    context = "The capital of France is"
    greedy = wb.complete(exact, context, response_tokens=2, temperature=0, cache=False).reply
    (lp_greedy, is_greedy), (lp_other, other_greedy) = wb.loglikelihood(
        exact, [(context, greedy), (context, " Berlin")], cache=False)
    assert is_greedy and not other_greedy and lp_greedy > lp_other
    ctx = wb.tokenize(exact, context, parse_special=False)
    whole = wb.tokenize(exact, context + " Berlin", parse_special=False)
    r = wb.score(exact, whole, cache=False)
    assert lp_other == pytest.approx(float(np.sum(r.logprobs[len(ctx):])), abs=1e-4)


def test_a_shared_context_is_computed_once_and_scores_the_same(exact):
    context = "Question: " + LICENSES.read_text()[:600] + "\nWhich licence is this? Answer:"
    choices = [" The GNU General Public License", " The MIT License", " The Apache License", " None"]
    cold = wb.loglikelihood(exact, [(context, c) for c in choices], cache=False)
    before = len(wb.history(exact))
    warm = wb.loglikelihood(exact, [(context, c) for c in choices], cache_scope="scoring-once")
    runs = wb.history(exact)[before:]
    n_ctx = len(wb.tokenize(exact, context, parse_special=False))
    assert [r["prefilled_tokens"] for r in runs[:1]] == [n_ctx]          # the context, once
    pairs = runs[1:]
    # the context from the cache, or copied from a pair still running it (live prefix sharing)
    assert len(pairs) == 4 and all(r["cache_hit_kind"] in ("exact", "shared") for r in pairs)
    assert all(r["prefilled_tokens"] <= r["prompt_tokens"] - n_ctx + 1 for r in pairs)
    assert [lp for lp, _ in warm] == pytest.approx([lp for lp, _ in cold], abs=1e-4)   # warm equals cold
    assert [g for _, g in warm] == [g for _, g in cold]


def test_perplexity_equals_llama_perplexity(model_path):
    from _paths import tool
    from conftest import require_tools

    try:
        exe = tool("llama-perplexity")
    except FileNotFoundError:
        if require_tools():
            raise
        pytest.skip("llama-perplexity not built (make tools)")
    # 2,048-row decodes with logits on half the rows: seconds each on 2 cores, more on a busy
    # machine, so no per-step budget (as the tool has none)
    model = wb.load_model(model_path=str(model_path), model_id="scoring-ppl", decode_budget_ms=0, n_threads=2)
    try:
        ours = wb.perplexity(model, LICENSES.read_text(), n_ctx=512, n_chunks=CHUNKS)
    finally:
        wb.unload(model)
    out = subprocess.run([str(exe), "-m", str(model_path), "-f", str(LICENSES), "-c", "512", "-b", "2048",
                          "-t", "2", "--chunks", str(CHUNKS)], capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    theirs = float(re.search(r"Final estimate: PPL = ([0-9.]+)", log).group(1))
    chunks = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", log)]
    assert ours.n_chunks == len(chunks) == CHUNKS and ours.n_scored == CHUNKS * 255
    assert ours.perplexity == pytest.approx(theirs, rel=1e-3)                 # the bound
    assert ours.estimates == pytest.approx(chunks, abs=1e-4)                  # as printed: 4 decimals


@pytest.mark.parametrize("call, key", [
    (lambda m: wb.score(m, ""), "text"), (lambda m: wb.score(m, "hi there", top=-1), "top"),
    (lambda m: wb.score(m, "hi there", window=1), "window"),
    (lambda m: wb.score(m, "hi there", window=16, overlap=16), "overlap"),
    (lambda m: wb.score(m, [1, -2]), "text"), (lambda m: wb.score(m, TEXT, cache="yes"), "cache"),
    (lambda m: wb.loglikelihood(m, "context"), "pairs"),
    (lambda m: wb.loglikelihood(m, [("a", "")]), "pairs[0]"),
    (lambda m: wb.loglikelihood(m, [("a", "b"), ("a", 3)]), "pairs[1]"),
    (lambda m: wb.perplexity(m, TEXT), "text"), (lambda m: wb.perplexity(m, TEXT, n_ctx=8), "n_ctx"),
    (lambda m: wb.perplexity(m, LICENSES.read_text(), n_chunks=0), "n_chunks"),
])
def test_bad_arguments_name_themselves(model, call, key):
    with pytest.raises(InvalidOption) as e:
        call(model)
    assert e.value.key == key


def test_a_text_past_the_limit_is_refused_before_tokenising(model, monkeypatch):
    from workbench import scoring

    monkeypatch.setattr(scoring, "MAX_TOKENS", 100)
    with pytest.raises(ContextOverflow):
        wb.score(model, "word " * 1000)
