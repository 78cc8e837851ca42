"""Middleware: a chain of functions around every public call of the ``workbench`` facade.

    import workbench as wb

    def log(name, arguments, next):
        print(name, arguments)
        return next(arguments)

    wb.middleware.add(log)                         # every call from now on
    wb.complete(m, "Hi", middleware=[my_limits])   # this call only, inside the registered ones
    wb.middleware.add(wb.middleware.timing)        # feeds workbench.notebook.views.calls()

A middleware is ``fn(name, arguments, next)``: ``name`` is the call (``"complete"``),
``arguments`` a fresh dict of what the caller passed, by parameter name, with keyword
options (``**opts``) flattened in and defaults not filled in; ``next(arguments)`` runs the
rest of the chain and then the call with those arguments, and returns its result. So a
middleware may log or time a call, rewrite its arguments (pass a changed dict to
``next``), answer it itself, or refuse it by raising. Registered middleware run in the
order added, outermost first, then the call's own ``middleware=[...]``.

Guarantees:

- An exception a middleware raises reaches the caller as itself (nothing wraps it). Raised
  before ``next``, the call never ran. Raised after it, the call's effects stand (a model
  loaded stays loaded) except that a stream the call created is closed, so its request is
  cancelled and its sequence freed: no engine is left holding work nobody will read.
- Streams: the chain wraps the call that creates the stream (``stream``, ``chat_stream``,
  ``continue_session(stream=True)``), not its iteration: a timing middleware measures the
  submission, and ``next`` returns the stream. Streams the chain made but did not return
  (a middleware that called ``next`` twice) are closed.
- Misuse is an InvalidOption, raised to the caller, never a TypeError from inside the
  chain: a middleware that cannot be called as ``fn(name, arguments, next)`` is refused
  when it is given (``add``, ``middleware=``); a ``next`` called with anything but one dict
  (``next()``, ``next(None)``, ``next(model=...)``), or with a dict that does not call the
  function (its model or prompt missing, a name it does not take), is refused naming the
  middleware that called it (key ``'arguments'``), before the call runs.
- Calls made while the chain runs on this thread (by a middleware, or by a call inside
  another one) are not wrapped again.
- With no middleware registered and none given, a call costs one tuple check.

What counts as a public call: the functions ``workbench`` exports (``__all__``), wrapped by
:func:`wrap_namespace` in ``workbench/__init__.py``, each imported there from the module
that defines it (``wb.complete.__wrapped__`` is ``workbench.generation.complete``); those
modules' functions (``workbench.api.*``, ``workbench.generation.*``, ...) called directly
bypass the chain.

Cluster handles (``wb.cluster.start(...)``: ``c.complete``, ``c.stream``, ...) are not
wrapped, by choice. The chain belongs to one process: a replica runs its ``workbench``
calls in its own Ray actor process, under that process's chain (empty: ``add`` in the
driver does not reach it; a middleware's closures and state could not follow it there
faithfully anyway). And a cluster call is not a facade call: it names no model (the router
picks a replica), so a middleware written for ``complete(model, ...)`` (reading
``arguments["model"]``, :func:`timing`'s model column) would misread it. ``middleware=`` on
a cluster call is refused (UnknownOption). What a cluster did is told by its own views:
``c.decisions()``, ``c.requests()``, ``c.counters()``.
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

from .engine.stream import EventEnds
from .errors import InvalidOption

Next = Callable[[Mapping[str, Any]], Any]
Middleware = Callable[[str, dict[str, Any], Next], Any]

_lock = threading.Lock()
_chain: tuple[Middleware, ...] = ()


class _Depth(threading.local):
    depth = 0                       # facade calls whose chain runs on this thread


_local = _Depth()


# --- the registered chain -------------------------------------------------------------------

def add(fn: Middleware) -> Middleware:
    """Register ``fn`` for every facade call (last added runs innermost); returns it, so it
    also works as a decorator. Adding a registered function again changes nothing."""
    global _chain
    _check(fn, "fn", "middleware")
    with _lock:
        if fn not in _chain:
            _chain = (*_chain, fn)
    return fn


def remove(fn: Middleware) -> None:
    """Unregister ``fn`` (idempotent)."""
    global _chain
    with _lock:
        _chain = tuple(f for f in _chain if f is not fn)


def clear() -> None:
    """Unregister every middleware."""
    global _chain
    with _lock:
        _chain = ()


def registered() -> list[Middleware]:
    """The registered middleware, outermost first."""
    return list(_chain)


def _check(fn: Any, key: str, where: str) -> Middleware:
    """``fn`` if the chain can call it as ``fn(name, arguments, next)``; refused now, when
    it is given, rather than as a TypeError from inside the call it was meant to wrap."""
    expected = "a callable fn(name, arguments, next)"
    if not callable(fn):
        raise InvalidOption(key, fn, expected, where)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): taken on trust
        return fn
    try:
        sig.bind("call", {}, None)
    except TypeError as e:
        raise InvalidOption(key, fn, f"{expected} taking those three positional arguments; "
                            f"{_name_of(fn)}{_params(sig)} does not ({e})", where) from None
    return fn


def _per_call(value: Any) -> tuple[Middleware, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidOption("middleware", value, "a list of callables fn(name, arguments, next)")
    return tuple(_check(fn, "middleware", "option") for fn in value)


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _params(sig: inspect.Signature) -> str:
    """A signature's parameters by name: ``(model, text, add_special=..., **opts)``."""
    stars = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
    return "(" + ", ".join(stars.get(p.kind.name, "") + p.name + ("=..." if p.default is not p.empty else "")
                           for p in sig.parameters.values()) + ")"


# --- wrapping the facade ----------------------------------------------------------------------

def wrap(func: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """``func`` with the chain around it, taking one more keyword argument, ``middleware``."""
    call_name = name or func.__name__
    sig = inspect.signature(func)

    @functools.wraps(func)
    def facade_call(*args: Any, **kwargs: Any) -> Any:
        fns = _chain + _per_call(kwargs.pop("middleware", None))
        if not fns or _local.depth:
            return func(*args, **kwargs)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return func(*args, **kwargs)  # Python's own error for a call that does not fit
        return _run(call_name, func, sig, fns, _flatten(sig, bound.arguments))

    return facade_call


def wrap_namespace(namespace: MutableMapping[str, Any], names: Iterable[str]) -> None:
    """Wrap each plain function among ``names`` in ``namespace`` (a package's globals)."""
    for n in names:
        obj = namespace.get(n)
        if inspect.isfunction(obj) and not hasattr(obj, "__wrapped__"):
            wrapped = wrap(obj, n)
            # pickled by reference as the namespace's own name (Ray, multiprocessing)
            wrapped.__module__, wrapped.__qualname__ = namespace.get("__name__", obj.__module__), n
            namespace[n] = wrapped


def _run(name: str, func: Callable[..., Any], sig: inspect.Signature, fns: tuple[Middleware, ...],
         arguments: dict[str, Any]) -> Any:
    made: list[Any] = []

    def step(i: int) -> Next:  # the next given to fns[i - 1]
        def next_(*given: Any, **named: Any) -> Any:
            args = _next_arguments(name, sig, fns[i - 1], given, named)
            if i == len(fns):
                pos, kw = _unflatten(sig, args)
                _check_fits(name, sig, fns[i - 1], args, pos, kw)
                out = func(*pos, **kw)
                made.append(out)
                return out
            return fns[i](name, dict(args), step(i + 1))
        return next_

    _local.depth += 1
    try:
        out = fns[0](name, dict(arguments), step(1))
    except BaseException:
        _close_streams(made, keep=None)
        raise
    finally:
        _local.depth -= 1
    _close_streams(made, keep=out)
    return out


def _next_arguments(name: str, sig: inspect.Signature, caller: Middleware, given: tuple[Any, ...],
                    named: dict[str, Any]) -> Mapping[str, Any]:
    """The one dict ``next`` takes, or InvalidOption naming the middleware that called it
    some other way (``next()``, ``next(model=...)``, ``next(None)``)."""
    if len(given) == 1 and not named and isinstance(given[0], Mapping):
        return given[0]
    value: Any = given[0] if len(given) == 1 and not named else {"args": given, "kwargs": named}
    raise InvalidOption("arguments", value, f"one dict of {name}{_params(sig)}'s arguments: next(arguments), "
                        f"called from middleware {_name_of(caller)!r}", "middleware next()")


def _check_fits(name: str, sig: inspect.Signature, caller: Middleware, args: Mapping[str, Any], pos: list[Any],
                kw: dict[str, Any]) -> None:
    """The arguments a middleware passed to ``next`` call the function (none missing, none
    it does not take), checked before the call so its own TypeError is not the answer."""
    try:
        sig.bind(*pos, **kw)
    except TypeError as e:
        raise InvalidOption("arguments", dict(args), f"the arguments of {name}{_params(sig)} "
                            f"({e}), from middleware {_name_of(caller)!r}", "middleware next()") from None


def _close_streams(made: list[Any], keep: Any) -> None:
    for out in made:
        if isinstance(out, EventEnds) and out is not keep:  # Stream, ThinkingStream, ChatStream, ...
            out.close()


def _flatten(sig: inspect.Signature, bound: Mapping[str, Any]) -> dict[str, Any]:
    """Bound arguments by name, a ``**kwargs`` parameter's items merged in."""
    out: dict[str, Any] = {}
    for key, value in bound.items():
        if sig.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[key] = value
    return out


def _unflatten(sig: inspect.Signature, args: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """(positional, keyword) arguments that call the function with ``args``."""
    rest = dict(args)
    pos: list[Any] = []
    kw: dict[str, Any] = {}
    P = inspect.Parameter
    star = any(p.kind is P.VAR_POSITIONAL for p in sig.parameters.values())
    for p in sig.parameters.values():
        if p.kind is P.VAR_KEYWORD or p.name not in rest:
            continue
        value = rest.pop(p.name)
        if p.kind is P.VAR_POSITIONAL:
            pos.extend(value)
        elif p.kind is P.POSITIONAL_ONLY or (star and p.kind is P.POSITIONAL_OR_KEYWORD):
            pos.append(value)
        else:
            kw[p.name] = value
    kw.update(rest)  # the **kwargs parameter's (without one, _check_fits refuses them)
    return pos, kw


# --- a ready-made timing middleware -------------------------------------------------------------

CALL_LOG_SIZE = 10_000
_calls: collections.deque[dict[str, Any]] = collections.deque(maxlen=CALL_LOG_SIZE)


def timing(name: str, arguments: dict[str, Any], next: Next) -> Any:  # noqa: A002 - the chain's own name
    """Record each call's name, model, wall time and outcome (see :func:`calls`)."""
    started = time.time()
    t0 = time.perf_counter()
    out: Any = None
    error: BaseException | None = None
    try:
        out = next(arguments)
        return out
    except BaseException as e:
        error = e
        raise
    finally:
        model = arguments.get("model")
        if model is None and name == "load_model" and isinstance(out, str):
            model = out
        ref = getattr(out, "ref", None)
        _calls.append({"call": name, "model": model if isinstance(model, str) else None,
                       "duration_ms": (time.perf_counter() - t0) * 1000.0, "ok": error is None,
                       "error": type(error).__name__ if error is not None else None,
                       "ref": ref if isinstance(ref, int) else None, "started_at": started})


def calls() -> list[dict[str, Any]]:
    """The calls :func:`timing` recorded (oldest first, the newest CALL_LOG_SIZE): call,
    model, duration_ms, ok, error (the exception's class name), ref, started_at (epoch s)."""
    return list(_calls)


def clear_calls() -> None:
    _calls.clear()
