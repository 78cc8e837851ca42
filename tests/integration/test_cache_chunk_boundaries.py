"""Chunk boundaries where a shared prefix ends (issue 14), with the real default model: chats
under one system prompt store its positions once whatever ``P mod chunk_size`` (read from
the chunk files: no two chunks continuing the same chunk share a position), within 1.1x the
raw KV of the distinct tokens; the rows restore warm == cold token for token."""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.cache.chunk_format import CHUNK_SUFFIX, read_chunk

pytestmark = pytest.mark.model

CHUNK = 64
SYSTEM = "You are a patient tutor who explains physics to curious students. " * 4
QUESTIONS = ("Why is the sky blue?", "What makes a rainbow appear after rain?")


@pytest.fixture
def disk_chunks(tmp_path):
    wb.configure_cache([{"kind": "disk", "root": str(tmp_path / "disk"), "budget_bytes": 2**30}],
                       storage="chunks", chunk_size=CHUNK)
    yield tmp_path / "disk"
    wb.configure_cache([{"kind": "ram"}])


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def distinct_positions(metas) -> int:
    """Distinct tokens of the rows the chunks hold: their token sequences as a prefix tree."""
    by_key = {m.key: m for m in metas}
    seqs = []
    for m in metas:
        chain = []
        while m is not None:
            chain.append(m.tokens)
            m = by_key.get(m.parent) if m.parent is not None else None
        seqs.append(b"".join(reversed(chain)))
    return len({s[:4 * i] for s in seqs for i in range(1, len(s) // 4 + 1)})


def test_chats_under_one_system_prompt_store_it_once(model, disk_chunks):
    system_len = len(wb.render_chat_template(model, messages(QUESTIONS[0])[:1], add_generation_prompt=False).tokens)
    assert system_len % CHUNK != 0  # on the fixed grid each chat would store its last positions again
    cold = [wb.chat(model, messages(q), response_tokens=12, cache=False) for q in QUESTIONS]
    first = [wb.chat(model, messages(q), response_tokens=12) for q in QUESTIONS]
    assert wb.wait_for_saves()
    assert [r.tokens for r in first] == [r.tokens for r in cold]
    files = sorted(disk_chunks.glob(f"*{CHUNK_SUFFIX}"))
    metas = [read_chunk(p)[0] for p in files]
    assert system_len in {m.p0 + m.n_tokens for m in metas}  # a chunk ends where the system prompt does
    held = [0] * system_len
    for m in metas:
        for pos in range(m.p0, min(m.p0 + m.n_tokens, system_len)):
            held[pos] += 1
    assert held == [1] * system_len  # the system prompt's positions are stored once, for both chats
    distinct = distinct_positions(metas)
    assert sum(m.n_tokens for m in metas) <= distinct + 8  # beyond it only a role header's few tokens again
    probe = wb.cached_prefix(model, wb.render_chat_template(model, messages(QUESTIONS[0])).prompt)
    kv_per_token = probe.bytes // probe.tokens
    assert sum(p.stat().st_size for p in files) <= 1.1 * distinct * kv_per_token
    warm = [wb.chat(model, messages(q), response_tokens=12) for q in QUESTIONS]
    assert [r.stats.cache_hit_kind for r in warm] == ["exact", "exact"]
    assert [r.tokens for r in warm] == [r.tokens for r in cold]


def test_cached_prefix_names_the_tier_of_the_chain_a_restore_reads(model, disk_chunks):
    """A chain cut where the system prompt ends leaves the fixed grid: the tier reported for
    a prefix inside it is the tier of its own chunks (the fixed grid's keys name none)."""
    wb.chat(model, messages(QUESTIONS[0]), response_tokens=4)
    assert wb.wait_for_saves()
    prompt = wb.render_chat_template(model, messages(QUESTIONS[0])).tokens
    assert len(prompt) > CHUNK  # the chain continues past the first grid position it left
    probe = wb.cached_prefix(model, prompt[:-3])                 # inside its chain, no row named
    assert probe.key is None and probe.tokens == len(prompt) - 3
    assert probe.tier == "disk"


def test_tasks_under_a_pinned_agent_prefix_store_it_once(model, disk_chunks):
    """An agent prefix (prefill_only with prefix_checkpoint_len) and tasks that continue it by
    parent_key alone: the prefix's last chunk stays its own (a task's reply is not pinned with
    it), and its positions are stored once for every task."""
    tools = SYSTEM + "Tools: search(query), calculator(expression).\n" * 6
    # the pinned row holds the prefix without its last token (decoded alone, not a prompt row)
    n_prefix = len(wb.tokenize(model, tools)) - 1
    assert n_prefix % CHUNK != 0
    warm = wb.prefill_only(model, tools, prefix_checkpoint_len=n_prefix + 1)
    for q in QUESTIONS:
        task = tools + f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
        r = wb.complete(model, task, response_tokens=6, parent_key=warm.finish_key)
        assert r.stats.prefilled_tokens == r.stats.prompt_tokens - n_prefix
    assert wb.wait_for_saves()
    metas = [read_chunk(p)[0] for p in sorted(disk_chunks.glob(f"*{CHUNK_SUFFIX}"))]
    assert n_prefix in {m.p0 + m.n_tokens for m in metas}  # a chunk ends where the prefix does
    held = [0] * n_prefix
    for m in metas:
        for pos in range(m.p0, min(m.p0 + m.n_tokens, n_prefix)):
            held[pos] += 1
    assert held == [1] * n_prefix
    protected = sum(c["n_tokens"] for c in wb.cache_chunks() if c["protected"])
    assert protected == n_prefix                          # only the pinned prefix is protected
