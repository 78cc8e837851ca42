"""One replica: a process (a Ray actor) owning one engine, called through the facade.

The cluster wraps :class:`Replica` with ``ray.remote`` as a threaded actor, so a cancel or
a probe is served while a stream runs. Everything a replica sends back is plain data:
results and events as they are, errors packed by ``wire`` (see there why).

With shared tiers and ``cache_sync='auto'``, a replica adopts the rows its peers
published there before each lookup (a probe, a request, a cached_prefix_len): see
``cache.shared.PeerRows``; ``'manual'`` leaves it to ``sync_cache``. Its cache is
configured with ``cache_tiers`` and the ``storage`` / ``chunk_size`` options start passed
with the load options (configure_cache's). Only the first incarnation's cache runs the
start-up scan (nobody writes yet); a restarted replica, ``sync_cache`` and ``reset_cache``
build a fresh cache and adopt what the tiers hold without deleting anything, since the
peers are live (in chunk storage the start-up scan would delete their chunks in flight).

A stream is a Ray streaming generator (:meth:`Replica.run`): its first item says whether
the request started (its local ref) or was refused (the error the facade raised), then
come lists of events, as many as were ready at once. A generator closed early (the caller
dropped it) cancels its request, as a dropped Stream does in-process.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..cache import shared
from ..cache.shared import PeerRows
from ..errors import InvalidOption, WorkbenchError
from .wire import RemoteError, pack_error, pack_events

# facade calls a replica serves for the cluster: those that name the model, and the
# process-wide ones (each replica process holds one model, so they are that replica's)
PER_MODEL_CALLS = ("cached_prefix_len", "detokenize", "draft_tokens", "embed", "embed_batch", "end_session",
                   "model_info", "prefill_only", "reset_session", "sessions", "tokenize", "verify")
PROCESS_CALLS = ("cache_info", "counters", "requests", "wait_for_saves")
STREAM_CALLS = ("stream", "continue_session", "chat_stream")
CACHE_SYNCS = ("auto", "manual")
CACHE_OPTIONS = ("storage", "chunk_size")  # configure_cache's, passed to start with the load options
SPECULATION_CALLS = ("draft_in_session", "verify_in_session")  # speculate.py's session form


class Replica:
    """One engine in this process; ``incarnation`` changes when Ray restarts the actor."""

    def __init__(self, name: str, load: Mapping[str, Any], cache_tiers: Sequence[Mapping[str, Any]] | None,
                 cache_sync: str = "auto") -> None:
        import workbench as wb

        self.name = name
        load = dict(load)
        self.cache_options = {k: load.pop(k) for k in CACHE_OPTIONS if k in load}
        self.cache_tiers = list(cache_tiers) if cache_tiers else None
        self.cache_sync = cache_sync
        self.peer_rows = 0  # rows adopted from peers automatically
        self._peers = PeerRows()
        if self.cache_tiers or self.cache_options:
            if restarted():
                self._fresh_cache()
            else:
                wb.configure_cache(self._tiers(), **self.cache_options)
        self.model = wb.load_model(**load)
        self.incarnation = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}
        self._cancelled: set[int] = set()

    # --- facts (never wait on the engine's loop) ---------------------------------------------
    def hello(self) -> dict[str, Any]:
        return {"name": self.name, "incarnation": self.incarnation, "pid": os.getpid(), "model": self.model}

    def probe(self, prompt: str | list[int], cache_scope: str) -> dict[str, int]:
        """This prompt's cached prefix here (all tiers, nothing loaded) and the load; a prompt
        the engine would refuse probes as 0 (the request itself raises the error)."""
        import workbench as wb

        try:
            self.adopt_peer_rows()
            cached = wb.cached_prefix_len(self.model, prompt, cache_scope)
        except WorkbenchError:
            cached = 0
        return {"cached_prefix_len": cached, "queue_depth": wb.queue_depth(self.model),
                "pending_len": wb.pending_len(self.model)}

    def facts(self) -> dict[str, Any]:
        """What the replicas view shows: load, cache bytes by tier, hits by kind."""
        import workbench as wb

        info = wb.cache_info()
        counters = wb.counters()
        return {"incarnation": self.incarnation, "pid": os.getpid(), "queue_depth": wb.queue_depth(self.model),
                "pending_len": wb.pending_len(self.model), "last_cache_hit": wb.last_cache_hit(self.model),
                "tiers": {t["name"]: t.get("used_bytes", 0) for t in info.get("tiers", [])},
                "counters": counters, "peer_rows": self.peer_rows, "cache_sync": self.cache_sync}

    # --- calls ----------------------------------------------------------------------------------
    def call(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, Any]:
        """A facade call: ('ok', value) or ('error', RemoteError)."""
        import workbench as wb

        try:
            if name in PER_MODEL_CALLS:
                self.adopt_peer_rows()
                return "ok", getattr(wb, name)(self.model, *args, **kwargs)
            if name in PROCESS_CALLS:
                return "ok", getattr(wb, name)(*args, **kwargs)
            if name == "chat_tokens":
                return "ok", list(wb.render_chat_template(self.model, *args, **kwargs).tokens)
            if name == "sync_cache":
                return "ok", self.sync_cache()
            if name == "configure_cache":
                return "ok", self.configure_cache(*args, **kwargs)
            if name == "reset_cache":
                return "ok", self.reset_cache()
            if name == "set_cache_sync":
                return "ok", self.set_cache_sync(*args)
            if name in SPECULATION_CALLS:
                from . import speculate

                return "ok", getattr(speculate, name)(self.model, *args, **kwargs)
            raise InvalidOption("call", name, "a call a replica serves")
        except Exception as e:
            return "error", pack_error(e)

    def sync_cache(self) -> int:
        """A fresh cache of this replica's tiers that adopts every row they hold, its peers'
        too (RAM rows dropped); returns the rows held."""
        import workbench as wb

        if not self.cache_tiers:
            return 0
        wb.wait_for_saves(30.0)
        return self._fresh_cache()

    def configure_cache(self, tiers: Sequence[Mapping[str, Any]] | None, **options: Any) -> dict[str, Any]:
        """Another cache for this replica from now on: ``tiers`` (None: one RAM tier) and
        configure_cache's ``storage`` / ``chunk_size``, adopting what the tiers hold (a
        restarted replica comes back with start's); returns the previous tiers and options."""
        from ..options.rules import one_of

        for key in options:
            one_of(*CACHE_OPTIONS)("option", key, "cache")
        check_cache_options(options, "cache")
        previous = {"tiers": self.cache_tiers, **self.cache_options}
        self.cache_tiers, self.cache_options = (list(tiers) if tiers else None), dict(options)
        import workbench as wb

        wb.wait_for_saves(30.0)
        self._fresh_cache()
        return previous

    def _tiers(self) -> list[Any]:
        return self.cache_tiers or [{"kind": "ram"}]

    def _fresh_cache(self) -> int:
        """A fresh cache of this replica's tiers and cache options that adopts what the
        tiers hold, deleting nothing (the peers are live: module doc); returns its rows."""
        cache = shared.install(shared.build(self._tiers(), **self.cache_options))
        self._peers.adopt(cache, force=True)
        return len(cache)

    def adopt_peer_rows(self) -> int:
        """With ``cache_sync='auto'`` and shared tiers: adopt the rows peers published since
        the last look (a stat per tier when there are none); returns how many."""
        if self.cache_sync != "auto" or not self.cache_tiers:
            return 0
        n = self._peers.adopt()
        self.peer_rows += n
        return n

    def set_cache_sync(self, mode: str) -> str:
        """'auto' or 'manual' from now on (a restarted replica comes back with start's)."""
        if mode not in CACHE_SYNCS:
            raise InvalidOption("cache_sync", mode, "one of " + ", ".join(map(repr, CACHE_SYNCS)))
        self.cache_sync = mode
        return mode

    def reset_cache(self) -> int:
        """A fresh cache of this replica's tiers (RAM rows dropped; what the persistent tiers
        hold is adopted again); returns the rows held."""
        import workbench as wb

        wb.wait_for_saves(30.0)
        return self._fresh_cache()

    def cancel(self, cref: int) -> None:
        """Cancel the cluster request ``cref`` here (also before its stream has started)."""
        with self._lock:
            s = self._streams.get(cref)
            if s is None:
                self._cancelled.add(cref)
        if s is not None:
            s.cancel()

    def run(self, cref: int, call: str, args: Sequence[Any], opts: Mapping[str, Any]) -> Iterator[Any]:
        """The streaming generator of one request (see the module doc)."""
        try:
            s = self._start(call, args, opts)
        except Exception as e:
            yield ("refused", pack_error(e))
            return
        with self._lock:
            self._streams[cref] = s
            cancelled = cref in self._cancelled
            self._cancelled.discard(cref)
        if cancelled:
            s.cancel()
        yield ("started", s.ref)
        try:
            yield from self._drain(s)
        finally:
            with self._lock:
                self._streams.pop(cref, None)
            if not s.ended:
                s.cancel()

    def _start(self, call: str, args: Sequence[Any], opts: Mapping[str, Any]) -> Any:
        import workbench as wb

        self.adopt_peer_rows()
        if call == "stream":
            return wb.stream(self.model, *args, **opts)
        if call == "continue_session":
            return wb.continue_session(self.model, *args, stream=True, **opts)
        if call == "chat_stream":
            return wb.chat_stream(self.model, *args, **opts)
        raise InvalidOption("call", call, "one of " + ", ".join(STREAM_CALLS))

    @staticmethod
    def _drain(s: Any) -> Iterator[list[Any]]:
        while not s.ended:
            ev = s.poll(None)
            if ev is None:
                return
            batch = [ev]
            while not s.ended:
                nxt = s.poll(0.0)
                if nxt is None:
                    break
                batch.append(nxt)
            yield pack_events(batch)


def check_cache_options(options: Mapping[str, Any], where: str) -> None:
    """configure_cache's rules for the cache options a cluster passes its replicas."""
    from ..cache_admin import check_storage

    check_storage(options.get("storage", "chunks"), options.get("chunk_size"), where)


def restarted() -> bool:
    """Whether Ray restarted this actor (its peers live on); False outside an actor."""
    try:
        import ray

        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # not in a Ray worker
        return False


__all__ = ["CACHE_OPTIONS", "CACHE_SYNCS", "PER_MODEL_CALLS", "PROCESS_CALLS", "Replica", "RemoteError"]
