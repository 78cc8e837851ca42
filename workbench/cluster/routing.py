"""Choosing a replica for each request: sessions first, then the router; the decisions log.

    session turn      -> the replica that holds the session (same incarnation); if it died
                         a continue_session raises SessionLost, a whole-prompt turn is
                         routed again (and restores from the cache if a tier has its rows)
    otherwise         -> the replicas that are up (a down one is skipped), probed in
                         parallel when the router wants exact facts, then router.choose

Every decision is logged with the facts it was made on (each replica's probed prefix and
load) and, once the request ends, what came of it (hit kind, tokens reused, TTFT).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import ray

from ..errors import InvalidOption, NoSession, ReplicaDown, SessionLost
from .members import ACTOR_GONE, Member, wait_for_up
from .routers import Decision, ReplicaFacts, RouteRequest, router_name

PROBE_TIMEOUT_S = 10.0
SessionKey = tuple[Hashable, str]


class Routing:
    def __init__(self, members: Sequence[Member], router: Any, log_size: int = 100_000) -> None:
        self.members = list(members)
        self.router = router
        self._lock = threading.Lock()
        self._choosing = threading.Lock()
        self._sessions: dict[SessionKey, tuple[int, str]] = {}
        self.log: collections.deque[dict[str, Any]] = collections.deque(maxlen=log_size)
        self._refs = itertools.count(1)
        self._open: dict[tuple[int, str], dict[str, Any]] = {}  # decisions whose request has not ended

    def next_ref(self) -> int:
        return next(self._refs)

    def up(self, exclude: Iterable[int] = ()) -> list[Member]:
        """The replicas that are up now (a down one's ping is looked at, not waited on)."""
        skip = set(exclude)
        return [m for m in self.members if m.refresh() == "up" and m.index not in skip]

    def available(self, exclude: Iterable[int] = ()) -> list[Member]:
        """The replicas that are up; when a look finds none, the down ones are pinged and
        waited on (members.PING_TIMEOUT_S) before concluding none is: after a restart the
        replica is back long before anyone asks it (a retry's first look would miss it)."""
        skip = set(exclude)
        return self.up(skip) or wait_for_up(m for m in self.members if m.index not in skip)

    # --- the decision ---------------------------------------------------------------------
    def route(self, request: RouteRequest, kind: str, ref: int, session: SessionKey | None = None,
              continuing: bool = False, exclude: Iterable[int] = ()) -> Member:
        """The replica for this request (its in-flight count taken); SessionLost /
        ReplicaDown when there is none to take it."""
        exclude = set(exclude)
        lost = None
        if session is not None:
            owner = self._owner(session, exclude)
            if isinstance(owner, Member):
                return self._take(owner, Decision(owner.index, "session"), request, kind, ref, session, [])
            lost = owner
            if lost is not None and continuing:
                raise SessionLost(session[0], lost)
        ups = self.available(exclude)
        if not ups:
            raise ReplicaDown("", "no replica is up (every one is down or restarting)")
        probed = self._probe(ups, request) if getattr(self.router, "probe", False) else None
        with self._choosing:  # routers keep state (turns, history); a pick and its count go together
            facts = self._facts(ups, probed)
            if not facts:
                raise ReplicaDown("", "no replica answered the probe")
            decision = self._choose(request, facts)
            if lost is not None:
                decision = Decision(decision.replica, f"session lost with {lost}; {decision.reason}")
            return self._take(self.members[decision.replica], decision, request, kind, ref, session, facts)

    def _owner(self, session: SessionKey, exclude: set[int]) -> Member | str | None:
        """The member holding the session, or the name of the one that lost it, or None."""
        with self._lock:
            owner = self._sessions.get(session)
        if owner is None:
            return None
        m = self.members[owner[0]]
        if m.refresh() == "up" and m.incarnation == owner[1] and m.index not in exclude:
            return m
        return m.name

    def _choose(self, request: RouteRequest, facts: list[ReplicaFacts]) -> Decision:
        decision = self.router.choose(request, facts)
        ok = {f.index for f in facts}
        replica = getattr(decision, "replica", None)
        # an int index only: 0.0 and True compare equal to an index (0.0 in {0, 1}) and a
        # list is unhashable, so the membership test alone lets them through to members[...]
        if (not isinstance(decision, Decision) or isinstance(replica, bool) or not isinstance(replica, int)
                or replica not in ok):
            raise InvalidOption("router", router_name(self.router),
                                f"a Decision naming a replica that is up by its int index (one of {sorted(ok)}), "
                                f"not {decision!r} (replica {replica!r}: {type(replica).__name__})")
        return decision

    @staticmethod
    def _facts(ups: list[Member], probed: dict[int, dict[str, int]] | None) -> list[ReplicaFacts]:
        """What the router sees: the loads now, and the probes (a replica that did not
        answer its probe is left out)."""
        if probed is not None:
            ups = [m for m in ups if m.index in probed]
        return [ReplicaFacts(m.index, m.name, m.in_flight, m.routed, **(probed or {}).get(m.index, {}))
                for m in ups]

    def _probe(self, ups: list[Member], request: RouteRequest) -> dict[int, dict[str, int]]:
        """Every replica's exact cached prefix and queue, asked in parallel; a replica
        that fails to answer is marked down and left out."""
        prompt = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
        refs = {m.index: m.actor.probe.remote(prompt, request.cache_scope) for m in ups}
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        out: dict[int, dict[str, int]] = {}
        for m in ups:
            try:
                out[m.index] = ray.get(refs[m.index], timeout=0)
            except ACTOR_GONE as e:
                m.mark_down(e)
            except ray.exceptions.GetTimeoutError:
                m.mark_down(f"no answer to a probe within {PROBE_TIMEOUT_S:.0f} s")
        return out

    def _take(self, m: Member, decision: Decision, request: RouteRequest, kind: str, ref: int,
              session: SessionKey | None, facts: list[ReplicaFacts]) -> Member:
        m.take()
        if session is not None:
            with self._lock:
                self._sessions[session] = (m.index, m.incarnation)
        rec = {
            "ref": ref, "time": time.time(), "kind": kind, "session": None if session is None else session[0],
            "prompt_tokens": request.length if isinstance(request.prompt, tuple) else None,
            "router": router_name(self.router), "replica": m.name, "reason": decision.reason,
            "probed": {f.name: (f.cached_prefix_len, f.load) for f in facts}, "outcome": None,
        }
        with self._lock:
            self.log.append(rec)
            self._open[(ref, m.name)] = rec
        return m

    # --- sessions -------------------------------------------------------------------------
    def session_owner(self, session: SessionKey) -> Member:
        """The member holding a session (for end/reset); SessionLost if it died."""
        owner = self._owner(session, set())
        if isinstance(owner, Member):
            return owner
        if owner is not None:
            raise SessionLost(session[0], owner)
        raise NoSession(session[0])

    def lost_by(self, session: SessionKey | None) -> str | None:
        """The replica that lost this session (died or restarted since), else None."""
        if session is None:
            return None
        owner = self._owner(session, set())
        return owner if isinstance(owner, str) else None

    def forget_session(self, session: SessionKey) -> None:
        with self._lock:
            self._sessions.pop(session, None)

    def sessions(self) -> dict[SessionKey, str]:
        with self._lock:
            return {k: self.members[i].name for k, (i, _) in self._sessions.items()}

    # --- outcomes -------------------------------------------------------------------------
    def record_outcome(self, ref: int, replica: str, outcome: dict[str, Any]) -> None:
        with self._lock:
            rec = self._open.pop((ref, replica), None)
        if rec is not None:
            rec["outcome"] = outcome
