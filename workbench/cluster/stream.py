"""A request running on a replica, as the same Stream the facade returns.

A :class:`Pump` thread reads the replica's streaming generator and puts the events on a
queue; :class:`ClusterStream` is the facade's :class:`~workbench.engine.stream.Stream`
over that queue (the pump stands in for the engine: ``cancel`` sends the cancel to the
replica), so iteration, ``poll``, ``async for``, ``close``, dropping it and ``result``
behave exactly as in-process.

Faults: if the replica's process dies before a token came back, the pump starts the
request again once on another replica (``restart``); after that the stream ends with an
``Error(ReplicaDown)`` naming the replica and the tokens it had delivered.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from typing import Any, cast

import ray

from ..chat import ChatDone, ChatResult
from ..engine.events import Done, Error, Thinking, Token, TokenId
from ..engine.stream import Stream
from ..errors import ReplicaDown
from .members import ACTOR_GONE, Member
from .wire import unpack_error, unpack_event

# (replica to avoid) -> (member, generator past its "started" item, local ref)
Restart = Callable[[Member], tuple[Member, Any, int]]


class RemoteRequest:
    """What a Stream reads of its request: the ref, the event queue, the end, the phase."""

    def __init__(self, ref: int) -> None:
        self.ref = ref
        self.events: queue.Queue[Any] = queue.Queue()
        self.finished = threading.Event()
        self.phase = "queued"


def start_remote(member: Member, ref: int, call: str, args: tuple[Any, ...], opts: dict[str, Any]) -> tuple[Any, int]:
    """Start a request on a replica: its generator and local ref. The facade's error when
    the replica refused it; ACTOR_GONE when the replica is gone."""
    gen = member.actor.run.options(num_returns="streaming").remote(ref, call, args, opts)
    status, value = ray.get(next(gen))
    if status == "refused":
        raise unpack_error(value)
    return gen, int(value)


class Pump:
    """Moves one request's events from its replica to the stream's queue (see the module doc)."""

    def __init__(self, ref: int, member: Member, gen: Any, local_ref: int, restart: Restart | None,
                 on_end: Callable[[Pump], None], retried_from: str | None = None) -> None:
        self.request = RemoteRequest(ref)
        self.member, self.gen, self.local_ref = member, gen, local_ref
        self.restart, self.on_end = restart, on_end
        self.tokens = 0
        self.retried_from = retried_from  # set: the one retry was used (at the start, or later here)
        self.done: Done | None = None
        self.error: BaseException | None = None
        self._cancelled = False
        self._ended = False  # on_end ran for the replica it ended on
        self._thread = threading.Thread(target=self._run, name=f"wb-cluster-{ref}", daemon=True)
        self._thread.start()

    @property
    def model_id(self) -> str:
        return self.member.model_id

    def cancel(self, req: RemoteRequest | None = None) -> None:
        """Cancel on the replica (idempotent; the Done(cancelled) comes through the stream)."""
        if self.request.finished.is_set():
            return
        self._cancelled = True
        try:
            self.member.actor.cancel.remote(self.request.ref)
        except Exception:  # the replica is gone: its stream ends with an Error anyway
            pass

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._read():
                pass
        finally:
            self.request.phase = "done"
            try:
                self._end_once()
            finally:
                self.request.finished.set()

    def _end_once(self) -> None:
        """Release the replica and log the outcome, before the last event is seen (so the
        load and the decisions log are current when the caller has its result)."""
        if not self._ended:
            self._ended = True
            self.on_end(self)

    def _read(self) -> bool:
        """Read the generator to its end; True when the stream is over, False when it was
        restarted on another replica."""
        try:
            for item in self.gen:
                for ev in ray.get(item):
                    self._put(unpack_event(ev))
        except ACTOR_GONE as e:
            self.member.mark_down(e)
            return not self._retry(e)
        except Exception as e:  # an unexpected failure of the replica's code or of Ray
            self._put(Error(ReplicaDown(self.member.name, f"the stream failed: {type(e).__name__}: {e}")))
            return True
        if self.done is None and self.error is None:
            self._put(Error(ReplicaDown(self.member.name, "the stream ended without a Done")))
        return True

    def _retry(self, cause: BaseException) -> bool:
        dead = self.member
        if self.tokens == 0 and self.restart is not None and not self._cancelled and self.retried_from is None:
            self.retried_from = dead.name
            self.on_end(self)  # the dead replica's in-flight slot
            try:
                self.member, self.gen, self.local_ref = self.restart(dead)
                return True
            except Exception as e:
                self._put(Error(e))
                return False
        err = ReplicaDown(dead.name, f"died mid-stream after {self.tokens} tokens")
        err.__cause__ = cause  # Ray's own error (ActorDiedError, ActorUnavailableError, ...)
        self._put(Error(err))
        return False

    def _put(self, ev: Any) -> None:
        if isinstance(ev, (Token, TokenId, Thinking)):
            self.tokens += isinstance(ev, TokenId)
            self.request.phase = "generating"
        elif isinstance(ev, Done):
            self.done = ev
            self._end_once()
        elif isinstance(ev, Error):
            self.error = ev.reason
            self._end_once()
        self.request.events.put(ev)


class ClusterStream(Stream):
    """The facade's Stream over a cluster request; ``replica`` names where it runs."""

    def __init__(self, pump: Pump) -> None:
        super().__init__(cast(Any, pump), cast(Any, pump.request))
        self._pump = pump

    @property
    def replica(self) -> str:
        return self._pump.member.name

    @property
    def retried_from(self) -> str | None:
        """The replica that died before this request's first token (it ran again here)."""
        return self._pump.retried_from

    def result(self) -> Any:
        res = super().result()
        self.model = self._pump.model_id  # the replica it ended on (a retry moves it)
        return dataclasses.replace(res, model=self.model)

    def __repr__(self) -> str:
        return f"<ClusterStream ref={self.ref} replica={self.replica!r} phase={self._pump.request.phase}>"


class ClusterChatStream(ClusterStream):
    """chat_stream's handle over the cluster: its last event is a ChatDone."""

    def result(self) -> ChatResult:
        super().result()
        if not isinstance(self.done, ChatDone):
            raise RuntimeError("the chat stream ended without a ChatDone")
        return ChatResult.from_chat_done(self.done, self.model, self.ref)
