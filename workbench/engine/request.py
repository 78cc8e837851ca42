"""A request's state as the model loop sees it.

The engine builds a request whole at submission (``Engine.submit``: prompt, options and
what the loop derives from them). From then on its state changes only through the
transition methods below, called where a request moves on: admission (placed, reused,
prefill started), results (KV advanced, tokens taken, finished), retire (sequence and
sampler released), and the steps that add to those (cache saves, scoring, speculation,
logprobs); every other module reads. The loop thread is the only caller of those methods
except ``cancel``, which any thread may call (observed at the next token boundary).
Readers on other threads only read plain attributes (phase, counts), never wait on the loop.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..cache import HitKind
from ..options import RequestOptions
from . import finished as _finished
from .events import RequestPhase, Done, Error, Event, FinishReason, Stats, Token, TokenId, TokenLogprob
from .text import ReplyText

_refs = itertools.count(1)


def next_ref() -> int:
    return next(_refs)


@dataclass(eq=False)
class Request:
    ref: int
    model_id: str
    prompt: list[int]
    opts: RequestOptions
    seed: int | None
    # its events in order; a token's TokenId and Token come as one tuple (emit_token)
    events: queue.SimpleQueue[Event | tuple[Event, ...]] = field(default_factory=queue.SimpleQueue)
    submitted_at: float = field(default_factory=time.perf_counter)
    phase: RequestPhase = "queued"
    seq: int | None = None
    sampler: Any = None
    feed: list[int] = field(default_factory=list)   # tokens not yet in the KV cache
    n_past: int = 0                  # tokens of this sequence in the KV cache
    generated: list[int] = field(default_factory=list)
    cancel_requested: bool = False
    text: ReplyText | None = None
    admitted_at: float | None = None
    prefill_started_at: float | None = None
    prefill_done_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)  # perf_counter() of each delivered token
    history: Any = None              # the engine's History (engine/history.py), set at submission
    prefilled: int = 0
    grammar: Any = None              # native Grammar prototype (from the engine's cache)
    reasoning_budget: dict[str, Any] | None = None  # token form of opts.reasoning_budget
    logit_bias: list[tuple[int, float]] = field(default_factory=list)  # opts.logit_bias by token id
    special: bool | frozenset[int] = False          # render_special: all, none, or these ids
    session: Any = None              # sessions.Session when session_id was given
    kv_tokens: list[int] = field(default_factory=list)  # live KV the sequence held at admission
    reused: int = 0                  # prompt tokens not prefilled (found in the KV / cache)
    continues: bool = False          # continue_session: the prompt extends the session's KV
    hit_kind: HitKind = HitKind.COLD
    boundaries: list[tuple[int, Any]] = field(default_factory=list)  # (position, SaveReason) ahead
    shared_end: int | None = None    # restored from a pinned (agent) prefix of this many tokens
    saved_by: str | None = None      # restored from the cache: the id of the model that saved it
    stored_upto: int = 0             # tokens of the longest row this request stored anew
    cold_upto: int = 0               # positions 0.. computed as a cold prefill computes them (cache_saves.py)
    prompt_key: str | None = None    # row of exactly the prompt, when cached
    finish_key: str | None = None
    sync_saves: bool = False         # prefill_only: rows are stored before the request ends
    spec: Any = None                 # speculation's drafter once a speculative request drafts
    draft_engine: Any = None         # speculative={'draft': id}: that model's Engine
    out_from: int | None = None      # every row from this position on gets logits (verify rows)
    verify_from: int | None = None   # a verify() request: its argmax from this position on
    argmax: list[int] = field(default_factory=list)  # a verify() request's argmax per row
    score: Any = None                # a scoring request's ScoreState (engine/scoring.py)
    # logprobs=: samples drawn but not yet in the reply (engine/logprobs.py), one per token taken
    pending_logprobs: collections.deque[Any] = field(default_factory=collections.deque)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    logprob_since_text: float | None = None  # summed over the tokens since the last Token event
    # a queued request waiting for another's prefill of its prefix (engine/live_share.py):
    # (that request's ref, the tokens it waits for, the perf_counter deadline); share_waited:
    # it waited once (never again)
    share_wait: tuple[int, int, float] | None = None
    share_waited: bool = False
    shared_from: str | None = None   # a shared hit: whose KV it copied ('request 12', 'session ...')
    finished: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.text = ReplyText(self.opts.stop_sequences)

    # --- transitions (module doc) ------------------------------------------------------
    def cancel(self) -> None:
        """Ask the loop to end the request at its next token boundary (any thread)."""
        self.cancel_requested = True

    def wait_for_share(self, src_ref: int, n_tokens: int, deadline: float) -> None:
        """Queued: wait until request ``src_ref`` holds ``n_tokens`` of its prefix (or until
        ``deadline``), then copy them (engine/live_share.py)."""
        self.share_wait = (src_ref, n_tokens, deadline)

    def share_wait_over(self) -> None:
        """It waits no more (and never again)."""
        self.share_wait, self.share_waited = None, True

    def place(self, seq: int, kv_tokens: list[int]) -> None:
        """Admission put the request on ``seq``, which holds ``kv_tokens`` (its session's KV)."""
        self.seq, self.kv_tokens = seq, kv_tokens

    def start_sampler(self, sampler: Any) -> None:
        self.sampler = sampler

    def reused_from(self, kind: HitKind, shared_end: int | None = None, key: str | None = None,
                    saved_by: str | None = None, shared_from: str | None = None) -> None:
        """Where the KV it starts from came from: ``kind``; a pinned prefix of ``shared_end``
        tokens; ``key``, the row of exactly its prompt, when that is what it restored;
        ``saved_by``, the model id recorded by the save that wrote a restored row;
        ``shared_from``, the live sequence a shared hit copied."""
        self.hit_kind, self.shared_end, self.saved_by = kind, shared_end, saved_by
        self.shared_from = shared_from
        if key is not None:
            self.prompt_key = key

    def start_prefill(self, reuse: int, cold_upto: int) -> None:
        """The sequence holds the first ``reuse`` prompt tokens (``cold_upto`` of them as a
        cold prefill computes them); the rest is fed."""
        self.kv_tokens = []
        self.n_past = self.reused = reuse
        self.cold_upto = cold_upto
        self.feed = self.prompt[reuse:]
        self.admitted_at = time.perf_counter()
        self.phase = "prefilling"

    def plan_saves(self, boundaries: list[tuple[int, Any]]) -> None:
        """The prefill stops at these save points (position, reason), in order."""
        self.boundaries = boundaries

    def advance(self, take: int, tiled: bool = False) -> None:
        """``take`` tokens of the feed are in the KV now (``tiled``: as prompt rows on the
        tiled kernel, extending the KV a cold prefill computes alike: cache_saves.py)."""
        if tiled and self.cold_upto == self.n_past:
            self.cold_upto += take
        self.n_past += take
        del self.feed[:take]
        if self.phase == "prefilling":
            self.prefilled += take

    def pop_boundary(self) -> tuple[int, Any]:
        """The next save point, reached."""
        return self.boundaries.pop(0)

    def stored(self, n_tokens: int) -> None:
        """A row of ``n_tokens`` was stored anew."""
        self.stored_upto = max(self.stored_upto, n_tokens)

    def prompt_row(self, key: str) -> None:
        """``key`` is the row of its prompt (all but the last token), saved at a save point."""
        self.prompt_key = key

    def prefill_starts(self, now: float) -> None:
        """Its first prompt rows go to llama_decode (a later chunk changes nothing)."""
        if self.prefill_started_at is None:
            self.prefill_started_at = now

    def prefill_done(self, now: float) -> None:
        self.prefill_done_at = now
        if self.phase == "prefilling":
            self.phase = "generating"

    def first_token(self, now: float) -> None:
        """A token was sampled (an end-of-generation one too): the time to first token."""
        if self.first_token_at is None:
            self.first_token_at = now

    def append_token(self, token: int, now: float) -> None:
        self.generated.append(token)
        self.last_token_at = now
        self.token_times.append(now)

    def next_input(self, token: int) -> None:
        """``token`` is fed next, alone (its KV is not in the sequence yet)."""
        self.feed, self.out_from = [token], None

    def accepted_upto(self, n_past: int) -> None:
        """Speculation: the KV holds ``n_past`` verified positions (the rest is trimmed)."""
        self.n_past = n_past

    def attach_draft(self, spec: Any, drafted: list[int]) -> None:
        """Speculation: ``drafted`` tokens follow the next input, verified in one step."""
        self.spec = spec
        self.feed.extend(drafted)
        self.out_from = self.n_past     # a plain step's one row comes back here too, timed

    def add_argmax(self, token: int) -> None:
        self.argmax.append(token)

    def queue_logprobs(self, sample: Any) -> None:
        self.pending_logprobs.append(sample)

    def next_logprobs(self) -> Any:
        return self.pending_logprobs.popleft()

    def close_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None

    def release_seq(self) -> int | None:
        """The sequence it held, released (None when it held none)."""
        seq, self.seq = self.seq, None
        return seq

    # --- events (loop thread) ----------------------------------------------------------
    def emit_token(self, token: int, piece: bytes, draft: bool = False, lp: TokenLogprob | None = None) -> None:
        """A token's events: its TokenId and, when it completes text, the Token, queued as
        one item (one wake-up of a waiting consumer per token; Stream hands them out one by
        one)."""
        if lp is None:
            ev = TokenId(token, draft)
        else:
            self.logprobs.append(lp)
            self.logprob_since_text = (self.logprob_since_text or 0.0) + lp.logprob
            ev = TokenId(token, draft, lp.logprob, lp.top)
        assert self.text is not None
        out = self.text.push(piece)
        self.events.put((ev, self._text_event(out)) if out else ev)

    def put_text(self, text: str) -> None:
        self.events.put(self._text_event(text))

    def _text_event(self, text: str) -> Token:
        tok = Token(text, self.logprob_since_text)
        self.logprob_since_text = None
        return tok

    def finish(self, reason: FinishReason, finish_key: str | None = None) -> Done:
        """The request ends with ``reason``; ``finish_key``: the row its Done names."""
        assert self.text is not None
        self.finish_key = finish_key
        tail = self.text.flush()
        if tail:
            self.put_text(tail)
        done = Done(
            reply=self.text.reply,
            tokens=tuple(self.generated),
            context_tokens=tuple(self.prompt) + tuple(self.generated),
            finish_reason=reason,
            stop_sequence=self.text.stop_hit,
            stats=self.stats(),
            finish_key=self.finish_key,
            logprobs=tuple(self.logprobs) if self.opts.logprobs is not None else None,
        )
        self.phase = "done"
        if self.history is not None:
            self.history.add(self, reason, done.stats, None)
        if _finished.listeners:  # before the caller can see its result: see engine/finished.py
            self._tell_listeners(reason, done.stats, None)
        self.events.put(done)
        self.finished.set()
        return done

    def fail(self, reason: BaseException) -> None:
        self.phase = "done"
        if self.history is not None or _finished.listeners:
            stats = self.stats()
            if self.history is not None:
                self.history.add(self, "error", stats, reason)
            if _finished.listeners:
                self._tell_listeners("error", stats, reason)
        self.events.put(Error(reason))
        self.finished.set()

    def _tell_listeners(self, reason: str, stats: Stats, error: BaseException | None) -> None:
        """The finished-request listeners hear of this request (a cancelled one with what it
        served so far, a failed one with its error); nothing here can keep the request's
        result from its caller."""
        try:
            record = _finished.FinishedRequest(
                ref=self.ref, model_id=self.model_id, prompt=tuple(self.prompt), generated=tuple(self.generated),
                kv_tokens=self.n_past, submitted_at=self.submitted_at, finished_at=time.perf_counter(),
                session_id=self.opts.session_id, cache_scope=self.opts.cache_scope, cache=self.opts.cache,
                finish_reason=reason, stats=stats, error=error)
        except Exception:  # noqa: BLE001 - the record is a courtesy; the result is not
            _finished.log.exception("could not describe request %s to the finished-request listeners", self.ref)
            return
        _finished.notify(record)

    def decode_s(self) -> float:
        """From the first token to the newest, on the engine's clock (when each was sampled)."""
        first, last = self.first_token_at, self.last_token_at
        return (last - first) if first and last else 0.0

    def decode_tps(self) -> float | None:
        """Tokens per second of decoding: (generated - 1) / decode_s, None before the second
        token. THE rate: the final Stats.decode_tps and the live request_info()['decode_tps']
        a notebook view shows while the request runs."""
        n_gen, decode_s = len(self.generated), self.decode_s()
        return (n_gen - 1) / decode_s if decode_s > 0 and n_gen > 1 else None

    def stats(self) -> Stats:
        now = time.perf_counter()
        prefill_s = (self.prefill_done_at or now) - (self.prefill_started_at or now)
        n_gen = len(self.generated)
        decode_s = self.decode_s()
        return Stats(
            prompt_tokens=len(self.prompt),
            generated_tokens=n_gen,
            prefilled_tokens=self.prefilled,
            ttft_s=(self.first_token_at - self.submitted_at) if self.first_token_at else None,
            prefill_s=prefill_s,
            prefill_tps=(self.prefilled / prefill_s) if prefill_s > 0 and self.prefilled else None,
            decode_s=decode_s,
            decode_tps=self.decode_tps(),
            total_s=now - self.submitted_at,
            queued_s=((self.admitted_at or now) - self.submitted_at),
            seed=self.seed,
            cache_hit_kind=self.hit_kind.value,
            cache_delta=self.cache_delta(),
            cache_saved_by=self.saved_by,
            speculative=self.spec.summary() if self.spec is not None else None,
        )

    def cache_delta(self) -> dict[str, int]:
        """In tokens: `read`, the prompt tokens whose KV was reused (restored from a row or
        kept from the session's live KV: prompt_tokens - prefilled_tokens); `created`, the
        tokens this request added to the cache beyond those (the longest row it stored)."""
        return {"read": self.reused, "created": max(0, self.stored_upto - self.reused)}

    @property
    def boundary(self) -> int | None:
        """The next position the prefill must stop at (a cache save point)."""
        return self.boundaries[0][0] if self.boundaries else None

    def info(self) -> dict[str, Any]:
        """A snapshot for request_info(); safe from any thread. The cache facts are known
        from admission on (None while queued): `cache_hit_kind`, `reused_tokens` (prompt
        tokens whose KV was restored or kept); `prefilled_tokens` grows chunk by chunk
        until reused + prefilled = prompt_tokens."""
        admitted = self.admitted_at is not None
        wait = self.share_wait   # read once: the loop thread may end the wait meanwhile
        return {
            "ref": self.ref,
            "model": self.model_id,
            "phase": self.phase,
            "seq": self.seq,
            "session_id": self.opts.session_id,
            "cache_hit_kind": self.hit_kind.value if admitted else None,
            "cache_saved_by": self.saved_by,
            "shared_from": self.shared_from,
            "waiting_for": f"request {wait[0]}" if wait is not None else None,
            "prompt_tokens": len(self.prompt),
            "reused_tokens": self.reused if admitted else None,
            "prefilled_tokens": self.prefilled,
            "generated_tokens": len(self.generated),
            "response_tokens": self.opts.response_tokens,
            "decode_tps": self.decode_tps(),
            "age_s": time.perf_counter() - self.submitted_at,
            "cancel_requested": self.cancel_requested,
        }
