"""The cluster handle: the facade's calls, served by replicas behind a router.

    c = wb.cluster.start(replicas=2, router="cache_affinity", n_ctx=2048)
    c.complete("The capital of France is").reply     # CompletionResult, as wb.complete
    for ev in c.stream(prompt): ...                  # Token / TokenId / Done / Error
    c.decisions(); c.replicas(); c.shutdown()

Generation calls (stream, complete, chat, continue_session, prefill_only) are routed (see
routing.py); calls without a prompt to route on (embed, tokenize) go to the least loaded
replica; the readings (counters, requests, sessions) gather every replica's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from ..generation import collect
from ..chat import ChatResult
from ..engine.events import CompletionResult, Stats
from ..errors import InvalidOption, ReplicaDown
from ..options import RequestOptions, build, check_scope, check_session_id
from ..options.rules import one_of
from .members import ACTOR_GONE, Member
from .replica import CACHE_SYNCS
from .routers import RouteRequest, make_router, router_name
from .routing import Routing, SessionKey
from .stream import ClusterChatStream, ClusterStream, Pump, start_remote
from .wire import unpack_error


class Cluster:
    def __init__(self, members: list[Member], router: Any, started_ray: bool,
                 cache_tiers: Sequence[Mapping[str, Any]] | None, cache_sync: str = "auto") -> None:
        self.routing = Routing(members, router)
        self.cache_tiers = cache_tiers
        self.cache_sync = cache_sync
        self._started_ray = started_ray
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def members(self) -> list[Member]:
        return self.routing.members

    @property
    def router(self) -> Any:
        return self.routing.router

    def actor(self, replica: str | int) -> Any:
        """The Ray actor handle of a replica (by name or index), e.g. for ray.kill."""
        return self.member(replica).actor

    def member(self, replica: str | int) -> Member:
        """A replica's member (by name or index)."""
        for m in self.members:
            if replica in (m.name, m.index) and not isinstance(replica, bool):
                return m
        raise InvalidOption("replica", replica, "a replica's name or index: "
                            + ", ".join(m.name for m in self.members))

    # --- generation ---------------------------------------------------------------------------
    def stream(self, prompt: str | Sequence[int], **opts: Any) -> ClusterStream:
        """As wb.stream, on the replica the router picks (a session's turn: its replica)."""
        ropts = build(RequestOptions, opts)
        return self._start("stream", "stream", (_wire_prompt(prompt),), opts, _route_key(prompt, ropts),
                           _session(ropts))

    def complete(self, prompt: str | Sequence[int], **opts: Any) -> CompletionResult:
        return collect(self.stream(prompt, **opts))

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    tool_choice: Any = None, **opts: Any) -> ClusterChatStream:
        """As wb.chat_stream; routed on the rendered prompt's tokens."""
        render_opts = dict(opts, **({"tool_choice": tool_choice} if tool_choice is not None else {}))
        tokens = self.call_replica(self._least_loaded(), "chat_tokens", (messages, tools), render_opts)
        scope = opts.get("cache_scope", "default")
        sid = opts.get("session_id")
        s = self._start("chat", "chat_stream", (messages, tools, tool_choice), opts,
                        RouteRequest(tuple(tokens), scope), None if sid is None else (sid, scope))
        assert isinstance(s, ClusterChatStream)
        return s

    def chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
             tool_choice: Any = None, **opts: Any) -> ChatResult:
        return self.chat_stream(messages, tools, tool_choice, **opts).result()

    def continue_session(self, session_id: str | int, tokens: Sequence[int], *,
                         expect_committed: Sequence[int] | None = None, stream: bool = False,
                         **opts: Any) -> CompletionResult | ClusterStream:
        """As wb.continue_session, on the session's replica; SessionLost if it died."""
        check_session_id("session_id", session_id)
        ropts = build(RequestOptions, opts, session_id=session_id)
        wire_tokens = _wire_prompt(tokens)
        if isinstance(wire_tokens, str):
            raise InvalidOption("tokens", tokens, "a list of token ids")
        call_opts = dict(opts, **({} if expect_committed is None else {"expect_committed": list(expect_committed)}))
        s = self._start("continue", "continue_session", (session_id, wire_tokens), call_opts,
                        RouteRequest(tuple(wire_tokens), ropts.cache_scope), (session_id, ropts.cache_scope),
                        continuing=True)
        return s if stream else collect(s)

    def prefill_only(self, prompt: str | Sequence[int], **opts: Any) -> CompletionResult:
        """As wb.prefill_only, on the replica the router picks."""
        ropts = build(RequestOptions, {k: v for k, v in opts.items() if k != "response_tokens"})
        key = _route_key(prompt, ropts)
        ref = self.routing.next_ref()
        m = self.routing.route(key, "prefill", ref)
        try:
            result: CompletionResult = self.call_replica(m, "prefill_only", (_wire_prompt(prompt),), opts)
        except BaseException as e:
            self.routing.record_outcome(ref, m.name, {"error": type(e).__name__})
            raise
        finally:
            m.release()
        self.routing.record_outcome(ref, m.name, outcome_of(result.stats, result.finish_reason))
        return result

    def _start(self, kind: str, call: str, args: tuple[Any, ...], opts: Mapping[str, Any], key: RouteRequest,
               session: SessionKey | None, continuing: bool = False) -> ClusterStream:
        ref = self.routing.next_ref()
        start = functools.partial(self._start_on, ref, kind, call, args, dict(opts), key, session, continuing)
        retried_from = None
        try:
            member, gen, local = start(None)
        except ReplicaDown as first:
            if not first.replica:
                raise
            retried_from = first.replica
            member, gen, local = start(self.member(first.replica))  # retried once on another replica
        pump = Pump(ref, member, gen, local, start, self._ended, retried_from)
        return (ClusterChatStream if call == "chat_stream" else ClusterStream)(pump)

    def _start_on(self, ref: int, kind: str, call: str, args: tuple[Any, ...], opts: dict[str, Any],
                  key: RouteRequest, session: SessionKey | None, continuing: bool,
                  dead: Member | None) -> tuple[Member, Any, int]:
        exclude = () if dead is None else (dead.index,)
        lost = None if continuing else self.routing.lost_by(session)
        m = self.routing.route(key, kind, ref, session, continuing, exclude)
        try:
            if lost is not None and self.cache_tiers and self.cache_sync == "manual":
                self.call_replica(m, "sync_cache", (), {})  # restore the lost session's rows from a shared tier
            gen, local = start_remote(m, ref, call, args, opts)
        except ACTOR_GONE as e:
            m.mark_down(e)
            m.release()
            self.routing.record_outcome(ref, m.name, {"error": "ReplicaDown"})
            raise ReplicaDown(m.name, f"died before the request started ({type(e).__name__})") from None
        except BaseException as e:
            m.release()
            self.routing.record_outcome(ref, m.name, {"error": type(e).__name__})
            raise
        return m, gen, local

    def _ended(self, pump: Pump) -> None:
        m = pump.member
        m.release()
        if pump.done is not None:
            outcome = outcome_of(pump.done.stats, pump.done.finish_reason)
        else:
            outcome = {"error": type(pump.error).__name__ if pump.error is not None else "ReplicaDown"}
        self.routing.record_outcome(pump.request.ref, m.name, outcome)

    def cancel(self, ref: ClusterStream | int) -> None:
        """Cancel a cluster request by its stream or ref (idempotent)."""
        if isinstance(ref, ClusterStream):
            ref.cancel()
            return
        if isinstance(ref, bool) or not isinstance(ref, int):
            raise InvalidOption("ref", ref, "a ClusterStream or an int cluster request ref")
        for m in self.members:
            if m.state == "up":
                m.actor.cancel.remote(ref)

    def speculate(self, prompt: str | Sequence[int], **opts: Any) -> Any:
        """Greedy generation verified on one replica from another's drafts, a session kept
        on each side unless ``sessions=False`` (speculate.py)."""
        from .speculate import speculate

        return speculate(self, prompt, **opts)

    # --- sessions -------------------------------------------------------------------------
    def end_session(self, session_id: str | int, cache_scope: str = "default") -> None:
        key = (check_session_id("session_id", session_id), check_scope("cache_scope", cache_scope))
        self.call_replica(self.routing.session_owner(key), "end_session", key, {})
        self.routing.forget_session(key)

    def reset_session(self, session_id: str | int, cache_scope: str = "default") -> str:
        key = (check_session_id("session_id", session_id), check_scope("cache_scope", cache_scope))
        out = self.call_replica(self.routing.session_owner(key), "reset_session", key, {})
        self.routing.forget_session(key)
        return str(out)

    def sessions(self) -> list[dict[str, Any]]:
        """Every replica's sessions, each with its ``replica``."""
        return [dict(s, replica=m.name) for m, rows in self._gather("sessions") for s in rows]

    # --- calls without a prompt to route on ---------------------------------------------------
    def embed(self, text_or_tokens: str | Sequence[int], pooling: str = "mean", normalize: bool = True) -> Any:
        return self.call_replica(self._least_loaded(), "embed", (_wire_prompt(text_or_tokens), pooling, normalize), {})

    def embed_batch(self, inputs: Sequence[Any], pooling: str = "mean", normalize: bool = True) -> Any:
        return self.call_replica(self._least_loaded(), "embed_batch", (list(inputs), pooling, normalize), {})

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.call_replica(self._least_loaded(), "tokenize", (text, add_special, parse_special), {})

    def detokenize(self, tokens: Sequence[int], **opts: Any) -> str:
        return self.call_replica(self._least_loaded(), "detokenize", (_wire_prompt(tokens),), opts)

    def cached_prefix_len(self, prompt: str | Sequence[int], cache_scope: str = "default") -> int:
        """The longest prefix of ``prompt`` any replica caches (what a well-routed request reuses)."""
        return max(self.cached_prefix_lens(prompt, cache_scope).values(), default=0)

    def cached_prefix_lens(self, prompt: str | Sequence[int], cache_scope: str = "default") -> dict[str, int]:
        """Each replica's exact cached prefix of ``prompt`` (replicas that are up)."""
        check_scope("cache_scope", cache_scope)
        return {m.name: n for m, n in self._gather("cached_prefix_len", (_wire_prompt(prompt), cache_scope))}

    # --- readings -----------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """The replicas' counters summed (each replica's process holds its own cache)."""
        total: dict[str, int] = {}
        for _, c in self._gather("counters"):
            for k, v in c.items():
                total[k] = total.get(k, 0) + v
        return total

    def requests(self) -> list[dict[str, Any]]:
        return [dict(r, replica=m.name) for m, rows in self._gather("requests") for r in rows]

    def wait_for_saves(self, timeout_s: float | None = 30.0) -> bool:
        return all(ok for _, ok in self._gather("wait_for_saves", (timeout_s,)))

    def sync_cache(self) -> dict[str, int]:
        """Let every replica adopt the rows the others published to the shared tiers
        (``cache_tiers`` with a shm or disk root they share) now, by a fresh cache of its
        tiers (RAM rows dropped); returns each one's rows. With ``cache_sync='auto'`` (the
        default) they adopt them anyway, before each lookup."""
        self.wait_for_saves()
        return {m.name: n for m, n in self._gather("sync_cache")}

    def set_cache_sync(self, mode: str) -> dict[str, str]:
        """'auto': every replica adopts the rows the others published to the shared tiers
        before each lookup; 'manual': only at sync_cache. A replica Ray restarts comes back
        with start's ``cache_sync``."""
        self.cache_sync = one_of(*CACHE_SYNCS)("cache_sync", mode, "cluster option")
        return {m.name: v for m, v in self._gather("set_cache_sync", (mode,))}

    def reset_cache(self) -> dict[str, int]:
        """Give every replica a fresh cache of its tiers (RAM rows dropped, persistent tiers
        rescanned); returns each one's rows. For comparing routers from the same start."""
        return {m.name: n for m, n in self._gather("reset_cache")}

    def set_router(self, router: Any, router_options: dict[str, Any] | None = None) -> None:
        """Route from now on with another router (a name with options, an object, a function)."""
        self.routing.router = make_router(router, router_options)

    def replicas(self) -> Any:
        from .views import replicas_frame

        return replicas_frame(self)

    def decisions(self) -> Any:
        from .views import decisions_frame

        return decisions_frame(self)

    def plot(self) -> Any:
        from .views import plot_routing

        return plot_routing(self)

    # --- plumbing -----------------------------------------------------------------------------
    def _least_loaded(self) -> Member:
        ups = self.routing.available()
        if not ups:
            raise ReplicaDown("", "no replica is up (every one is down or restarting)")
        return min(ups, key=lambda m: (m.in_flight, m.index))

    def call_replica(self, m: Member, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """One facade call on one replica (its error raised here, ReplicaDown if it is gone)."""
        try:
            status, value = ray.get(m.actor.call.remote(name, tuple(args), dict(kwargs)))
        except ACTOR_GONE as e:
            m.mark_down(e)
            raise ReplicaDown(m.name, f"is down ({type(e).__name__})") from None
        if status == "error":
            raise unpack_error(value)
        return value

    def _gather(self, name: str, args: Sequence[Any] = ()) -> list[tuple[Member, Any]]:
        """One call on every replica that is up, in parallel; a failed one is marked down."""
        ups = self.routing.up()
        refs = [m.actor.call.remote(name, tuple(args), {}) for m in ups]
        out = []
        for m, ref in zip(ups, refs):
            try:
                status, value = ray.get(ref)
            except ACTOR_GONE as e:
                m.mark_down(e)
                continue
            if status == "error":
                raise unpack_error(value)
            out.append((m, value))
        return out

    def shutdown(self) -> None:
        """Stop every replica (and the local Ray this cluster started). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for m in self.members:
            try:
                ray.kill(m.actor, no_restart=True)
            except Exception:
                pass
        if self._started_ray:
            ray.shutdown()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        states = ", ".join(f"{m.name}:{m.state}" for m in self.members)
        return f"<Cluster router={router_name(self.router)!r} replicas=[{states}]>"


def outcome_of(s: Stats, finish_reason: str) -> dict[str, Any]:
    """What the decisions log keeps of a finished request."""
    return {"hit": s.cache_hit_kind, "prompt_tokens": s.prompt_tokens,
            "reused_tokens": s.prompt_tokens - s.prefilled_tokens, "ttft_s": s.ttft_s, "finish": finish_reason}


def _wire_prompt(prompt: Any) -> str | list[int]:
    """A prompt as it crosses to a replica (which checks the token ids against its vocab)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, Sequence):
        raise InvalidOption("prompt", prompt, "a string or a list of token ids")
    out = list(prompt)
    for t in out:
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidOption("prompt", t, "token ids (ints)")
    return out


def _route_key(prompt: Any, ropts: RequestOptions) -> RouteRequest:
    wire = _wire_prompt(prompt)
    return RouteRequest(wire if isinstance(wire, str) else tuple(wire), ropts.cache_scope)


def _session(ropts: RequestOptions) -> SessionKey | None:
    return None if ropts.session_id is None else (ropts.session_id, ropts.cache_scope)
