"""IPython magics: `%wb ...` (models, counters, cache) and `%%generate` / `%%chat`.

Thin by design (as jupysql's magic.py): each magic parses its arguments with IPython's
magic_arguments, turns argument and option errors into UsageError naming the reason, and
delegates to the public API, `views` and `widgets`; the %wb subcommands live in
`commands.py`.

    %wb load [PATH|default] [--id ID] [--n-ctx N] [--n-seq-max N]
    %wb models | unload ID | counters | history | mode [auto|widget|text] | help [COMMAND]
    %wb cache | tiers | evict BYTES [--tier T] | pin KEY | unpin KEY   [--model ID | --cache VAR]
    %%generate [--model ID] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
               [--seed S] [--stop STR ...] [--grammar FILE|VAR] [--json-schema VAR]
               [--session S] [--ignore-eos] [--logprobs N] [--draft ID | --ngram KIND [--spec-n-max N]]
               [--no-stream] [--background] [--as VAR]
    %%chat     [the %%generate options] [--system TEXT] [--new] [--thinking]
               [--thinking-budget N] [--tools VAR|FILE] [--tool-choice auto|none|required|NAME]
               [--tool-result CALL_ID]
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

import workbench as wb
from workbench.cache.interface import PrefixCache
from workbench.errors import close_matches
from workbench.notebook import transcript, views, widgets
from workbench.notebook.cell_inputs import interpolate, speculative_option, text_from, unescape
from workbench.notebook.commands import SUBCOMMANDS, parse_arguments, usage_errors, with_arguments
from workbench.notebook.results import Result

DEFAULT_VAR = "_wb"
NOTE_WIDTH = 88  # notes are wrapped between words here (a notebook's output wraps mid-word)


# --- generation arguments ----------------------------------------------------------------------

_generation_args = [
    argument("--model", metavar="ID", help="model id (default: the current model)"),
    argument("--max-tokens", type=int, metavar="N", help="most tokens to generate (response_tokens)"),
    argument("--temperature", type=float, metavar="T"),
    argument("--top-k", type=int, metavar="K"),
    argument("--top-p", type=float, metavar="P"),
    argument("--seed", type=int, metavar="S"),
    argument("--stop", nargs="+", metavar="STR", help="stop sequences (\\n, \\t understood)"),
    argument("--grammar", metavar="FILE|VAR", help="GBNF grammar: a variable holding it, or a file"),
    argument("--json-schema", metavar="VAR", help="JSON schema: a variable (dict or text), or a file"),
    argument("--session", metavar="S", help="sticky session id (keeps this conversation's KV live)"),
    argument("--ignore-eos", action="store_true", help="never stop at end-of-generation"),
    argument("--logprobs", type=int, metavar="N",
             help="each token's logprob and the N most likely (0-20); the live view colours by probability"),
    argument("--draft", metavar="ID", help="speculative decoding with this loaded draft model"),
    argument("--ngram", choices=["simple", "map_k", "map_k4v", "cache"],
             help="speculative decoding with n-gram drafts from the prompt and reply (no second model)"),
    argument("--spec-n-max", type=int, metavar="N", help="most draft tokens per step (with --draft/--ngram)"),
    argument("--n", type=int, metavar="N", help="N samples of the prompt, one prefill (shown side by side when "
             "all are done; --as holds the list)"),
    argument("--best-of", type=int, metavar="K", help="K samples, the --n (default 1) best by mean logprob kept"),
    argument("--no-stream", action="store_true", help="wait for the whole reply, then show it"),
    argument("--background", action="store_true",
             help="stream on a thread and return at once (the Cancel button works meanwhile)"),
    argument("--as", dest="var", default=DEFAULT_VAR, metavar="VAR", help="store the Result here (default _wb)"),
]


@dataclass
class _Job:
    """One %%generate / %%chat cell, parsed: how to start it streaming or whole."""

    args: Any
    model: str
    start: Callable[[dict[str, Any]], Any]
    complete: Callable[[dict[str, Any]], Any]
    on_result: Callable[[Result], None] | None = None
    options: dict[str, Any] = field(default_factory=dict)


@magics_class
class WorkbenchMagics(Magics):
    """%wb, %%generate and %%chat (see the module doc)."""

    line_names = ("wb",)
    cell_names = ("generate", "chat")

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.current_model: str | None = None
        self.chats: dict[str, list[dict[str, str]]] = {}
        self.thinking_warned: set[str] = set()  # models told that --thinking shows nothing

    @property
    def user_ns(self) -> dict[str, Any]:
        """The notebook's namespace (cells interpolate from it; --as stores into it)."""
        if self.shell is None:
            raise UsageError("the workbench magics need an IPython shell")
        return self.shell.user_ns

    # -- %wb ---------------------------------------------------------------------------------
    @line_magic
    def wb(self, line: str) -> Any:
        """%wb COMMAND [ARGS]: load, models, unload, counters, history, mode, cache, chunks,
        tiers, evict, pin, unpin, cluster, help. `%wb help` (or `%wb` alone) lists them with a
        line each; `%wb help COMMAND` shows a command's arguments."""
        command, _, rest = line.strip().partition(" ")
        if command in ("", "-h", "--help"):
            command = "help"
        fn = SUBCOMMANDS.get(command)
        if fn is None:
            raise UsageError(f"unknown %wb command {command!r}{_hint(command)}; commands: {', '.join(SUBCOMMANDS)}")
        return fn(self, parse_arguments(fn, rest))

    # -- shared helpers -------------------------------------------------------------------------
    def model_of(self, requested: str | None) -> str:
        """The model a command works on: --model, else the current one, else the only one."""
        loaded = [info["model_id"] for info in wb.list_models()]
        if requested is not None:
            if requested not in loaded:
                raise UsageError(f"model {requested!r} is not loaded; loaded: {', '.join(loaded) or 'none'}")
            return requested
        if self.current_model in loaded:
            return self.current_model  # type: ignore[return-value]
        if len(loaded) == 1:
            return loaded[0]
        if not loaded:
            raise UsageError("no model is loaded: run %wb load default (or %wb load PATH)")
        raise UsageError(f"several models are loaded ({', '.join(loaded)}): pass --model")

    def cache_of(self, args: Any) -> Any:
        """--cache VAR (a prefix cache in the namespace), else the model's cache."""
        if getattr(args, "cache", None):
            obj = self.user_ns.get(args.cache)
            if not isinstance(obj, PrefixCache):
                raise UsageError(f"--cache {args.cache}: not a variable holding a prefix cache "
                                 "(a workbench.cache.PrefixCache)")
            return obj
        return views.model_cache(self.model_of(getattr(args, "model", None)))

    @staticmethod
    def row_key(cache: Any, key: str) -> str:
        """A full row key from a key or a unique prefix of one (as %wb cache shows)."""
        if key in cache:
            return key
        found = [k for k in cache.keys() if k.startswith(key)]
        if len(found) == 1:
            return found[0]
        raise KeyError(f"no cached row {key!r}" if not found else f"{key!r} matches {len(found)} rows")

    def _request_options(self, args: Any) -> dict[str, Any]:
        ns = self.user_ns
        opts: dict[str, Any] = {}
        for arg, key in (("max_tokens", "response_tokens"), ("temperature", "temperature"), ("top_k", "top_k"),
                         ("top_p", "top_p"), ("seed", "seed"), ("session", "session_id"), ("logprobs", "logprobs")):
            if getattr(args, arg) is not None:
                opts[key] = getattr(args, arg)
        if args.stop:
            opts["stop_sequences"] = [unescape(s) for s in args.stop]
        if args.ignore_eos:
            opts["ignore_eos"] = True
        spec = speculative_option(args)
        if spec is not None:
            opts["speculative"] = spec
        if args.grammar is not None:
            opts["grammar"] = text_from(args.grammar, ns, "--grammar", "GBNF text")
        if args.json_schema is not None:
            value = ns.get(args.json_schema) if args.json_schema.isidentifier() else None
            if value is None:
                text = text_from(args.json_schema, ns, "--json-schema", "a JSON schema")
                try:
                    value = json.loads(text)
                except ValueError as e:
                    raise UsageError(f"--json-schema {args.json_schema}: not valid JSON ({e})") from None
            opts["json_schema"] = value
        return opts

    def _job(self, args: Any, model: str, start: Callable[[dict[str, Any]], Any],
             complete: Callable[[dict[str, Any]], Any], on_result: Callable[[Result], None] | None = None) -> _Job:
        if not args.var.isidentifier():
            raise UsageError(f"--as {args.var!r} is not a valid variable name")
        return _Job(args, model, start, complete, on_result, self._request_options(args))

    def _store(self, var: str, result: Result | None) -> None:
        self.user_ns[var] = result

    # -- %%generate -----------------------------------------------------------------------------
    @cell_magic
    @magic_arguments(name="%generate")
    @with_arguments(_generation_args)
    def generate(self, line: str, cell: str) -> None:
        """Generate a completion of the cell's text, shown live.

        The cell is the prompt ({name} is filled from the notebook's variables); the Result is
        stored in --as (default _wb)."""
        __tracebackhide__ = True  # an Interrupt shows one line, not the magic's frames
        self._run(self._generate_job(line, cell))

    def _generate_job(self, line: str, cell: str) -> _Job:
        args = parse_arguments(self.generate, line)
        model = self.model_of(args.model)
        prompt = interpolate(cell.rstrip("\n"), self.user_ns)
        if not prompt.strip():
            raise UsageError("the cell is empty: write the prompt below the %%generate line")
        return self._job(args, model, lambda opts: wb.stream(model, prompt, **opts),
                         lambda opts: wb.complete(model, prompt, **opts))

    async def run_cell_async(self, name: str, line: str, cell: str) -> None:
        """What a `%%generate` / `%%chat` cell runs in a kernel that handles widget messages
        while a cell awaits (async_cells.install rewrites the cell to await this): the
        stream is consumed with awaits in between, so a click on Cancel acts at once."""
        __tracebackhide__ = True
        job = (self._generate_job if name == "generate" else self._chat_job)(line, cell)
        if job.args.no_stream or job.args.background:
            self._run(job)
            return
        stream, view, finished = self._start(job, live_cancel=True)
        try:
            result = await transcript.consume_async(stream, view)
        except transcript.GenerationInterrupted as e:
            finished(e.result)
            raise transcript.GenerationInterrupted(e.result, job.args.var) from None
        finished(result)

    def _start(self, job: _Job, *, live_cancel: bool) -> tuple[Any, Any, Callable[[Result], None]]:
        """Start the stream and its view; return them and the callback that stores the Result."""
        var = job.args.var
        with usage_errors():
            stream = job.start(job.options)
        self._warn_thinking(job, stream)
        view = widgets.make_view(job.model, live_cancel=live_cancel)

        def finished(result: Result) -> None:
            self._store(var, result)
            if job.on_result is not None:
                job.on_result(result)

        return stream, view, finished

    def _run(self, job: _Job) -> None:
        __tracebackhide__ = True
        args = job.args
        if args.n is not None or args.best_of is not None:
            self._run_samples(job)
            return
        if args.no_stream:
            self._run_whole(job)
            return
        # a blocking cell: a click cannot reach the kernel before it ends, unless in the background
        stream, view, finished = self._start(job, live_cancel=args.background)
        if args.background:  # the variable holds the running handle, then the Result
            self.user_ns[args.var] = transcript.consume_in_background(stream, view, finished)
            return
        try:
            result = transcript.consume(stream, view)
        except transcript.GenerationInterrupted as e:
            finished(e.result)
            raise transcript.GenerationInterrupted(e.result, args.var) from None
        finished(result)

    def _run_whole(self, job: _Job) -> None:
        """--no-stream: wait for the whole reply, then display the Result."""
        with usage_errors():
            try:
                raw = job.complete(job.options)
            except KeyboardInterrupt:
                print("[cancelled] interrupted before the reply was complete")
                raise
        result = Result.of(raw)
        self._store(job.args.var, result)
        if job.on_result is not None:
            job.on_result(result)
        from IPython.display import display

        display(result)

    def _run_samples(self, job: _Job) -> None:
        """--n / --best-of: every sample whole (one prefill: workbench/samples.py), then the
        samples side by side (views.samples); --as holds the list of Results (best first),
        and a chat continues with the first."""
        args = job.args
        with usage_errors():
            try:
                raw = job.complete({**job.options, "n": args.n, "best_of": args.best_of})
            except KeyboardInterrupt:
                print("[cancelled] interrupted before every sample was complete")
                raise
        results = [Result.of(r) for r in raw]
        self._store_list(args.var, results)
        if job.on_result is not None:
            job.on_result(results[0])
        from IPython.display import display

        display(views.samples(raw))

    def _store_list(self, var: str, results: list[Result]) -> None:
        self.user_ns[var] = results

    def _warn_thinking(self, job: _Job, stream: Any) -> None:
        """--thinking on a template that has no thinking block: say so, once per model."""
        if not getattr(job.args, "thinking", False) and getattr(job.args, "thinking_budget", None) is None:
            return
        plan = getattr(stream, "plan", None)
        if plan is None or plan.markers is not None or job.model in self.thinking_warned:
            return
        self.thinking_warned.add(job.model)
        print(textwrap.fill(f"note: {job.model}'s chat template has no thinking block, so --thinking shows "
                            "none (load the model with thinking_markers={'start': ..., 'end': ...} to split "
                            "one out)", NOTE_WIDTH, break_long_words=False, break_on_hyphens=False))

    # -- %%chat --------------------------------------------------------------------------------
    @cell_magic
    @magic_arguments(name="%chat")
    @argument("--system", help="system message (starts a new conversation)")
    @argument("--new", action="store_true", help="start a new conversation")
    @argument("--thinking", action="store_true", help="ask the template to think; show the block apart")
    @argument("--thinking-budget", type=int, metavar="N", help="close the thinking block after N tokens")
    @argument("--tools", metavar="VAR|FILE", help="OpenAI-shaped tools: a variable holding the list, or a JSON file")
    @argument("--tool-choice", metavar="CHOICE", help="auto, none, required, or a tool's name")
    @argument("--tool-result", metavar="CALL_ID", help="the cell is the result of this tool call (a tool message)")
    @with_arguments(_generation_args)
    def chat(self, line: str, cell: str) -> None:
        """A chat turn: the cell is the user's message, the conversation is kept.

        The cell (or, with --tool-result, a tool's result) goes to workbench.chat with this
        conversation's history (per model and --session); the assistant's Result is stored
        in --as and its parsed message joins the history."""
        __tracebackhide__ = True
        self._run(self._chat_job(line, cell))

    def _chat_job(self, line: str, cell: str) -> _Job:
        args = parse_arguments(self.chat, line)
        model = self.model_of(args.model)
        text = interpolate(cell.rstrip("\n"), self.user_ns)
        if not text.strip():
            raise UsageError("the cell is empty: write the message below the %%chat line")
        key = f"{model}/{args.session or ''}"
        if args.new or args.system is not None:
            self.chats.pop(key, None)
        history = self.chats.setdefault(key, [{"role": "system", "content": args.system}] if args.system else [])
        if args.tool_result is not None:
            turn = {"role": "tool", "tool_call_id": args.tool_result, "content": text}
        else:
            turn = {"role": "user", "content": text}
        messages = [*history, turn]
        chat_opts = self._chat_options(args)

        def remember(result: Result) -> None:
            if result.ok and not result.cancelled:
                parsed = result.raw.message if isinstance(result.raw, wb.ChatResult) else None
                reply = dict(parsed) if parsed else {"role": "assistant", "content": result.reply}
                history.extend([turn, reply])

        return self._job(args, model, lambda opts: wb.chat_stream(model, messages, **{**opts, **chat_opts}),
                         lambda opts: wb.chat(model, messages, **{**opts, **chat_opts}), remember)

    def _chat_options(self, args: Any) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if args.thinking or args.thinking_budget is not None:
            opts["thinking"] = "enabled"
        if args.thinking_budget is not None:
            opts["thinking_budget_tokens"] = args.thinking_budget
        if args.tools is not None:
            ns = self.user_ns
            value = ns.get(args.tools) if args.tools.isidentifier() else None
            if value is None:
                path = Path(args.tools).expanduser()
                if not path.is_file():
                    raise UsageError(f"--tools {args.tools}: neither a variable holding a list of tools nor a file")
                try:
                    value = json.loads(path.read_text())
                except ValueError as e:
                    raise UsageError(f"--tools {args.tools}: not valid JSON ({e})") from None
            opts["tools"] = value
        if args.tool_choice is not None:
            choice = args.tool_choice
            opts["tool_choice"] = (choice if choice in ("auto", "none", "required")
                                   else {"type": "function", "function": {"name": choice}})
        return opts


def _hint(command: str) -> str:
    close = close_matches(command, list(SUBCOMMANDS))
    return f" (did you mean {' or '.join(close)}?)" if close else ""
