"""The eviction lab's offline optimum (`policy='belady'`, labelled "optimal", lab only):
exact saves on hand-made traces, never below a built-in policy on the lab's traces, its
ranking (next use after the current request, ranked again when a predicted read did not
happen), its label and plot, and the real cache still refusing it."""

from __future__ import annotations

import array
from typing import Any

import pandas as pd
import pytest

from workbench import lab
from workbench.cache.chunk_format import chunk_file_size, manifest_size
from workbench.cache.policies import POLICIES, get_policy
from workbench.cache.types import RowStats
from workbench.lab import traces
from workbench.lab.belady import Belady, FutureUses, is_belady
from workbench.lab.plan import build_plan
from workbench.lab.simcache import ranking_mode
from workbench.lab.traces import Trace

BUILT_IN = sorted(POLICIES)   # every policy a real cache takes by name


def _prompt(base: int, n: int = 21) -> list[int]:
    return list(range(base, base + n))


# --- (a) hand-made traces: the optimum is known -------------------------------------------------

def _whole(trace: Trace, policies: list[Any], size: int) -> pd.DataFrame:
    return lab.replay(trace, policies, [size], bytes_per_token=1, checkpoint_every=None, workers=1,
                      chunk_size=None).set_index("policy")


def test_cyclic_trace_whole_rows() -> None:
    # three prompts of 21 tokens, each saving a row of 20 (without its last token), a budget
    # of 40 (two rows), requests A B C A B C A B C. lru always misses (the row asked for is
    # the one it evicted last). Belady, at C (request 2): A is next used at 3, B at 4: B goes;
    # A hits (3); at B (4): A next at 6, C at 5: A goes; C hits (5); at A (6): C next at 8,
    # B at 7: C goes; B hits (7); C (8) misses. Three exact hits of 20 tokens each.
    a, b, c = _prompt(100), _prompt(200), _prompt(300)
    df = _whole(Trace.from_prompts([a, b, c] * 3), ["lru", "belady"], 40)
    assert df.loc["lru", "prefill_tokens_saved"] == 0
    assert df.loc["optimal", "prefill_tokens_saved"] == 3 * 20
    assert df.loc["optimal", "exact_hits"] == 3 and df.loc["optimal", "misses"] == 6


def test_a_row_never_used_again_goes_first() -> None:
    # A X B A B, two rows of 20 fit: at B (request 2) the rows are A (next use 3) and X (never
    # used again): X goes, and A and B both hit: 40 saved. lru evicts A (used longest ago),
    # misses A (evicting X), hits B: 20.
    a, x, b = _prompt(100), _prompt(500), _prompt(200)
    df = _whole(Trace.from_prompts([a, x, b, a, b]), ["lru", "belady"], 40)
    assert df.loc["optimal", "prefill_tokens_saved"] == 40
    assert df.loc["lru", "prefill_tokens_saved"] == 20


def test_cyclic_trace_chunk_model() -> None:
    # the same cycle in the chunk model: chunks of 16 tokens, prompts of 17, so each prompt's
    # row (16 tokens) is one chunk plus its manifest; the budget holds two such rows, not three
    a, b, c = _prompt(100, 17), _prompt(200, 17), _prompt(300, 17)
    one = chunk_file_size(16, 16) + manifest_size(16, 1)
    df = lab.replay(Trace.from_prompts([a, b, c] * 3), ["lru", "belady"], [2 * one + one // 2], bytes_per_token=1,
                    checkpoint_every=None, workers=1, chunk_size=16).set_index("policy")
    assert df.loc["lru", "prefill_tokens_saved"] == 0
    assert df.loc["optimal", "prefill_tokens_saved"] == 3 * 16
    assert df.loc["optimal", "exact_hits"] == 3


# --- (b) the lab's traces: never below a built-in policy ---------------------------------------

TRACES = {
    "chats": lambda: traces.multi_turn_chats(400, seed=21),
    "agents": lambda: traces.agent_tasks(400, seed=22),
    "rag": lambda: traces.rag_queries(400, seed=23, documents=200),
}


@pytest.mark.parametrize("chunk_size", [64, None], ids=["chunks", "whole-rows"])
@pytest.mark.parametrize("workload", sorted(TRACES))
def test_optimal_saves_at_least_every_built_in_policy(workload: str, chunk_size: int | None) -> None:
    trace = TRACES[workload]()
    footprint = build_plan(trace, chunk_size=chunk_size).footprint_tokens * lab.experiment.DEFAULT_BYTES_PER_TOKEN
    sizes = [int(footprint * f) for f in (0.02, 0.06, 0.2)]   # from tight to where little is evicted
    df = lab.replay(trace, [*BUILT_IN, "belady"], sizes, workers=1, timeline_points=0, chunk_size=chunk_size)
    saved = df.pivot_table(index="size_bytes", columns="policy", values="prefill_tokens_saved", observed=True)
    best = saved[BUILT_IN].max(axis=1)
    assert (saved["optimal"] >= best).all(), saved
    # and it is a bound worth having: strictly more than every built-in one at the smallest budget
    assert saved["optimal"].iloc[0] > best.iloc[0]


# --- its ranking ------------------------------------------------------------------------------

def _stats(key: str, n_tokens: int = 1) -> RowStats:
    return RowStats(key, 10, n_tokens, 0.0)


def test_next_use_is_after_the_current_request() -> None:
    # a unit inserted by request 3 and read by request 3 in the unbounded replay (its own
    # lookup came first) is next used at 5, not 3
    future = FutureUses(10, {"a": array.array("i", [3, 5]), "b": array.array("i", [4])})
    pol = Belady(future)
    pol.on_request(3, 0.0)
    pol.on_insert(_stats("a"))
    pol.on_insert(_stats("b"))
    assert pol.priority(_stats("a"), 0.0) == -5.0 and pol.priority(_stats("b"), 0.0) == -4.0
    assert pol.victim() == "a"                      # the farthest next use goes
    assert pol.victim() == "b" and pol.victim() is None
    pol.on_insert(_stats("c"))                      # never read: first to go
    pol.on_insert(_stats("b"))
    assert pol.priority(_stats("c"), 0.0) == -10.0
    assert pol.victim(lambda k: k == "c") == "b"    # what the cache blocks is skipped
    assert pol.victim() == "c"


def test_a_predicted_read_that_did_not_happen_is_ranked_again() -> None:
    # a is predicted to be read at 2 and 8, b at 5. At request 3, a was not read at 2 (the
    # finite cache read something else): its next use is 8, so it goes before b. Ranked on
    # its insert alone, it would look needed at 2 and b would go.
    future = FutureUses(10, {"a": array.array("i", [2, 8]), "b": array.array("i", [5])})
    pol = Belady(future)
    pol.on_request(0, 0.0)
    pol.on_insert(_stats("a"))
    pol.on_insert(_stats("b"))
    pol.on_request(2, 0.0)
    pol.on_request(3, 0.0)
    assert pol.victim() == "a"
    assert pol.reranked == 1
    # read when predicted: ranked again on the hit, nothing to catch up
    pol = Belady(future)
    pol.on_request(0, 0.0)
    pol.on_insert(_stats("a"))
    pol.on_insert(_stats("b"))
    pol.on_request(2, 0.0)
    pol.on_hit(_stats("a"))
    pol.on_request(3, 0.0)
    assert pol.victim() == "a" and pol.reranked == 0


def test_ties_go_to_the_deeper_chunk_and_removed_units_are_forgotten() -> None:
    future = FutureUses(10, {"p": array.array("i", [4]), "q": array.array("i", [4])}, {"p": 0, "q": 1})
    pol = Belady(future)
    pol.on_request(1, 0.0)
    pol.on_insert(_stats("p"))
    pol.on_insert(_stats("q"))
    pol.on_remove(_stats("q"))
    assert len(pol) == 1 and pol.victim() == "p"
    pol.on_insert(_stats("p"))
    pol.on_insert(_stats("q"))
    assert pol.victim() == "q"                      # same next use: the deeper one (a leaf) first


def test_future_uses_of_a_plan_record_the_unbounded_reads() -> None:
    a, b = _prompt(100), _prompt(200)
    plan = build_plan(Trace.from_prompts([a, b, a, a, b]), checkpoint_every=None)   # whole rows
    future = FutureUses.of(plan)
    # a's row (saved by request 0) is read by 2 and 3, b's (saved by 1) by 4
    assert sorted(list(v) for v in future.uses.values()) == [[2, 3], [4]]
    row_a = plan.prefill[0][0][0]
    assert future.next_use(row_a, 0) == 2 and future.next_use(row_a, 2) == 3 and future.next_use(row_a, 3) == 5
    chunked = FutureUses.of(build_plan(Trace.from_prompts([a, b, a, a, b]), checkpoint_every=None, chunk_size=8))
    assert chunked.depth and min(chunked.depth.values()) == 0
    # each read of a prompt reads its stored chain: two full chunks (16 tokens) and the tail (4)
    assert chunked.reads() == 3 * 3


def test_it_chooses_its_victims_itself() -> None:
    plan = build_plan(Trace.from_prompts([_prompt(100)]), checkpoint_every=None)
    assert ranking_mode(Belady(plan)) == "victim"
    assert is_belady("belady") and is_belady("Optimal") and is_belady(Belady) and not is_belady("lru")


# --- (c) the label and the plot -----------------------------------------------------------------

def test_label_plot_and_forked_workers() -> None:
    from matplotlib.figure import Figure

    from workbench.notebook import plots

    trace = traces.multi_turn_chats(5_000, seed=24)
    kw = dict(sizes=["1GiB", "4GiB"], chunk_size=None, timeline_points=0)
    serial = lab.replay(trace, ["lru", "belady"], workers=1, **kw)
    assert list(serial["policy"].cat.categories) == ["lru", "optimal"]
    forked = lab.replay(trace, ["lru", "belady"], workers=2, **kw)   # 5,000 x 4 jobs: forked
    cols = [c for c in serial.columns if c != "seconds"]
    pd.testing.assert_frame_equal(serial[cols], forked[cols])
    fig = plots.miss_ratio_curves(serial, metric="prefill_saved_fraction")
    assert isinstance(fig, Figure)
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    assert set(lines) == {"lru", "optimal (Belady)"}
    assert lines["optimal (Belady)"].get_linestyle() == "--" and lines["optimal (Belady)"].get_color() == "black"
    assert lines["lru"].get_color() != "black"


def test_a_belady_instance_is_rebuilt_for_the_replays_trace() -> None:
    a, b, c = _prompt(100), _prompt(200), _prompt(300)
    other = Belady(build_plan(Trace.from_prompts([a]), checkpoint_every=None))
    df = _whole(Trace.from_prompts([a, b, c] * 3), ["lru", other], 40)
    assert df.loc["optimal", "prefill_tokens_saved"] == 3 * 20


# --- (d) not a cache policy -------------------------------------------------------------------

def test_the_real_cache_refuses_it() -> None:
    assert "belady" not in POLICIES and "optimal" not in POLICIES
    for name in ("belady", "optimal"):
        with pytest.raises(ValueError, match="needs the future: it is the eviction lab's offline optimum"):
            get_policy(name)
