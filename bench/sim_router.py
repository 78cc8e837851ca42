#!/usr/bin/env python3
"""Routers over simulated replicas: bench_router.py's trace and requests, no engines.

Each replica is one of the eviction lab's caches (workbench.lab: the whole-row model
`SimCache`, or with `--chunk-size` the chunk model `ChunkSimCache`, built from the cache's
own index, levels and policies), replaying the engine's save rules (lab/plan.py) for what
bench_router.py sends: each request with its first segment as `prefix_checkpoint_len` (a
pinned row), the prompt row, and a finish row of the prompt + the `--response-tokens`
generated tokens (distinct from the trace's reply, which the next turn carries, as in the
real run). The routers are the real ones (workbench.cluster.routers): each request is
routed on every replica's exact cached prefix (the probe) with nothing in flight (requests
one at a time), then looked up, restored and saved on the chosen replica. So a router's
design is explored in seconds; bench_router.py confirms it on engines.

    python bench/sim_router.py [--replicas 2,4] [--requests 80] [--trace mixed|documents]
                               [--cache-mib 48] [--chunk-size N] [--routers a,b]
                               [--affinity-options JSON ...] [--seeds N] [--hindsight]

Each `--affinity-options` adds a cache_affinity variant to the table. `--seeds N` runs both
traces at seeds 0..N-1 and counts, per router, the runs where issue 15's targets hold.
`--hindsight` adds what no online router can know: the best placement of whole tenants (a
request's first segment: its system prompt or agent prefix) with a load spread <= 1.5,
found by trying every partition of the tenants into one group per replica (what the
targets ask of a router on a trace, against the tree's tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_traces import TRACES, make_trace  # noqa: E402
from workbench.cache.policies import get_policy  # noqa: E402
from workbench.cache.types import SaveReason  # noqa: E402
from workbench.cluster.routers import Decision, ReplicaFacts, RouteRequest, make_router, router_name  # noqa: E402
from workbench.lab.chunksim import ChunkSimCache  # noqa: E402
from workbench.lab.experiment import DEFAULT_BYTES_PER_TOKEN  # noqa: E402
from workbench.lab.plan import NAMESPACE, PIN, Plan, build_plan  # noqa: E402
from workbench.lab.simcache import SimCache  # noqa: E402
from workbench.lab.traces import Trace  # noqa: E402


def as_sent(trace: Trace, response_tokens: int) -> Trace:
    """The trace as bench_router.py runs it: every request pins its first segment when the
    prompt goes past it, and its reply is `response_tokens` generated tokens of its own (a
    new segment), not the trace's reply (which only the next turn's prompt holds)."""
    n = len(trace)
    seg_len = np.concatenate([trace.seg_len, np.full(n, response_tokens, trace.seg_len.dtype)])
    replies = np.arange(len(trace.seg_len), len(trace.seg_len) + n, dtype=trace.reply_seg.dtype)
    pins = (np.diff(trace.prompt_ptr) > 1).astype(trace.pin_segs.dtype)
    return dataclasses.replace(trace, seg_len=seg_len, reply_seg=replies, pin_segs=pins)


class Replica:
    """One simulated replica's cache under the engine's save rules (plan.run_plan's steps)."""

    def __init__(self, plan: Plan, budget: int, bytes_per_token: int, policy: str) -> None:
        self.plan, self.bpt = plan, bytes_per_token
        self.cache: SimCache | ChunkSimCache = (
            SimCache(get_policy(policy), budget) if plan.chunks is None
            else ChunkSimCache(get_policy(policy), budget, plan.chunks, bytes_per_token))

    def lookup(self, i: int) -> Any:
        p = self.plan
        if p.prompt_len[i] <= 1:
            return None
        if p.prompt_chunks is None:
            return self.cache.lookup(NAMESPACE, p.prompts[i])
        return self.cache.lookup(NAMESPACE, p.prompts[i], p.prompt_chunks[i])  # type: ignore[call-arg]

    def cached(self, i: int) -> int:
        hit = self.lookup(i)
        return 0 if hit is None else int(hit.n_tokens)

    def serve(self, i: int, now: float) -> int:
        """Run request i here: restore, save its rows; the prompt tokens reused."""
        p, cache, bpt = self.plan, self.cache, self.bpt
        hit = self.lookup(i)
        matched = 0 if hit is None else int(hit.n_tokens)
        if hit is not None:
            cache.hit(hit, now)
        start = min(matched, p.prompt_len[i] - 1)
        reason = SaveReason.CONTINUED if matched else SaveReason.COLD
        for key, raw, n_tok, kind in p.prefill[i]:
            if kind == PIN and n_tok > start:
                cache.put(key, NAMESPACE, raw, n_tok, n_tok * bpt, SaveReason.AGENT_PREFIX, now, pinned=True)
            elif kind == PIN:
                cache.pin(key, now)
            elif n_tok > start:
                cache.put(key, NAMESPACE, raw, n_tok, n_tok * bpt, reason, now)
        fin = p.finish[i]
        if fin is not None:
            cache.put(fin[0], NAMESPACE, fin[1], fin[2], fin[2] * bpt, SaveReason.FINISH, now)
        return start


def simulate(router: Any, trace: Trace, plan: Plan, replicas: int, budget: int, *,
             bytes_per_token: int = DEFAULT_BYTES_PER_TOKEN, policy: str = "lru") -> dict[str, Any]:
    """One router over `replicas` fresh simulated replicas, the requests one at a time."""
    reps = [Replica(plan, budget, bytes_per_token, policy) for _ in range(replicas)]
    routed = [0] * replicas
    saved = hits = 0
    picks: list[int] = []
    for i in range(len(trace)):
        tokens = tuple(trace.prompt_token_ids(i))
        facts = [ReplicaFacts(k, f"replica-{k}", 0, routed[k], r.cached(i), 0, 0) for k, r in enumerate(reps)]
        pick = router.choose(RouteRequest(tokens), facts).replica
        reused = reps[pick].serve(i, float(i))
        routed[pick] += 1
        picks.append(pick)
        saved, hits = saved + reused, hits + (reused > 0)
    prompt = int(sum(plan.prompt_len))
    return {"router": router_name(router), "requests": len(trace), "prompt_tokens": prompt, "saved_tokens": saved,
            "saved_fraction": saved / prompt if prompt else 0.0, "hit_ratio": hits / len(trace),
            "load_spread": max(routed) / min(routed) if min(routed) else float("inf"),
            "per_replica": routed, "picks": picks}


def tenants_of(trace: Trace) -> list[int]:
    """Each request's tenant: its first segment (the system prompt or the agent prefix)."""
    return [int(trace.prompt(i)[0]) for i in range(len(trace))]


def partitions(items: Sequence[int], k: int) -> Iterator[list[list[int]]]:
    """Every partition of ``items`` into exactly ``k`` non-empty groups (groups unordered)."""
    groups: list[list[int]] = []

    def extend(i: int) -> Iterator[list[list[int]]]:
        if len(items) - i < k - len(groups):
            return
        if i == len(items):
            yield [list(g) for g in groups]
            return
        for g in groups:
            g.append(items[i])
            yield from extend(i + 1)
            g.pop()
        if len(groups) < k:
            groups.append([items[i]])
            yield from extend(i + 1)
            groups.pop()

    yield from extend(0)


class Placement:
    """A router that sends each tenant's requests to the replica a fixed map names."""

    name = "hindsight"
    probe = False

    def __init__(self, tenants: Sequence[int], where: dict[int, int]) -> None:
        self.tenants, self.where, self.i = tenants, where, 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaFacts]) -> Decision:
        self.i += 1
        return Decision(self.where[self.tenants[self.i - 1]], "placed in hindsight")


def hindsight(trace: Trace, plan: Plan, replicas: int, budget: int, *, max_spread: float = 1.5,
              limit: int = 5_000, **kw: Any) -> dict[str, Any] | None:
    """The best whole-tenant placement whose requests per replica stay within
    ``max_spread``, every partition tried (None past ``limit`` partitions or when none
    is balanced)."""
    tenants = tenants_of(trace)
    order = list(dict.fromkeys(tenants))
    count = {t: tenants.count(t) for t in order}
    best = None
    for n, groups in enumerate(partitions(order, replicas)):
        if n >= limit:
            return None
        loads = [sum(count[t] for t in g) for g in groups]
        if max(loads) > max_spread * min(loads):
            continue
        res = simulate(Placement(tenants, {t: k for k, g in enumerate(groups) for t in g}), trace, plan,
                       replicas, budget, **kw)
        if best is None or res["saved_tokens"] > best["saved_tokens"]:
            best = res
    return best


def plan_for(trace: Trace, response_tokens: int, chunk_size: int | None) -> Plan:
    """The engine's save rules at bench_router.py's load options (n_ctx 2048: no cold
    checkpoint below 2,048 tokens; cache_min_tokens 16)."""
    return build_plan(as_sent(trace, response_tokens), checkpoint_every=2048, min_tokens=16, chunk_size=chunk_size)


def table(rows: Sequence[dict[str, Any]]) -> str:
    out = ["| replicas | router | options | prefill tokens saved | x round_robin | x prefix_tree | hit ratio | "
           "load spread | requests per replica |", "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        same = [b for b in rows if b["replicas"] == r["replicas"]]
        ratio = {name: next((b["saved_tokens"] for b in same if b["router"] == name and not b["options"]), 0)
                 for name in ("round_robin", "prefix_tree")}
        x = {k: f"{r['saved_tokens'] / v:.2f}" if v else "-" for k, v in ratio.items()}
        out.append(f"| {r['replicas']} | {r['router']} | {json.dumps(r['options']) if r['options'] else ''} | "
                   f"{r['saved_tokens']:,} ({r['saved_fraction']:.0%}) | {x['round_robin']} | {x['prefix_tree']} | "
                   f"{r['hit_ratio']:.0%} | {r['load_spread']:.2f} | {'/'.join(map(str, r['per_replica']))} |")
    return "\n".join(out)


def targets(rows: Sequence[dict[str, Any]]) -> str:
    """Over many (seed, replicas) runs: per router, in how many issue 15's targets hold
    (saved >= prefix_tree's, >= 1.5x round_robin's, load spread <= 1.5, each and all
    three in the same run) and its saved tokens against prefix_tree's (mean, min)."""
    def base(r: dict[str, Any], name: str) -> int:
        key = ("trace_kind", "seed", "replicas")
        return next(b["saved_tokens"] for b in rows
                    if all(b[k] == r[k] for k in key) and b["router"] == name and not b["options"])

    def held(r: dict[str, Any]) -> tuple[bool, bool, bool]:
        return (r["saved_tokens"] >= base(r, "prefix_tree"), r["saved_tokens"] >= 1.5 * base(r, "round_robin"),
                r["load_spread"] <= 1.5)

    out = ["| router | options | runs | >= prefix_tree | >= 1.5x round_robin | spread <= 1.5 | all three | "
           "x prefix_tree mean (min) | worst spread |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, opts in dict.fromkeys((r["router"], json.dumps(r["options"])) for r in rows):
        mine = [r for r in rows if r["router"] == name and json.dumps(r["options"]) == opts]
        x_tree = [r["saved_tokens"] / max(1, base(r, "prefix_tree")) for r in mine]
        counts = [sum(col) for col in zip(*(held(r) for r in mine))]
        out.append(f"| {name} | {'' if opts == 'null' else opts} | {len(mine)} | "
                   f"{' | '.join(map(str, counts))} | {sum(all(held(r)) for r in mine)} | "
                   f"{sum(x_tree) / len(x_tree):.3f} ({min(x_tree):.2f}) | {max(r['load_spread'] for r in mine):.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="2,4", help="replica counts, comma-separated")
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--trace", choices=TRACES, default="mixed")
    ap.add_argument("--response-tokens", type=int, default=4)
    ap.add_argument("--routers", default="round_robin,prefix_tree,cache_affinity")
    ap.add_argument("--cache-mib", type=float, default=48, help="each replica's cache budget")
    ap.add_argument("--chunk-size", type=int, default=None, help="the chunk model (default: whole rows)")
    ap.add_argument("--bytes-per-token", type=int, default=DEFAULT_BYTES_PER_TOKEN)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--affinity-options", type=json.loads, action="append", default=[], metavar="JSON",
                    help="a cache_affinity variant's options (repeatable)")
    ap.add_argument("--seeds", type=int, default=None, metavar="N",
                    help="trace seeds 0..N-1 (both traces), summarised against issue 15's targets")
    ap.add_argument("--hindsight", action="store_true",
                    help="add the best balanced whole-tenant placement (without --seeds)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    budget = int(args.cache_mib * (1 << 20))
    variants = [(name, None) for name in args.routers.split(",")]
    if args.seeds is not None and not {"round_robin", "prefix_tree"} <= {v[0] for v in variants}:
        variants = [("round_robin", None), ("prefix_tree", None), *variants]
    variants += [("cache_affinity", opts) for opts in args.affinity_options]
    runs = ([(args.trace, args.seed)] if args.seeds is None
            else [(kind, seed) for kind in TRACES for seed in range(args.seeds)])
    rows = []
    for kind, seed in runs:
        trace = make_trace(args.requests, seed, kind)
        plan = plan_for(trace, args.response_tokens, args.chunk_size)
        for n in (int(x) for x in args.replicas.split(",")):
            for name, opts in variants:
                res = simulate(make_router(name, opts), trace, plan, n, budget, bytes_per_token=args.bytes_per_token)
                rows.append({"trace_kind": kind, "seed": seed, "replicas": n, "options": opts, **res})
            best = hindsight(trace, plan, n, budget, bytes_per_token=args.bytes_per_token) \
                if args.hindsight and args.seeds is None else None
            if best is not None:
                rows.append({"trace_kind": kind, "seed": seed, "replicas": n, "options": None, **best})
    print(table(rows) if args.seeds is None else targets(rows))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": rows},
                                        indent=2, default=str))


if __name__ == "__main__":
    main()
