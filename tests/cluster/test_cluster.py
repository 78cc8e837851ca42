"""The cluster on a real local Ray: 2 replicas of the default model behind the router.

Order matters only at the end: the fault tests kill replicas and wait for Ray to restart
them, so they run last (pytest keeps file order)."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager

import pytest
import ray

from workbench import Done, Error, TokenId
from workbench.errors import EmptyPrompt, InvalidOption, ModelFileError, NoSession, ReplicaDown, SessionLost

from waiting import wait_for
from .conftest import wait_all_up

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


def prefix(seed: int, n: int) -> list[int]:
    """A tenant's 'system prompt' as token ids (distinct per seed)."""
    return [1000 + (seed * 7919 + i * 31) % 30000 for i in range(n)]


def test_a_cluster_reply_is_the_in_process_reply(cluster, model, scope):
    import workbench as wb

    local = wb.complete(model, "The capital of France is", response_tokens=12)
    remote = cluster.complete("The capital of France is", response_tokens=12, cache_scope=scope)
    assert remote.reply == local.reply and remote.tokens == local.tokens
    assert remote.finish_reason == "length" and remote.model in {m.name for m in cluster.members}


def test_stream_cancel_crosses_the_actor_boundary(cluster, scope):
    s = cluster.stream("Once upon a time", response_tokens=1000, ignore_eos=True, cache_scope=scope)
    n = 0
    for ev in s:
        if isinstance(ev, TokenId):
            n += 1
            if n == 3:
                s.cancel()
    assert isinstance(ev, Done) and ev.finish_reason == "cancelled"
    assert ev.stats.generated_tokens < 100
    assert not [r for r in cluster.requests() if r["replica"] == s.replica]


def test_dropping_a_stream_cancels_it_on_its_replica(cluster, scope):
    s = cluster.stream("Once upon a time", response_tokens=3000, ignore_eos=True, cache_scope=scope)
    replica = s.replica
    assert isinstance(next(iter(s)), TokenId)
    del s
    gc.collect()
    deadline = time.monotonic() + 15
    while [r for r in cluster.requests() if r["replica"] == replica] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [r for r in cluster.requests() if r["replica"] == replica]  # 3000 tokens take minutes


def test_a_remote_error_is_the_same_workbench_error(cluster, scope):
    with pytest.raises(InvalidOption) as e:
        cluster.complete([5, 10**9], response_tokens=2, cache_scope=scope)  # checked by the replica's vocab
    assert e.value.key == "prompt" and e.value.value == 10**9 and "49152" in str(e.value)
    with pytest.raises(EmptyPrompt):
        cluster.complete("", cache_scope=scope)
    with pytest.raises(NoSession):
        cluster.continue_session("never-started", [1, 2], cache_scope=scope)
    with pytest.raises(InvalidOption) as e:  # checked before routing: no replica sees it
        cluster.complete("hi", temperature=-1)
    assert e.value.key == "temperature"
    assert all(m.state == "up" for m in cluster.members)


def test_start_checks_its_options_before_starting_anything(tmp_path):
    import workbench.cluster as wc

    with pytest.raises(InvalidOption) as e:
        wc.start(replicas=0)
    assert e.value.key == "replicas"
    with pytest.raises(InvalidOption) as e:
        wc.start(replicas=2, n_ctx="big")
    assert e.value.key == "n_ctx"
    with pytest.raises(InvalidOption) as e:
        wc.start(replicas=2, router="fastest")
    assert e.value.key == "router"
    with pytest.raises(ModelFileError):
        wc.start(replicas=2, model=str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize("bad, says", [
    ("localhost", "an IP address"), (127001, "an IP address"), ("10.0.0.300", "an IP address"),
])
def test_start_checks_node_ip_address_before_starting_anything(bad, says):
    import workbench.cluster as wc

    with pytest.raises(InvalidOption) as e:
        wc.start(replicas=2, node_ip_address=bad)
    assert e.value.key == "node_ip_address" and e.value.value == bad and says in str(e.value)
    with pytest.raises(InvalidOption) as e:  # a running Ray has its own addresses
        wc.start(replicas=2, address="auto", node_ip_address="127.0.0.1")
    assert e.value.key == "node_ip_address" and "address=" in str(e.value)


def test_the_local_ray_advertises_loopback_only(cluster):
    """start's local Ray (this directory's fixture starts the cluster with no address=)
    is on 127.0.0.1, not the machine's network address: its node and its GCS advertise
    it, and every TCP port its processes (GCS, raylet, workers, replicas) listen on is
    on loopback."""
    import ipaddress

    import psutil

    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert nodes and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    listening = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            name, conns = proc.name(), proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        listening |= {(name, c.laddr.ip) for c in conns if c.status == psutil.CONN_LISTEN}
    assert any(name == "gcs_server" for name, _ in listening) and any(name == "raylet" for name, _ in listening)
    beyond = {(name, ip) for name, ip in listening
              if not (getattr(ipaddress.ip_address(ip), "ipv4_mapped", None) or ipaddress.ip_address(ip)).is_loopback}
    assert not beyond


def test_the_replicas_run_at_the_drivers_priority(cluster):
    """Ray starts its workers at niceness 15 unless told otherwise; the local Ray of start()
    runs them at 0, so a replica competes for the CPU as the notebook does (at 15, beside two
    busy processes, a replica's 180-token prefill took 40 s instead of 2)."""
    import os

    import psutil

    replicas = [p for p in psutil.Process().children(recursive=True) if "ReplicaActor" in p.name()
                or any("ReplicaActor" in part for part in p.cmdline())]
    assert len(replicas) >= 2
    assert {p.nice() for p in replicas} == {os.getpriority(os.PRIO_PROCESS, 0)}


@contextmanager
def private_caches(cluster):
    """cache_sync 'manual': a replica sees only its own rows of the shared tier until
    sync_cache, so where a row lies depends on where its request went."""
    cluster.set_cache_sync("manual")
    try:
        yield
    finally:
        cluster.set_cache_sync("auto")


def run_trace(cluster, trace, scope):
    """Requests one at a time, each finished and saved before the next is routed; each
    saves its tenant's 160-token prefix as a row of its own (prefix_checkpoint_len)."""
    out = []
    for prompt in trace:
        r = cluster.complete(prompt, response_tokens=2, cache_scope=scope, prefix_checkpoint_len=160)
        cluster.wait_for_saves()
        out.append(r)
    return out


def scripted_trace():
    """Tenant A twice, tenant B twice, A again (each a 160-token prefix + its question)."""
    a, b = prefix(1, 160), prefix(2, 160)
    return [a + prefix(10, 20), a + prefix(11, 20), b + prefix(12, 20), b + prefix(13, 20), a + prefix(14, 20)]


def saved(results):
    return [r.stats.prompt_tokens - r.stats.prefilled_tokens for r in results]


def test_cache_affinity_routes_each_tenant_prefix_to_the_replica_that_caches_it(cluster, scope):
    cluster.set_router("cache_affinity")
    start = len(cluster.routing.log)
    with private_caches(cluster):
        results = run_trace(cluster, scripted_trace(), scope)
    log = list(cluster.routing.log)[start:]
    where = [rec["replica"] for rec in log]
    assert where[1] == where[0] and where[4] == where[0]  # A's prefix stays where it is cached
    assert where[2] != where[0] and where[3] == where[2]  # B's new prefix goes to the other replica
    assert log[0]["reason"] == log[2]["reason"] == "no prefix >= 10% cached: balance"
    for rec in (log[1], log[3], log[4]):
        assert rec["reason"] == "160 of 180 tokens cached"
        assert rec["probed"] == {rec["replica"]: (160, 0), **{k: (0, 0) for k in rec["probed"] if k != rec["replica"]}}
    assert saved(results) == [0, 160, 0, 160, 160]


def test_prefix_tree_and_round_robin_on_the_same_trace(cluster, scope):
    cluster.set_router("prefix_tree")
    try:
        with private_caches(cluster):
            tree = run_trace(cluster, scripted_trace(), scope + "-tree")
            cluster.set_router("round_robin")
            rr = run_trace(cluster, scripted_trace(), scope + "-rr")
    finally:
        cluster.set_router("cache_affinity")
    assert saved(tree) == [0, 160, 0, 160, 160]  # the tree sends each repeat to its tenant's replica
    assert [r.model for r in rr][::2] == [rr[0].model] * 3 and rr[1].model != rr[0].model  # alternates
    assert saved(rr) == [0, 0, 0, 0, 160]  # only A's third turn lands where A's row is


def test_a_session_sticks_to_its_replica(cluster, scope):
    first = cluster.complete(prefix(3, 40), response_tokens=4, session_id="s1", cache_scope=scope)
    nxt = cluster.continue_session("s1", [1500, 1501, 1502], response_tokens=4, cache_scope=scope)
    assert nxt.model == first.model and nxt.stats.cache_hit_kind == "continuation"
    recs = [r for r in cluster.routing.log if r["session"] == "s1"]
    assert recs[-1]["reason"] == "session"
    cluster.end_session("s1", cache_scope=scope)
    with pytest.raises(NoSession):
        cluster.end_session("s1", cache_scope=scope)


def test_a_row_made_on_one_replica_is_found_by_the_other_with_no_sync_call(cluster, scope):
    prompt = prefix(9, 300)
    cluster.set_router(lambda req, reps: reps[0].index)
    try:
        first = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
        other = next(m.name for m in cluster.members if m.name != first.model)
        adopted = cluster.replicas().loc[other, "peer_rows"]
        assert first.stats.cache_hit_kind == "cold" and cluster.wait_for_saves()  # the row is published
        cluster.set_router(lambda req, reps: [r for r in reps if r.name == other][0].index)  # no probe first
        second = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
    finally:
        cluster.set_router("cache_affinity")
    assert second.model == other
    assert second.stats.cache_hit_kind in ("exact", "partial") and second.stats.prefilled_tokens <= 10
    assert second.tokens == first.tokens
    assert cluster.replicas().loc[other, "peer_rows"] > adopted
    assert min(cluster.cached_prefix_lens(prompt, scope).values()) >= 290
    assert max(cluster.cached_prefix_lens(prompt, scope + "-other").values()) == 0  # tenant scope holds


def test_a_probe_finds_a_row_a_peer_published_since_its_last_look(cluster, scope):
    prompt = prefix(10, 200)
    r = cluster.prefill_only(prompt, cache_scope=scope)
    # the publish is the writer's; every replica's probe (no sync call) finds it once it lands
    assert wait_for(lambda: min(cluster.cached_prefix_lens(prompt, scope).values()) >= 199, timeout=30)
    assert r.stats.generated_tokens == 0 and cluster.replicas()["cache_sync"].eq("auto").all()


def test_sync_cache_shares_rows_when_cache_sync_is_manual(cluster, scope):
    prompt = prefix(4, 300)
    cluster.set_router(lambda req, reps: reps[0].index)
    try:
        with private_caches(cluster):
            first = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
            assert first.stats.cache_hit_kind == "cold"
            lens = cluster.cached_prefix_lens(prompt, scope)
            assert lens[first.model] >= 290 and min(lens.values()) == 0  # the other has not scanned it yet
            cluster.sync_cache()
            assert min(cluster.cached_prefix_lens(prompt, scope).values()) >= 290
            assert max(cluster.cached_prefix_lens(prompt, scope + "-other").values()) == 0  # tenant scope holds
            cluster.set_router(lambda req, reps: [r for r in reps if r.name != first.model][0].index)
            second = cluster.complete(prompt, response_tokens=6, cache_scope=scope)
    finally:
        cluster.set_router("cache_affinity")
    assert second.model != first.model
    assert second.stats.cache_hit_kind in ("exact", "partial") and second.stats.prefilled_tokens <= 10
    assert second.tokens == first.tokens


def test_views_show_replicas_and_decisions(cluster, scope):
    cluster.complete(prefix(5, 30), response_tokens=2, cache_scope=scope)
    reps = cluster.replicas()
    assert list(reps.index) == [m.name for m in cluster.members]
    assert {"state", "in_flight", "routed", "queue_depth", "bytes_disk"} <= set(reps.columns)
    assert (reps["bytes_disk"] > 0).all() and reps["routed"].sum() == len(cluster.routing.log)
    dec = cluster.decisions()
    assert len(dec) == len(cluster.routing.log)
    assert {"replica", "reason", "hit", "reused_tokens", f"prefix[{cluster.members[0].name}]"} <= set(dec.columns)
    fig = cluster.plot()
    assert [b.get_height() for b in fig.axes[0].patches] == [reps.loc[n, "routed"] for n in reps.index]


def test_chat_through_the_cluster_is_the_in_process_chat(cluster, model, scope):
    import workbench as wb

    messages = [{"role": "user", "content": "Say hello in French."}]
    local = wb.chat(model, messages, response_tokens=10)
    remote = cluster.chat(messages, response_tokens=10, cache_scope=scope)
    assert type(remote) is type(local) and remote.message == local.message and remote.tokens == local.tokens
    rec = list(cluster.routing.log)[-1]
    assert rec["kind"] == "chat" and rec["prompt_tokens"] == local.stats.prompt_tokens


def test_wb_cluster_commands(cluster, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    import workbench.cluster as wc
    from workbench.notebook import widgets

    assert wc.current() is cluster
    monkeypatch.setenv(widgets.DISPLAY_ENV, "text")
    shell = InteractiveShell.instance()
    if "workbench" not in shell.extension_manager.loaded:
        assert shell.run_cell("%load_ext workbench").success
    status = shell.run_cell("%wb cluster status")
    assert list(status.result.index) == [m.name for m in cluster.members]
    assert len(shell.run_cell("%wb cluster decisions --last 2").result) == min(2, len(cluster.routing.log))
    bad = shell.run_cell("%wb cluster router fastest")
    assert not bad.success and "'router'" in str(bad.error_in_exec) and "fastest" in str(bad.error_in_exec)
    bad = shell.run_cell("%wb cluster sync sometimes")
    assert not bad.success and "'cache_sync'" in str(bad.error_in_exec) and "sometimes" in str(bad.error_in_exec)
    assert shell.run_cell("%wb cluster sync auto").success
    assert cluster.replicas()["cache_sync"].eq("auto").all()
    again = shell.run_cell("%wb cluster start")
    assert not again.success and "already running" in str(again.error_in_exec)
    assert shell.run_cell("%wb cluster router cache_affinity").success


def decoded_tokens(cluster) -> dict[str, int]:
    return {m.name: cluster.call_replica(m, "counters", (), {})["decoded_tokens"] for m in cluster.members}


def test_speculation_across_replicas_gives_the_verifiers_greedy_reply(cluster, scope):
    prompt = prefix(11, 200)
    plain = cluster.complete(prompt, response_tokens=16, cache_scope=scope, cache=False)
    runs = {}
    for sessions in (False, True):
        before = decoded_tokens(cluster)
        spec = cluster.speculate(prompt, response_tokens=16, n_draft=4, draft_replica=0, verify_replica=1,
                                 sessions=sessions)
        after = decoded_tokens(cluster)
        runs[sessions] = spec, {name: after[name] - before[name] for name in after}
        assert spec.tokens == plain.tokens and spec.reply == plain.reply
        assert (spec.draft_replica, spec.verify_replica) == ("replica-0", "replica-1")
        # the same model drafts: every drafted token is the verifier's argmax; 4 + its own
        # next token per round, the last round drafts the one token left
        assert (spec.rounds, spec.drafted, spec.accepted) == (4, 13, 13)
    (stateless, work_before), (fast, work_after) = runs[False], runs[True]
    # the primitives keep no KV: each round prefills the whole context (200, 205, ...) on both sides
    assert stateless.draft_prefilled == (200, 205, 210, 215) and stateless.verify_prefilled == (204, 209, 214, 216)
    # a session on each side: after the first round, the drafter prefills the verifier's token
    # and its own last draft, the verifier its token and the new drafts
    assert fast.draft_prefilled == (200, 2, 2, 2) and fast.verify_prefilled == (204, 5, 5, 2)
    for name in work_after:  # what each replica's engine decoded (prefill and generation)
        assert work_after[name] < 0.4 * work_before[name]
    assert not [s for s in cluster.sessions() if str(s.get("session_id", "")).startswith("speculate-")]


def test_prefill_only_stores_its_row_on_the_replica_it_was_routed_to(cluster, scope):
    prompt = prefix(8, 64)
    with private_caches(cluster):
        r = cluster.prefill_only(prompt, cache_scope=scope)
        assert r.stats.generated_tokens == 0 and r.finish_key
        lens = cluster.cached_prefix_lens(prompt, scope)
    assert lens[r.model] >= 63 and sum(lens.values()) == lens[r.model]  # the other has not scanned it
    assert cluster.decisions().iloc[-1]["kind"] == "prefill"


def test_embed_through_the_cluster_is_the_in_process_embedding(cluster, model):
    import numpy as np

    import workbench as wb

    assert np.allclose(cluster.embed("a red apple"), wb.embed(model, "a red apple"), atol=1e-4)


def test_least_loaded_spreads_concurrent_streams_by_their_in_flight_count(cluster, scope):
    cluster.set_router("least_loaded")
    try:
        streams = [cluster.stream("Once upon a time", response_tokens=1000, ignore_eos=True, cache_scope=scope)
                   for _ in range(4)]
        reasons = [rec["reason"] for rec in list(cluster.routing.log)[-4:]]
        where = [s.replica for s in streams]
    finally:
        cluster.set_router("cache_affinity")
        for s in streams:
            s.cancel()
    assert sorted(where.count(m.name) for m in cluster.members) == [2, 2]
    assert reasons[-1] == "least loaded (1 in flight)"
    for s in streams:
        assert s.result().finish_reason == "cancelled"
    assert all(m.in_flight == 0 for m in cluster.members)


def test_a_replica_the_cluster_has_no_cpu_for_is_a_replica_down_naming_it(cluster, model_path):
    import workbench.cluster as wc

    # the running Ray is reused (not started again) and its 2 CPUs are held by the 2 replicas
    with pytest.raises(ReplicaDown) as e:
        wc.start(replicas=1, model=str(model_path), model_id="extra", ready_timeout_s=3)
    assert e.value.replica == "extra-0" and "did not start within 3 s" in str(e.value)
    assert "has 2 CPUs" in str(e.value)
    assert ray.is_initialized() and wc.current() is cluster
    assert cluster.complete("Hi", response_tokens=2).finish_reason in ("length", "stop")


def test_a_user_router_naming_no_replica_is_an_invalid_option(cluster, scope):
    cluster.set_router(lambda request, replicas: 99)
    try:
        with pytest.raises(InvalidOption) as e:
            cluster.complete("Hi", response_tokens=2, cache_scope=scope)
    finally:
        cluster.set_router("cache_affinity")
    assert e.value.key == "router" and "replica=99" in str(e.value) and "one of [0, 1]" in str(e.value)
    assert all(m.in_flight == 0 for m in cluster.members)
    assert cluster.complete("Hi", response_tokens=2, cache_scope=scope).finish_reason in ("length", "stop")


@pytest.mark.parametrize("bad", [0.0, 1.0, True, [0], "0"])
def test_a_user_router_returning_no_int_index_is_an_invalid_option_naming_it(cluster, scope, bad):
    def picks(request, replicas):
        return bad

    cluster.set_router(picks)
    try:
        with pytest.raises(InvalidOption) as e:  # not a TypeError from indexing the replicas
            cluster.complete("Hi", response_tokens=2, cache_scope=scope)
    finally:
        cluster.set_router("cache_affinity")
    assert e.value.key == "router" and e.value.value == "picks"
    assert f"replica={bad!r}" in str(e.value) and "int index" in str(e.value) and type(bad).__name__ in str(e.value)
    assert all(m.in_flight == 0 for m in cluster.members)


def test_async_for_and_poll_over_a_cluster_stream(cluster, scope):
    import asyncio

    plain = cluster.complete("Name three fruits:", response_tokens=8, cache_scope=scope)

    async def collect_async():
        return [ev async for ev in cluster.stream("Name three fruits:", response_tokens=8, cache_scope=scope)]

    events = asyncio.run(collect_async())
    assert isinstance(events[-1], Done) and events[-1].tokens == plain.tokens
    s = cluster.stream("Name three fruits:", response_tokens=8, cache_scope=scope)
    polled = []
    while not s.ended:
        ev = s.poll(0.05)
        if ev is not None:
            polled.append(ev)
    assert [type(e) for e in polled] == [type(e) for e in events]


# --- faults (last: they kill replicas) ---------------------------------------------------------

def test_a_replica_killed_mid_stream_ends_the_stream_with_an_error_naming_it(cluster, scope):
    wait_all_up(cluster)
    cluster.complete(prefix(6, 30), response_tokens=2, session_id="doomed", cache_scope=scope)
    s = cluster.stream("Once upon a time", response_tokens=2000, ignore_eos=True, cache_scope=scope,
                       session_id="doomed")
    victim = s.replica
    events = []
    for ev in s:
        events.append(ev)
        if sum(isinstance(e, TokenId) for e in events) == 3:
            ray.kill(cluster.actor(victim), no_restart=False)
    assert isinstance(events[-1], Error) and isinstance(events[-1].reason, ReplicaDown)
    delivered = sum(isinstance(e, TokenId) for e in events)  # 3, or more already on their way when killed
    assert events[-1].reason.replica == victim and f"mid-stream after {delivered} tokens" in str(events[-1].reason)
    other = cluster.complete("Hello", response_tokens=2, cache_scope=scope)
    assert other.model != victim  # the router skips the down replica
    with pytest.raises(SessionLost) as e:
        cluster.continue_session("doomed", [1, 2, 3], cache_scope=scope)
    assert e.value.replica == victim and victim in str(e.value)
    wait_all_up(cluster)
    assert cluster.replicas().loc[victim, "restarts"] == 1
    with pytest.raises(SessionLost):  # restarted: a fresh engine, the session is gone
        cluster.continue_session("doomed", [1, 2, 3], cache_scope=scope)
    # a turn with its whole prompt starts the session again where the router says
    again = cluster.complete(prefix(6, 30), response_tokens=2, session_id="doomed", cache_scope=scope)
    assert list(cluster.routing.log)[-1]["reason"].startswith(f"session lost with {victim}; ")
    assert again.stats.cache_hit_kind != "cold"  # its first turn's row, from the shared tier
    assert cluster.continue_session("doomed", [7, 8], response_tokens=2, cache_scope=scope).model == again.model


def asked(actor) -> dict:
    """A replica's hello asked by the test itself (not through its member), {} while it restarts."""
    try:
        return ray.get(actor.hello.remote(), timeout=30)
    except ray.exceptions.RayError:
        return {}


def test_a_retry_asks_a_replica_marked_down_that_has_since_restarted(cluster, scope):
    """The retry's replica was marked down and Ray restarted it, but nobody pinged it
    since: the retry asks (and waits on the ping) before concluding that none is up."""
    wait_all_up(cluster)
    back, doomed = cluster.members
    cluster.set_router(lambda req, reps: max(reps, key=lambda r: r.name == doomed.name).index)  # doomed if up
    try:
        old = back.incarnation
        ray.kill(back.actor, no_restart=False)
        assert wait_for(lambda: asked(back.actor).get("incarnation") not in (None, old), timeout=120, interval=0.5)
        assert back.state == "up" and back.incarnation == old  # restarted; the cluster has not looked
        s = cluster.stream(prefix(8, 1500), response_tokens=4, cache_scope=scope)  # seconds of prefill
        assert s.replica == doomed.name
        back.mark_down("a call failed while it restarted")  # what the driver saw; no ping since
        ray.kill(doomed.actor, no_restart=False)
        result = s.result()
    finally:
        cluster.set_router("cache_affinity")
    assert s.retried_from == doomed.name and s.replica == back.name
    assert result.finish_reason == "length" and len(result.tokens) == 4 and result.model == back.name
    assert back.state == "up" and back.restarts >= 1


def test_a_request_with_no_token_yet_is_retried_once_on_another_replica(cluster, scope):
    wait_all_up(cluster)
    s = cluster.stream(prefix(7, 1500), response_tokens=4, cache_scope=scope)  # seconds of prefill
    victim = s.replica
    ray.kill(cluster.actor(victim), no_restart=False)
    result = s.result()
    assert s.retried_from == victim and s.replica != victim
    assert result.finish_reason == "length" and len(result.tokens) == 4
    assert result.model == s.replica  # (the last test: the victim's restart is not awaited)
