"""The eviction lab's chunk model against the real chunked cache (issue 14): one seeded trace
replayed through `lab.plan.run_plan` (the lab: virtual tokens, chunksim.py) and through
`ChunkedCache` over a `ChunkStore` writing real files in a temporary directory (at the
smaller budget; in memory at the larger one, which keeps the same byte counts and runs
without fsync: `notebook/chunk_reference.py`), both driven by the engine's save rules
(the lab's plan.py, and `notebook/reference.py` written out plainly). Request by request:
the hit kind and the prefill saved; after every request: the store's bytes and evictions.
Whole rows (``storage='rows'``: chunks of ``WHOLE_ROWS`` positions, a row's new KV one chunk,
a longer row's chunk absorbing the tail it extends) are held to the same, with the lab's
chunk model at that chunk size."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from notebook.chunk_reference import StoreCache, store_cache
from notebook.reference import reference_replay

from workbench.cache import get_policy
from workbench.cache.chunk_store import WHOLE_ROWS
from workbench.lab import traces
from workbench.lab.chunks import pinned_marks
from workbench.lab.plan import build_plan, run_plan
from workbench.lab.traces import Trace

CHUNK = 16
BPT = 64            # bytes a token: a full chunk is a 1,248-byte file
EVERY = 32          # a checkpoint every 32 tokens
SMALL, LARGE = 25_000, 60_000   # bytes: both evict
POLICIES = ["lru", "lfu", "frecency", "gdsf", "s3fifo"]


def chats() -> Trace:
    """Conversations sharing four system prompts of three chunks each."""
    return traces.multi_turn_chats(50, seed=3, system_tokens=(48, 48), user_tokens=(3, 30), reply_tokens=(3, 40),
                                   turns=(1, 6), concurrency=6)


def agents() -> Trace:
    """A fleet of three agents, each with a pinned prefix of four chunks, tasks appending steps."""
    return traces.agent_tasks(50, seed=4, agents=3, prefix_tokens=(64, 64), task_tokens=(3, 20),
                              action_tokens=(2, 15), observation_tokens=(5, 40), concurrency=5)


def retokenised() -> Trace:
    """Raw-text conversations: each turn re-sends the reply as text, its last tokens
    tokenised differently, or continues a prompt cut inside its last word."""
    rng = random.Random(7)

    def words(n: int) -> list[int]:
        return [rng.randrange(100, 32000) for _ in range(n)]

    system = words(32)
    prompts: list[list[int]] = []
    for _ in range(8):
        convo = system + words(rng.randrange(5, 40))
        for _turn in range(rng.randrange(2, 6)):
            prompts.append(list(convo))
            reply = words(rng.randrange(6, 40))
            if rng.random() < 0.5:
                convo = convo + reply[:-3] + words(2) + words(rng.randrange(3, 20))   # reply re-tokenised
            else:
                convo = convo[:-1] + words(rng.randrange(2, 25))                      # cut mid-word
    order = sorted(range(len(prompts)), key=lambda i: (i % 5, i))  # conversations interleaved
    return Trace.from_prompts([prompts[i] for i in order], name="retokenised")


def boundaries() -> Trace:
    """A fleet whose pinned prefixes (agents' system prompts and tools) end inside a chunk
    (37-59 tokens, chunks of 16): each is a chunk boundary (chunk_catalog.plan), stored once."""
    return traces.agent_tasks(50, seed=5, agents=3, prefix_tokens=(37, 59), task_tokens=(3, 20),
                              action_tokens=(2, 15), observation_tokens=(5, 40), concurrency=5)


TRACES = {"chats": chats, "agents": agents, "retokenised": retokenised, "boundaries": boundaries}


def compare(trace: Trace, policy: str, size: int, root: Path | None,
            made: list[StoreCache] | None = None, chunk_size: int = CHUNK) -> dict[str, int]:
    """Replay through both (the store's files under `root`, or in memory; chunks of
    `chunk_size`); assert equal outcomes and per-request state; the lab's totals."""
    lab = run_plan(build_plan(trace, checkpoint_every=EVERY, chunk_size=chunk_size), get_policy(policy), size, BPT,
                   timeline_every=1, record=True)
    made = [] if made is None else made
    ref = reference_replay(trace, policy, size, BPT, checkpoint_every=EVERY,
                           cache_factory=store_cache(None if root is None else str(root), BPT, chunk_size, made,
                                                     pinned_marks(trace)))
    store = made[0]
    assert len(store.trail) == len(trace)   # one lookup per request: no one-token prompt
    after = [*store.trail[1:], store.state()]
    assert lab["_requests"] == ref
    assert [(used, ev) for _, _, used, _, ev, _, _ in lab["_timeline"]] == after
    assert lab["bytes_end"] == store.store.used
    if root is not None:   # the files on disk, every byte
        assert lab["bytes_end"] == sum(p.stat().st_size for p in store.store.root.iterdir())
    assert lab["rows_end"] == len(store.store.rows) and lab["chunks_end"] == len(store.store.chunks)
    return lab


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("workload", sorted(TRACES))
def test_the_lab_replays_a_trace_as_the_chunk_store_does(tmp_path: Path, workload: str, policy: str) -> None:
    trace = TRACES[workload]()
    saved = []
    for size, root in ((SMALL, tmp_path), (LARGE, None)):
        lab = compare(trace, policy, size, root)
        assert lab["chunk_ties"] == 0   # no choice left to the store's set order (see below)
        assert lab["evictions"] > 0
        saved.append(lab["prefill_tokens_saved"])
        kinds = {k for k, _ in lab["_requests"]}
        assert "partial" in kinds and "cold" in kinds
    assert saved[1] > saved[0] > 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("workload", sorted(TRACES))
def test_the_lab_replays_whole_rows_as_the_store_does(tmp_path: Path, workload: str, policy: str) -> None:
    """storage='rows': the lab's chunk model with chunks of WHOLE_ROWS positions against the
    store at that chunk size, request by request and byte for byte, tails absorbed by the
    longer rows extending them."""
    trace = TRACES[workload]()
    for size, root in ((SMALL, tmp_path), (LARGE, None)):
        made: list[StoreCache] = []
        lab = compare(trace, policy, size, root, made, chunk_size=WHOLE_ROWS)
        assert lab["evictions"] > 0
        assert made[0].store.counters.get("tails_absorbed") > 0
        kinds = {k for k, _ in lab["_requests"]}
        assert "partial" in kinds and "cold" in kinds


def test_ties_between_continuing_chunks() -> None:
    """System prompts ending inside a chunk: every conversation's chunk after the system's
    last full one agrees with a new conversation's prompt for the same tokens."""
    trace = traces.multi_turn_chats(160, seed=3, system_tokens=(40, 40), user_tokens=(3, 30), reply_tokens=(3, 40),
                                    turns=(1, 6), concurrency=6)
    lab = compare(trace, "lru", SMALL, None)
    assert lab["chunk_ties"] > 0


def test_pinned_prefixes_ending_inside_a_chunk_are_boundaries_in_both() -> None:
    trace = boundaries()
    made: list[StoreCache] = []
    lab = compare(trace, "lru", 10**7, None, made)   # nothing evicted
    store = made[0].store
    short_inner = [c for c in store.chunks.values() if c.n_tokens < CHUNK and store.children(c.key)]
    assert short_inner and lab["evictions"] == 0
    # one chain per agent's prefix, however many tasks continue it
    firsts = [c for c in store.chunks.values() if c.parent is None]
    assert len(firsts) == len({trace.prompt(i)[0] for i in range(len(trace))})
