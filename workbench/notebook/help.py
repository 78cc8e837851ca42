"""What `%wb help` prints: every %wb subcommand with its arguments and a line on what it
does, the `%wb cluster` actions one per line, and the cell magics; `%wb help COMMAND` one
command (or cell magic) in full.

Everything is read from the registered commands, so the help cannot drift from the code:
the subcommands and their parsers (`commands.SUBCOMMANDS`, magic_arguments), the first
line of each command's docstring, the cluster's actions with their values and flags
(`cluster_commands.ACTIONS`, `VALUES`, `FLAGS`), and the cell magics of `WorkbenchMagics`.
"""

from __future__ import annotations

import argparse
import copy
import textwrap
from typing import Any

from IPython.core.error import UsageError

from workbench.notebook import cluster_commands
from workbench.notebook.commands import CACHE_FLAGS, SUBCOMMANDS
from workbench.notebook.magics import WorkbenchMagics

COLUMN = 28   # where the descriptions start
WIDTH = 100   # descriptions wrap before this column


def summary(fn: Any) -> str:
    """The first line of a magic's own docstring (magic_arguments keeps it as the parser's
    description), without its full stop."""
    text = getattr(getattr(fn, "parser", None), "description", None) or fn.__doc__ or ""
    first = text.strip().split("\n\n", 1)[0]
    return " ".join(first.split()).rstrip(".")


def _positional(action: argparse.Action) -> str:
    name = "|".join(map(str, action.choices)) if action.choices else str(action.metavar or action.dest)
    return f"[{name}]" if action.nargs in ("?", "*") else name


def _flag(action: argparse.Action) -> str:
    flag = next(f for f in action.option_strings if f.startswith("--"))
    if action.nargs == 0:  # store_true and the like
        return f"[{flag}]"
    return f"[{flag} {action.metavar or action.dest.upper()}]"


def _actions(fn: Any) -> list[argparse.Action]:
    # argparse lists no arguments publicly; its _actions are the documented way in
    return [a for a in fn.parser._actions if not isinstance(a, argparse._HelpAction)]


def usage(fn: Any, *, leave_out: tuple[str, ...] = ()) -> str:
    """A command's arguments as typed: positionals first, then the flags (but `leave_out`)."""
    actions = _actions(fn)
    words = [_positional(a) for a in actions if not a.option_strings]
    words += [_flag(a) for a in actions if a.option_strings and not set(a.option_strings) & set(leave_out)]
    return " ".join(words)


def _flags_named(fn: Any, names: list[str]) -> list[str]:
    by_name = {f: a for a in _actions(fn) for f in a.option_strings}
    return [_flag(by_name[name]) for name in names]


def _row(left: str, description: str) -> list[str]:
    """`left` and its description in two columns; the description wraps in its column, and
    goes below a `left` too wide for the first."""
    lines = textwrap.wrap(description, WIDTH - COLUMN) or [""]
    pad = " " * COLUMN
    if len(left) + 2 + 2 <= COLUMN:
        out = [f"  {left}".ljust(COLUMN) + lines[0]]
    else:
        out = [f"  {left}", pad + lines[0]]
    return out + [pad + line for line in lines[1:]]


def _heading(left: str, right: str) -> str:
    return left.ljust(COLUMN) + right


def _cluster_rows() -> list[str]:
    fn = SUBCOMMANDS["cluster"]
    rows = []
    for action, what in cluster_commands.ACTIONS.items():
        words = ["cluster", action, cluster_commands.VALUES.get(action, "")]
        words += _flags_named(fn, cluster_commands.FLAGS.get(action, []))
        rows += _row(" ".join(w for w in words if w), what)
    return rows


def overview() -> str:
    """`%wb help`: the table of every command."""
    lines = [_heading("%wb COMMAND [ARGS]", "%wb help COMMAND: a command's arguments in full"), ""]
    cache_commands = []
    for name, fn in SUBCOMMANDS.items():
        if name == "cluster":
            continue
        flags = {f for a in _actions(fn) for f in a.option_strings}
        if set(CACHE_FLAGS) <= flags:
            cache_commands.append(name)
        lines += _row(" ".join(w for w in (name, usage(fn, leave_out=CACHE_FLAGS)) if w), summary(fn))
    cache_fn = SUBCOMMANDS[cache_commands[0]]
    either = " | ".join(f.strip("[]") for f in _flags_named(cache_fn, list(CACHE_FLAGS)))
    lines += ["", *textwrap.wrap(f"{', '.join(cache_commands)} also take [{either}]: the cache of that model "
                                 "(default: the current model) or a cache held in a variable.", WIDTH - 2,
                                 initial_indent="  ", subsequent_indent="  ")]
    lines += ["", _heading("%wb cluster ACTION", summary(SUBCOMMANDS["cluster"])), *_cluster_rows()]
    lines += ["", _heading("Cell magics", "the cell is the prompt or message; %wb help generate | chat: options")]
    for name in WorkbenchMagics.cell_names:
        lines += _row(f"%%{name} [OPTIONS]", summary(getattr(WorkbenchMagics, name)))
    return "\n".join(lines)


def command_help(command: str) -> str:
    """`%wb help COMMAND`: a subcommand's (or a cell magic's, `generate` or `%%chat`) usage,
    description and arguments; for `cluster`, its actions one per line first."""
    cell = command.lstrip("%")
    if command.startswith("%%") or (cell in WorkbenchMagics.cell_names and command not in SUBCOMMANDS):
        if cell not in WorkbenchMagics.cell_names:
            raise UsageError(f"no cell magic %%{cell}; the workbench's: "
                             + ", ".join(f"%%{n}" for n in WorkbenchMagics.cell_names))
        return _doc(getattr(WorkbenchMagics, cell))
    fn = SUBCOMMANDS.get(command)
    if fn is None:
        raise UsageError(f"unknown %wb command {command!r}; commands: {', '.join(SUBCOMMANDS)}")
    if command == "cluster":
        # the parser's usage line runs every action's flags together: the actions instead
        parser = copy.copy(fn.parser)
        parser.usage = argparse.SUPPRESS
        body = parser.format_help().strip()
        return "\n".join(["%wb cluster ACTION", *_cluster_rows(), "", body])
    return _doc(fn)


def _doc(fn: Any) -> str:
    # magic_arguments writes the help as a docstring, behind an "::" line
    return (fn.__doc__ or "").removeprefix("::\n\n").rstrip()
