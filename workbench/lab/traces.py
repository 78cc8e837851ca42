"""Seeded request traces for the eviction lab: chats, agents, RAG, plain objects.

A trace stores prompts as *segments*, not tokens, so a 100,000-request trace costs a few MB:

    segment   a run of tokens with an id and a length; its token ids are drawn from a
              generator seeded by (trace seed, segment id), so they are fixed but never
              stored. Different segments are different text (the lab relies on it).
    request   prompt = a tuple of segment ids, plus the segment of the reply the model
              gives (-1: none), an arrival time in seconds, a session id (-1: none) and
              how many leading segments form a shared prefix an agent would pin (0: none).

Prefix sharing is expressed by sharing segments: turn k of a chat is the previous turn's
prompt + its reply + a new user message; agent steps share the agent's system+tools
segment; RAG prompts share popular documents. `Trace.from_prompts` builds a trace from
plain token-id sequences instead (each token is then its own segment; segment id = token
id, `literal`), with optional replies.

Replies in a literal trace. A reply of several tokens cannot be one segment there (segment
id = token id), so a literal trace with replies keeps them in a ragged table instead
(`reply_ptr`, `reply_segs`: request i's reply is `reply_segs[reply_ptr[i]:reply_ptr[i+1]]`,
one segment a token, and `reply_seg` is -1 throughout). A later prompt that starts with an
earlier prompt + its reply then walks the same segments, which is what the lab matches on.
Every other trace has no table (None) and one reply segment or none (`reply_seg`).

Real workloads. `from_block_hashes` turns a trace of hashed prefix blocks (Mooncake's
format: per request a timestamp, input and output lengths and the ids of its prompt's
blocks of `block_size` tokens, equal ids standing for equal, reusable blocks) into a
Trace: one segment per (block id, block length), a fresh segment per reply. `mooncake(name)`
reads the two Mooncake FAST'25 traces shipped in `workbench/lab/data/` (see its README).

Files. `Trace.save(path)` / `load(path)` keep a trace exactly (every array, its name, seed,
token range, literal flag and params) in a NumPy .npz with a small JSON header (format
version 1), without pickle.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import InvalidOption

Range = tuple[int, int]
DEFAULT_TOKEN_RANGE: Range = (100, 32000)  # inside every common vocabulary, past the specials


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a trace, as a view (segment ids, not tokens). `reply` is the reply's
    segment (None: no reply, or a literal trace's reply, which is `reply_segments`);
    `reply_segments` are the reply's segments in every trace: (reply,) or (), a literal
    trace's reply token ids."""

    index: int
    prompt: tuple[int, ...]
    reply: int | None
    arrival_s: float
    session: int | None
    pin_segments: int
    prompt_tokens: int
    reply_tokens: int
    reply_segments: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class Trace:
    """A compact, immutable request trace (see the module doc).

    Arrays: `seg_len[s]` tokens in segment s; the prompt of request i is
    `prompt_segs[prompt_ptr[i]:prompt_ptr[i+1]]`; `reply_seg`, `arrival_s`, `session`,
    `pin_segs` have one entry per request. A literal trace with replies also has
    `reply_ptr` / `reply_segs` (request i's reply tokens: `reply_segs[reply_ptr[i]:reply_ptr[i+1]]`);
    every other trace has None there.
    """

    name: str
    seg_len: np.ndarray
    prompt_ptr: np.ndarray
    prompt_segs: np.ndarray
    reply_seg: np.ndarray
    arrival_s: np.ndarray
    session: np.ndarray
    pin_segs: np.ndarray
    seed: int = 0
    token_range: Range = DEFAULT_TOKEN_RANGE
    literal: bool = False  # segment s is the single token s (from_prompts)
    params: dict[str, Any] = field(default_factory=dict)
    reply_ptr: np.ndarray | None = None   # literal traces with replies only (see the module doc)
    reply_segs: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.reply_seg)
        if len(self.prompt_ptr) != n + 1 or any(len(a) != n for a in (self.arrival_s, self.session, self.pin_segs)):
            raise ValueError("trace arrays disagree on the number of requests")
        if n and np.any(np.diff(self.prompt_ptr) <= 0):
            raise ValueError("every request needs a non-empty prompt")
        if (self.reply_ptr is None) != (self.reply_segs is None):
            raise ValueError("reply_ptr and reply_segs come together")
        if self.reply_ptr is not None:
            assert self.reply_segs is not None
            if not self.literal or np.any(self.reply_seg >= 0):
                raise ValueError("a reply table belongs to a literal trace, whose reply_seg is -1 throughout")
            if (len(self.reply_ptr) != n + 1 or self.reply_ptr[0] != 0 or np.any(np.diff(self.reply_ptr) < 0)
                    or self.reply_ptr[-1] != len(self.reply_segs)):
                raise ValueError("reply_ptr must run from 0 to len(reply_segs), one step per request")

    # -- sizes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.reply_seg)

    @property
    def prompt_tokens(self) -> np.ndarray:
        """Prompt length of every request, in tokens."""
        if not len(self):
            return np.zeros(0, np.int64)
        lens = self.seg_len[self.prompt_segs].astype(np.int64)
        return np.add.reduceat(lens, self.prompt_ptr[:-1].astype(np.int64))

    @property
    def reply_tokens(self) -> np.ndarray:
        """Reply length of every request (0 where the trace has no reply)."""
        if self.reply_ptr is not None:
            return np.diff(self.reply_ptr).astype(np.int64)
        out = np.zeros(len(self), np.int64)
        has = self.reply_seg >= 0
        out[has] = self.seg_len[self.reply_seg[has]]
        return out

    # -- access ------------------------------------------------------------------------------
    def prompt(self, i: int) -> tuple[int, ...]:
        """Segment ids of request i's prompt."""
        return tuple(int(s) for s in self.prompt_segs[self.prompt_ptr[i]:self.prompt_ptr[i + 1]])

    def reply(self, i: int) -> tuple[int, ...]:
        """Segment ids of request i's reply: (its reply segment,) or (), in a literal trace
        its reply's token ids."""
        if self.reply_ptr is not None:
            assert self.reply_segs is not None
            return tuple(int(s) for s in self.reply_segs[self.reply_ptr[i]:self.reply_ptr[i + 1]])
        r = int(self.reply_seg[i])
        return () if r < 0 else (r,)

    def __getitem__(self, i: int) -> TraceRequest:
        if not -len(self) <= i < len(self):
            raise IndexError(f"request {i} out of range for a trace of {len(self)}")
        i %= len(self)
        segs = self.prompt(i)
        reply = int(self.reply_seg[i])
        sess = int(self.session[i])
        rsegs = self.reply(i)
        return TraceRequest(i, segs, None if reply < 0 else reply, float(self.arrival_s[i]),
                            None if sess < 0 else sess, int(self.pin_segs[i]),
                            int(sum(int(self.seg_len[s]) for s in segs)),
                            int(sum(int(self.seg_len[s]) for s in rsegs)), rsegs)

    def __iter__(self) -> Iterator[TraceRequest]:
        return (self[i] for i in range(len(self)))

    def segment_array(self, seg: int) -> np.ndarray:
        """The token ids of one segment as int32 (deterministic in the trace seed and the id)."""
        if self.literal:
            return np.asarray([seg], np.int32)
        lo, hi = self.token_range
        rng = np.random.default_rng([self.seed, int(seg)])
        return rng.integers(lo, hi, int(self.seg_len[seg])).astype(np.int32)

    def segment_tokens(self, seg: int) -> list[int]:
        """The token ids of one segment, as a list."""
        return [int(t) for t in self.segment_array(seg)]

    def segment_bytes(self, seg: int) -> bytes:
        """The token ids of one segment as int32 little-endian bytes (as the cache hashes them)."""
        return self.segment_array(seg).astype("<i4", copy=False).tobytes()

    def prompt_token_ids(self, i: int) -> list[int]:
        """Request i's prompt as token ids (what a real run sends to the model)."""
        out: list[int] = []
        for s in self.prompt(i):
            out.extend(self.segment_tokens(s))
        return out

    def reply_token_ids(self, i: int) -> list[int]:
        """Request i's reply as token ids ([] where it has none)."""
        out: list[int] = []
        for s in self.reply(i):
            out.extend(self.segment_tokens(s))
        return out

    def head(self, n: int) -> Trace:
        """The first n requests (segment table shared)."""
        n = max(0, min(n, len(self)))
        ptr = self.prompt_ptr[: n + 1]
        rptr = rsegs = None
        if self.reply_ptr is not None and self.reply_segs is not None:
            rptr = self.reply_ptr[: n + 1]
            rsegs = self.reply_segs[: rptr[-1]]
        return Trace(f"{self.name}[:{n}]", self.seg_len, ptr, self.prompt_segs[: ptr[-1]],
                     self.reply_seg[:n], self.arrival_s[:n], self.session[:n], self.pin_segs[:n],
                     self.seed, self.token_range, self.literal, dict(self.params), rptr, rsegs)

    def describe(self) -> dict[str, Any]:
        """Sizes at a glance: requests, tokens, distinct segments, duration."""
        p = self.prompt_tokens
        parts = [self.prompt_segs, self.reply_seg[self.reply_seg >= 0]]
        if self.reply_segs is not None:
            parts.append(self.reply_segs)
        used = np.unique(np.concatenate(parts))
        return {"name": self.name, "requests": len(self), "prompt_tokens": int(p.sum()),
                "mean_prompt_tokens": float(p.mean()) if len(p) else 0.0,
                "max_prompt_tokens": int(p.max()) if len(p) else 0,
                "distinct_segments": int(len(used)),
                "distinct_tokens": int(self.seg_len[used].sum()),
                "sessions": int(len(np.unique(self.session[self.session >= 0]))),
                "duration_s": float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0,
                **self.params}

    def __repr__(self) -> str:
        if self.literal:   # segment s is token s: count the tokens the trace uses
            used = [self.prompt_segs] if self.reply_segs is None else [self.prompt_segs, self.reply_segs]
            tokens = len(np.unique(np.concatenate(used)))
            return f"<Trace {self.name!r}: {len(self)} requests, {tokens} distinct tokens>"
        return f"<Trace {self.name!r}: {len(self)} requests, {len(self.seg_len)} segments>"

    # -- files -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trace to `path` exactly as it is (see `load`): a NumPy .npz (the name
        is kept as given) with a JSON header; written to a temporary file, then renamed."""
        save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """A trace written by `save` (the module's `load`)."""
        return load(path)

    # -- other constructors -------------------------------------------------------------------
    @classmethod
    def from_prompts(cls, prompts: Sequence[Sequence[int]], *, replies: Sequence[Sequence[int] | None] | None = None,
                     arrivals: Sequence[float] | None = None, sessions: Sequence[int | None] | None = None,
                     name: str = "prompts") -> Trace:
        """A trace from explicit token-id sequences: each token is its own segment (segment
        id = token id), arrivals default to 0, 1, 2, ... `replies` (optional, one per
        prompt: token ids, [] or None for none) are what the model answered, its last token
        included (the end-of-turn token, or the last one sampled): the lab saves prompt +
        reply without that last token at finish, as the engine does."""
        n = len(prompts)
        for key, given in (("replies", replies), ("arrivals", arrivals), ("sessions", sessions)):
            if given is not None and len(given) != n:
                raise InvalidOption(key, f"{len(given)} entries", f"one per prompt ({n})", where="from_prompts")
        b = _Builder(name, 0, literal=True)
        if replies is not None:
            b.reply_ptr = [0]
        for i, prompt in enumerate(prompts):
            toks = [int(t) for t in prompt]
            if not toks or min(toks) < 0:
                raise ValueError(f"prompt {i} must be a non-empty list of token ids >= 0")
            given = None if replies is None else replies[i]
            reply = [] if given is None else [int(t) for t in given]
            if reply and min(reply) < 0:
                raise InvalidOption(f"replies[{i}]", reply, "token ids >= 0", where="from_prompts")
            session = None if sessions is None else sessions[i]
            b.literal_request(toks, float(i) if arrivals is None else float(arrivals[i]),
                              -1 if session is None else int(session), reply)
        return b.build()


class _Builder:
    """Accumulates segments and requests, then freezes them into a Trace."""

    def __init__(self, name: str, seed: int, literal: bool = False, **params: Any) -> None:
        self.name, self.seed, self.literal, self.params = name, seed, literal, params
        self.seg_len: list[int] = []
        self.ptr: list[int] = [0]
        self.segs: list[int] = []
        self.reply: list[int] = []
        self.arrival: list[float] = []
        self.session: list[int] = []
        self.pin: list[int] = []
        self.reply_ptr: list[int] | None = None   # a literal trace's reply table (from_prompts)
        self.reply_segs: list[int] = []

    def segment(self, length: int) -> int:
        self.seg_len.append(max(1, int(length)))
        return len(self.seg_len) - 1

    def request(self, prompt: Sequence[int], reply: int, arrival: float, session: int = -1, pin: int = 0) -> None:
        self.segs.extend(prompt)
        self.ptr.append(len(self.segs))
        self.reply.append(reply)
        self.arrival.append(arrival)
        self.session.append(session)
        self.pin.append(pin)

    def literal_request(self, tokens: list[int], arrival: float, session: int, reply: Sequence[int] = ()) -> None:
        top = max(max(tokens), max(reply, default=-1))
        if top >= len(self.seg_len):
            self.seg_len.extend([1] * (top + 1 - len(self.seg_len)))
        if self.reply_ptr is not None:
            self.reply_segs.extend(reply)
            self.reply_ptr.append(len(self.reply_segs))
        self.request(tokens, -1, arrival, session)

    def build(self) -> Trace:
        table = (None, None) if self.reply_ptr is None else (np.asarray(self.reply_ptr, np.int64),
                                                             np.asarray(self.reply_segs, np.int32))
        return Trace(self.name, np.asarray(self.seg_len, np.int32), np.asarray(self.ptr, np.int64),
                     np.asarray(self.segs, np.int32), np.asarray(self.reply, np.int32),
                     np.asarray(self.arrival, np.float64), np.asarray(self.session, np.int32),
                     np.asarray(self.pin, np.int32), self.seed, DEFAULT_TOKEN_RANGE, self.literal,
                     self.params, *table)


def _draw(rng: random.Random, r: Range | int) -> int:
    if isinstance(r, int):
        return r
    lo, hi = r
    return rng.randint(lo, hi)


def _zipf_weights(n: int, alpha: float, rng: random.Random) -> list[float]:
    """Popularity 1/rank^alpha with ranks shuffled, so popularity is unrelated to the id."""
    ranks = list(range(n))
    rng.shuffle(ranks)
    return [1.0 / (r + 1) ** alpha for r in ranks]


class _Clock:
    """Poisson arrivals at `rate_per_s`."""

    def __init__(self, rng: random.Random, rate_per_s: float) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        self.rng, self.rate, self.t = rng, rate_per_s, 0.0

    def next(self) -> float:
        self.t += self.rng.expovariate(self.rate)
        return self.t


# --- workloads --------------------------------------------------------------------------------

def multi_turn_chats(n_requests: int, *, seed: int = 0, concurrency: int = 32, system_prompts: int = 4,
                     system_tokens: Range = (200, 800), turns: Range = (1, 12), user_tokens: Range = (10, 200),
                     reply_tokens: Range = (30, 400), max_context: int = 8192,
                     rate_per_s: float = 2.0) -> Trace:
    """Interleaved conversations: turn k's prompt is turn k-1's prompt + its reply + a user
    message. `concurrency` conversations are open at once (one is picked at random per
    request); a conversation ends after its drawn number of turns or before it would pass
    `max_context`. System prompts are shared across conversations, popularity Zipf(1)."""
    rng = random.Random(seed)
    clock = _Clock(rng, rate_per_s)
    b = _Builder("chats", seed, concurrency=concurrency, system_prompts=system_prompts)
    systems = [b.segment(_draw(rng, system_tokens)) for _ in range(system_prompts)]
    sys_weights = _zipf_weights(system_prompts, 1.0, rng)
    next_session = 0

    def new_chat() -> list[Any]:
        nonlocal next_session
        next_session += 1
        sys_seg = rng.choices(systems, sys_weights)[0]
        return [next_session - 1, [sys_seg], b.seg_len[sys_seg], _draw(rng, turns)]

    open_chats = [new_chat() for _ in range(max(1, concurrency))]
    for _ in range(n_requests):
        slot = rng.randrange(len(open_chats))
        sid, segs, ctx_len, left = open_chats[slot]
        user = b.segment(_draw(rng, user_tokens))
        reply = b.segment(_draw(rng, reply_tokens))
        prompt = segs + [user]
        b.request(prompt, reply, clock.next(), sid)
        ctx_len += b.seg_len[user] + b.seg_len[reply]
        left -= 1
        if left <= 0 or ctx_len + user_tokens[1] + reply_tokens[1] > max_context:
            open_chats[slot] = new_chat()
        else:
            open_chats[slot] = [sid, prompt + [reply], ctx_len, left]
    return b.build()


def agent_tasks(n_requests: int, *, seed: int = 0, agents: int = 4, agent_alpha: float = 1.0,
                prefix_tokens: Range = (1500, 4000), task_tokens: Range = (30, 300), steps: Range = (1, 8),
                action_tokens: Range = (20, 150), observation_tokens: Range = (50, 800),
                concurrency: int = 16, max_context: int = 16384, rate_per_s: float = 4.0) -> Trace:
    """Agents sharing a long system+tools prefix: each task is the agent's prefix + a task
    description, and each step appends the model's action (the reply) and the tool's
    observation. Agents are drawn Zipf(`agent_alpha`); the prefix is marked for pinning."""
    rng = random.Random(seed)
    clock = _Clock(rng, rate_per_s)
    b = _Builder("agents", seed, agents=agents, concurrency=concurrency)
    prefixes = [b.segment(_draw(rng, prefix_tokens)) for _ in range(agents)]
    weights = _zipf_weights(agents, agent_alpha, rng)
    next_task = 0

    def new_task() -> list[Any]:
        nonlocal next_task
        next_task += 1
        prefix = rng.choices(prefixes, weights)[0]
        task = b.segment(_draw(rng, task_tokens))
        return [next_task - 1, [prefix, task], b.seg_len[prefix] + b.seg_len[task], _draw(rng, steps)]

    open_tasks = [new_task() for _ in range(max(1, concurrency))]
    for _ in range(n_requests):
        slot = rng.randrange(len(open_tasks))
        sid, segs, ctx_len, left = open_tasks[slot]
        action = b.segment(_draw(rng, action_tokens))
        b.request(list(segs), action, clock.next(), sid, pin=1)
        obs = b.segment(_draw(rng, observation_tokens))
        ctx_len += b.seg_len[action] + b.seg_len[obs]
        left -= 1
        if left <= 0 or ctx_len + action_tokens[1] + observation_tokens[1] > max_context:
            open_tasks[slot] = new_task()
        else:
            open_tasks[slot] = [sid, segs + [action, obs], ctx_len, left]
    return b.build()


def rag_queries(n_requests: int, *, seed: int = 0, documents: int = 2000, zipf_alpha: float = 1.0,
                doc_tokens: Range = (200, 1000), docs_per_query: int = 3, system_tokens: Range | int = 150,
                query_tokens: Range = (10, 80), reply_tokens: Range = (50, 300),
                rate_per_s: float = 4.0) -> Trace:
    """Retrieval-augmented prompts: system + `docs_per_query` distinct documents drawn
    Zipf(`zipf_alpha`) in retrieval order + the question. Prompts share a prefix as far as
    their leading documents agree (the most popular document first is common)."""
    if docs_per_query > documents:
        raise ValueError(f"docs_per_query ({docs_per_query}) > documents ({documents})")
    rng = random.Random(seed)
    clock = _Clock(rng, rate_per_s)
    b = _Builder("rag", seed, documents=documents, zipf_alpha=zipf_alpha, docs_per_query=docs_per_query)
    system = b.segment(_draw(rng, system_tokens))
    docs = [b.segment(_draw(rng, doc_tokens)) for _ in range(documents)]
    weights = _zipf_weights(documents, zipf_alpha, rng)
    for _ in range(n_requests):
        chosen: list[int] = []
        while len(chosen) < docs_per_query:
            for d in rng.choices(docs, weights, k=docs_per_query):
                if d not in chosen and len(chosen) < docs_per_query:
                    chosen.append(d)
        query = b.segment(_draw(rng, query_tokens))
        b.request([system, *chosen, query], b.segment(_draw(rng, reply_tokens)), clock.next())
    return b.build()


def object_trace(objects: Sequence[int], size_of: Callable[[int], int] | int = 1, *, name: str = "objects") -> Trace:
    """One single-segment request per entry of `objects` (object id -> the same segment),
    no reply, arrivals 0, 1, 2, ...: a plain cache trace, as libCacheSim replays them."""
    b = _Builder(name, 0)
    seg_of: dict[int, int] = {}
    for t, obj in enumerate(objects):
        seg = seg_of.get(obj)
        if seg is None:
            seg = seg_of[obj] = b.segment(size_of(obj) if callable(size_of) else size_of)
        b.request((seg,), -1, float(t))
    return b.build()


def zipf_objects(n_requests: int, n_objects: int, alpha: float = 1.0, seed: int = 0) -> list[int]:
    """Object ids drawn Zipf(alpha) (for `object_trace`)."""
    rng = random.Random(seed)
    ids = list(range(n_objects))
    rng.shuffle(ids)
    weights = [1.0 / (rank + 1) ** alpha for rank in range(n_objects)]
    return rng.choices(ids, weights=weights, k=n_requests)


def merge(*traces: Trace, name: str | None = None) -> Trace:
    """Interleave traces by arrival time. Segment and session ids are renumbered, and token
    ids are drawn with the first trace's seed: the prefix structure is kept, the exact token
    ids of the parts are not."""
    if not traces:
        raise ValueError("merge needs at least one trace")
    if any(t.literal for t in traces):
        raise ValueError("merge: token-literal traces (from_prompts) cannot be renumbered")
    seg_base = np.cumsum([0] + [len(t.seg_len) for t in traces])
    sess_base = np.cumsum([0] + [int(t.session.max(initial=-1)) + 1 for t in traces])
    order = np.argsort(np.concatenate([t.arrival_s for t in traces]), kind="stable")
    src = np.concatenate([np.full(len(t), k) for k, t in enumerate(traces)]).astype(np.int64)
    idx = np.concatenate([np.arange(len(t)) for t in traces]).astype(np.int64)
    b = _Builder(name or "+".join(t.name for t in traces), traces[0].seed)
    b.seg_len = np.concatenate([t.seg_len for t in traces]).tolist()
    for j in order:
        t, i, base = traces[src[j]], int(idx[j]), int(seg_base[src[j]])
        r = int(t.reply_seg[i])
        s = int(t.session[i])
        b.request([s_ + base for s_ in t.prompt(i)], r + base if r >= 0 else -1, float(t.arrival_s[i]),
                  s + int(sess_base[src[j]]) if s >= 0 else -1, int(t.pin_segs[i]))
    return b.build()


# --- real workloads: traces of hashed prefix blocks ------------------------------------------

BLOCK_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE = {"conversation": "mooncake_conversation_trace.jsonl.gz",
            "synthetic": "mooncake_synthetic_trace.jsonl.gz"}


def from_block_hashes(requests: Iterable[Mapping[str, Any]] | str | os.PathLike[str], *, block_size: int = 512,
                      name: str | None = None, seed: int = 0, time_unit_s: float = 1e-3) -> Trace:
    """A trace from requests given as hashed prefix blocks (Mooncake's format): an iterable
    of dicts, or the path of a .jsonl / .jsonl.gz file of them (one JSON object a line;
    blank lines are skipped). Each request has

        timestamp       its arrival, in units of `time_unit_s` seconds (default 0.001: the
                        milliseconds of Mooncake's traces), not decreasing from one request
                        to the next (the lab replays them in order)
        input_length    prompt tokens, >= 1
        output_length   reply tokens, >= 0 (0: no reply)
        hash_ids        the ids of the prompt's blocks of `block_size` tokens, in order: the
                        last block holds input_length - block_size * (len - 1) tokens, which
                        must be 1..block_size; equal ids = equal blocks (a reusable prefix)

    Each (hash id, block length) is one segment, so requests sharing ids share segments;
    an id seen with two lengths (as a full block and as a shorter last one, or as last
    blocks of different lengths) becomes two segments, counted in params' split_hash_ids.
    Each reply is a fresh segment of output_length tokens. Other keys are ignored. A
    malformed request raises `InvalidOption` naming the request (its index, or the file
    and line), the field, the value and what was expected; none is dropped."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise InvalidOption("block_size", block_size, "an int >= 1", where="from_block_hashes")
    if isinstance(time_unit_s, bool) or not isinstance(time_unit_s, (int, float)) or not time_unit_s > 0:
        raise InvalidOption("time_unit_s", time_unit_s, "seconds per timestamp unit, > 0", where="from_block_hashes")
    if isinstance(requests, (str, os.PathLike)):
        path = Path(requests)
        source = path.name
        records: Iterable[tuple[str, Any]] = _jsonl_records(path)
        name = name or path.name.split(".")[0]
    else:
        source = "requests"
        records = ((f"request {i}", rec) for i, rec in enumerate(requests))
        name = name or "block_hashes"
    b = _Builder(name, seed, block_size=block_size, source=source)
    seg_of: dict[tuple[int, int], int] = {}   # (hash id, block length) -> segment
    length_of: dict[int, int] = {}            # hash id -> the first length it was seen with
    split: set[int] = set()
    last_ts = -math.inf
    for where, rec in records:
        ts, n_in, n_out, ids = _block_request(where, rec, block_size, last_ts)
        last_ts = ts
        prompt = []
        for k, h in enumerate(ids):
            n = block_size if k + 1 < len(ids) else n_in - block_size * k
            seg = seg_of.get((h, n))
            if seg is None:
                seg = seg_of[(h, n)] = b.segment(n)
                if length_of.setdefault(h, n) != n:
                    split.add(h)
            prompt.append(seg)
        b.request(prompt, b.segment(n_out) if n_out else -1, ts * time_unit_s)
    b.params.update(distinct_hash_ids=len(length_of), split_hash_ids=len(split), time_unit_s=time_unit_s)
    return b.build()


def mooncake(name: str = "conversation") -> Trace:
    """One of the Mooncake FAST'25 traces shipped with the workbench ('conversation': an
    hour of 12,031 conversation requests; 'synthetic': 3,993 requests built from public
    datasets, Poisson arrivals), through `from_block_hashes` (blocks of 512 tokens,
    timestamps in ms). Source, commit and license: workbench/lab/data/README.md."""
    if name not in MOONCAKE:
        raise InvalidOption("name", name, f"one of {', '.join(repr(k) for k in MOONCAKE)}", where="mooncake trace")
    ref = resources.files("workbench.lab") / "data" / MOONCAKE[name]
    with resources.as_file(ref) as path:
        trace = from_block_hashes(path, block_size=512, name=f"mooncake-{name}")
    trace.params["source"] = f"kvcache-ai/Mooncake FAST25-release/traces/{name}_trace.jsonl"
    return trace


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, parsed object) for each non-blank line of a .jsonl or .jsonl.gz file."""
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    line_no = 0
    with (gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")) as f:
        try:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path.name} line {line_no}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    text = line.strip()
                    raise InvalidOption("line", text if len(text) <= 80 else text[:77] + "...",
                                        f"one JSON object a line ({e.msg}, column {e.colno})", where=where) from None
                yield where, rec
        except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
            raise InvalidOption("file", str(path), f"a readable UTF-8 .jsonl or .jsonl.gz file ({e})",
                                where=f"{path.name} line {line_no + 1}") from None


def _block_request(where: str, rec: Any, block_size: int, last_ts: float) -> tuple[float, int, int, list[int]]:
    """One request's fields, validated: (timestamp, input_length, output_length, hash_ids)."""
    if not isinstance(rec, Mapping):
        raise InvalidOption("request", rec, f"an object with {', '.join(BLOCK_FIELDS)}", where=where)
    for key in BLOCK_FIELDS:
        if key not in rec:
            err = InvalidOption(key, None, "", where=where)
            err.args = (f"{where}: no {key!r} field; a request needs {', '.join(BLOCK_FIELDS)}",)
            raise err
    ts = rec["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise InvalidOption("timestamp", ts, "a finite number >= 0", where=where)
    if ts < last_ts:
        raise InvalidOption("timestamp", ts, f">= the previous request's ({last_ts:g}): requests in arrival order",
                            where=where)
    n_in = _count(where, rec, "input_length", 1)
    n_out = _count(where, rec, "output_length", 0)
    ids = rec["hash_ids"]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(h, (int, np.integer)) and not isinstance(h, bool)
                                                     for h in ids):
        raise InvalidOption("hash_ids", ids, "a list of int block ids", where=where)
    want = -(-n_in // block_size)
    if len(ids) != want:
        last = f", a last block of {n_in - block_size * (len(ids) - 1)} tokens" if ids else ""
        err = InvalidOption("hash_ids", ids, "", where=where)
        err.args = (f"{where} 'hash_ids': got {len(ids)} block ids for input_length {n_in}{last}; expected "
                    f"{want} (blocks of {block_size} tokens, the last one 1..{block_size})",)
        raise err
    return ts, n_in, n_out, [int(h) for h in ids]


def _count(where: str, rec: Mapping[str, Any], key: str, lo: int) -> int:
    value = rec[key]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise InvalidOption(key, value, f"an int >= {lo}", where=where)
    return int(value)


# --- files ------------------------------------------------------------------------------------

TRACE_FORMAT, TRACE_VERSION = "workbench-lab-trace", 1
_ARRAYS = ("seg_len", "prompt_ptr", "prompt_segs", "reply_seg", "arrival_s", "session", "pin_segs")


def save(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write `trace` to `path` (`Trace.save`): its arrays in a NumPy .npz, beside a JSON
    header (format, version, name, seed, token_range, literal, params), no pickle."""
    header = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "name": trace.name, "seed": trace.seed,
              "token_range": list(trace.token_range), "literal": trace.literal, "params": trace.params}
    try:
        text = json.dumps(header, default=_json_scalar)
    except (TypeError, ValueError) as e:
        raise InvalidOption("params", trace.params, f"JSON-serialisable values ({e})", where="Trace.save") from None
    arrays = {k: getattr(trace, k) for k in _ARRAYS}
    if trace.reply_ptr is not None:
        arrays.update(reply_ptr=trace.reply_ptr, reply_segs=trace.reply_segs)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, header=np.frombuffer(text.encode(), np.uint8), **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load(path: str | os.PathLike[str]) -> Trace:
    """The trace `save` wrote to `path`, exactly. A file that is not one (or truncated, or
    of another format version) raises `InvalidOption`; a missing file FileNotFoundError."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise _not_a_trace(path, "not a NumPy .npz archive")
        f.seek(0)
        try:
            with np.load(f, allow_pickle=False) as z:
                header = _header(z)
                if header.get("version") != TRACE_VERSION:
                    raise _not_a_trace(path, f"format version {header.get('version')!r}; this workbench reads "
                                             f"version {TRACE_VERSION}")
                names = [*_ARRAYS, *(("reply_ptr", "reply_segs") if "reply_ptr" in z.files else ())]
                arrays = {k: z[k] for k in names}
        except InvalidOption:
            raise
        except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile, zlib.error) as e:
            why = f"{type(e).__name__}: {e}" if "pickle" not in str(e) else "it holds pickled data (a trace never does)"
            raise _not_a_trace(path, why) from None
    return _checked(path, header, arrays)


def _header(z: Any) -> dict[str, Any]:
    if not hasattr(z, "files") or "header" not in z.files:
        raise KeyError("no trace header")
    header = json.loads(z["header"].tobytes().decode())
    if not isinstance(header, dict) or header.get("format") != TRACE_FORMAT:
        raise ValueError(f"the header names no {TRACE_FORMAT!r} format")
    return header


def _checked(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Trace:
    """The Trace the file describes, its arrays checked (shapes, kinds, segment ids in range)."""
    for k, a in arrays.items():
        if a.ndim != 1 or a.dtype.kind not in ("f" if k == "arrival_s" else "iu"):
            raise _not_a_trace(path, f"array {k!r} of shape {a.shape} and dtype {a.dtype}")
    n_segs = len(arrays["seg_len"])
    for k in ("prompt_segs", "reply_segs"):
        if k in arrays and len(arrays[k]) and not 0 <= arrays[k].min() <= arrays[k].max() < n_segs:
            raise _not_a_trace(path, f"{k} names segments outside 0..{n_segs - 1}")
    if len(arrays["reply_seg"]) and arrays["reply_seg"].max() >= n_segs:
        raise _not_a_trace(path, f"reply_seg names segments past {n_segs - 1}")
    try:
        lo, hi = (int(v) for v in header["token_range"])
        return Trace(str(header["name"]), **arrays, seed=int(header["seed"]), token_range=(lo, hi),
                     literal=bool(header["literal"]), params=dict(header["params"]))
    except (KeyError, TypeError, ValueError) as e:
        raise _not_a_trace(path, str(e)) from None


def _not_a_trace(path: Path, why: str) -> InvalidOption:
    return InvalidOption("path", str(path), f"a trace written by Trace.save ({why})", where="trace file")


def _json_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")
