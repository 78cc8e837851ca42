"""The eviction lab without a model: exact outcomes on hand-made traces, agreement with a
plain whole-row replay (real token ids, reference.py), libCacheSim's miss counts, user policies, speed."""

from __future__ import annotations

import math
import time

import pandas as pd
import pytest

from .reference import reference_replay
from workbench.cache import LRU, S3FIFO, get_policy
from workbench.cache.types import RowStats
from workbench import lab
from workbench.lab import traces
from workbench.lab.plan import CHECKPOINT, build_plan, run_plan
from workbench.lab.traces import Trace

EXACT_COLUMNS = ["policy", "size_bytes", "requests", "hits", "exact_hits", "partial_hits", "misses", "hit_ratio",
                 "miss_ratio", "byte_hit_ratio", "prompt_tokens", "prefill_tokens_saved", "prefill_saved_fraction",
                 "rows_saved", "saves_too_large", "evictions", "evicted_bytes", "rows_end", "bytes_end", "seconds"]
CHUNK_COLUMNS = ["chunks_end", "logical_bytes_end", "shared_bytes_end", "chunks_written", "chunks_reused",
                 "chunks_collected", "chunk_ties"]


# --- hand-made traces: exact hits and misses ------------------------------------------------

def test_tiny_trace_exact_partial_and_cold() -> None:
    a = list(range(100, 140))           # 40 tokens
    b = a + list(range(200, 220))       # extends a: partial hit of 39 (the row a[:39])
    c = list(range(300, 330))           # unrelated: cold
    trace = Trace.from_prompts([a, a, b, c, b])
    df = lab.replay(trace, ["lru"], [10**6], bytes_per_token=1, checkpoint_every=None, workers=1, chunk_size=None)
    row = df.iloc[0]
    # whole rows (a row of n tokens costs n bytes here); the prompt row holds the prompt
    # without its last token (n - 1), exact = matched >= n - 1:
    # a: cold (saves a[:39]); a: exact (39 >= 40 - 1); b: partial 39 (39 < 60 - 1; saves
    # b[:59]); c: cold (saves c[:29]); b: exact (59 >= 60 - 1)
    assert (row.misses, row.exact_hits, row.partial_hits) == (2, 2, 1)
    assert row.prompt_tokens == 40 + 40 + 60 + 30 + 60
    # saved = min(matched, prompt - 1): 0 + 39 + 39 + 0 + 59
    assert row.prefill_tokens_saved == 137
    assert row.byte_hit_ratio == pytest.approx((39 + 39 + 59) / 230)
    assert row.rows_saved == 3 and row.evictions == 0
    assert row.bytes_end == 39 + 59 + 29


def test_one_token_reply_saves_no_finish_row() -> None:
    # turn 1: prompt 20 + 5 = 25 tokens, reply 1 token (its end-of-turn token alone, sampled,
    # never decoded: the KV ends with the prompt, as after a prefill alone, and the engine
    # saves a finish row only longer than the prompt); turn k+1 = turn k + reply (1) + user
    # (5): prompts of 25, 31, 37 tokens, prompt rows of 24, 30, 36
    trace = traces.multi_turn_chats(3, seed=1, concurrency=1, turns=(3, 3), system_tokens=(20, 20),
                                    user_tokens=(5, 5), reply_tokens=(1, 1))
    got = run_plan(build_plan(trace, checkpoint_every=None), get_policy("lru"), 10**9, 1, record=True)
    # turn 2 matches turn 1's prompt row (24 < 31 - 1: partial), turn 3 turn 2's (30 < 36)
    assert got["_requests"] == [("cold", 0), ("partial", 24), ("partial", 30)]
    assert got["rows_saved"] == 3 and got["bytes_end"] == 24 + 30 + 36
    assert got["_requests"] == reference_replay(trace, "lru", 10**9, 1, checkpoint_every=None)


def test_a_repeated_prompt_is_an_exact_hit_on_its_prompt_row() -> None:
    b = traces._Builder("again", 0)
    system, user, reply = b.segment(20), b.segment(5), b.segment(3)
    b.request([system, user], reply, 0.0)
    b.request([system, user], reply, 1.0)
    again = b.build()
    got = run_plan(build_plan(again, checkpoint_every=None), get_policy("lru"), 10**9, 1, record=True)
    # request 1 saves its prompt row (24) and a finish row (25 + 3 - 1 = 27); request 2 finds
    # the prompt row (24 >= 25 - 1: exact) and saves nothing new
    assert got["_requests"] == [("cold", 0), ("exact", 24)]
    assert got["rows_saved"] == 2 and got["bytes_end"] == 24 + 27
    assert got["_requests"] == reference_replay(again, "lru", 10**9, 1, checkpoint_every=None)


def test_an_agent_prefix_of_the_whole_prompt_replaces_the_prompt_row() -> None:
    b = traces._Builder("whole", 0)
    system, task = b.segment(30), b.segment(6)
    b.request([system], -1, 0.0, pin=1)        # the pinned prefix is all of the prompt: 30
    b.request([system], -1, 1.0, pin=1)
    b.request([system, task], -1, 2.0, pin=1)  # 36 tokens, prefix 30
    trace = b.build()
    got = run_plan(build_plan(trace, checkpoint_every=None), get_policy("lru"), 10**9, 1, record=True)
    # request 0 saves the pinned row of 30 tokens and no prompt row of 29; request 1 finds it
    # (30 >= 30 - 1: exact, reuses 29); request 2 reuses it (partial 30) and saves its prompt
    # row of 35
    assert got["_requests"] == [("cold", 0), ("exact", 29), ("partial", 30)]
    assert got["rows_saved"] == 2 and got["bytes_end"] == 30 + 35
    assert got["_requests"] == reference_replay(trace, "lru", 10**9, 1, checkpoint_every=None)


def test_one_token_prompts_are_never_looked_up() -> None:
    # a checkpoint every token: [5, 6, 7] saves [5] (checkpoint at 1) and [5, 6]
    # (its prompt row); the prompt [5] then matches [5], but the engine skips the lookup of a
    # one-token prompt (nothing could be reused), so it is cold and reads nothing
    trace = Trace.from_prompts([[5, 6, 7], [5], [5, 6, 7]])
    plan = build_plan(trace, checkpoint_every=1, min_tokens=1)
    got = run_plan(plan, get_policy("lru"), 100, 1, record=True)["_requests"]
    assert got == [("cold", 0), ("cold", 0), ("exact", 2)]
    assert got == reference_replay(trace, "lru", 100, 1, block_size=1, checkpoint_every=1, min_tokens=1)


def test_checkpoints_make_a_shared_prefix_reusable() -> None:
    doc = list(range(1000, 1064))                         # 64 tokens shared
    q1, q2 = doc + [5, 6, 7], doc + [8, 9, 10, 11]
    trace = Trace.from_prompts([q1, q2])
    # whole rows: only a row that is a prefix of q2 serves it (chunks: q1's chunk agrees with
    # q2 for 64 tokens, and a chain lookup resumes there without checkpoints)
    plain = lab.replay(trace, ["lru"], [10**6], bytes_per_token=1, checkpoint_every=None, workers=1,
                       chunk_size=None).iloc[0]
    every32 = lab.replay(trace, ["lru"], [10**6], bytes_per_token=1, checkpoint_every=32, workers=1,
                         chunk_size=None).iloc[0]
    chunked = lab.replay(trace, ["lru"], [10**6], bytes_per_token=1, checkpoint_every=None, workers=1).iloc[0]
    assert chunked.partial_hits == 1 and chunked.prefill_tokens_saved == 64
    assert plain.misses == 2                              # the saved q1[:66] is not a prefix of q2
    # q1 (67 tokens) checkpoints at range(32, 67 - 1, 32) = 32, 64, and its prompt row is 66
    assert every32.partial_hits == 1 and every32.prefill_tokens_saved == 64


def test_checkpoint_band() -> None:
    doc = list(range(1000, 1100))                         # 100 tokens shared
    q1, q2 = doc + [5, 6, 7], doc + [8, 9, 10, 11]
    trace = Trace.from_prompts([q1, q2])

    def ckpts(**band: int | None) -> list[int]:
        plan = build_plan(trace, checkpoint_every=16, **band)  # type: ignore[arg-type]
        return [n for _, _, n, kind in plan.prefill[0] if kind == CHECKPOINT]

    def saved(**band: int | None) -> int:
        df = lab.replay(trace, ["lru"], [10**6], bytes_per_token=1, checkpoint_every=16, workers=1, chunk_size=None,
                        **band)
        ref = reference_replay(trace, "lru", 10**6, 1, checkpoint_every=16, **band)  # type: ignore[arg-type]
        assert df.iloc[0].prefill_tokens_saved == sum(s for _, s in ref)
        return int(df.iloc[0].prefill_tokens_saved)

    # q1: 103 tokens, checkpoints at multiples of 16 below 103 - 1 = 102, inside the band
    assert ckpts() == [16, 32, 48, 64, 80, 96]
    assert ckpts(checkpoint_min=40, checkpoint_max=90) == [48, 64, 80]
    assert ckpts(checkpoint_min=48, checkpoint_max=64) == [48, 64]        # both ends included
    assert ckpts(checkpoint_min=97) == []                   # the first multiple in the band, 112, is >= 102
    assert ckpts(checkpoint_max=15) == []
    # q2 reuses the longest checkpoint in the band: 96, 80, none
    assert (saved(), saved(checkpoint_max=90), saved(checkpoint_min=97)) == (96, 80, 0)
    for bad, message in [(dict(checkpoint_min=-1), "checkpoint_min must be an int >= 0"),
                         (dict(checkpoint_max=0), "checkpoint_max must be an int >= 1 or None"),
                         (dict(checkpoint_min=50, checkpoint_max=40),
                          r"checkpoint_max \(40\) must be >= checkpoint_min \(50\)")]:
        with pytest.raises(ValueError, match=message):
            lab.replay(trace, ["lru"], [100], **bad)  # type: ignore[arg-type]
    params = lab.replay(trace, ["lru"], [100], checkpoint_min=32, checkpoint_max=64, workers=1).attrs["params"]
    assert (params["checkpoint_min"], params["checkpoint_max"]) == (32, 64)


def test_eviction_order_lru_with_small_budget() -> None:
    x, y, z = [1] * 20, [2] * 20, [3] * 20
    # each prompt saves a row of 19 tokens (without its last token); a budget of 40 holds two:
    # x y x z (evicts y, the least recently used) y (evicts x) x (miss); lfu keeps x (hit once)
    trace = Trace.from_prompts([x, y, x, z, y, x])
    got = run_plan(build_plan(trace, checkpoint_every=None), get_policy("lru"), 40, 1, record=True)["_requests"]
    assert [k for k, _ in got] == ["cold", "cold", "exact", "cold", "cold", "cold"]
    got = run_plan(build_plan(trace, checkpoint_every=None), get_policy("lfu"), 40, 1, record=True)["_requests"]
    assert [k for k, _ in got] == ["cold", "cold", "exact", "cold", "cold", "exact"]  # x has a hit: kept


def test_finish_row_serves_the_next_chat_turn() -> None:
    trace = traces.multi_turn_chats(3, seed=1, concurrency=1, turns=(3, 3), system_tokens=(20, 20),
                                    user_tokens=(5, 5), reply_tokens=(7, 7))
    got = run_plan(build_plan(trace, checkpoint_every=None), get_policy("lru"), 10**9, 1, record=True)["_requests"]
    # turn 2's prompt = turn 1's prompt (25) + reply (7) + user (5) = 37; the finish row
    # holds the prompt and the reply without its end token: 25 + 6 = 31 tokens (the prompt
    # row, 24, is shorter); turn 3's prompt is 37 + 7 + 5 = 49, turn 2's finish row 37 + 6
    assert got == [("cold", 0), ("partial", 31), ("partial", 31 + 1 + 5 + 6)]


def test_agent_prefix_is_pinned_and_survives_pressure() -> None:
    trace = traces.agent_tasks(60, seed=2, agents=1, prefix_tokens=(50, 50), task_tokens=(5, 30),
                               action_tokens=(3, 9), observation_tokens=(5, 40), concurrency=8)
    size = 400  # tokens; a few rows at most
    with_pin = lab.replay(trace, ["lru"], [size], bytes_per_token=1, checkpoint_every=None, workers=1,
                          chunk_size=None).iloc[0]
    without = lab.replay(trace, ["lru"], [size], bytes_per_token=1, checkpoint_every=None, workers=1,
                         saves=("prompt", "finish"), chunk_size=None).iloc[0]
    assert with_pin.misses == 1  # only the very first request: every later one starts with the pinned prefix
    assert without.misses > with_pin.misses


# --- agreement with the real cache ------------------------------------------------------------

SMALL_CHATS = dict(system_tokens=(20, 60), user_tokens=(3, 30), reply_tokens=(3, 40), turns=(1, 6), concurrency=6)
CASES = {
    "chats": (lambda: traces.multi_turn_chats(300, seed=3, **SMALL_CHATS), 32),
    "agents": (lambda: traces.agent_tasks(300, seed=4, agents=3, prefix_tokens=(40, 90), task_tokens=(3, 20),
                                          action_tokens=(2, 15), observation_tokens=(5, 40), concurrency=5), 48),
    "rag": (lambda: traces.rag_queries(300, seed=5, documents=40, doc_tokens=(10, 60), system_tokens=12,
                                       query_tokens=(3, 12), reply_tokens=(2, 20)), 32),
    # replies of 1 to 3 tokens (one token: no finish row), 1-token messages, prompts of a
    # few tokens: every row ends within a token or two of a prompt's end
    "short": (lambda: traces.multi_turn_chats(300, seed=6, system_tokens=(1, 20), user_tokens=(1, 6),
                                              reply_tokens=(1, 3), turns=(1, 8), concurrency=4), 16),
}


@pytest.mark.parametrize("policy", ["lru", "lfu", "frecency", "gdsf", "s3fifo"])
@pytest.mark.parametrize("workload", sorted(CASES))
def test_same_outcomes_as_the_plain_whole_row_replay(workload: str, policy: str) -> None:
    """Virtual tokens + SimCache give, request by request, the hit kind and saved prefill
    of whole rows fed the real token ids (the slow reference in reference.py)."""
    make, every = CASES[workload]
    trace = make()
    for size in (600, 2500):
        ours = run_plan(build_plan(trace, checkpoint_every=every), get_policy(policy), size, 1, record=True)
        ref = reference_replay(trace, policy, size, 1, checkpoint_every=every)
        assert ours["_requests"] == ref
    assert any(kind != "cold" for kind, _ in ref)


@pytest.mark.parametrize("workload", sorted(CASES))
def test_checkpoint_band_agrees_with_the_plain_whole_row_replay(workload: str) -> None:
    make, every = CASES[workload]
    trace = make()
    band = dict(checkpoint_min=every + 1, checkpoint_max=3 * every)  # the 2nd and 3rd checkpoints only
    for policy in ("lru", "gdsf"):
        ours = run_plan(build_plan(trace, checkpoint_every=every, **band), get_policy(policy), 1500, 1, record=True)
        assert ours["_requests"] == reference_replay(trace, policy, 1500, 1, checkpoint_every=every, **band)


# --- libCacheSim -------------------------------------------------------------------------------

def reference_misses(name: str, cache_size: int, objects: list[int], size_of) -> int:  # type: ignore[no-untyped-def]
    import libcachesim as lcs

    cache = getattr(lcs, name)(cache_size=cache_size)
    return sum(not cache.get(lcs.Request(obj_size=size_of(o), obj_id=o + 1)) for o in objects)


def mixed_size(obj: int) -> int:
    return 1 + (obj * 2654435761) % 4


@pytest.mark.parametrize("size_of, sizes", [(lambda o: 1, [20, 100, 400]), (mixed_size, [100, 300])],
                         ids=["unit", "mixed"])
def test_miss_ratio_equals_libcachesim(size_of, sizes) -> None:  # type: ignore[no-untyped-def]
    """Single-segment requests (one object each) through replay: the miss ratio of lru and
    s3fifo equals libCacheSim's LRU and S3FIFO on the same Zipf trace (sizes stay below
    S3-FIFO's small queue, which libCacheSim would refuse).

    Object o is a prompt of size_of(o) + 1 tokens: the engine saves a prompt without its
    last token, so its row is exactly size_of(o) tokens (bytes, at 1 byte a token), and
    the next request for o finds it (size_of(o) >= n - 1: an exact hit, nothing saved).
    Whole rows (chunk_size=None): libCacheSim's objects are distinct, while the chunk model
    would let two objects whose 1-token rows draw the same token id share their chunk."""
    objects = traces.zipf_objects(12_000, 1_500, alpha=1.0, seed=42)
    trace = traces.object_trace(objects, lambda o: size_of(o) + 1)
    df = lab.replay(trace, ["lru", "s3fifo"], sizes, bytes_per_token=1, min_tokens=1, checkpoint_every=None,
                    workers=1, chunk_size=None)
    for row in df.itertuples():
        expected = reference_misses({"lru": "LRU", "s3fifo": "S3FIFO"}[row.policy], row.size_bytes, objects, size_of)
        assert row.misses == expected and row.exact_hits == len(objects) - expected
        assert row.miss_ratio == expected / len(objects)
        assert row.rows_saved == expected  # one row per miss (a miss is a libCacheSim insert)


# --- policies given every way ------------------------------------------------------------------

def test_user_function_class_and_instance_policies() -> None:
    trace = traces.multi_turn_chats(400, seed=7, **SMALL_CHATS)

    def oldest_first(row: RowStats, now: float) -> float:
        return row.last_used_at

    stateful = S3FIFO()
    df = lab.replay(trace, ["lru", oldest_first, LRU, stateful, lambda row, now: -row.n_tokens],
                    [40_000, 150_000], bytes_per_token=64, checkpoint_every=32, workers=1, chunk_size=16)
    assert list(df["policy"].cat.categories) == ["lru", "oldest_first", "lru#2", "s3fifo", "custom"]
    by = df.set_index(["policy", "size_bytes"])
    for size in (40_000, 150_000):
        # a function computing LRU's priority evicts exactly as LRU does
        assert by.loc[("oldest_first", size), "misses"] == by.loc[("lru", size), "misses"]
        assert by.loc[("lru#2", size), "misses"] == by.loc[("lru", size), "misses"]
    assert len(stateful.small) == 0 and len(stateful.main) == 0  # the instance was copied, not used
    # largest first is a different policy: it must change something at the small size
    assert by.loc[("custom", 40_000), "evictions"] != by.loc[("lru", 40_000), "evictions"]


def test_time_invariant_function_takes_the_fast_path_with_the_same_result() -> None:
    trace = traces.multi_turn_chats(300, seed=8, **SMALL_CHATS)

    def by_hits(row: RowStats, now: float) -> float:
        return float(row.hits)

    fast = lambda row, now: float(row.hits)  # noqa: E731
    fast.time_invariant = True  # type: ignore[attr-defined]
    from workbench.lab.simcache import SimCache

    assert SimCache(get_policy(fast), 10).mode == "event"
    assert SimCache(get_policy(by_hits), 10).mode == "pure"
    df = lab.replay(trace, [by_hits, fast, "lfu"], [900], bytes_per_token=1, checkpoint_every=32, workers=1)
    assert df["misses"].nunique() == 1 and df["evictions"].nunique() == 1


def test_unknown_policy_and_bad_arguments() -> None:
    trace = Trace.from_prompts([[1, 2, 3]])
    with pytest.raises(ValueError, match="unknown eviction policy 'nope'; valid:"):
        lab.replay(trace, ["nope"], [100])
    with pytest.raises(ValueError, match="unknown save kind"):
        lab.replay(trace, ["lru"], [100], saves=("finish", "everything"))
    with pytest.raises(ValueError, match="not a byte size"):
        lab.replay(trace, ["lru"], ["lots"])
    with pytest.raises(ValueError, match="bytes_per_token"):
        lab.replay(trace, ["lru"], [100], bytes_per_token=0)


# --- output -------------------------------------------------------------------------------------

def test_dataframe_shape_dtypes_and_timeline() -> None:
    trace = traces.rag_queries(500, seed=9, documents=30, doc_tokens=(20, 80))
    df = lab.replay(trace, ["lru", "gdsf"], ["1MiB", 4 << 20], checkpoint_every=64, workers=1)
    assert list(df.columns) == [*EXACT_COLUMNS[:-1], *CHUNK_COLUMNS, "seconds"]
    whole = lab.replay(trace, ["lru"], ["1MiB"], checkpoint_every=64, workers=1, chunk_size=None)
    assert list(whole.columns) == EXACT_COLUMNS
    assert isinstance(df["policy"].dtype, pd.CategoricalDtype)
    assert df["size_bytes"].dtype == "int64" and df["misses"].dtype == "int64"
    assert df["hit_ratio"].dtype == "float64"
    assert list(df["size_bytes"]) == [1 << 20, 4 << 20, 1 << 20, 4 << 20]
    assert ((df["hit_ratio"] + df["miss_ratio"]) - 1).abs().max() < 1e-12
    assert (df["bytes_end"] <= df["size_bytes"]).all()
    tl = df.attrs["timeline"]
    assert set(tl["policy"].astype(str)) == {"lru", "gdsf"}
    last = tl.groupby(["policy", "size_bytes"], observed=True).last()
    for row in df.itertuples():
        assert last.loc[(row.policy, row.size_bytes), "evictions"] == row.evictions
        assert last.loc[(row.policy, row.size_bytes), "misses"] == row.misses
    assert df.attrs["params"]["checkpoint_every"] == 64


def test_default_sizes_span_the_footprint() -> None:
    trace = traces.multi_turn_chats(200, seed=10, **SMALL_CHATS)
    df = lab.replay(trace, ["lru"], workers=1)
    footprint = df.attrs["params"]["footprint_bytes"]
    assert len(df) == 8
    assert df["size_bytes"].min() >= footprint * 0.004 and df["size_bytes"].max() <= footprint * 0.5 + 1
    assert df["miss_ratio"].is_monotonic_decreasing  # LRU is a stack algorithm on this trace


def test_forked_workers_give_the_same_numbers() -> None:
    trace = traces.multi_turn_chats(6_000, seed=11)
    unpicklable = lambda row, now: row.last_used_at  # noqa: E731 - lambdas do not pickle
    kw = dict(sizes=["256MiB", "1GiB"], workers=1)
    serial = lab.replay(trace, ["lru", "s3fifo", unpicklable], **kw)
    forked = lab.replay(trace, ["lru", "s3fifo", unpicklable], **{**kw, "workers": 2})
    cols = [c for c in EXACT_COLUMNS if c != "seconds"]
    pd.testing.assert_frame_equal(serial[cols], forked[cols])


def test_plots_return_figures() -> None:
    from matplotlib.figure import Figure

    from workbench.notebook import plots

    trace = traces.multi_turn_chats(300, seed=12, **SMALL_CHATS)
    df = lab.replay(trace, ["lru", "s3fifo"], [500, 1500, 5000], bytes_per_token=1, workers=1)
    fig = lab.plot_miss_ratio_curves(df)
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 2
    assert isinstance(plots.miss_ratio_curves(df, metric="prefill_saved_fraction"), Figure)
    tl_fig = plots.eviction_timeline(df)
    assert isinstance(tl_fig, Figure) and len(tl_fig.axes[0].lines) == 4  # evictions + hits per policy
    with pytest.raises(ValueError, match="no column"):
        plots.miss_ratio_curves(df, metric="nope")


# --- speed --------------------------------------------------------------------------------------

@pytest.mark.parametrize("requests, chunk_size", [(100_000, None), (20_000, 256)], ids=["rows-100k", "chunks-20k"])
def test_speed_of_a_long_replay(capsys: pytest.CaptureFixture[str], requests: int, chunk_size: int | None) -> None:
    """A long chat trace through the 5 policies at one budget, whole rows and chunks (the
    chunk model, the store's rules, costs more a request); the time is printed (the
    machine's load varies too much to assert it). bench/bench_replay.py measures more."""
    t0 = time.perf_counter()
    trace = traces.multi_turn_chats(requests, seed=0)
    t1 = time.perf_counter()
    df = lab.replay(trace, lab.DEFAULT_POLICIES, ["8GiB"], chunk_size=chunk_size)
    t2 = time.perf_counter()
    with capsys.disabled():
        print(f"\n{requests:,}-request chat trace ({'whole rows' if chunk_size is None else 'chunks'}): generated in "
              f"{t1 - t0:.1f} s, replayed through {len(df)} policies in {t2 - t1:.1f} s wall (per policy, s: "
              + ", ".join(f"{p} {s:.1f}" for p, s in zip(df['policy'], df['seconds'])) + ")")
    assert len(df) == 5 and (df["requests"] == requests).all()
    assert not math.isnan(df["hit_ratio"].sum())


def test_lab_imports_and_replays_without_ipython():
    """The lab is its own package: a replay runs in a process that never imports IPython or
    ipywidgets (scripts, benchmarks and Ray workers use it without a notebook)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from workbench import lab\n"
            "from workbench.lab import traces\n"
            "df = lab.replay(traces.multi_turn_chats(40, seed=1), policies=['lru'], sizes=['64MiB'])\n"
            "assert len(df) == 1, df\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'ipykernel'))\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
