"""bench/sim_router.py's `--hindsight`: every partition of a trace's tenants into one group
per replica, and the best balanced one, the reading docs/benchmarks.md gives for what the
router benchmark's targets ask of an online router."""

from __future__ import annotations

import sim_router
from router_traces import make_trace

from workbench.cluster.routers import make_router


def test_partitions_are_every_split_into_k_nonempty_groups():
    items = list(range(7))
    got = list(sim_router.partitions(items, 4))
    assert len(got) == 350                                    # Stirling S(7, 4)
    assert all(len(p) == 4 and all(p) and sorted(x for g in p for x in g) == items for p in got)
    assert len({tuple(sorted(map(tuple, p))) for p in got}) == 350  # no partition twice
    assert [len(list(sim_router.partitions(items, k))) for k in (1, 2, 3, 7, 8)] == [1, 63, 301, 1, 0]


def test_hindsight_ties_the_tree_when_nothing_is_evicted_and_keeps_the_spread():
    trace = make_trace(80, 0, "mixed")
    plan = sim_router.plan_for(trace, 4, 64)
    budget = 1 << 30                                          # nothing evicted in 80 requests
    tree = sim_router.simulate(make_router("prefix_tree"), trace, plan, 4, budget)
    best = sim_router.hindsight(trace, plan, 4, budget)
    assert best is not None and best["load_spread"] <= 1.5 < tree["load_spread"]
    assert best["saved_tokens"] == tree["saved_tokens"]       # whole tenants: the same prefills
    assert sim_router.hindsight(trace, plan, 4, budget, limit=10) is None
