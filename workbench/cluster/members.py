"""The driver's view of one replica: its actor, whether it is up, its load.

A replica is ``up``, ``down`` (a call to it failed: it died or is restarting) or ``dead``
(Ray will not restart it again). A down replica is pinged in the background: the ping is
sent once and looked at, not waited on, each time the router asks who is up, so routing
never blocks on a restarting actor while another is up. When the ping answers the replica
is up again; if its incarnation changed, Ray restarted it (a fresh engine: its sessions
are gone). Only when that look finds none up are the pings waited on (``wait_for_up``, at
most ``PING_TIMEOUT_S``) before concluding none is: a replica that came back since it was
marked down may not have been asked yet (a ping sent at the look is not answered by then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

# what a call to a replica raises when its process died or is being restarted
ACTOR_GONE: tuple[type[BaseException], ...] = (RayActorError, ray.exceptions.WorkerCrashedError,
                                              ray.exceptions.ObjectLostError)
# how long a request waits on the pings of down replicas when none is up by a look
PING_TIMEOUT_S = 10.0


class Member:
    """One replica as the driver sees it; counters change under ``lock``."""

    def __init__(self, index: int, name: str, actor: Any, hello: dict[str, Any]) -> None:
        self.index, self.name, self.actor = index, name, actor
        self.lock = threading.Lock()
        self.state = "up"
        self.incarnation: str = hello["incarnation"]
        self.pid: int = hello["pid"]
        self.model_id: str = hello["model"]
        self.in_flight = 0
        self.routed = 0
        self.restarts = 0
        self.last_error = ""
        self.down_since: float | None = None
        self._ping: Any = None

    def mark_down(self, error: BaseException | str) -> None:
        with self.lock:
            if self.state == "up":
                self.state, self.down_since, self._ping = "down", time.monotonic(), None
            self.last_error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"

    def ping(self) -> Any:
        """The ping of a down replica (sent now unless one is out), else None."""
        with self.lock:
            if self.state != "down":
                return None
            if self._ping is None:
                self._ping = self.actor.hello.remote()
            return self._ping

    def refresh(self) -> str:
        """The state, after looking (without waiting) at the ping of a down replica."""
        ping = self.ping()
        if ping is None:
            return self.state
        ready, _ = ray.wait([ping], timeout=0)
        if ready:
            self._answered(ping)
        return self.state

    def _answered(self, ping: Any) -> None:
        try:
            hello = ray.get(ping)
        except ray.exceptions.ActorDiedError as e:  # no restarts left
            with self.lock:
                self.state, self.last_error = "dead", f"{type(e).__name__}: {e}"
            return
        except RayError:
            with self.lock:
                self._ping = None  # still restarting: ask again next time
            return
        with self.lock:
            if hello["incarnation"] != self.incarnation:
                self.restarts += 1
            self.incarnation, self.pid, self.state, self._ping = hello["incarnation"], hello["pid"], "up", None
            self.in_flight = 0  # what was in flight died with the old process

    def take(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.routed += 1

    def release(self) -> None:
        with self.lock:
            self.in_flight = max(0, self.in_flight - 1)

    def row(self) -> dict[str, Any]:
        return {"replica": self.name, "state": self.state, "model": self.model_id, "pid": self.pid,
                "incarnation": self.incarnation, "restarts": self.restarts, "in_flight": self.in_flight,
                "routed": self.routed, "last_error": self.last_error}


def wait_for_up(members: Iterable[Member], timeout_s: float = PING_TIMEOUT_S) -> list[Member]:
    """The members that are up, waiting up to ``timeout_s`` on the pings of the down ones
    until one answers (at once when one is up, or when none is down: dead ones are not
    asked). A ping that fails (the replica still restarting) is sent again."""
    members = list(members)
    deadline = time.monotonic() + timeout_s
    while True:
        ups = [m for m in members if m.refresh() == "up"]
        pings = [p for p in (m.ping() for m in members) if p is not None]
        left = deadline - time.monotonic()
        if ups or not pings or left <= 0:
            return ups
        ready, _ = ray.wait(pings, num_returns=1, timeout=left)
        if ready and not any(m.refresh() == "up" for m in members):
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))  # a failed ping: not a busy loop
