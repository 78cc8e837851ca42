"""The eviction lab's chunk model: rows as chains of chunks keyed by keys.chunk_keys, a
shared prefix stored once, leaves evicted first; checked on hand-made traces and against a
plain chunk cache over real token ids (chunk_reference.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .chunk_reference import chunk_cache, chunk_store_cache
from .reference import reference_replay
from .test_lab import CASES
from workbench import lab
from workbench.cache import get_policy
from workbench.cache.keys import chunk_keys
from workbench.lab import traces
from workbench.lab.plan import NAMESPACE, Plan, build_plan, run_plan
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
    n = 0
    for key, tokens in _rows(trace, plan):
        chain = plan.chunks.chain(key)
        assert chain == [k.hex() for k in chunk_keys(NAMESPACE, tokens, 256)]
        assert [plan.chunks.tokens[k] for k in chain] == [256] * (len(tokens) // 256) + (
            [len(tokens) % 256] if len(tokens) % 256 else [])
        n += 1
    assert n > 200


def test_a_shared_prefix_is_stored_once() -> None:
    system = list(range(1000, 1512))                      # 512 tokens: two full chunks
    prompts = [system + list(range(100 * i, 100 * i + 10)) for i in range(1, 6)]
    df = lab.replay(Trace.from_prompts(prompts), ["lru"], [10**6], bytes_per_token=1, checkpoint_every=None,
                    workers=1)
    row = df.iloc[0]
    # five prompt rows of 521 tokens: the system's 2 chunks once, five tails of 9 tokens
    assert row.rows_end == 5 and row.chunks_end == 2 + 5
    assert row.bytes_end == 512 + 5 * 9 and row.logical_bytes_end == 5 * 521
    assert row.shared_bytes_end == 512 and row.chunks_reused == 4 * 2
    whole = lab.replay(Trace.from_prompts(prompts), ["lru"], [10**6], bytes_per_token=1, checkpoint_every=None,
                       workers=1, chunk_size=None).iloc[0]
    assert whole.bytes_end == 5 * 521
    assert df.attrs["params"]["footprint_bytes"] == 512 + 5 * 9


def test_leaves_go_first_and_a_shared_first_chunk_survives() -> None:
    x, y, z = list(range(1000, 1256)), list(range(2000, 2256)), list(range(3000, 3256))
    p1 = x + y + list(range(100, 109))       # 521: checkpoints at 256 (x) and 512 (x y), prompt row 520
    p2 = x + list(range(200, 220))           # 276: hits x (partial 256), saves its prompt row of 275
    p3 = z + list(range(300, 344))           # 300: needs room: checkpoint z, prompt row of 299
    p4 = x + y + list(range(400, 420))       # finds x only: x y went as leaves, x was still shared
    trace = Trace.from_prompts([p1, p2, p3, p4])
    plan = build_plan(trace, checkpoint_every=256, chunk_size=256)
    got = run_plan(plan, get_policy("lru"), 600, 1, record=True)
    # before p3: x 256, y 256, tails 8 (p1) and 19 (p2) = 539. LRU over the leaves: p1's tail
    # (its row goes), then y (a leaf now; the row x y goes), 264 bytes; x, used by p2, stays
    assert got["_requests"] == [("cold", 0), ("partial", 256), ("cold", 0), ("partial", 256)]
    # p4 (hit x) stores y again (checkpoint x y) and a tail of 19: room from p2's tail (19),
    # p3's tail (43), then z, a leaf by then (256)
    assert got["evictions"] == 2 + 3 and got["evicted_bytes"] == 8 + 256 + 19 + 43 + 256
    assert got["bytes_end"] == 256 + 256 + 19 and got["chunks_collected"] == 0
    assert got["_requests"] == reference_replay(trace, "lru", 600, 1, checkpoint_every=256,
                                                cache_factory=chunk_cache(256))
    whole = run_plan(build_plan(trace, checkpoint_every=256), get_policy("lru"), 600, 1, record=True)
    assert whole["_requests"][3] != ("partial", 256)   # whole rows: x's row was the oldest to go


@pytest.mark.parametrize("policy", ["lru", "lfu", "frecency", "gdsf", "s3fifo"])
@pytest.mark.parametrize("workload", sorted(CASES))
def test_same_outcomes_as_a_plain_chunk_cache(workload: str, policy: str) -> None:
    """Request by request, the hit kind and saved prefill of the lab's chunk model equal a
    plain chunk cache fed the real token ids, at budgets that evict."""
    make, every = CASES[workload]
    trace = make()
    for size, chunk in ((600, 16), (2500, 32)):
        ours = run_plan(build_plan(trace, checkpoint_every=every, chunk_size=chunk), get_policy(policy), size, 1,
                        record=True)
        ref = reference_replay(trace, policy, size, 1, checkpoint_every=every, cache_factory=chunk_cache(chunk))
        assert ours["_requests"] == ref
        assert ours["evictions"] > 0
    assert any(kind != "cold" for kind, _ in ref)


def test_bad_chunk_size() -> None:
    trace = Trace.from_prompts([[1, 2, 3]])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size"):
            lab.replay(trace, ["lru"], [100], chunk_size=bad, workers=1)


@pytest.mark.parametrize("where", ["files", "memory"])
def test_the_chunk_store_ranks_the_policies_as_the_lab_does(tmp_path: Path, where: str) -> None:
    """The evidence for the default policy (docs/cache.md), checked on ChunkStore itself:
    on a chat trace, at a budget that evicts, lru saves clearly more prefill than lfu and
    frecency (fresh leaves, the next turn's, have no hits) and about as much as gdsf, in
    the store as in the lab. The store serves more (chains of full chunks, absorbed tails), so
    only the order is compared."""
    trace = traces.multi_turn_chats(300, seed=0)
    total = int(trace.prompt_tokens.sum())
    bpt, size = 64, 3 << 20
    store: dict[str, float] = {}
    sim: dict[str, float] = {}
    factory = chunk_store_cache(str(tmp_path) if where == "files" else None, bpt)
    for policy in ("lru", "lfu", "frecency", "gdsf"):
        out = reference_replay(trace, policy, size, bpt, cache_factory=factory)
        store[policy] = sum(saved for _, saved in out) / total
        sim[policy] = run_plan(build_plan(trace, chunk_size=256), get_policy(policy), size, bpt)[
            "prefill_saved_fraction"]
    # measured: store lru 0.732, gdsf 0.715, lfu = frecency 0.661; lab 0.656, 0.670, 0.548
    for saved in (store, sim):
        assert saved["lru"] > saved["lfu"] + 0.05 and saved["lru"] > saved["frecency"] + 0.05
        assert abs(saved["lru"] - saved["gdsf"]) < 0.03
