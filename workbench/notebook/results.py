"""What a notebook generation leaves behind: a `Result` with rich reprs, and the few
formatting helpers the widget, the plain-text view and the repr share (so all three say
the same thing)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from workbench.cache.types import stored_model_id
from workbench.chat import ChatResult
from workbench.engine.events import CompletionResult, Stats

HIT_COLOURS = {"cold": "#6c757d", "partial": "#fd7e14", "exact": "#198754", "sticky": "#0d6efd",
               "continuation": "#6f42c1", "shared": "#20c997"}
STATE_COLOURS = {"running": "#0d6efd", "done": "#198754", "cancelled": "#fd7e14", "error": "#dc3545"}
UNKNOWN_COLOUR = "#adb5bd"


def finish_words(finish_reason: str | None, stop_sequence: str | None = None) -> str:
    """Why a generation ended, in words: 'end of turn' (the model's end-of-generation
    token), "stopped at stop sequence ','", 'max tokens reached', 'cancelled', 'error'."""
    if finish_reason == "stop":
        return f"stopped at stop sequence {stop_sequence!r}" if stop_sequence else "end of turn"
    return {"length": "max tokens reached"}.get(finish_reason or "", finish_reason or "")


def ended_at_once(stats: Stats | None, finish_reason: str | None, stop_sequence: str | None,
                  chat: bool = False) -> str | None:
    """Why a reply is empty, when the model ended its turn before any token: the first token
    it sampled was its end-of-generation token (the engine stops there and keeps none of
    it). A completion's prompt (no chat template) is the usual cause with a chat model,
    which then says nothing; None when the reply did not end that way."""
    if finish_reason != "stop" or stop_sequence or stats is None or stats.generated_tokens:
        return None
    why = "the model ended its turn at once (its first token was end-of-generation)"
    if chat:
        return why
    return f"{why}; a chat model usually needs its chat template: try %%chat (or workbench.chat)"


def saved_by_words(stats: Stats | None, model: str | None) -> str | None:
    """"saved by model 'a'" when the KV a hit restored was saved by another model id than
    ``model`` (the one that ran the request): models loaded from the same file with the same
    KV settings share rows, so a "fresh" model id can start warm; None otherwise."""
    saved_by = None if stats is None else stats.cache_saved_by
    if saved_by is None or (model is not None and saved_by == stored_model_id(model)):
        return None
    return f"saved by model {saved_by!r}" if saved_by else "saved by a model the row does not name"


def stats_line(stats: Stats | None, finish_reason: str | None = None, stop_sequence: str | None = None,
               chat: bool = False, model: str | None = None) -> str:
    """'ttft 41 ms · 88.2 tok/s · 12 prompt (3 prefilled) + 32 generated · cache: 9 tokens
    read, 34 stored · end of turn' (parts without data are left out; cache counts are
    tokens; the reason the generation ended in words, see finish_words; a reply the model
    ended before its first token says so instead, see ended_at_once: `chat`, whether the
    request was a chat turn; tokens read from a row another model id saved say so, see
    saved_by_words: `model`, the request's model id)."""
    parts: list[str] = []
    if stats is not None:
        if stats.ttft_s is not None:
            parts.append(f"ttft {stats.ttft_s * 1000:.0f} ms")
        if stats.decode_tps is not None:
            parts.append(f"{stats.decode_tps:.1f} tok/s")
        parts.append(f"{stats.prompt_tokens:,} prompt ({stats.prefilled_tokens:,} prefilled) + "
                     f"{stats.generated_tokens:,} generated")  # counts as the tables show them
        delta = stats.cache_delta or {}
        origin = saved_by_words(stats, model)
        read = f"{delta.get('read', 0):,} tokens read" + (f" ({origin})" if origin else "")
        parts.append(f"cache: {read}, {delta.get('created', 0):,} stored")
        spec = getattr(stats, "speculative", None)
        if spec:
            parts.append(f"speculative {spec.get('kind', '')}: {spec.get('accepted', 0)} of "
                         f"{spec.get('drafted', 0)} drafted tokens accepted")
    at_once = ended_at_once(stats, finish_reason, stop_sequence, chat)
    if at_once is not None:
        parts.append(at_once)
    elif finish_reason:
        parts.append(finish_words(finish_reason, stop_sequence))
    return " · ".join(parts)


def badge_html(kind: str | None) -> str:
    """A coloured pill naming the cache hit kind (cold / partial / exact / sticky)."""
    label = kind or "…"
    colour = HIT_COLOURS.get(label, UNKNOWN_COLOUR)
    return (f'<span class="wb-badge wb-hit-{html.escape(label)}" style="background:{colour};color:white;'
            f'border-radius:0.8em;padding:0 0.6em;font-size:85%;font-family:sans-serif">{html.escape(label)}</span>')


def muted_html(text: str) -> str:
    """Secondary text (stats, hints, progress) in the views' grey."""
    return f'<span style="color:#6c757d;font-size:85%">{html.escape(text)}</span>'


DRAFT_COLOUR = "#d1e7dd"  # the background of reply text that came from accepted draft tokens


def prob_span(text: str, prob: float | None) -> str:
    """A piece of reply text on a background as red as the piece was unlikely (logprobs=;
    its probability in the tooltip); plain text when its probability is not known."""
    if prob is None:
        return html.escape(text)
    return (f'<span class="wb-prob" title="p={prob:.3f}" style="background:rgba(220,53,69,{0.6 * (1 - prob):.2f})">'
            f'{html.escape(text)}</span>')


def reply_html(text: str, *, error: bool = False, segments: list[tuple[str, bool]] | None = None,
               probs: list[tuple[str, float | None]] | None = None) -> str:
    """The reply in a <pre>; with `segments` ((text, drafted) pairs that join to `text`),
    text from accepted draft tokens (speculative decoding) on a green background; with
    `probs` ((text, probability) pairs that join to `text`), each piece coloured by its
    probability instead."""
    border = STATE_COLOURS["error"] if error else "#dee2e6"
    if probs and "".join(t for t, _ in probs) == text:
        body = "".join(prob_span(t, p) for t, p in probs)
    elif segments and "".join(t for t, _ in segments) == text:
        body = "".join(f'<span class="wb-draft" style="background:{DRAFT_COLOUR}">{html.escape(t)}</span>'
                       if drafted else html.escape(t) for t, drafted in segments)
    else:
        body = html.escape(text)
    return (f'<pre class="wb-reply" style="white-space:pre-wrap;word-break:break-word;margin:0.3em 0;'
            f'padding:0.4em 0.6em;border-left:3px solid {border}">{body}</pre>')


def state_html(state: str) -> str:
    colour = STATE_COLOURS.get(state, UNKNOWN_COLOUR)
    name = html.escape(state)
    return f'<span class="wb-state wb-state-{name}" style="color:{colour};font-weight:600">{name}</span>'


@dataclass(frozen=True, eq=False)
class Result:
    """A finished (or cancelled, or failed) notebook generation.

    Attributes not defined here (tokens, context_tokens, stop_sequence, ...) are read from
    the wrapped CompletionResult (`raw`), None when the request failed before finishing.
    """

    reply: str
    raw: CompletionResult | None = None
    thinking: str = ""
    error: BaseException | None = None
    model: str | None = None
    ref: int | None = None

    @classmethod
    def of(cls, result: CompletionResult, thinking: str = "") -> Result:
        """Wrap a CompletionResult (a chat turn's ChatResult shows its parsed content)."""
        content = getattr(result, "content", None)
        reply = content if isinstance(content, str) and content else result.reply
        return cls(reply, result, thinking or getattr(result, "thinking", "") or "", None, result.model, result.ref)

    @property
    def stats(self) -> Stats | None:
        return None if self.raw is None else self.raw.stats

    @property
    def finish_reason(self) -> str:
        if self.error is not None:
            return "error"
        return "unknown" if self.raw is None else self.raw.finish_reason

    @property
    def cache_hit_kind(self) -> str | None:
        return None if self.raw is None else self.raw.stats.cache_hit_kind

    @property
    def cancelled(self) -> bool:
        return self.finish_reason == "cancelled"

    @property
    def ok(self) -> bool:
        return self.error is None

    def __getattr__(self, name: str) -> Any:
        raw = object.__getattribute__(self, "raw")
        if raw is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(raw, name)

    def __str__(self) -> str:
        return self.reply

    # -- reprs ---------------------------------------------------------------------------------
    def summary(self) -> str:
        """The stats line, or the error."""
        if self.error is not None:
            return f"error: {type(self.error).__name__}: {self.error}"
        return stats_line(self.stats, self.finish_reason, None if self.raw is None else self.raw.stop_sequence,
                          chat=isinstance(self.raw, ChatResult), model=self.model)

    def __repr__(self) -> str:
        preview = self.reply if len(self.reply) <= 60 else self.reply[:57] + "..."
        return (f"<Result model={self.model!r} ref={self.ref} finish={self.finish_reason} "
                f"hit={self.cache_hit_kind} reply={preview!r}>")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        if cycle:
            p.text("Result(...)")
            return
        p.text(self.as_text())

    def as_text(self) -> str:
        lines = []
        if self.thinking:
            lines.append(f"[thinking] {self.thinking.strip()}")
        lines.append(self.reply)
        lines.append(f"[{self.cache_hit_kind or '-'}] {self.summary()}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        state = "error" if self.error is not None else "cancelled" if self.cancelled else "done"
        think = ""
        if self.thinking:
            think = (f"<details><summary>thinking</summary>{reply_html(self.thinking)}</details>")
        return (f'<div class="wb-result">{badge_html(self.cache_hit_kind)} {state_html(state)} '
                f'<span style="color:#6c757d;font-size:85%">{html.escape(self.model or "")}'
                f'{"" if self.ref is None else f" #{self.ref}"}</span>{think}'
                f"{reply_html(self.reply, error=self.error is not None)}"
                f'<div class="wb-stats" style="color:#6c757d;font-size:85%">{html.escape(self.summary())}</div></div>')
