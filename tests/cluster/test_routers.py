"""Routers and the wire format, without Ray: exact choices on scripted replica facts."""

from __future__ import annotations

import collections
import itertools
import pickle
import random

import pytest

from workbench.cluster.prefixtree import PrefixTree
from workbench.cluster.routers import (CacheAffinity, Decision, LeastLoaded, PowerOfTwo, PrefixTreeRouter,
                                       ReplicaFacts, RoundRobin, RouteRequest, make_router)
from workbench.cluster.wire import pack_error, unpack_error
from workbench.errors import DecodeTimeout, InvalidOption, NoSession, ReplicaDown, SessionLost, UnknownOption


def facts(*specs: tuple[int, int, int | None]) -> list[ReplicaFacts]:
    """(in_flight, routed, cached) per replica."""
    return [ReplicaFacts(i, f"r{i}", load, routed, cached) for i, (load, routed, cached) in enumerate(specs)]


REQ = RouteRequest(tuple(range(100)))


def test_round_robin_cycles_and_skips_a_down_replica():
    rr = RoundRobin()
    three = facts((0, 0, None), (0, 0, None), (0, 0, None))
    assert [rr.choose(REQ, three).replica for _ in range(4)] == [0, 1, 2, 0]
    without_1 = [three[0], three[2]]
    assert [rr.choose(REQ, without_1).replica for _ in range(3)] == [2, 0, 2]


def test_least_loaded_breaks_ties_by_requests_routed():
    assert LeastLoaded().choose(REQ, facts((2, 0, None), (1, 9, None), (1, 3, None))).replica == 2


def test_power_of_two_takes_the_less_loaded_of_its_seeded_pair():
    reps = facts((5, 0, None), (0, 0, None), (3, 0, None), (1, 0, None))
    a, b = PowerOfTwo(seed=7), PowerOfTwo(seed=7)
    picks = [a.choose(REQ, reps) for _ in range(20)]
    assert [p.replica for p in picks] == [b.choose(REQ, reps).replica for _ in range(20)]
    for p in picks:  # the busiest loses every pair it is drawn in
        assert p.replica != 0


def test_cache_affinity_prefers_the_longest_exact_prefix_over_a_small_load_gap():
    ca = CacheAffinity()
    d = ca.choose(REQ, facts((0, 0, 10), (2, 0, 90)))
    assert d == Decision(1, "90 of 100 tokens cached")


def test_cache_affinity_below_min_match_routes_by_load_and_share():
    d = CacheAffinity(min_match=0.5).choose(REQ, facts((1, 0, 0), (0, 0, 40)))
    assert d == Decision(1, "no prefix >= 50% cached: balance")
    d = CacheAffinity(min_match=0.5).choose(REQ, facts((0, 0, 0), (1, 0, 40)))
    assert d.replica == 0


def test_cache_affinity_balances_cheap_moves_but_keeps_a_conversation_where_it_is_cached():
    ca = CacheAffinity(window=10, share_weight=1.0, balance_rel=10.0)  # the share term alone, no guard
    both = facts((0, 0, 60), (0, 0, 60))  # new chats under a system prompt both replicas hold
    assert [ca.choose(REQ, both).replica for _ in range(4)] == [0, 1, 0, 1]
    # turns of a chat cached on replica 0 (95 vs 60 tokens: 0.35 ahead) stay there until
    # replica 0's excess of the last 10 picks passes 0.35: then one goes to replica 1
    turns = [ca.choose(REQ, facts((0, 0, 95), (0, 0, 60))) for _ in range(6)]
    assert [d.replica for d in turns] == [0, 0, 0, 0, 1, 0]
    assert turns[4].reason == "60 of 100 tokens cached (balance over 95 on r0)"


def test_cache_affinity_with_nothing_cached_goes_where_the_prefix_went_before():
    ca = CacheAffinity()
    tenant = RouteRequest(tuple(range(100)))
    cold = facts((0, 0, 0), (0, 0, 0))
    first = ca.choose(tenant, cold)
    other = ca.choose(RouteRequest(tuple(range(500, 600))), cold)
    assert other.replica != first.replica and other.reason == "no prefix >= 10% cached: balance"
    again = ca.choose(RouteRequest(tuple(range(90)) + (7, 7)), cold)  # evicted everywhere since
    assert again == Decision(first.replica, "nothing cached; sent here before (98%)")  # 90 of 92


def test_cache_affinity_spread_guard_skips_a_replica_past_its_share_of_the_window():
    ca = CacheAffinity(window=8)
    hot = facts((0, 0, 90), (0, 0, 0), (0, 0, 0), (0, 0, 0))  # a tenant cached on r0 alone
    picks = [ca.choose(REQ, hot) for _ in range(10)]
    # 90% cached outweighs the share term, so r0 takes the window's first 8 picks; then it
    # holds 8 of 8 (>= 1.5 x the mean 2) and is skipped until it is back under 1.5x
    assert [d.replica for d in picks[:8]] == [0] * 8
    assert picks[8].replica != 0 and picks[9].replica not in (0, picks[8].replica)
    assert picks[8].reason == "no prefix >= 10% cached: balance; skipped r0: past 1.5x a fair share of the last 8"
    # a turn that another eligible replica also holds goes there, its reason naming both
    d = ca.choose(REQ, facts((0, 0, 90), (0, 0, 80), (0, 0, 0), (0, 0, 0)))
    assert d.replica == 1 and d.reason.startswith("80 of 100 tokens cached (balance over 90 on r0); skipped r0")


def test_cache_affinity_cold_request_leaves_a_replica_past_its_share():
    """With nothing cached anywhere a request costs the same everywhere: the history of a
    replica that already took more than its share does not pull the tenant back there."""
    ca = CacheAffinity(balance_rel=10.0)  # the spread guard off: this rule alone
    tenants = [RouteRequest(tuple(range(t * 1000, t * 1000 + 100))) for t in range(4)]
    cold = facts(*[(0, 0, 0)] * 4)
    homes = [ca.choose(t, cold).replica for t in tenants]
    assert sorted(homes) == [0, 1, 2, 3]  # new tenants spread
    a_cached = facts(*[(0, 0, 95 if i == homes[0] else 0) for i in range(4)])
    assert all(ca.choose(tenants[0], a_cached).replica == homes[0] for _ in range(4))  # its turns stay
    # tenant 0's rows evicted everywhere: its home took 5 of 8 (mean 2), so balance decides
    again = ca.choose(RouteRequest(tuple(range(90)) + (7, 7)), cold)
    assert again.replica != homes[0]
    assert again.reason == f"nothing cached; sent before to r{homes[0]}, past its share: balance"
    # tenant 1's home is within its share: its evicted tenant comes back to it
    back = ca.choose(RouteRequest(tuple(range(1000, 1090)) + (7, 7)), cold)
    assert back == Decision(homes[1], "nothing cached; sent here before (98%)")


class PromptCaches:
    """A scripted cluster: each replica caches the last ``capacity`` prompts it served, and
    its probe is the longest prefix of any of them."""

    def __init__(self, replicas: int, capacity: int) -> None:
        self.held: list[dict[tuple[int, ...], None]] = [{} for _ in range(replicas)]
        self.capacity = capacity

    def facts(self, prompt: tuple[int, ...]) -> list[ReplicaFacts]:
        return [ReplicaFacts(k, f"r{k}", 0, 0, max((common(prompt, p) for p in held), default=0))
                for k, held in enumerate(self.held)]

    def serve(self, k: int, prompt: tuple[int, ...]) -> None:
        held = self.held[k]
        held.pop(prompt, None)
        held[prompt] = None
        while len(held) > self.capacity:
            del held[next(iter(held))]


def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def popular_tenant_chats(seed: int = 0, conversations: int = 30, turns: int = 3) -> list[tuple[tuple[int, ...], int]]:
    """(prompt, turn) of 3-turn chats, 4 open at a time, under 4 tenants' 60-token system
    prompts, 60% of the chats under tenant 0; each turn adds 10 tokens."""
    rng = random.Random(seed)
    system = [tuple(range(1000 * (t + 1), 1000 * (t + 1) + 60)) for t in range(4)]
    fresh = itertools.count(10**6)
    live: list[list] = []
    out, started = [], 0
    while started < conversations or live:
        if started < conversations and len(live) < 4:
            live.append([system[0 if rng.random() < 0.6 else rng.randrange(1, 4)], 0])
            started += 1
            continue
        chat = rng.choice(live)
        chat[0] = chat[0] + tuple(next(fresh) for _ in range(10))
        chat[1] += 1
        out.append((chat[0], chat[1]))
        if chat[1] == turns:
            live.remove(chat)
    return out


@pytest.mark.parametrize("replicas", [2, 4])
def test_cache_affinity_spreads_a_popular_tenant_and_keeps_its_conversations(replicas):
    """A popular tenant (60% of the chats, its system prompt first cached on one replica):
    every replica serves within 1.5x of the others' requests, the tenant spreading over
    several where one cannot take its share, while a next turn with most of its prompt
    cached on one replica stays there (all but a few the spread guard moves)."""
    cluster, ca = PromptCaches(replicas, capacity=2), CacheAffinity()
    served = collections.Counter()
    tenant0 = collections.Counter()
    kept = movable = 0
    for prompt, turn in popular_tenant_chats():
        probe = cluster.facts(prompt)
        d = ca.choose(RouteRequest(prompt), probe)
        holder = max(probe, key=lambda f: f.cached_prefix_len or 0)
        if turn > 1 and (holder.cached_prefix_len or 0) >= 0.8 * len(prompt):
            movable += 1
            kept += d.replica == holder.index
        cluster.serve(d.replica, prompt)
        served[d.replica] += 1
        tenant0[d.replica] += prompt[0] == 1000
    counts = [served[k] for k in range(replicas)]
    assert max(counts) <= 1.5 * min(counts), counts
    if sum(tenant0.values()) > 1.5 * sum(counts) / replicas:  # more than one replica can take: spread
        assert sum(1 for n in tenant0.values() if n) >= 2, tenant0
    assert kept >= 0.9 * movable and movable > 30, (kept, movable)


def test_cache_affinity_imbalance_guard_overrides_the_cache():
    ca = CacheAffinity(balance_abs=4, balance_rel=1.5)
    assert ca.choose(REQ, facts((1, 0, 0), (6, 0, 100))).replica == 0  # 6 - 1 > 4 and 6 > 1.5
    assert ca.choose(REQ, facts((1, 0, 0), (5, 0, 100))).replica == 1  # 5 - 1 = 4: not imbalanced


def test_prefix_tree_router_follows_what_it_routed_and_spreads_new_prefixes():
    pt = PrefixTreeRouter(cache_threshold=0.3)
    reps = facts((0, 0, None), (0, 0, None))
    a1 = RouteRequest(tuple(range(0, 100)))
    b1 = RouteRequest(tuple(range(500, 600)))
    a2 = RouteRequest(tuple(range(0, 80)) + tuple(range(900, 920)))
    first = pt.choose(a1, reps).replica
    second = pt.choose(b1, reps)
    assert second.replica != first and "smallest tree" in second.reason  # empty tree has the most room
    third = pt.choose(a2, reps)
    assert third.replica == first and third.reason == "tree match 80%"
    # text prompts match by characters
    t = PrefixTreeRouter()
    t.choose(RouteRequest("You are a helpful assistant. Q1"), reps)
    assert t.choose(RouteRequest("You are a helpful assistant. Q2"), reps).reason.startswith("tree match")


def test_prefix_tree_evicts_least_recently_used_leaves_past_its_size():
    tree = PrefixTree(max_size=100)
    tree.insert(list(range(60)))
    tree.insert([1000 + i for i in range(60)])  # 120 nodes > 100: the older prompt's tail goes
    assert tree.size <= 100
    assert tree.match([1000 + i for i in range(60)]) == 60
    assert tree.match(list(range(60))) < 60


def test_make_router_names_the_bad_router_or_option():
    with pytest.raises(InvalidOption) as e:
        make_router("cache_afinity")
    assert e.value.key == "router"
    with pytest.raises(InvalidOption) as e:
        make_router("cache_affinity", {"min_match": 2.0})
    assert e.value.key == "min_match"
    with pytest.raises(InvalidOption) as e:
        make_router("cache_affinity", {"threshold": 0.2})
    assert e.value.key == "router_options"
    with pytest.raises(InvalidOption):
        make_router(42)
    fn = make_router(lambda req, reps: reps[-1].index)
    assert fn.choose(REQ, facts((0, 0, 0), (0, 0, 0))).replica == 1


@pytest.mark.parametrize("exc", [
    InvalidOption("temperature", -1.0, "a number >= 0"), UnknownOption("max_tokns", ["response_tokens"]),
    NoSession("chat-1"), SessionLost("chat-1", "replica-1"), ReplicaDown("replica-0", "died mid-stream"),
    DecodeTimeout("step over budget"),
])
def test_errors_cross_the_wire_as_their_own_class_and_fields(exc):
    back = unpack_error(pickle.loads(pickle.dumps(pack_error(exc))))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert vars(back) == vars(exc)


def test_an_unpicklable_attribute_travels_as_its_repr():
    class Odd:
        def __reduce__(self):
            raise TypeError("no")

        def __repr__(self):
            return "<odd>"

    back = unpack_error(pickle.loads(pickle.dumps(pack_error(InvalidOption("x", Odd(), "an int")))))
    assert isinstance(back, InvalidOption) and back.value == "<odd>" and back.key == "x"


def test_a_function_router_is_named_by_its_source() -> None:
    """The decisions name a lambda router by its text, a function by its name."""
    pick = make_router(lambda request, replicas: 0)
    assert pick.name == "lambda request, replicas: 0"
    assert pick.choose(REQ, facts((0, 0, None))).reason == "chosen by lambda request, replicas: 0"

    def first_up(request, replicas):
        return replicas[0].index

    assert make_router(first_up).name == "first_up"
    nested = make_router(lambda req, reps: max(reps, key=lambda r: r.in_flight).index)
    assert nested.name == "lambda req, reps: max(reps, key=lambda r: r.in_flight).index"


def test_the_routing_plot_labels_both_axes_and_the_tables_show_units() -> None:
    """c.plot() and c.decisions() from a cluster's members and decision log (no Ray)."""
    from types import SimpleNamespace

    from workbench.cluster.views import decisions_frame, plot_routing
    from workbench.notebook import display

    members = [SimpleNamespace(name="replica-0"), SimpleNamespace(name="replica-1")]
    log = [{"ref": i, "kind": "complete", "session": None, "router": "cache_affinity", "replica": f"replica-{i % 2}",
            "reason": "no prefix >= 10% cached: balance", "probed": {"replica-0": (0, 0), "replica-1": (160, 1)},
            "outcome": {"hit": "partial", "prompt_tokens": 180, "reused_tokens": 160, "ttft_s": 0.031195}}
           for i in range(3)]
    cluster = SimpleNamespace(members=members, routing=SimpleNamespace(log=log))
    fig = plot_routing(cluster)
    assert [ax.get_ylabel() for ax in fig.axes] == ["requests", "prompt tokens"]
    assert [p.get_height() for p in fig.axes[0].patches] == [2, 1]
    df = decisions_frame(cluster)
    assert display.is_table(df) and df["ttft_s"].iloc[0] == 0.031195
    text = display.shown(df)
    assert text.loc[0, "ttft_s"] == "0.031" and text.loc[0, "reused_tokens"] == "160"
