"""The eviction lab's chunk model: rows as chains of chunks keyed by keys.chunk_keys, a
shared prefix stored once, leaves evicted first; checked on hand-made traces here, and
against the real chunk store in tests/unit/test_lab_vs_store.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workbench import lab
from workbench.cache.chunk_format import chunk_file_size, manifest_size
from workbench.cache.keys import chunk_ends, chunk_keys
from workbench.lab import traces
from workbench.lab.chunks import pinned_marks
from workbench.lab.plan import NAMESPACE, Plan, build_plan
from workbench.lab.traces import Trace


def _rows(trace: Trace, plan: Plan) -> Iterator[tuple[str, list[int]]]:
    for i in range(len(trace)):
        req = trace[i]
        tokens = trace.prompt_token_ids(i) + (trace.segment_tokens(req.reply) if req.reply is not None else [])
        for r in (*plan.prefill[i], plan.finish[i]):
            if r is not None:
                yield r[0], tokens[:r[2]]


@pytest.mark.parametrize("workload", ["chats", "agents", "rag"])
def test_chains_are_the_chunk_keys_of_the_real_tokens(workload: str) -> None:
    trace = {"chats": lambda: traces.multi_turn_chats(200, seed=1),
             "agents": lambda: traces.agent_tasks(150, seed=2),
             "rag": lambda: traces.rag_queries(150, seed=3, documents=30)}[workload]()
    plan = build_plan(trace, chunk_size=256)
    assert plan.chunks is not None
    marks = pinned_marks(trace)
    n = 0
    for key, tokens in _rows(trace, plan):
        chain = plan.chunks.chain(key)
        ends = chunk_ends(len(tokens), 256, marks(tokens))  # the grid, restarted where a pinned prefix ends
        assert chain == [k.hex() for k in chunk_keys(NAMESPACE, tokens, 256, ends)]
        assert [plan.chunks.tokens[k] for k in chain] == [b - a for a, b in zip([0, *ends], ends)]
        n += 1
    assert n > 200


def test_a_shared_prefix_is_stored_once() -> None:
    system = list(range(1000, 1512))                      # 512 tokens: two full chunks
    prompts = [system + list(range(100 * i, 100 * i + 10)) for i in range(1, 6)]
    df = lab.replay(Trace.from_prompts(prompts), ["lru"], [10**6], bytes_per_token=1, checkpoint_every=None,
                    workers=1, chunk_size=256)
    row = df.iloc[0]
    # five prompt rows of 521 tokens: the system's 2 chunks once, five tails of 9 tokens, at
    # the store's file sizes (a chunk file: header, tokens, payload), and five manifests
    assert row.rows_end == 5 and row.chunks_end == 2 + 5
    full, tail = chunk_file_size(256, 256), chunk_file_size(9, 9)
    assert row.bytes_end == 2 * full + 5 * tail + 5 * manifest_size(521, 3)
    assert row.logical_bytes_end == 5 * 521
    assert row.shared_bytes_end == 2 * full and row.chunks_reused == 4 * 2
    # each later prompt resumes after the system's chunks (a chain no row ends at): partial
    assert (row.misses, row.partial_hits, row.prefill_tokens_saved) == (1, 4, 4 * 512)
    whole = lab.replay(Trace.from_prompts(prompts), ["lru"], [10**6], bytes_per_token=1, checkpoint_every=None,
                       workers=1, chunk_size=None).iloc[0]
    assert whole.bytes_end == 5 * 521
    assert df.attrs["params"]["footprint_bytes"] == 512 + 5 * 9


def test_bad_chunk_size() -> None:
    trace = Trace.from_prompts([[1, 2, 3]])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size"):
            lab.replay(trace, ["lru"], [100], chunk_size=bad, workers=1)
