"""The value rules of every option record and facade argument: the one definition of each.

`check_*` validate one value (for facade arguments); the `as_*` / `one_of` field checkers
take (key, value, where) and return the normalised value or raise InvalidOption; `opt`
declares a record field with its checker, `build` makes a record from a dict, telling an
unknown key (UnknownOption) from a bad value (InvalidOption), and `amend` replaces some
fields of a built record, checked the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal, TypeVar, overload

from ..errors import InvalidOption, UnknownOption

T = TypeVar("T")


THREADS_ENV = "WORKBENCH_N_THREADS"
MAX_THREADS = 512   # ggml's limit (GGML_MAX_N_THREADS)


def default_threads() -> int:
    """``n_threads`` when a load does not give it: the environment variable
    WORKBENCH_N_THREADS when set (a machine whose cores other work holds: there fewer
    threads decode faster, docs/api.md), else the cores this process may run on (its
    affinity mask, not the machine's count)."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        n = int(env) if env.isdigit() else 0
        if not 1 <= n <= MAX_THREADS:
            raise InvalidOption(THREADS_ENV, env, f"an integer from 1 to {MAX_THREADS} (the default n_threads)",
                                "environment variable")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# --- shared value rules: the one definition of each, for records and facade arguments ------

INT32_MAX = 2**31 - 1  # llama.cpp takes counts as int32 / uint32: nothing larger reaches it


@overload
def check_int(key: str, v: Any, lo: int | None = ..., hi: int | None = ..., *, none_ok: Literal[False] = ...,
              where: str = ...) -> int: ...
@overload
def check_int(key: str, v: Any, lo: int | None = ..., hi: int | None = ..., *, none_ok: bool,
              where: str = ...) -> int | None: ...
def check_int(key: str, v: Any, lo: int | None = None, hi: int | None = INT32_MAX, *, none_ok: bool = False,
              where: str = "argument") -> int | None:
    """An int (not a bool) in [lo, hi], or None when ``none_ok``; else InvalidOption."""
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise InvalidOption(key, v, _rng("an integer", lo, hi) + (" or None" if none_ok else ""), where)
    return v


@overload
def check_number(key: str, v: Any, lo: float | None = ..., hi: float | None = ..., *,
                 none_ok: Literal[False] = ..., where: str = ..., what: str = ...) -> float: ...
@overload
def check_number(key: str, v: Any, lo: float | None = ..., hi: float | None = ..., *, none_ok: bool,
                 where: str = ..., what: str = ...) -> float | None: ...
def check_number(key: str, v: Any, lo: float | None = None, hi: float | None = None, *, none_ok: bool = False,
                 where: str = "argument", what: str = "a finite number") -> float | None:
    """A finite int or float (not a bool, nan or inf) in [lo, hi], as a float; or None."""
    if v is None and none_ok:
        return None
    expected = _rng(what, lo, hi) + (" or None" if none_ok else "")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidOption(key, v, expected, where)
    try:
        f = float(v)
    except OverflowError:
        raise InvalidOption(key, v, expected, where) from None
    if not math.isfinite(f) or (lo is not None and f < lo) or (hi is not None and f > hi):
        raise InvalidOption(key, v, expected, where)
    return f


def check_bool(key: str, v: Any, where: str = "argument") -> bool:
    if not isinstance(v, bool):
        raise InvalidOption(key, v, "True or False", where)
    return v


def check_scope(key: str, v: Any, where: str = "argument") -> str:
    """A cache scope (tenant): a non-empty string."""
    if not isinstance(v, str) or not v:
        raise InvalidOption(key, v, "a non-empty string (a cache scope)", where)
    return v


def check_session_id(key: str, v: Any, where: str = "argument", none_ok: bool = False) -> Any:
    """A session id: a str or an int (not a bool); None too when ``none_ok``."""
    if (v is None and none_ok) or (isinstance(v, (str, int)) and not isinstance(v, bool)):
        return v
    raise InvalidOption(key, v, "a string or an int" + (" or None" if none_ok else ""), where)


# --- field checkers: each returns the normalised value or raises InvalidOption ------------

def as_int(lo: int | None = None, hi: int | None = INT32_MAX, none_ok: bool = False) -> Callable[[str, Any, str], Any]:
    return lambda key, v, where: check_int(key, v, lo, hi, none_ok=none_ok, where=where)


def as_float(lo: float | None = None, hi: float | None = None) -> Callable[[str, Any, str], Any]:
    return lambda key, v, where: check_number(key, v, lo, hi, where=where)


def as_bool(key: str, v: Any, where: str) -> Any:
    return check_bool(key, v, where)


def one_of(*choices: str) -> Callable[[str, Any, str], Any]:
    def check(key: str, v: Any, where: str) -> Any:
        if not isinstance(v, str) or v not in choices:
            raise InvalidOption(key, v, "one of " + ", ".join(repr(c) for c in choices), where)
        return v
    return check


def as_str(none_ok: bool = True) -> Callable[[str, Any, str], Any]:
    def check(key: str, v: Any, where: str) -> Any:
        if v is None and none_ok:
            return None
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if not isinstance(v, str):
            raise InvalidOption(key, v, "a string" + (" or None" if none_ok else ""), where)
        return v
    return check


def as_session_id(key: str, v: Any, where: str) -> Any:
    return check_session_id(key, v, where, none_ok=True)


def as_scope(key: str, v: Any, where: str) -> Any:
    return check_scope(key, v, where)


def as_json_schema(key: str, v: Any, where: str) -> Any:
    """A JSON schema as a dict (or JSON text); kept as canonical JSON text."""
    import json

    if v is None:
        return None
    try:
        if isinstance(v, str):
            v = json.loads(v)
        if not isinstance(v, (dict, bool)):
            raise InvalidOption(key, v, "a JSON schema (dict or JSON text)", where)
        return json.dumps(v, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise InvalidOption(key, "...", "a schema nested less deeply (Python's JSON recursion limit)", where) from None
    except (ValueError, TypeError) as e:  # not JSON text; nan / inf, bytes, sets, non-string keys in a dict
        raise InvalidOption(key, v, f"valid JSON ({e})", where) from None


def as_str_list(key: str, v: Any, where: str) -> Any:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) and s for s in v):
        raise InvalidOption(key, v, "a list of non-empty strings", where)
    return tuple(v)


def as_marker_pair(key: str, v: Any, where: str) -> Any:
    """{'start': str, 'end': str} of non-empty strings (thinking markers), or None; a plain dict copy."""
    if v is None:
        return None
    expected = "a dict {'start': str, 'end': str} of non-empty strings, or None"
    if not isinstance(v, Mapping) or set(v) != {"start", "end"}:
        raise InvalidOption(key, v, expected, where)
    if not all(isinstance(v[k], str) and v[k] for k in ("start", "end")):
        raise InvalidOption(key, v, expected, where)
    return {"start": v["start"], "end": v["end"]}


def as_json_object(key: str, v: Any, where: str) -> Any:
    import json

    if v is None:
        return None
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise InvalidOption(key, v, "a dict with string keys", where)
    try:
        json.dumps(dict(v))
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidOption(key, v, f"JSON-serialisable values ({e})", where) from None
    return dict(v)


def _rng(what: str, lo: Any, hi: Any) -> str:
    if lo is not None and hi is not None:
        return f"{what} in [{lo}, {hi}]"
    if lo is not None:
        return f"{what} >= {lo}"
    if hi is not None:
        return f"{what} <= {hi}"
    return what


def opt(default: Any, check: Callable[[str, Any, str], Any], doc: str = "") -> Any:
    """A dataclass field carrying its checker in metadata."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"check": check, "doc": doc})
    return field(default=default, metadata={"check": check, "doc": doc})


def build(cls: type[T], values: Mapping[str, Any] | None, where: str = "option", **extra: Any) -> T:
    """Build record ``cls`` from ``values`` (+ keyword overrides), validating every key."""
    merged: dict[str, Any] = dict(values or {})
    merged.update(extra)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    for key, value in merged.items():
        if not isinstance(key, str) or key not in fields:
            raise UnknownOption(str(key), list(fields), where)
        out[key] = fields[key].metadata["check"](key, value, where)
    return cls(**out)


def amend(record: T, values: Mapping[str, Any], where: str = "option") -> T:
    """``record`` (made by :func:`build`) with the fields in ``values`` replaced, each value
    checked as ``build`` checks it: what a call adds to options it has already built (chat's
    tool grammar, a thinking budget) without building them again."""
    if not values:
        return record
    fields = {f.name: f for f in dataclasses.fields(record)}  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields:
            raise UnknownOption(str(key), list(fields), where)
        out[key] = fields[key].metadata["check"](key, value, where)
    return dataclasses.replace(record, **out)  # type: ignore[type-var]


def option_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


