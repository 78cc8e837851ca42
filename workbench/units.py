"""Byte sizes as people write them: 1.5GiB, 512MB, 2_000_000."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """An int from 123, 1.5e9, '512MiB', '2GB', '4 gib' (decimal k/M/G, binary KiB/MiB/GiB)."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte size: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or value != value:
            raise ValueError(f"a byte size must be >= 0, got {value!r}")
        return int(value)
    m = _SIZE.match(str(value))
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {value!r} (try 512MiB, 2GB or 1000000)")
    return int(float(m.group(1).replace("_", "")) * _UNITS[m.group(2).lower()])


def format_bytes(n: int | float | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'unbounded'."""
    if n is None:
        return "unbounded"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable


def format_count(n: int | float | None) -> str:
    """A count in words as model sizes are written: 134_515_008 -> '135M', 1.54e9 -> '1.5B'."""
    if n is None or n != n:
        return ""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale * 0.9995:  # 999,999 is 1M, not 1000K
            v = n / scale
            text = f"{v:.1f}" if v < 9.95 else f"{v:.0f}"
            return text.removesuffix(".0") + unit
    return f"{n:.0f}"
