#!/usr/bin/env python3
"""How fast the eviction lab replays a long trace (no model involved), or, with --table,
how the policies compare on it.

Generates a seeded trace (100,000 requests by default), then runs
`workbench.lab.replay` through the five registered policies at the given cache
sizes, and prints the wall time of each stage, the per-(policy, size) replay times and
the CPU time of this process and its worker processes.

    python bench/bench_replay.py [--workload chats|agents|rag] [--requests 100000]
                                 [--sizes 8GiB] [--workers N] [--checkpoint-every 2048] [--json out.json]
                                 [--chunk-size 64 | --whole-rows] [--table]

--table prints a Markdown table instead (a deterministic simulation, not a timing): per
budget and policy, the miss ratio (exact / partial hits) and the fraction of prompt
tokens whose prefill the cache saved, the best policy of each budget in bold.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench import lab  # noqa: E402
from workbench.lab import traces  # noqa: E402
from workbench.cache.chunk_store import DEFAULT_CHUNK_SIZE  # noqa: E402 - the cache's default, the lab's too
from workbench.lab.plan import build_plan  # noqa: E402
from workbench.units import format_bytes  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd

WORKLOADS: dict[str, Callable[..., traces.Trace]] = {
    "chats": traces.multi_turn_chats, "agents": traces.agent_tasks, "rag": traces.rag_queries}


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="chats")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--sizes", default="8GiB", help="comma-separated cache sizes")
    ap.add_argument("--policies", default=",".join(lab.DEFAULT_POLICIES))
    ap.add_argument("--workers", type=int, default=None, help="default: the usable cores")
    ap.add_argument("--checkpoint-every", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE,
                    help=f"the chunk model's chunk size (tokens; default {DEFAULT_CHUNK_SIZE}, the cache's)")
    ap.add_argument("--whole-rows", action="store_true", help="the whole-row model instead of chunks")
    ap.add_argument("--table", action="store_true", help="print the policy table (Markdown) only")
    args = ap.parse_args()
    chunk_size = None if args.whole_rows else args.chunk_size
    if args.table:
        trace = WORKLOADS[args.workload](args.requests, seed=args.seed)
        df = lab.replay(trace, args.policies.split(","), args.sizes.split(","), workers=args.workers,
                        checkpoint_every=args.checkpoint_every, chunk_size=chunk_size)
        print(policy_table(df))
        return

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.workload}: {args.requests:,} requests; policies {args.policies}; sizes {args.sizes}; "
          f"{cores} usable cores, load average {load:.1f}")
    t0 = time.perf_counter()
    trace = WORKLOADS[args.workload](args.requests, seed=args.seed)
    t1 = time.perf_counter()
    info = trace.describe()
    print(f"  trace generated   {t1 - t0:6.1f} s  ({info['prompt_tokens']:,} prompt tokens, "
          f"{info['distinct_segments']:,} segments)")
    build_plan(trace, checkpoint_every=args.checkpoint_every, chunk_size=chunk_size)
    t2 = time.perf_counter()
    print(f"  plan (once)       {t2 - t1:6.1f} s  (replay builds it again below, included in its time)")
    cpu0 = cpu_seconds()
    df = lab.replay(trace, args.policies.split(","), args.sizes.split(","), workers=args.workers,
                    checkpoint_every=args.checkpoint_every, chunk_size=chunk_size)
    t3 = time.perf_counter()
    cpu = cpu_seconds() - cpu0
    print(f"  replay            {t3 - t2:6.1f} s wall, {cpu:.1f} s CPU (all processes)")
    for row in df.itertuples():
        print(f"    {row.policy:<9} {format_bytes(row.size_bytes):>10}  {row.seconds:6.1f} s   "
              f"hit {row.hit_ratio:6.1%}  prefill saved {row.prefill_saved_fraction:6.1%}  "
              f"evictions {row.evictions:,}")
    total = t3 - t0
    print(f"total (generate + replay): {total:.1f} s for {args.requests:,} requests x {len(df)} (policy, size) pairs")
    if args.json:
        out = {"workload": args.workload, "requests": args.requests, "cores": cores, "load": load,
               "generate_s": t1 - t0, "plan_s": t2 - t1, "replay_wall_s": t3 - t2, "replay_cpu_s": cpu,
               "rows": df.drop(columns=["policy"]).assign(policy=df["policy"].astype(str)).to_dict("records")}
        args.json.write_text(json.dumps(out, indent=2))


def policy_table(df: pd.DataFrame) -> str:
    """One line per budget: each policy's miss ratio (exact / partial hits) and prefill
    saved; the most prefill saved in bold."""
    p = df.attrs["params"]
    policies = list(df["policy"].cat.categories)
    lines = [f"{p['trace']}, {p['requests']:,} requests, footprint {format_bytes(p['footprint_bytes'])}, "
             f"chunk size {p['chunk_size']}: miss ratio (exact / partial hits), prefill saved",
             "", "| budget | " + " | ".join(policies) + " |", "|---:|" + "---:|" * len(policies)]
    for size, group in df.groupby("size_bytes", sort=True):
        best = group["prefill_saved_fraction"].max()
        cells = []
        for r in group.set_index("policy").loc[policies].itertuples():
            saved = f"{r.prefill_saved_fraction:.1%}"
            cells.append(f"{r.miss_ratio:.1%} ({r.exact_hits:,} / {r.partial_hits:,}), "
                         + (f"**{saved}**" if r.prefill_saved_fraction == best else saved))
        lines.append(f"| {format_bytes(int(size))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
