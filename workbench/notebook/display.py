"""One way the workbench shows figures in a table: bytes as KiB / MiB / GiB, shares as
percents, seconds to the millisecond, milliseconds and rates to 0.1, counts with thousands
separators, unix times as clock times, long keys cut to 12 characters, other figures to four
significant digits; missing values as "-".

The views (`views`, `lab.replay`, the cluster's `replicas()` / `decisions()`) return raw
DataFrames, which users compute on; `table(df)` marks one (in ``df.attrs``, which pandas
carries to frames derived from it: a selection of columns, ``head``, ``round``, a
``groupby``), and IPython shows a marked frame through `shown(df)`, a copy of its figures as
text, in both its plain-text and its HTML form (where no cell wraps inside a word). The
frame itself keeps its numbers: ``print(df)`` and ``df.to_string()`` show them raw.

The format is chosen by a column's name (``*_bytes``, ``*_s``, ``*_ms``, ``*_at``, ...) and
then its dtype; `column_format` is the rule, `views.style` the same as a pandas Styler.
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from workbench.units import format_bytes

TABLE_ATTR = "workbench.table"   # the mark table() sets in DataFrame.attrs
VALUES_ATTR = "workbench.values"  # table(df, values=name): every column shown as column `name` would be

FRACTIONS = ("occupancy", "acceptance", "share")           # shown as a percent, as *_ratio / *_fraction are
CLOCKS = ("score", "arrival")                             # readings of a clock (seconds), as *_at are
IDS = ("ref", "request", "seq", "busy_ref", "position", "rank", "pid", "index", "replica_index")
CLOCK_MIN = 1e9   # a clock reading at least this large is a unix time (after 2001), shown as a time of day
TEXT_MAX = 48     # longer text is cut (with "…") in a table
KEY_CHARS = 12    # hexadecimal keys (32+ characters) are cut to this many
MISSING = "-"
_HEX_KEY = re.compile(r"^[0-9a-f]{32,}$")

Format = Callable[[Any], str]


def table(df: pd.DataFrame, values: str | None = None) -> pd.DataFrame:
    """Mark ``df`` to show with the workbench's display format in IPython (and make sure the
    running IPython shell, if any, shows marked frames so); returns ``df`` itself.
    ``values``: the name of the figure every column holds (a pivot of one column, whose
    columns are named by the pivot's keys), formatted as that column would be."""
    df.attrs[TABLE_ATTR] = True
    if values is not None:
        df.attrs[VALUES_ATTR] = values
    install()
    return df


def is_table(obj: Any) -> bool:
    return isinstance(obj, pd.DataFrame) and bool(obj.attrs.get(TABLE_ATTR))


# --- values ----------------------------------------------------------------------------------

def _missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, str) or hasattr(v, "__len__"):  # text, a list, an array: not one missing value
        return False
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def number(v: Any) -> str:
    """A figure with no unit: an integral value with separators, else four significant
    digits (no exponent from 0.0001 up)."""
    v = float(v)
    if math.isnan(v):
        return MISSING
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1e-4:
        return f"{v:.4g}"
    return f"{v:.2e}"


def clock(v: Any) -> str:
    """A unix time as the local time of day to 0.1 s ("14:03:27.4"); a smaller clock reading
    (a monotonic clock's seconds) as a number."""
    v = float(v)
    if abs(v) < CLOCK_MIN:
        return number(v)
    t = _dt.datetime.fromtimestamp(v)
    return t.strftime("%H:%M:%S") + f".{t.microsecond // 100_000}"


def text(v: Any) -> str:
    """Text, a hexadecimal key cut to 12 characters, a long string cut with "…"; lists of
    text joined, other sequences as their first values or their length."""
    if isinstance(v, str):
        if _HEX_KEY.match(v):
            return v[:KEY_CHARS]
        return v if len(v) <= TEXT_MAX else v[:TEXT_MAX - 1] + "…"
    if isinstance(v, Mapping):
        return text(", ".join(f"{k}: {x}" for k, x in v.items()))
    if isinstance(v, (list, tuple, np.ndarray)):
        items = list(v)
        if all(isinstance(x, str) for x in items):
            return text(", ".join(items))
        if len(items) <= 4:
            return "[" + ", ".join(text(x) for x in items) + "]"
        return f"{len(items):,} values"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    if isinstance(v, numbers.Real):
        return number(v)
    return text(str(v))


# --- columns ---------------------------------------------------------------------------------

def _fmt(spec: str) -> Format:
    return lambda v: spec.format(float(v))


def _bytes_of(name: str) -> Format:
    def show(v: Any) -> str:
        return v if isinstance(v, str) else format_bytes(v)

    show.missing = "unbounded" if "budget" in name else MISSING  # type: ignore[attr-defined]
    return show


def _kind(name: str) -> Format | None:
    """The format a column's name asks for, or None (its dtype decides)."""
    if "bytes" in name.split("_") or name.endswith("_b"):   # bytes, used_bytes, bytes_disk, logical_bytes_end
        return _bytes_of(name)
    if name in FRACTIONS or name.endswith(("_ratio", "_fraction", "_share")):
        return _fmt("{:.1%}")
    if name == "percent_full":
        return _fmt("{:.1f}%")
    if name == "speedup":
        return _fmt("{:.2f}x")
    if name == "score_norm":
        return _fmt("{:.2f}")
    if name in CLOCKS or name.endswith("_at"):
        return clock
    if name.endswith("_s"):
        return _fmt("{:,.3f}")
    if name.endswith(("_ms", "MiB", "_tps")):
        return _fmt("{:,.1f}")
    return None


def _name(column: Any) -> str:
    """The name a column's format is chosen by: itself, or (a MultiIndex column) its first
    part that names a format, else its last."""
    if isinstance(column, tuple):
        parts = [str(p) for p in column]
        return next((p for p in parts if _kind(p) is not None), parts[-1] if parts else "")
    return str(column)


def column_format(column: Any, dtype: Any = None) -> Format:
    """How a column's values are shown: by its name first, then its dtype."""
    name = _name(column)
    fmt = _kind(name)
    if fmt is None:
        if dtype is not None and pd.api.types.is_bool_dtype(dtype):
            fmt = str
        elif name in IDS:
            fmt = _identifier
        elif dtype is not None and (pd.api.types.is_integer_dtype(dtype) or pd.api.types.is_float_dtype(dtype)):
            fmt = number
        else:
            fmt = text
    return _guarded(fmt)


def _identifier(v: Any) -> str:
    """An id (a ref, a sequence, a position): its digits, no separators."""
    return str(int(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else text(v)


def _guarded(fmt: Format) -> Format:
    """``fmt`` with missing values as "-" (or the format's own word: an unbounded budget),
    and values it cannot read (text in a figure's column) shown as text."""
    missing = getattr(fmt, "missing", MISSING)

    def show(v: Any) -> str:
        if _missing(v):
            return missing
        try:
            return fmt(v)
        except (TypeError, ValueError, OverflowError):
            return text(v)
    return show


# --- frames ----------------------------------------------------------------------------------

def shown(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` with every figure as the text the workbench shows for it (same
    index, columns and order; the index's keys, sizes and clock readings formatted too)."""
    values = df.attrs.get(VALUES_ATTR)
    out = pd.DataFrame({i: [column_format(values or c, df.dtypes.iloc[i])(v) for v in df.iloc[:, i]]
                        for i, c in enumerate(df.columns)}, index=_shown_index(df.index))
    out.columns = df.columns
    return out


def _shown_index(index: pd.Index) -> pd.Index:
    if isinstance(index, pd.MultiIndex):
        levels = [_shown_level(index.get_level_values(i)) for i in range(index.nlevels)]
        if all(new is old for new, old in zip(levels, (index.get_level_values(i) for i in range(index.nlevels)))):
            return index
        return pd.MultiIndex.from_arrays(levels, names=index.names)
    return _shown_level(index)


def _shown_level(level: pd.Index) -> pd.Index:
    name = "" if level.name is None else str(level.name)
    fmt = _kind(name)
    if fmt is None and (name == "key" or (level.dtype == object and any(
            isinstance(v, str) and _HEX_KEY.match(v) for v in level[:50]))):
        fmt = text
    if fmt is None:
        return level
    show = _guarded(fmt)
    return pd.Index([show(v) for v in level], name=level.name)


NOWRAP = '<div style="white-space: nowrap; overflow-x: auto">{}</div>'


def html(df: pd.DataFrame) -> str | None:
    """The HTML of `shown(df)`, in a block where no cell wraps."""
    inner = shown(df)._repr_html_()
    return None if inner is None else NOWRAP.format(inner)


# --- IPython ---------------------------------------------------------------------------------

def install(shell: Any = None) -> None:
    """Show marked frames through `shown` in ``shell`` (default: the running IPython shell,
    if IPython is imported and one runs); other frames as before. Idempotent."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    formatter = getattr(shell, "display_formatter", None)
    if formatter is None:
        return
    plain, rich = formatter.formatters["text/plain"], formatter.formatters["text/html"]
    if getattr(_lookup(plain), "workbench_table", False):
        return
    old_plain, old_rich = _lookup(plain), _lookup(rich)

    def show_plain(obj: Any, p: Any, cycle: bool) -> None:
        if not is_table(obj) and old_plain is not None:
            old_plain(obj, p, cycle)
            return
        lines = repr(shown(obj) if is_table(obj) else obj).splitlines()
        with p.group():
            for i, line in enumerate(lines):
                if i:
                    p.break_()
                p.text(line)

    def show_rich(obj: Any) -> str | None:
        if is_table(obj):
            return html(obj)
        return old_rich(obj) if old_rich is not None else obj._repr_html_()

    show_plain.workbench_table = True  # type: ignore[attr-defined]
    show_rich.workbench_table = True   # type: ignore[attr-defined]
    plain.for_type(pd.DataFrame, show_plain)
    rich.for_type(pd.DataFrame, show_rich)


def _lookup(formatter: Any) -> Any:
    try:
        return formatter.lookup_by_type(pd.DataFrame)
    except KeyError:
        return None
