"""What crosses the actor boundary: events and errors in a form that survives pickling.

Most events are frozen dataclasses and pickle as they are. Exceptions do not: pickle
rebuilds one by calling its class with ``self.args``, and the workbench's errors take
their own arguments (``InvalidOption(key, value, expected)``) while ``args`` holds only the
message. So an exception travels as :class:`RemoteError` (its class, args and attributes)
and is rebuilt without calling ``__init__``: the caller gets the same WorkbenchError
subclass, with the same message and attributes (``key``, ``value``, ...), as the facade
raises in-process.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..engine.events import Error


@dataclass(slots=True, frozen=True)
class RemoteError:
    """An exception's class, args and attributes, as sent from a replica."""

    cls: type[BaseException]
    args: tuple[Any, ...]
    state: dict[str, Any]
    text: str


def _picklable(v: Any) -> bool:
    try:
        pickle.dumps(v)
    except Exception:
        return False
    return True


def pack_error(e: BaseException) -> RemoteError:
    """The exception as a RemoteError; attributes that do not pickle travel as their repr,
    a class that does not pickle (defined in a notebook cell) as RuntimeError."""
    cls = type(e) if _picklable(type(e)) else RuntimeError
    args = e.args if _picklable(e.args) else tuple(repr(a) for a in e.args)
    state = {k: (v if _picklable(v) else repr(v)) for k, v in getattr(e, "__dict__", {}).items()}
    return RemoteError(cls, args, state, f"{type(e).__name__}: {e}")


def unpack_error(r: RemoteError) -> BaseException:
    """The exception again, of its own class; ``__init__`` is not called (see the module doc)."""
    try:
        exc = r.cls.__new__(r.cls, *r.args)
        exc.args = r.args
        exc.__dict__.update(r.state)
    except Exception:  # a class whose __new__ wants other arguments
        return RuntimeError(r.text)
    return exc


@dataclass(slots=True, frozen=True)
class ErrorEvent:
    """An Error event on the wire (its reason packed)."""

    error: RemoteError


def pack_events(events: Iterable[Any]) -> list[Any]:
    return [ErrorEvent(pack_error(ev.reason)) if isinstance(ev, Error) else ev for ev in events]


def unpack_event(ev: Any) -> Any:
    return Error(unpack_error(ev.error)) if isinstance(ev, ErrorEvent) else ev
