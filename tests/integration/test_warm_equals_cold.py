"""Warm equals cold, counted over many prompts (docs/architecture.md, "Warm equals cold").

Default mode: exact hits on rows saved after partial restores ("continued" rows), on rows
another process saved to a shared disk tier, and on a chat's second turn, give the greedy
reply of a cold run (no row holds KV that decodes computed).
Before the kernel rule of engine/kernel_rows.py, 12 of 30 such exact hits differed
(bench/warm_cold.py), so ten prompts passing by luck is unlikely.

Deterministic mode: every hit kind (cold, partial, exact, sticky, another process's tier)
and every batch composition (1-6 other streams, speculative verify rows) gives the reply of
a solo cold run, token for token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from warm_cold import prompts, second_turns   # bench/warm_cold.py (tests/conftest.py puts bench/ on the path)

import workbench as wb

pytestmark = pytest.mark.model

TOKENS = 12
def solo_cold(model: str, texts: list[str]) -> list[tuple[int, ...]]:
    return [wb.complete(model, t, response_tokens=TOKENS, cache=False).tokens for t in texts]


def differing(results: list, cold: list[tuple[int, ...]]) -> int:
    return sum(r.tokens != c for r, c in zip(results, cold))


CHILD = """
import json, sys
import workbench as wb
root, model_path, deterministic, tokens = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
wb.configure_cache([{"kind": "disk", "root": root, "budget_bytes": 1 << 30}])
m = wb.load_model(model_path=model_path, deterministic=deterministic)
for text in json.loads(sys.stdin.read()):
    wb.complete(m, text, response_tokens=tokens)
assert wb.wait_for_saves(60)
"""


def saved_by_another_process(root: Path, model_path: Path, texts: list[str], deterministic: bool) -> None:
    subprocess.run([sys.executable, "-c", CHILD, str(root), str(model_path), "1" if deterministic else "0",
                    str(TOKENS)], input=json.dumps(texts), text=True, check=True, timeout=600)
    wb.configure_cache([{"kind": "disk", "root": str(root), "budget_bytes": 1 << 30}])   # adopts its rows


def test_exact_hits_on_continued_rows_give_the_cold_reply(model):
    texts = prompts(10, seed=1)
    cold = solo_cold(model, texts)
    first = [wb.complete(model, t, response_tokens=TOKENS) for t in texts]
    assert wb.wait_for_saves(60)
    again = [wb.complete(model, t, response_tokens=TOKENS) for t in texts]
    assert Counter(r.stats.cache_hit_kind for r in first) == {"cold": 1, "partial": 9}
    assert [r.stats.cache_hit_kind for r in again] == ["exact"] * 10
    assert differing(again, cold) == 0
    assert differing(first, cold) == 0      # the partial hits too, in this one-stream run
    assert wb.counters()["pad_rows"] > 0    # the suffixes after the restores were padded


def test_exact_hits_on_another_processes_tier_give_the_cold_reply(model, model_path, tmp_path):
    texts = prompts(5, seed=2)
    cold = solo_cold(model, texts)
    saved_by_another_process(tmp_path / "disk", model_path, texts, deterministic=False)
    warm = [wb.complete(model, t, response_tokens=TOKENS) for t in texts]
    assert [r.stats.cache_hit_kind for r in warm] == ["exact"] * 5
    assert differing(warm, cold) == 0


def test_a_second_turn_restores_no_decoded_kv_and_gives_the_cold_reply(model):
    """Turn 1 stores its prompt row and no finish row: its reply's KV came from one-row
    decodes, which a cold prefill of the same text computes as prompt rows on the tiled
    kernel. So turn 2 restores exactly turn 1's prompt row (counted: cannot pass by luck),
    prefills the reply, and its replies, partial and then exact on the row it saved, equal
    a cold run's. Restoring finish rows, 2 of 40 of each differed (bench/warm_cold.py --turns)."""
    texts = prompts(6, seed=5)
    turn1 = [wb.complete(model, t, response_tokens=TOKENS) for t in texts]
    assert wb.wait_for_saves(60)
    turn2 = second_turns(texts, [r.reply for r in turn1], seed=6)
    cold = solo_cold(model, turn2)
    first = [wb.complete(model, t, response_tokens=TOKENS) for t in turn2]
    assert wb.wait_for_saves(60)
    again = [wb.complete(model, t, response_tokens=TOKENS) for t in turn2]
    restored = [r.stats.prompt_tokens - r.stats.prefilled_tokens for r in first]
    assert restored == [r.stats.prompt_tokens - 1 for r in turn1]
    assert [r.stats.cache_hit_kind for r in first] == ["partial"] * 6
    assert [r.stats.cache_hit_kind for r in again] == ["exact"] * 6
    assert differing(first, cold) == 0 and differing(again, cold) == 0


def concurrently(model: str, texts: list[str], **opts) -> list:
    streams = [wb.stream(model, t, response_tokens=TOKENS, **opts) for t in texts]
    return [s.result() for s in streams]


@pytest.mark.load(deterministic=True, n_seq_max=8)
def test_deterministic_mode_every_hit_kind_and_batch_gives_the_solo_cold_reply(fresh_model, model_path, tmp_path):
    m = fresh_model
    texts = prompts(6, seed=3)
    others = prompts(5, seed=4, system_words=40)     # shorter prompts sharing the batch
    cold = solo_cold(m, texts)
    kinds: Counter[str] = Counter()
    diffs: Counter[str] = Counter()

    def check(label: str, results: list, first: int = 0) -> None:
        """``results`` are the replies of texts[first:]."""
        kinds.update(f"{label}:{r.stats.cache_hit_kind}" for r in results)
        diffs[label] += differing(results, cold[first:])

    check("solo", [wb.complete(m, t, response_tokens=TOKENS) for t in texts])      # cold, then partial
    assert wb.wait_for_saves(60)
    check("solo", [wb.complete(m, t, response_tokens=TOKENS) for t in texts])      # exact
    for n_others in (1, 3, 5):                        # a prompt beside n other streams
        batch = [wb.stream(m, o, response_tokens=TOKENS * 2, cache=False) for o in others[:n_others]]
        check(f"beside {n_others}", [wb.complete(m, texts[n_others], response_tokens=TOKENS, cache=False)],
              first=n_others)
        [s.result() for s in batch]
    check("all at once, cache off", concurrently(m, texts, cache=False))
    check("all at once, cached", concurrently(m, texts))
    check("speculative", [wb.complete(m, t, response_tokens=TOKENS, cache=False,
                                      speculative={"ngram": "simple", "size_n": 2, "adaptive": False})
                          for t in texts[:3]])
    # sticky: a session's second turn continues its live KV
    turn1 = wb.complete(m, texts[0], response_tokens=TOKENS, session_id="s")
    turn2 = f"{texts[0]}{turn1.reply}<|im_end|>\n<|im_start|>user\nShorter.<|im_end|>\n<|im_start|>assistant\n"
    sticky = wb.complete(m, turn2, response_tokens=TOKENS, session_id="s")
    assert sticky.stats.cache_hit_kind == "sticky"
    assert sticky.tokens == wb.complete(m, turn2, response_tokens=TOKENS, cache=False).tokens
    # rows another deterministic process saved to a disk tier (the session ends first: its
    # live KV holds texts[0], which a request would copy rather than restore, live sharing)
    wb.end_session(m, "s")
    saved_by_another_process(tmp_path / "disk", model_path, texts, deterministic=True)
    check("other process", [wb.complete(m, t, response_tokens=TOKENS) for t in texts])
    assert kinds["solo:partial"] >= 4 and kinds["solo:exact"] == 6 and kinds["other process:exact"] == 6
    assert sum(diffs.values()) == 0, dict(diffs)


@pytest.mark.load(deterministic=True, n_seq_max=4, n_ctx=1024)
def test_deterministic_mode_a_reply_does_not_depend_on_when_the_streams_beside_it_end(fresh_model):
    """Three short streams end while a long one decodes: their freed cells lie below the long
    stream's (a unified KV would put its next tokens there, summed out of position order:
    4 of 4 such runs differed from the solo run from token 5 or 6, bits and tokens, before
    deterministic mode gave each sequence a KV stream of its own). Every log-probability
    must equal the solo run's, bit for bit."""
    m = fresh_model
    prompt = "Write a long story about a lighthouse keeper and the sea, with many details:"
    solo = wb.complete(m, prompt, response_tokens=120, ignore_eos=True, logprobs=1, cache=False)
    for trial in range(2):
        long = wb.stream(m, prompt, response_tokens=120, ignore_eos=True, logprobs=1, cache=False)
        short = [wb.stream(m, f"Short note {trial}-{i}: the", response_tokens=5 + 7 * i, ignore_eos=True,
                           cache=False) for i in range(3)]
        beside = long.result()
        assert all(s.result().finish_reason == "length" for s in short)
        assert [t.logprob for t in beside.logprobs] == [t.logprob for t in solo.logprobs], f"trial {trial}"
        assert beside.tokens == solo.tokens
    info = wb.model_info(m)
    assert info["n_ctx"] == 1024 and info["deterministic"]
