"""What each request of a trace looks up and saves, and replaying that through one cache.

The save rule is the engine's own (`cache/save_rule.py`, which `SavePoints` calls too). For a
prompt of n tokens, `matched` being the longest cached prefix of it (whole rows: the longest
row that is a token prefix; chunks: that, or a chain of chunks, chunksim.py):

    lookup      none for a one-token prompt (nothing could be reused): it is cold
    hit kind    `HitKind.of(matched, n)`: exact when matched >= n - 1, partial when
                0 < matched < n - 1, cold when matched == 0
    start       = min(matched, n - 1)   the KV reused (`types.reusable`)
    prefill     `save_rule.prefill_saves(n, 0, ...)`: checkpoints, the agent prefix (the
                trace's `pin_segs` leading segments, pinned) and the prompt row; every
                condition the rule puts on start is "position > start", so a replay drops
                the saves at or before `start` (an agent prefix there: its existing row is
                pinned). `saves` leaves out the kinds not named
    finish      `save_rule.finish_tokens(n, n + reply - 1)`: a trace's reply ends with its
                end-of-turn token, which is sampled but never decoded, so the KV a request
                ends with stops just before it; a one-token reply (the end-of-turn token
                alone) saves no finish row. A reply is one segment, or in a literal trace
                one segment a token (`Trace.reply`): the row runs along the prompt's path
                and then the reply's, so a later prompt that repeats prompt + reply matches
                it as the real index does

A row already cached is not stored again (an agent prefix pins it).

Indexing trick (exact, and why a 100,000-request trace replays in seconds): rows and
prompts are indexed as *virtual tokens*, one per trace segment, where a segment in which a
saved row ends is split into pieces, in that context only (the exact segment path before
it). Distinct segments are distinct text, so a row is a token prefix of a prompt exactly
when its virtual tokens are a prefix of the prompt's: the longest match is the one the real
index would find, while hashing a few ids per prompt instead of every 16-token block.
"""

from __future__ import annotations

import array
import bisect
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workbench.cache.keys import CacheNamespace, row_key_from_bytes
from workbench.cache import save_rule
from workbench.cache.policies import EvictionPolicy
from workbench.cache.save_rule import SaveSettings, finish_tokens, prefill_saves
from workbench.cache.types import HitKind, SaveReason, reusable
from workbench.lab.chunks import ChunkChains, ChunkTree
from workbench.lab.chunksim import ChunkSimCache
from workbench.lab.simcache import SimCache
from workbench.lab.traces import Trace

SAVE_KINDS = (save_rule.CHECKPOINT, save_rule.AGENT_PREFIX, save_rule.PROMPT, "finish")
NAMESPACE = CacheNamespace("0" * 64, scope="eviction-lab").digest()
PIN, CHECKPOINT, PROMPT = 0, 1, 2   # a prefill save's kind in a plan (and the native replay's codes)
_KINDS = {save_rule.AGENT_PREFIX: PIN, save_rule.CHECKPOINT: CHECKPOINT, save_rule.PROMPT: PROMPT}

Row = tuple[str, bytes, int]          # key, virtual token bytes, real tokens
PrefillSave = tuple[str, bytes, int, int]  # key, bytes, tokens, PIN | CHECKPOINT | PROMPT


@dataclass(slots=True)
class Plan:
    """What every (policy, size) replay of one trace shares, computed once."""

    prompts: list[bytes]                     # virtual prompt of each request
    prompt_len: list[int]                    # its real tokens
    arrival: list[float]
    prefill: list[tuple[PrefillSave, ...]]   # saves during prefill, shortest first
    finish: list[Row | None]
    footprint_tokens: int                    # tokens of all distinct rows (chunks) the plan may save
    chunks: ChunkTree | None = None          # the chunk model: each row's chain (None: whole rows)
    prompt_chunks: list[tuple[str, ...]] | None = None   # the chunk model: each prompt's own chain
    native: Any = None   # the chunk model's arrays for the native replay (native.py), made on first use


def check_saves(saves: Iterable[str]) -> tuple[str, ...]:
    out = tuple(saves)
    bad = [s for s in out if s not in SAVE_KINDS]
    if bad:
        raise ValueError(f"unknown save kind(s) {bad}; valid: {', '.join(SAVE_KINDS)}")
    return out


def check_band(checkpoint_min: int, checkpoint_max: int | None) -> None:
    """The checkpoint band's bounds, validated as the engine's cold_min/cold_max_tokens."""
    if isinstance(checkpoint_min, bool) or not isinstance(checkpoint_min, int) or checkpoint_min < 0:
        raise ValueError(f"checkpoint_min must be an int >= 0, got {checkpoint_min!r}")
    if checkpoint_max is not None and (isinstance(checkpoint_max, bool) or not isinstance(checkpoint_max, int)
                                       or checkpoint_max < 1):
        raise ValueError(f"checkpoint_max must be an int >= 1 or None, got {checkpoint_max!r}")
    if checkpoint_max is not None and checkpoint_max < checkpoint_min:
        raise ValueError(f"checkpoint_max ({checkpoint_max}) must be >= checkpoint_min ({checkpoint_min})")


def build_plan(trace: Trace, *, saves: Iterable[str] = SAVE_KINDS,
               checkpoint_every: int | None = 2048, min_tokens: int = 16, checkpoint_min: int = 0,
               checkpoint_max: int | None = None, chunk_size: int | None = None) -> Plan:
    """Virtual-token prompts and the rows each request may save (see the module doc).
    Checkpoints fall only at positions p with `checkpoint_min` <= p <= `checkpoint_max`
    (None: no bound), as the engine's cold_min_tokens / cold_max_tokens. With `chunk_size`
    each row is also cut into its chunk chain (`chunks.py`) and replays use the chunk model
    (`chunksim.py`); None keeps whole rows (`simcache.py`, no sharing)."""
    saves = check_saves(saves)
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1 or None, got {checkpoint_every}")
    check_band(checkpoint_min, checkpoint_max)
    rule = SaveSettings(checkpoint_every if "checkpoint" in saves else None, checkpoint_min, checkpoint_max,
                        min_tokens)
    seg_len = trace.seg_len.tolist()
    ptr, segs = trace.prompt_ptr.tolist(), trace.prompt_segs.tolist()
    replies, pin_segs = _replies(trace), trace.pin_segs.tolist()
    prompts = [segs[ptr[i]:ptr[i + 1]] for i in range(len(trace))]
    plens = [sum(seg_len[s] for s in p) for p in prompts]
    ctx = _Contexts(seg_len)
    agent = [sum(seg_len[s] for s in p[:k]) if k > 0 and "agent_prefix" in saves else None
             for p, k in zip(prompts, pin_segs)]
    paths, points, finish_len = [], [], []
    for i, prompt in enumerate(prompts):
        path = ctx.path(prompt)
        paths.append(path)
        n = plens[i]
        # the engine's rule at start = 0: a replay drops the saves at or before what it found
        planned = [(pos, _KINDS[kind]) for pos, kind in prefill_saves(n, 0, rule, agent=agent[i])
                   if kind in saves]
        points.append(planned)
        ctx.cut(path, prompt, tuple(pos for pos, kind in planned if kind == CHECKPOINT))
        if any(kind == PROMPT for _, kind in planned):
            # the prompt row ends before the last prompt token: inside the last segment
            ctx.cut_inside(path[-1], seg_len[prompt[-1]] - 1)
        reply = replies[i]
        # the reply's last token (end of turn) is sampled, never decoded
        n_fin = finish_tokens(n, n + sum(seg_len[s] for s in reply) - 1) if "finish" in saves and reply else 0
        if n_fin:
            ctx.cut(ctx.extend(path, reply), [*prompt, *reply], (n_fin,))
        finish_len.append(n_fin)
    keys: dict[bytes, str] = {}

    def row(raw: bytes, cum: list[int], n: int) -> Row:
        part = raw[:4 * bisect.bisect_left(cum, n)]
        key = keys.get(part)
        if key is None:
            key = keys[part] = row_key_from_bytes(NAMESPACE, part)
        return key, part, n

    plan = Plan([], plens, trace.arrival_s.tolist(), [], [], 0)
    chains = None if chunk_size is None else ChunkChains(trace, NAMESPACE, chunk_size)
    if chains is not None:
        plan.prompt_chunks = []
    for i, prompt in enumerate(prompts):
        vids: list[int] = []
        cum = [0]
        path = paths[i]
        plen = plens[i]
        if finish_len[i]:
            prompt, path = [*prompt, *replies[i]], ctx.extend(path, replies[i])
        ctx.virtual(path, prompt, vids, cum)
        raw = array.array("i", vids).tobytes()
        plan.prompts.append(raw[:4 * bisect.bisect_left(cum, plen)])
        plan.prefill.append(tuple((*row(raw, cum, n), kind) for n, kind in points[i]))
        plan.finish.append(row(raw, cum, finish_len[i]) if finish_len[i] else None)
        if chains is not None:
            ends = list(itertools.accumulate(seg_len[s] for s in prompt))
            for r in (*plan.prefill[i], plan.finish[i]):
                if r is not None:
                    chains.add_row(r[0], path, prompt, ends, r[2])
            assert plan.prompt_chunks is not None
            plan.prompt_chunks.append(chains.chain(path, prompt, ends, plen))
    seen: dict[str, int] = {}
    for i in range(len(prompts)):
        for r in plan.prefill[i]:
            seen[r[0]] = r[2]
        fin = plan.finish[i]
        if fin is not None:
            seen[fin[0]] = fin[2]
    plan.footprint_tokens = sum(seen.values())
    if chains is not None:
        plan.chunks = chains.tree
        plan.footprint_tokens = chains.tree.footprint_tokens()
    return plan


def _replies(trace: Trace) -> list[list[int]]:
    """Each request's reply segments (`Trace.reply`)."""
    return [list(trace.reply(i)) for i in range(len(trace))]


class _Contexts:
    """Segment paths as trie nodes, and where saved rows end inside a segment.

    A segment is split into pieces only in the context (the exact segment path up to and
    including it) where a row ends inside it; everywhere else it stays one virtual token,
    its segment id. Splitting per context rather than per segment keeps a popular document
    from collecting the cut points of every prompt it appears in.
    """

    def __init__(self, seg_len: list[int]) -> None:
        self.seg_len = seg_len
        self._nodes: dict[tuple[int, int], int] = {}
        self._offsets: dict[int, set[int]] = {}
        self._pieces: dict[int, list[tuple[int, int]]] = {}  # node -> (virtual id, length)
        self._next_vid = len(seg_len)  # segment ids are the virtual ids of uncut segments

    def child(self, parent: int, seg: int) -> int:
        node = self._nodes.get((parent, seg))
        if node is None:
            node = self._nodes[(parent, seg)] = len(self._nodes) + 1
        return node

    def path(self, segs: list[int]) -> list[int]:
        node, out = 0, []
        for s in segs:
            node = self.child(node, s)
            out.append(node)
        return out

    def extend(self, path: list[int], segs: list[int]) -> list[int]:
        """`path` continued by the nodes of `segs`."""
        out = list(path)
        for s in segs:
            out.append(self.child(out[-1], s))
        return out

    def cut(self, path: list[int], segs: list[int], points: tuple[int, ...]) -> None:
        """Note rows ending at `points` (ascending token positions) along this path."""
        pos, k = 0, 0
        for node, s in zip(path, segs):
            if k == len(points):
                return
            n = self.seg_len[s]
            while k < len(points) and points[k] <= pos + n:
                if points[k] - pos < n:
                    self._offsets.setdefault(node, set()).add(points[k] - pos)
                k += 1
            pos += n

    def cut_inside(self, node: int, offset: int) -> None:
        """Note a row ending `offset` tokens into the segment of `node` (0: at its start, no cut)."""
        if offset > 0:
            self._offsets.setdefault(node, set()).add(offset)

    def virtual(self, path: list[int], segs: list[int], out: list[int], cum: list[int]) -> None:
        """Append the virtual tokens of `segs` and their cumulative real lengths."""
        for node, s in zip(path, segs):
            p = self._pieces.get(node)
            if p is None:
                offs = self._offsets.get(node)
                if offs is None:
                    out.append(s)
                    cum.append(cum[-1] + self.seg_len[s])
                    continue
                p = self._split(node, s, offs)
            for vid, n in p:
                out.append(vid)
                cum.append(cum[-1] + n)

    def _split(self, node: int, seg: int, offs: set[int]) -> list[tuple[int, int]]:
        bounds = [0, *sorted(offs), self.seg_len[seg]]
        p = [(self._next_vid + k, b - a) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        self._next_vid += len(p)
        if self._next_vid >= 2**31:
            raise ValueError("trace too large for the lab's int32 virtual tokens")
        self._pieces[node] = p
        return p


# --- one replay ---------------------------------------------------------------------------------

def run_plan(plan: Plan, policy: EvictionPolicy, size_bytes: int, bytes_per_token: int, *,
             timeline_every: int = 0, record: bool = False, native: bool = True) -> dict[str, Any]:
    """Replay the plan through one cache; totals, plus a timeline (every `timeline_every`
    requests) and each request's (hit kind, prefill saved) when `record`. A chunk-model plan
    and a policy with a `native_spec` replay natively (native.py: the same numbers, faster)
    unless `native` is False."""
    spec = getattr(policy, "native_spec", None) if native and plan.chunks is not None else None
    spec = spec() if spec is not None else None
    if spec is not None:
        return _native_result(plan, spec, size_bytes, bytes_per_token, timeline_every, record)
    sim: SimCache | ChunkSimCache = (SimCache(policy, size_bytes) if plan.chunks is None
                                     else ChunkSimCache(policy, size_bytes, plan.chunks, bytes_per_token))
    chained = plan.prompt_chunks
    ns, bpt = NAMESPACE, bytes_per_token
    exact = partial = misses = saved = matched_total = 0
    timeline: list[tuple[int, float, int, int, int, int, int]] = []
    per_request: list[tuple[str, int]] = []
    started = time.perf_counter()
    prompts, plens, arrival, prefill, finishes = plan.prompts, plan.prompt_len, plan.arrival, plan.prefill, plan.finish
    n = len(prompts)
    on_request = getattr(policy, "on_request", None)  # lab-only hook: an offline policy's clock
    for i in range(n):
        now, plen = arrival[i], plens[i]
        if on_request is not None:
            on_request(i, now)
        hit: Any = None  # the engine skips one-token prompts (nothing could be reused)
        if reusable(plen) > 0:
            hit = sim.lookup(ns, prompts[i]) if chained is None else sim.lookup(ns, prompts[i], chained[i])  # type: ignore[call-arg]
        if hit is None:
            matched = 0
            misses += 1
        else:
            matched = hit.n_tokens
            sim.hit(hit, now)
        hit_kind = HitKind.of(matched, plen)
        if hit_kind is HitKind.EXACT:
            exact += 1
        elif hit_kind is HitKind.PARTIAL:
            partial += 1
        start = min(matched, reusable(plen))
        matched_total += matched
        saved += start
        reason = SaveReason.CONTINUED if matched else SaveReason.COLD
        for key, raw, n_tok, kind in prefill[i]:
            if kind == PIN:
                if n_tok > start:
                    sim.put(key, ns, raw, n_tok, n_tok * bpt, SaveReason.AGENT_PREFIX, now, pinned=True)
                else:
                    sim.pin(key, now)
            elif n_tok > start:  # checkpoint, or the prompt row (n - 1 > start: nothing covered it)
                sim.put(key, ns, raw, n_tok, n_tok * bpt, reason, now)
        fin = finishes[i]
        if fin is not None:
            sim.put(fin[0], ns, fin[1], fin[2], fin[2] * bpt, SaveReason.FINISH, now)
        if record:
            per_request.append((hit_kind.value, start))
        if timeline_every and ((i + 1) % timeline_every == 0 or i + 1 == n):
            timeline.append((i + 1, now, sim.used_bytes, len(sim), sim.evictions, exact + partial, misses))
    return {
        **_totals(plan, exact, partial, misses, saved, matched_total),
        "rows_saved": sim.saves, "saves_too_large": sim.too_large, "evictions": sim.evictions,
        "evicted_bytes": sim.evicted_bytes, "rows_end": len(sim), "bytes_end": sim.used_bytes,
        **_chunk_columns(sim), "seconds": time.perf_counter() - started, "_timeline": timeline,
        "_requests": per_request,
    }


def _totals(plan: Plan, exact: int, partial: int, misses: int, saved: int, matched: int) -> dict[str, Any]:
    """A replay's request counts and the ratios derived from them (both replay paths)."""
    n, total_prompt = len(plan.prompts), sum(plan.prompt_len)
    return {
        "requests": n, "hits": exact + partial, "exact_hits": exact, "partial_hits": partial, "misses": misses,
        "hit_ratio": (exact + partial) / n if n else 0.0, "miss_ratio": misses / n if n else 0.0,
        "byte_hit_ratio": matched / total_prompt if total_prompt else 0.0,
        "prompt_tokens": total_prompt, "prefill_tokens_saved": saved,
        "prefill_saved_fraction": saved / total_prompt if total_prompt else 0.0,
    }


def _native_result(plan: Plan, spec: tuple[str, dict[str, Any]], size_bytes: int, bytes_per_token: int,
                   timeline_every: int, record: bool) -> dict[str, Any]:
    """run_plan's result from the native replay of a built-in policy."""
    from workbench.lab.native import native_plan

    name, params = spec
    out = native_plan(plan).replay(name, params, size_bytes, bytes_per_token, timeline_every=timeline_every,
                                   record=record)
    kinds = (HitKind.COLD.value, HitKind.EXACT.value, HitKind.PARTIAL.value)
    return {
        **_totals(plan, out["exact_hits"], out["partial_hits"], out["misses"], out["prefill_tokens_saved"],
                  out["matched_tokens"]),
        **{k: out[k] for k in ("rows_saved", "saves_too_large", "evictions", "evicted_bytes", "rows_end",
                               "bytes_end", *CHUNK_COLUMNS)},
        "seconds": out["seconds"], "_timeline": out["timeline"],
        "_requests": [(kinds[k], s) for k, s in zip(out["kinds"], out["starts"])],
    }


CHUNK_COLUMNS = ("chunks_end", "logical_bytes_end", "shared_bytes_end", "chunks_written", "chunks_reused",
                 "chunks_collected", "chunk_ties")


def _chunk_columns(sim: SimCache | ChunkSimCache) -> dict[str, int]:
    """The chunk model's byte counts (absent in the whole-row model): chunks and what the
    cached rows would take as whole rows, bytes of chunks more than one row holds, chunks
    written / found already cached by puts, chunks collected with an evicted leaf."""
    if not isinstance(sim, ChunkSimCache):
        return {}
    return {"chunks_end": len(sim.chunks), "logical_bytes_end": sim.logical_bytes,
            "shared_bytes_end": sim.shared_bytes(), "chunks_written": sim.chunks_written,
            "chunks_reused": sim.chunks_reused, "chunks_collected": sim.collected, "chunk_ties": sim.ties}
