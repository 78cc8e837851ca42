"""The `%wb` subcommands: one plain function per command, each with its own
magic_arguments parser, called by `WorkbenchMagics.wb` with the parsed arguments.

    %wb load [PATH|default] [--id ID] [--n-ctx N] [--n-seq-max N]
    %wb models | unload ID | counters | history | mode [auto|widget|text] | help [COMMAND]
    %wb cache | chunks | tiers | evict BYTES [--tier T] | pin KEY | unpin KEY   [--model ID | --cache VAR]
    %wb serve [start|status|stop] [--port N] [--only ID] [--api-key KEY]   (serve_commands.py)
    %wb cluster start|status|decisions|plot|router|sync|stop   (cluster_commands.py)

The first line of each command's docstring is its line in `%wb help` (help.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

import workbench as wb
from workbench.notebook.host import MagicsHost
from workbench import errors
from workbench.notebook import views, widgets
from workbench.notebook.cluster_commands import cluster_command
from workbench.notebook.serve_commands import serve_command
from workbench.units import format_bytes, format_count, parse_bytes

# errors that mean "the arguments were wrong", shown as UsageError with their message
ARGUMENT_ERRORS: tuple[type[BaseException], ...] = (
    errors.OptionError, errors.NotLoaded, errors.AlreadyLoaded, errors.ModelFileError, errors.EmptyPrompt,
    errors.ContextOverflow, errors.NoSession, errors.SessionBusy, errors.TranscriptMismatch)


@contextmanager
def usage_errors() -> Iterator[None]:
    """Re-raise argument/option errors of the API as UsageError with the same message."""
    try:
        yield
    except ARGUMENT_ERRORS as e:
        raise UsageError(str(e)) from None


# the API's option names (and others') typed as flags, and the flag each means
FLAG_ALIASES = {"response_tokens": "max_tokens", "max_new_tokens": "max_tokens", "n_predict": "max_tokens",
                "stop_sequences": "stop", "session_id": "session", "system_prompt": "system"}
_UNRECOGNIZED = "unrecognized arguments: "


def parse_arguments(fn: Any, line: str) -> Any:
    """`parse_argstring(fn, line)`, whose "unrecognized arguments" UsageError also says which
    of fn's flags each unknown one probably meant (--max_tokens: did you mean --max-tokens?)."""
    try:
        return parse_argstring(fn, line)
    except UsageError as e:
        message = str(e)
        if not message.startswith(_UNRECOGNIZED):
            raise
        hints = _flag_hints(fn.parser, message[len(_UNRECOGNIZED):].split())
        raise UsageError(message + (f" ({'; '.join(hints)})" if hints else "")) from None


def _flag_hints(parser: Any, words: list[str]) -> list[str]:
    # argparse lists no option strings publicly; its _actions are the documented way in
    flags = [f for action in parser._actions for f in action.option_strings if f.startswith("--")]
    hints = []
    for word in words:
        flag = word.split("=", 1)[0]
        if not flag.startswith("-"):
            continue
        meant = errors.close_matches(flag, flags, FLAG_ALIASES)
        if meant:
            hints.append(f"{flag}: did you mean {' or '.join(meant)}?")
    return hints


def with_arguments(args: list[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Apply a shared list of magic_arguments `argument`s (in the order given)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for a in reversed(args):
            fn = a(fn)
        return fn
    return deco


CACHE_FLAGS = ("--model", "--cache")  # the flags of every command on a cache (%wb help names them once)
_cache_args = [argument(CACHE_FLAGS[0], metavar="ID", help="model id (default: the current model)"),
               argument(CACHE_FLAGS[1], metavar="VAR",
                        help="a prefix cache (workbench.cache.PrefixCache) held in this variable instead")]


@magic_arguments(name="wb load")
@argument("path", nargs="?", default="default", metavar="PATH|default",
          help="a GGUF file, or 'default' (SmolLM2-135M-Instruct)")
@argument("--id", dest="model_id", metavar="ID", help="model id to register (default: from the file name)")
@argument("--n-ctx", type=int, metavar="N", help="context tokens")
@argument("--n-seq-max", type=int, metavar="N", help="concurrent sequences")
def _load(m: MagicsHost, args: Any) -> None:
    """Load a model; it becomes the current model of the magics."""
    cfg: dict[str, Any] = {}
    if args.path != "default":
        cfg["model_path"] = args.path
    for key in ("model_id", "n_ctx", "n_seq_max"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    with usage_errors():
        mid = wb.load_model(**cfg)
    m.current_model = mid
    info = wb.model_info(mid)
    print(f"loaded {mid!r}: {format_count(info.get('n_params'))} parameters (llama.cpp: {info.get('desc', '')}), "
          f"n_ctx {info['n_ctx']}, {info['n_seq_max']} sequences")


MODEL_COLUMNS = ["params", "desc", "size_bytes", "n_ctx", "n_seq_max", "available_seqs", "phase", "queue_depth",
                 "deterministic"]   # what %wb models shows without --all
ROW_COLUMNS = ["tier", "rank", "reason", "n_tokens", "bytes", "hits", "idle_s", "pinned", "live"]  # %wb cache's


def _columns(df: Any, columns: list[str], every: bool) -> Any:
    """``df`` with only ``columns`` (those it has), or whole with --all."""
    return df if every else df[[c for c in columns if c in df.columns]]


@magic_arguments(name="wb models")
@argument("--all", dest="every", action="store_true", help="every column of views.models()")
def _models(m: MagicsHost, args: Any) -> Any:
    """Loaded models (a DataFrame; --all for every column of model_info)."""
    return _columns(views.models(), MODEL_COLUMNS, args.every)


@magic_arguments(name="wb unload")
@argument("model_id", metavar="ID", help="the model to unload")
def _unload(m: MagicsHost, args: Any) -> None:
    """Unload a model (its running requests end with an error)."""
    with usage_errors():
        wb.unload(args.model_id)
    if m.current_model == args.model_id:
        m.current_model = None
    print(f"unloaded {args.model_id!r}")


@magic_arguments(name="wb counters")
@with_arguments(_cache_args)
def _counters(m: MagicsHost, args: Any) -> Any:
    """Engine counters, plus the cache's when the model has one."""
    if args.cache or args.model:
        return views.counters(m.cache_of(args))
    try:
        cache = m.cache_of(args)
    except UsageError:  # no model, several models, or no cache wired: engine counters only
        cache = None
    return views.counters(cache)


@magic_arguments(name="wb history")
@argument("--model", metavar="ID", help="only this model's requests (default: every loaded model's)")
@argument("--last", type=int, metavar="N", help="only the newest N requests")
@argument("--latency", action="store_true", help="mean / p50 / p90 / p99 of queued, TTFT, TPOT, ITL and E2E "
          "in milliseconds instead (views.latency)")
@argument("--by", metavar="COLUMN", help="with --latency: one group per value of this column (e.g. cache_hit_kind)")
def _history(m: MagicsHost, args: Any) -> Any:
    """Every finished request of the loaded models, oldest first (views.history).

    The engine's history: %%generate / %%chat, API calls and an endpoint's clients alike.
    Times in milliseconds: queued_ms, ttft_ms (to the first token), tpot_ms (per later
    token), e2e_ms (arrival to the end); each engine keeps its newest history_size."""
    df = views.history(args.model)
    if args.last is not None:
        if args.last < 1:
            raise UsageError(f"--last {args.last}: expected a number of requests >= 1")
        df = df.tail(args.last)
    if args.latency:
        if args.by is not None and args.by not in df.columns:
            raise UsageError(f"--by {args.by}: expected one of the history's columns ({', '.join(df.columns)})")
        lat = views.latency(df, by=args.by)
        times = ["mean", "p50", "p90", "p99"]
        lat[times] = lat[times] * 1000
        return lat.rename(columns={c: f"{c}_ms" for c in times})
    out = df[["model", "finish_reason", "cache_hit_kind", "prompt_tokens", "cached_tokens", "generated_tokens"]].copy()
    for col in ("queued_s", "ttft_s", "tpot_s", "e2e_s"):
        out[col.replace("_s", "_ms")] = df[col] * 1000
    return out.reset_index()


@magic_arguments(name="wb mode")
@argument("mode", nargs="?", choices=["auto", "widget", "text"], help="how generations are shown")
def _mode(m: MagicsHost, args: Any) -> None:
    """Show or set how %%generate shows a generation: widget, text, or auto.

    auto: a widget in a Jupyter kernel where ipywidgets imports, text elsewhere."""
    if args.mode is not None:
        widgets.set_display_mode(args.mode)
    print(f"display mode: {widgets.display_mode()} (widgets {'on' if widgets.widgets_available() else 'off'})")


@magic_arguments(name="wb cache")
@argument("--all", dest="every", action="store_true",
          help="every column of views.cache_rows() (scores, times, copies, scope)")
@with_arguments(_cache_args)
def _cache(m: MagicsHost, args: Any) -> Any:
    """Cached KV rows, next victim first (tier, rank, size, hits, idle time; --all: scores too)."""
    return _columns(views.cache_rows(m.cache_of(args)), ROW_COLUMNS, args.every)


@magic_arguments(name="wb chunks")
@with_arguments(_cache_args)
def _chunks(m: MagicsHost, args: Any) -> Any:
    """The chunks of a cache (leaves first, next victim first); in whole rows, one per row's
    new KV."""
    cache = m.cache_of(args)
    with usage_errors():
        return views.cache_chunks(cache)


@magic_arguments(name="wb tiers")
@with_arguments(_cache_args)
def _tiers(m: MagicsHost, args: Any) -> Any:
    """The cache's tiers: budget, use, policy."""
    return views.tiers(m.cache_of(args))


@magic_arguments(name="wb evict")
@argument("bytes", metavar="BYTES", help="how much to free: 1000000, 512MiB, 2GB")
@argument("--tier", metavar="T", help="tier to free (default: the top one)")
@with_arguments(_cache_args)
def _evict(m: MagicsHost, args: Any) -> None:
    """Free at least BYTES in a tier, demoting evicted rows down the tiers."""
    try:
        n = parse_bytes(args.bytes)
    except ValueError as e:
        raise UsageError(str(e)) from None
    cache = m.cache_of(args)
    try:
        freed = cache.evict_bytes(n, args.tier)
    except (ValueError, KeyError) as e:  # an unknown tier (rows: ValueError, chunks: KeyError)
        raise UsageError(str(e.args[0] if isinstance(e, KeyError) else e)) from None
    print(f"freed {format_bytes(freed)} ({freed} bytes)")


@magic_arguments(name="wb pin")
@argument("key", metavar="KEY", help="row key or a unique prefix (see %%wb cache)")
@with_arguments(_cache_args)
def _pin(m: MagicsHost, args: Any) -> None:
    """Pin a row (the previously pinned row of its namespace is unpinned)."""
    old = _on_row(m, args, lambda cache, key: cache.pin(key))
    print(f"pinned {args.key}" + (f" (unpinned {old[:12]})" if old else ""))


@magic_arguments(name="wb unpin")
@argument("key", metavar="KEY", help="row key or a unique prefix")
@with_arguments(_cache_args)
def _unpin(m: MagicsHost, args: Any) -> None:
    """Unpin a row."""
    was = _on_row(m, args, lambda cache, key: cache.unpin(key))
    print(f"unpinned {args.key}" if was else f"{args.key} was not pinned")


def _on_row(m: MagicsHost, args: Any, op: Callable[[Any, str], Any]) -> Any:
    """``op(cache, key)`` on the row that KEY (a key or a unique prefix) names in the
    command's cache; a KEY naming no row, or several, is a UsageError with the cache's words."""
    cache = m.cache_of(args)
    try:
        return op(cache, m.row_key(cache, args.key))
    except KeyError as e:
        raise UsageError(str(e.args[0])) from None


@magic_arguments(name="wb help")
@argument("command", nargs="?", metavar="COMMAND", help="a %%wb command, or generate / chat")
def _help(m: MagicsHost, args: Any) -> None:
    """This table, or one command's (or cell magic's) arguments in full."""
    from workbench.notebook import help as wb_help  # help.py reads SUBCOMMANDS

    print(wb_help.command_help(args.command) if args.command else wb_help.overview())


# each wrapped by magic_arguments, which gives the function a `parser` (its usage); the order
# is %wb help's
SUBCOMMANDS: dict[str, Any] = {
    "load": _load, "models": _models, "unload": _unload, "counters": _counters, "history": _history,
    "mode": _mode, "cache": _cache, "chunks": _chunks, "tiers": _tiers, "evict": _evict, "pin": _pin, "unpin": _unpin,
    "serve": serve_command, "help": _help, "cluster": cluster_command,
}
