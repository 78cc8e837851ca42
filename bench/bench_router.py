#!/usr/bin/env python3
"""Routers compared on a multi-tenant trace over 2-4 replicas of the default model.

The ``mixed`` trace (workbench.lab.traces, seeded) merges multi-turn chats under a few
shared system prompts with agent loops sharing long system+tools prefixes; turn k+1's
prompt is turn k's prompt + its reply + the next message, as a stateless chat API sees it
(no session ids: the router decides every turn). The ``documents`` trace is one where the
approximate tree guesses wrong: short system prompts before long messages, below its 30%
match threshold (documents_trace). Each request saves its first segment (the system
prompt or agent prefix) as a row of its own (prefix_checkpoint_len), as a serving stack
pins its system prompts.

For each router, from the same start (every replica's cache emptied): the requests one at
a time, each finished and its rows saved before the next is routed, so routing and every
token count are deterministic. Per router: prefill tokens saved (prompt tokens whose KV
was reused), hit ratio (requests that reused any), mean and p95 TTFT (ratios from one run;
run it on a quiet machine), load spread (max/min requests per replica).

    python bench/bench_router.py [--replicas 2] [--requests 80] [--trace mixed|documents] [--cache-mib 1024]
                                 [--routers a,b,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import workbench as wb  # noqa: E402
import workbench.cluster as wc  # noqa: E402
from router_traces import TRACES, first_segment, make_trace  # noqa: E402
from workbench.lab import traces  # noqa: E402

ROUTERS = ("round_robin", "power_of_two", "least_loaded", "prefix_tree", "cache_affinity")


def run_router(cluster: wc.Cluster, router: str, trace: traces.Trace, response_tokens: int,
               options: dict[str, Any] | None = None) -> dict[str, Any]:
    cluster.reset_cache()
    cluster.set_router(router, options)
    start = len(cluster.routing.log)
    saved = prompt = hits = 0
    ttfts: list[float] = []
    per_replica: dict[str, int] = {m.name: 0 for m in cluster.members}
    t0 = time.perf_counter()
    for i in range(len(trace)):
        r = cluster.complete(trace.prompt_token_ids(i), response_tokens=response_tokens,
                             prefix_checkpoint_len=first_segment(trace, i))
        cluster.wait_for_saves()
        s = r.stats
        reused = s.prompt_tokens - s.prefilled_tokens
        saved, prompt, hits = saved + reused, prompt + s.prompt_tokens, hits + (reused > 0)
        if s.ttft_s is not None:
            ttfts.append(s.ttft_s)
        per_replica[r.model] += 1
    wall = time.perf_counter() - t0
    counts = list(per_replica.values())
    ttfts.sort()
    return {"router": router, "requests": len(trace), "prompt_tokens": prompt, "saved_tokens": saved,
            "saved_fraction": saved / prompt if prompt else 0.0, "hit_ratio": hits / len(trace),
            "ttft_mean_ms": 1000 * statistics.fmean(ttfts) if ttfts else None,
            "ttft_p95_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))] if ttfts else None,
            "load_spread": max(counts) / min(counts) if min(counts) else float("inf"),
            "per_replica": per_replica, "wall_s": wall, "decisions": len(cluster.routing.log) - start}


def cache_storage() -> str:
    """The storage a replica's cache_tiers get (configure_cache's default: the replicas
    configure their cache without naming one), e.g. 'rows' or 'chunks/64'."""
    from workbench.cache.shared import store_chunk_size

    storage = str(inspect.signature(wb.configure_cache).parameters["storage"].default)
    return f"{storage}/{store_chunk_size(storage, None)}" if storage == "chunks" else storage


def table(rows: list[dict[str, Any]]) -> str:
    base = next((r["saved_tokens"] for r in rows if r["router"] == "round_robin"), None)
    out = ["| router | prefill tokens saved | x round_robin | hit ratio | TTFT mean | TTFT p95 | load spread |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['saved_tokens'] / base:.2f}" if base else "-"
        out.append(f"| {r['router']} | {r['saved_tokens']:,} ({r['saved_fraction']:.0%}) | {ratio} | "
                   f"{r['hit_ratio']:.0%} | {r['ttft_mean_ms']:.0f} ms | {r['ttft_p95_ms']:.0f} ms | "
                   f"{r['load_spread']:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per replica")
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--trace", choices=TRACES, default="mixed", help="mixed: chats + agents; documents: "
                    "short system prompts before long messages (documents_trace)")
    ap.add_argument("--response-tokens", type=int, default=4)
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--cache-mib", type=int, default=1024, help="each replica's RAM cache budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--affinity-options", type=json.loads, default=None, metavar="JSON",
                    help='cache_affinity\'s router options, e.g. \'{"share_weight": 3}\'')
    args = ap.parse_args()
    trace = make_trace(args.requests, args.seed, args.trace)
    storage = cache_storage()
    print(f"trace: {trace.describe()}; cache storage: {storage}", file=sys.stderr)
    # no bound on one native step: on a loaded machine (4 replicas on 2 cores) a long
    # prefill may pass the default 30 s, and the token counts are what this measures
    cluster = wc.start(replicas=args.replicas, threads=args.threads, n_ctx=2048, n_seq_max=2, decode_budget_ms=0,
                       cache_tiers=[{"kind": "ram", "budget_bytes": args.cache_mib << 20}])
    try:
        rows = []
        for router in args.routers.split(","):
            options = args.affinity_options if router == "cache_affinity" else None
            rows.append(run_router(cluster, router, trace, args.response_tokens, options))
            print(f"{router}: {rows[-1]['saved_tokens']} tokens saved, {rows[-1]['per_replica']}, "
                  f"{rows[-1]['wall_s']:.0f} s", file=sys.stderr)
    finally:
        cluster.shutdown()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"replicas": args.replicas, "threads": args.threads, "trace_kind": args.trace,
                                         "cache_mib": args.cache_mib, "cache_storage": storage,
                                         "trace": trace.describe(), "results": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
