"""The tutorials' nbval sanitizers as nbval itself reads them: every section of
notebooks/nbval_sanitize.cfg parses (nbval's reader skips a section silently, e.g. a
`replace:` without the space before an empty replacement), and the text view's prefill
progress line, which a slow machine adds to a cell's output, is taken out."""

from __future__ import annotations

import re
from pathlib import Path

from nbformat.v4 import new_output
from nbval.plugin import coalesce_streams, get_sanitize_patterns

CFG = Path(__file__).resolve().parents[2] / "notebooks" / "nbval_sanitize.cfg"


def sanitized(text: str) -> str:
    for regex, replace in get_sanitize_patterns(CFG.read_text()):
        text = re.sub(regex, replace, text)
    return text


def test_every_section_parses() -> None:
    sections = re.findall(r"^\[(\w+)\]$", CFG.read_text(), flags=re.MULTILINE)
    assert len(get_sanitize_patterns(CFG.read_text())) == len(sections) > 0


def test_a_slow_prefills_progress_line_is_not_compared() -> None:
    reply = "\nThe sky is blue.\n[cold] ttft 215 ms · 88.7 tok/s · 32 prompt (32 prefilled) + 40 generated\n"
    quiet = coalesce_streams([new_output("stream", name="stdout", text=reply)])
    # as the text view writes it on a loaded machine: progress redrawn with \r, then a newline
    busy = coalesce_streams([new_output("stream", name="stdout", text=t) for t in (
        "\r[prefill] 0 of 32 prompt tokens", "\r[prefill] 31 of 32 prompt tokens (0 restored from cache, "
        "31 computed)", "\n", reply)])
    assert sanitized(busy[0].text) == sanitized(quiet[0].text)
    assert "TIME ms" in sanitized(reply) and "RATE tok/s" in sanitized(reply)


def test_clock_times_of_the_tables_are_not_compared() -> None:
    """A table shows a unix time as a time of day (workbench.notebook.display.clock)."""
    from workbench.notebook.display import clock

    one, other = clock(1_796_286_123.46), clock(1_796_299_999.9)
    assert sanitized(f"ram  lru  {one}") == sanitized(f"ram  lru  {other}") == "ram  lru  CLOCK"
