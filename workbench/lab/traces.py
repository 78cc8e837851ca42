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
plain token-id sequences instead (each token is then its own segment).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Range = tuple[int, int]
DEFAULT_TOKEN_RANGE: Range = (100, 32000)  # inside every common vocabulary, past the specials


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a trace, as a view (segment ids, not tokens)."""

    index: int
    prompt: tuple[int, ...]
    reply: int | None
    arrival_s: float
    session: int | None
    pin_segments: int
    prompt_tokens: int
    reply_tokens: int


@dataclass(frozen=True, eq=False)
class Trace:
    """A compact, immutable request trace (see the module doc).

    Arrays: `seg_len[s]` tokens in segment s; the prompt of request i is
    `prompt_segs[prompt_ptr[i]:prompt_ptr[i+1]]`; `reply_seg`, `arrival_s`, `session`,
    `pin_segs` have one entry per request.
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

    def __post_init__(self) -> None:
        n = len(self.reply_seg)
        if len(self.prompt_ptr) != n + 1 or any(len(a) != n for a in (self.arrival_s, self.session, self.pin_segs)):
            raise ValueError("trace arrays disagree on the number of requests")
        if n and np.any(np.diff(self.prompt_ptr) <= 0):
            raise ValueError("every request needs a non-empty prompt")

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
        out = np.zeros(len(self), np.int64)
        has = self.reply_seg >= 0
        out[has] = self.seg_len[self.reply_seg[has]]
        return out

    # -- access ------------------------------------------------------------------------------
    def prompt(self, i: int) -> tuple[int, ...]:
        """Segment ids of request i's prompt."""
        return tuple(int(s) for s in self.prompt_segs[self.prompt_ptr[i]:self.prompt_ptr[i + 1]])

    def __getitem__(self, i: int) -> TraceRequest:
        if not -len(self) <= i < len(self):
            raise IndexError(f"request {i} out of range for a trace of {len(self)}")
        i %= len(self)
        segs = self.prompt(i)
        reply = int(self.reply_seg[i])
        sess = int(self.session[i])
        return TraceRequest(i, segs, None if reply < 0 else reply, float(self.arrival_s[i]),
                            None if sess < 0 else sess, int(self.pin_segs[i]),
                            int(sum(int(self.seg_len[s]) for s in segs)),
                            0 if reply < 0 else int(self.seg_len[reply]))

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

    def head(self, n: int) -> Trace:
        """The first n requests (segment table shared)."""
        n = max(0, min(n, len(self)))
        ptr = self.prompt_ptr[: n + 1]
        return Trace(f"{self.name}[:{n}]", self.seg_len, ptr, self.prompt_segs[: ptr[-1]],
                     self.reply_seg[:n], self.arrival_s[:n], self.session[:n], self.pin_segs[:n],
                     self.seed, self.token_range, self.literal, dict(self.params))

    def describe(self) -> dict[str, Any]:
        """Sizes at a glance: requests, tokens, distinct segments, duration."""
        p = self.prompt_tokens
        used = np.unique(np.concatenate([self.prompt_segs, self.reply_seg[self.reply_seg >= 0]]))
        return {"name": self.name, "requests": len(self), "prompt_tokens": int(p.sum()),
                "mean_prompt_tokens": float(p.mean()) if len(p) else 0.0,
                "max_prompt_tokens": int(p.max()) if len(p) else 0,
                "distinct_segments": int(len(used)),
                "distinct_tokens": int(self.seg_len[used].sum()),
                "sessions": int(len(np.unique(self.session[self.session >= 0]))),
                "duration_s": float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0,
                **self.params}

    def __repr__(self) -> str:
        return f"<Trace {self.name!r}: {len(self)} requests, {len(self.seg_len)} segments>"

    # -- other constructors -------------------------------------------------------------------
    @classmethod
    def from_prompts(cls, prompts: Sequence[Sequence[int]], *, arrivals: Sequence[float] | None = None,
                     sessions: Sequence[int | None] | None = None, name: str = "prompts") -> Trace:
        """A trace from explicit token-id sequences: each token is its own segment (segment
        id = token id), requests have no reply, arrivals default to 0, 1, 2, ..."""
        b = _Builder(name, 0, literal=True)
        for i, prompt in enumerate(prompts):
            toks = [int(t) for t in prompt]
            if not toks or min(toks) < 0:
                raise ValueError(f"prompt {i} must be a non-empty list of token ids >= 0")
            session = None if sessions is None else sessions[i]
            b.literal_request(toks, float(i) if arrivals is None else float(arrivals[i]),
                              -1 if session is None else int(session))
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

    def literal_request(self, tokens: list[int], arrival: float, session: int) -> None:
        top = max(tokens)
        if top >= len(self.seg_len):
            self.seg_len.extend([1] * (top + 1 - len(self.seg_len)))
        self.request(tokens, -1, arrival, session)

    def build(self) -> Trace:
        return Trace(self.name, np.asarray(self.seg_len, np.int32), np.asarray(self.ptr, np.int64),
                     np.asarray(self.segs, np.int32), np.asarray(self.reply, np.int32),
                     np.asarray(self.arrival, np.float64), np.asarray(self.session, np.int32),
                     np.asarray(self.pin, np.int32), self.seed, DEFAULT_TOKEN_RANGE, self.literal,
                     self.params)


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
