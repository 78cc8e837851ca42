"""Re-tokenised prompts hit the cache in both storages (issue 14, "Re-tokenised prompts"), with
the real default model: a raw-text chat that re-sends the assistant's reply as text, and a
prompt cut mid-word then continued, are partial hits that prefill only the new text plus a
few tokens. Where the re-tokenisation diverges inside a chunk, chunk storage resumes at the
last agreeing token (a row cannot: its prompt row stops at the token the new text changed)."""

from __future__ import annotations

import pytest

import workbench as wb

from .test_cache_chunked_engine import CHUNK, SYSTEM, chunks  # noqa: F401 - chunks: the fixture

pytestmark = pytest.mark.model

STORY = ("Once upon a time a lighthouse keeper lived alone on a rocky island far out in the cold northern sea. "
         "Every evening he climbed the spiral stairs, lit the great lamp and watched the ships pass safely by. "
         "He kept a diary of the storms, the birds and the strange lights he sometimes saw on the water. "
         "One grey morning, walking along the shore after a wild night, he finds an ")
WORD = "extraordinary"
REST = " object half buried in the sand. Tell what it is and what he does next."


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture(params=["rows", "chunks"])
def storage(request, chunks):  # noqa: F811 - the imported fixture
    """The process-wide cache in the given storage, in RAM (the chunks fixture restores the
    default cache afterwards)."""
    if request.param == "rows":
        wb.configure_cache([{"kind": "ram", "budget_bytes": 2**30}], storage="rows")
    else:
        chunks({"kind": "ram", "budget_bytes": 2**30})
    return request.param


def reused(r) -> int:
    return r.stats.prompt_tokens - r.stats.prefilled_tokens


def in_a_session(model: str, first: str, second: str, n1: int, n2: int):
    """The second turn run on the first turn's live KV (sticky, no cache): it resumes at the
    last token the two agree on and prefills the rest in the batches a restore uses, so a
    partial restore must reply with exactly its tokens (a cold run prefills in other
    batches, and llama.cpp's CPU kernels are not batch-invariant)."""
    wb.complete(model, first, session_id="retok", response_tokens=n1, cache=False)
    r = wb.complete(model, second, session_id="retok", response_tokens=n2, cache=False)
    wb.end_session(model, "retok")
    assert r.stats.cache_hit_kind == "sticky"
    return r


@pytest.mark.load(deterministic=True)   # the default mode stores no finish row (docs/architecture.md)
def test_a_raw_text_chat_that_re_sends_the_reply_hits_partial(fresh_model, storage):
    model = fresh_model
    turn1 = SYSTEM + "<|im_start|>user\nName a red fruit and say why it is red.<|im_end|>\n<|im_start|>assistant\n"
    r1 = wb.complete(model, turn1, response_tokens=48)
    assert wb.wait_for_saves()
    new_text = "<|im_end|>\n<|im_start|>user\nAnd a yellow one?<|im_end|>\n<|im_start|>assistant\n"
    turn2 = turn1 + r1.reply + new_text
    sticky = in_a_session(model, turn1, turn2, 48, 24)
    r2 = wb.complete(model, turn2, response_tokens=24)
    assert r2.stats.cache_hit_kind == "partial"
    assert r2.stats.prefilled_tokens <= len(wb.tokenize(model, new_text, add_special=False)) + 4
    # the turn resumes where the stored turn and the re-tokenised text stop agreeing
    stored = r1.context_tokens[:next(r["n_tokens"] for r in wb.cache_rows() if r["key"] == r1.finish_key)]
    prompt2 = wb.tokenize(model, turn2)
    assert reused(r2) == min(common_prefix(stored, prompt2), len(prompt2) - 1)
    assert reused(r2) >= len(wb.tokenize(model, turn1))
    assert (reused(r2), r2.tokens) == (reused(sticky), sticky.tokens)


@pytest.mark.parametrize("cut", [8, 10], ids=["diverges-at-the-last-token", "diverges-two-tokens-back"])
def test_a_prompt_cut_mid_word_then_continued_hits_partial(model, storage, cut):
    """Cut 8 ("extraord") re-tokenises only the prompt's last token, which no prompt row
    holds anyway: both storages resume at the last agreeing token. Cut 10 ("extraordin")
    re-tokenises two: the prompt row ends one token past the agreement, and both resume
    inside the chunk that holds it (whole rows: the row's one chunk)."""
    first = STORY + WORD[:cut]
    new_text = WORD[cut:] + REST
    second = first + new_text
    a, b = wb.tokenize(model, first), wb.tokenize(model, second)
    agree = common_prefix(a, b)
    assert len(a) - agree == (1 if cut == 8 else 2)             # the tokeniser does what the case needs
    assert agree % CHUNK and agree > CHUNK                       # it diverges inside a chunk, past the first
    sticky = in_a_session(model, first, second, 12, 16)
    assert reused(sticky) == agree
    r1 = wb.complete(model, first, response_tokens=12)
    assert wb.wait_for_saves()
    probe, hits = wb.cached_prefix(model, second), hit_counts()
    r2 = wb.complete(model, second, response_tokens=16)
    assert r2.stats.cache_hit_kind == "partial"
    assert reused(r2) == agree == common_prefix(r1.context_tokens, b)   # not the chunk boundary before it
    assert r2.stats.prefilled_tokens <= len(wb.tokenize(model, new_text, add_special=False)) + 4
    assert r2.tokens == sticky.tokens
    assert (probe.tokens, probe.kind) == (agree, "partial")
    if cut == 10:
        # served by a chain no row names: the hit counts on each chunk it read, on no row
        assert probe.key is None
        rows, chunk_hits = hit_counts()
        assert rows == hits[0] and chunk_hits == hits[1] + (agree // CHUNK + 1 if storage == "chunks" else 1)


def hit_counts() -> tuple[int, int]:
    """Restores counted on rows (cache_rows) and on chunks (cache_chunks)."""
    return sum(r["hits"] for r in wb.cache_rows()), sum(c["hits"] for c in wb.cache_chunks())
