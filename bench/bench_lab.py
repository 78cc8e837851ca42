"""The eviction lab's speed on a production trace, beside libCacheSim on the same lookups.

Loads Mooncake's conversation trace (``lab.traces.mooncake``), builds the lab's plan once
(the rows every request saves, cut into chunks: ``plan.build_plan``), then replays it
through each policy at one budget (``plan.run_plan``, one core) and reports:

    plan_s            building the plan (shared by every policy and budget)
    arrays_s          the plan as arrays for the native replay (lab/native.py; once, shared)
    replay_s          one policy at one budget, the whole trace: built-in policies replay
                      natively (csrc/lab_replay.cpp), `fn-lru` is LRU's priority written as
                      a Python function (time_invariant), the path any user policy takes
    chunk_lookups     chunks of every prompt's own chain: what a replay looks up (the
                      issue's "about 2.3M chunk lookups at 64-token chunks")
    lookups_per_s     chunk_lookups / replay_s
    chunk_ops_per_s   (lookups + chunks written + chunks evicted) / replay_s: every chunk a
                      replay looks up, stores or evicts
    lcs_s / lcs_ops_per_s / ratio
                      libCacheSim (the reference simulator, C) replaying the same chunk
                      lookups as an object trace (object = chunk, size = the chunk's file
                      bytes, one request per chunk looked up; oracleGeneral binary file,
                      ``cache.process_trace``): its speed on the same work, and the lab's
                      speed as a fraction of it

``--figure9`` adds Mooncake's Figure 9 (FAST'25): prompt tokens served from the cache
against capacity (10^4..10^9 tokens), lru, both traces, the lab at 512-token chunks saving
prompts only (Mooncake's blocks hold prompts), beside a plain block-level LRU on the
trace's hash ids (libCacheSim, prefix hits only), with the sweep's seconds.

    python bench/bench_lab.py [--requests N] [--policies lru,s3fifo] [--capacity 3e6]
    python bench/bench_lab.py --figure9 [--requests N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.cache.chunk_format import chunk_file_size
from workbench.cache.policies import get_policy
from workbench.lab import traces
from workbench.cache.types import RowStats
from workbench.lab.native import native_plan
from workbench.lab.plan import Plan, build_plan, run_plan

BPT = 23_040  # bytes per token: the lab's default (SmolLM2-135M f16 K+V)
LCS_POLICIES = {"lru": "LRU", "lfu": "LFU", "fifo": "FIFO", "s3fifo": "S3FIFO", "gdsf": "GDSF"}
FIGURE9_CAPACITIES = (10**4, 10**5, 10**6, 3 * 10**6, 10**7, 3 * 10**7, 10**8, 3 * 10**8, 10**9)
# read off Mooncake's Figure 9: the plateau, and the share of it reached at 3M tokens
PAPER = {"conversation": (0.40, 0.41), "synthetic": (0.66, 0.46)}


def load(name: str, n: int | None) -> traces.Trace:
    trace = traces.mooncake(name)
    return trace if n is None else trace.head(n)


def chunk_objects(plan: Plan, bpt: int) -> tuple[np.ndarray, np.ndarray]:
    """Every chunk a replay looks up, in order, as (object id, size in bytes)."""
    assert plan.chunks is not None and plan.prompt_chunks is not None
    ids: dict[str, int] = {}
    tokens = plan.chunks.tokens
    obj, size = [], []
    for chain in plan.prompt_chunks:
        for key in chain:
            obj.append(ids.setdefault(key, len(ids) + 1))
            size.append(chunk_file_size(tokens[key], tokens[key] * bpt))
    return np.asarray(obj, np.uint64), np.asarray(size, np.uint32)


def write_oracle(path: str, obj: np.ndarray, size: np.ndarray) -> None:
    """libCacheSim's oracleGeneral records: u32 time, u64 id, u32 size, i64 next access."""
    rec = np.zeros(len(obj), np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]))
    rec["t"] = np.arange(len(obj), dtype=np.uint32)
    rec["id"], rec["size"] = obj, size
    nxt = np.full(len(obj), -1, np.int64)
    last: dict[int, int] = {}
    for i in range(len(obj) - 1, -1, -1):
        o = int(obj[i])
        nxt[i] = last.get(o, -1)
        last[o] = i
    rec["next"] = nxt
    rec.tofile(path)


def lcs_replay(name: str, path: str, cache_bytes: int) -> tuple[float, float]:
    """libCacheSim's (seconds, miss ratio) for one policy over the oracle file."""
    import libcachesim as lcs

    reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = getattr(lcs, name)(cache_size=cache_bytes)
    t = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    return time.perf_counter() - t, miss_ratio


def lru_function(row: RowStats, now: float) -> float:
    """LRU as a user would write it: the Python path's speed."""
    return row.last_used_at


lru_function.time_invariant = True  # type: ignore[attr-defined]


def make_policy(name: str) -> Any:
    return get_policy(lru_function) if name == "fn-lru" else get_policy(name)


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    t = time.perf_counter()
    trace = load(args.trace, args.requests)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    plan = build_plan(trace, chunk_size=args.chunk_size)
    plan_s = time.perf_counter() - t
    t = time.perf_counter()
    native_plan(plan)
    arrays_s = time.perf_counter() - t
    lookups = sum(len(c) for c in plan.prompt_chunks or ())
    budget = int(args.capacity * BPT)
    print(f"{trace!r}: load {load_s:.2f} s, plan {plan_s:.2f} s, arrays {arrays_s:.2f} s, {lookups:,} chunk "
          f"lookups, budget {args.capacity:,.0f} tokens")
    obj, size = chunk_objects(plan, BPT)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        oracle = os.path.join(tmp, "chunks.oracleGeneral")
        write_oracle(oracle, obj, size)
        for name in args.policies:
            t = time.perf_counter()
            res = run_plan(plan, make_policy(name), budget, BPT)
            replay_s = time.perf_counter() - t
            ops = lookups + res["chunks_written"] + res["evictions"]
            row = {"policy": name, "requests": len(trace), "plan_s": plan_s, "arrays_s": arrays_s,
                   "replay_s": replay_s, "chunk_lookups": lookups, "lookups_per_s": lookups / replay_s,
                   "chunk_ops_per_s": ops / replay_s, "saved_fraction": res["prefill_saved_fraction"]}
            if name in LCS_POLICIES:
                lcs_s, miss = lcs_replay(LCS_POLICIES[name], oracle, budget)
                row |= {"lcs_s": lcs_s, "lcs_ops_per_s": lookups / lcs_s, "ratio": lcs_s / replay_s,
                        "lcs_chunk_hit_ratio": 1 - miss}
            out.append(row)
            print(" ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)
    return out


def block_lru(trace: traces.Trace, capacity_blocks: int) -> float:
    """Prompt tokens served by a plain LRU over the trace's blocks (segments), prefix hits
    only: a request's blocks are looked up in order until the first miss; every block it
    holds is then used (inserted or refreshed) and the LRU evicts down to the capacity."""
    seg_len = trace.seg_len
    lru: OrderedDict[int, None] = OrderedDict()
    served = total = 0
    for i in range(len(trace)):
        prefix = True
        for s in trace.prompt(i):
            n = int(seg_len[s])
            total += n
            if prefix and s in lru:
                served += n
            else:
                prefix = False
            lru[s] = None
            lru.move_to_end(s)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return served / total if total else 0.0


def figure9(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    started = time.perf_counter()
    for name in ("conversation", "synthetic"):
        trace = load(name, args.requests)
        plan = build_plan(trace, chunk_size=512, saves=("prompt",))
        for cap in FIGURE9_CAPACITIES:
            res = run_plan(plan, get_policy("lru"), cap * BPT, BPT)
            ref = block_lru(trace, max(1, cap // 512))
            row = {"trace": name, "capacity_tokens": cap, "lab": res["prefill_saved_fraction"],
                   "block_lru": ref, "diff": res["prefill_saved_fraction"] - ref}
            out.append(row)
            print(" ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)
        top = max(r["lab"] for r in out if r["trace"] == name)
        at3m = next(r["lab"] for r in out if r["trace"] == name and r["capacity_tokens"] == 3 * 10**6)
        paper_top, paper_share = PAPER[name]
        print(f"{name}: plateau {top:.3f} (paper ~{paper_top}), 3M tokens reach {at3m / top:.0%} of it "
              f"(paper ~{paper_share:.0%})")
    print(f"figure 9 sweep: {time.perf_counter() - started:.1f} s, max |lab - block lru| = "
          f"{max(abs(r['diff']) for r in out):.4f}")
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="conversation", choices=("conversation", "synthetic"))
    p.add_argument("--requests", type=int, default=None, help="the first N requests (default: all)")
    p.add_argument("--policies", default="lru,lfu,fifo,frecency,gdsf,s3fifo",
                   help="built-in names, and fn-lru (LRU as a Python function: the user-policy path)")
    p.add_argument("--capacity", type=float, default=3e6, help="cache capacity in tokens")
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--figure9", action="store_true")
    args = p.parse_args(argv)
    args.policies = [s for s in args.policies.split(",") if s]
    if args.figure9:
        figure9(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
