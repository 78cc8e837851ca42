"""What a %%generate / %%chat cell and its flags turn into: the prompt with `{name}` filled
from the notebook (`interpolate`), `--stop` escapes (`unescape`), FILE|VAR arguments
(`text_from`), and `--draft` / `--ngram` as the `speculative=` request option. Each raises
UsageError naming the argument."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError


# --- prompt interpolation ----------------------------------------------------------------------

_FIELD = re.compile(
    r"\{\{([^{}]*)\}\}"                                   # {{x}} -> a literal {x}
    r"|\{([A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[[^\[\]{}]*\])*)"  # {name}, {obj.attr}, {seq[0]}
    r"(![rsa])?(?::([^{}]*))?\}")                         # optional !r and :format


def interpolate(text: str, namespace: dict[str, Any]) -> str:
    """Replace `{name}` (also `{a.b}`, `{a[0]}`, `{x!r}`, `{x:.2f}`) with values from
    `namespace`. Braces around anything else (JSON, code) are left alone; `{{name}}` gives a
    literal `{name}`. An unknown name raises UsageError."""
    fmt = string.Formatter()

    def sub(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return "{" + m.group(1) + "}"
        field, conv, spec = m.group(2), m.group(3), m.group(4)
        try:
            value, _ = fmt.get_field(field, (), namespace)
        except (KeyError, AttributeError, IndexError, TypeError) as e:
            raise UsageError(f"the prompt uses {{{field}}}, which cannot be resolved: {e!r}") from None
        value = fmt.convert_field(value, conv[1] if conv else None)
        try:
            return format(value, spec or "")
        except (ValueError, TypeError) as e:
            raise UsageError(f"the prompt's {{{field}:{spec}}}: {e}") from None

    return _FIELD.sub(sub, text)


def unescape(s: str) -> str:
    """`--stop '\\n\\n'` means two newlines."""
    return s.replace("\\\\", "\0").replace("\\n", "\n").replace("\\t", "\t").replace("\0", "\\")


def speculative_option(args: Any) -> dict[str, Any] | None:
    """--draft ID / --ngram KIND [--spec-n-max N] as the request's speculative= option."""
    if args.draft is not None and args.ngram is not None:
        raise UsageError("--draft and --ngram: choose one way of drafting")
    if args.draft is None and args.ngram is None:
        if args.spec_n_max is not None:
            raise UsageError("--spec-n-max needs --draft ID or --ngram KIND")
        return None
    spec: dict[str, Any] = {"draft": args.draft} if args.draft is not None else {"ngram": args.ngram}
    if args.spec_n_max is not None:
        spec["n_max"] = args.spec_n_max
    return spec


def text_from(ref: str, ns: dict[str, Any], flag: str, what: str) -> str:
    """The text a FILE|VAR argument names: a str variable, else a file's contents."""
    if ref.isidentifier() and ref in ns:
        value = ns[ref]
        if isinstance(value, (dict, list, bool)) and flag == "--json-schema":
            return json.dumps(value)
        if not isinstance(value, str):
            raise UsageError(f"{flag} {ref}: the variable holds a {type(value).__name__}, expected {what}")
        return value
    path = Path(ref).expanduser()
    if path.is_file():
        return path.read_text()
    raise UsageError(f"{flag} {ref}: neither a variable holding {what} nor a file")
