"""The save rule: which prefix-cache rows a request saves, and where. One definition, used by
the engine (`engine/cache_saves.py`, `SavePoints`) and by the eviction lab (`lab/plan.py`),
so the lab's replays follow the engine by construction.

A prompt of n tokens can reuse at most n - 1 cached tokens (`types.reusable`: its last token
is always decoded again, for its logits). With `start` tokens of it already in the KV (a
restored row, a session's KV), its prefill saves (`prefill_saves`):

    checkpoint    every `checkpoint_every` tokens (cold_checkpoint_interval), at positions p
                  with start < p < n - 1 and checkpoint_min <= p <= checkpoint_max
                  (cold_min_tokens / cold_max_tokens: each row holds its whole prefix, so an
                  unbounded run of them on a very long prompt would store O(n^2) bytes)
    prompt        the prompt without its last token (n - 1), when n - 1 >= min_tokens
                  (cache_min_tokens), n - 1 > start (nothing covers it yet), the row restored
                  is not the prompt's own, and the agent prefix is not the whole prompt (its
                  pinned row of n tokens stands for the prompt)
    agent_prefix  the agent prefix (prefix_checkpoint_len) when it lies past start, pinned;
                  one at or before start is already stored: the engine pins that row
                  instead (not a save)

Where two fall on one position the agent prefix wins, then the prompt row. When the request
ends, a finish row holds everything it decoded, when that is more than the prompt
(`finish_tokens`). The engine adds one condition of its own (engine/cache_saves.py): a row
holds only KV a cold prefill computes alike, so in the default mode (not deterministic) it
stores no finish row, no row past a sticky session's first prompt, and an agent prefix
that is the whole prompt without its last token; the lab replays that with `saves` leaving
"finish" out. Every condition on start is `position > start`: the lab plans each
request with start = 0 and drops, at replay, the saves at or before the prefix it found.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.cache.types import reusable

CHECKPOINT, PROMPT, AGENT_PREFIX = "checkpoint", "prompt", "agent_prefix"


@dataclass(frozen=True, slots=True)
class SaveSettings:
    """The load options that shape the rule (their defaults are the engine's)."""

    checkpoint_every: int | None = 2048   # cold_checkpoint_interval; None or 0: no checkpoints
    checkpoint_min: int = 0               # cold_min_tokens
    checkpoint_max: int | None = None     # cold_max_tokens; None: no bound
    min_tokens: int = 16                  # cache_min_tokens


def checkpoints(n: int, start: int, settings: SaveSettings) -> list[int]:
    """Cold checkpoints of a prompt of n tokens past `start`, inside the band."""
    every, lo, hi = settings.checkpoint_every, settings.checkpoint_min, settings.checkpoint_max
    if not every:
        return []
    end = reusable(n) if hi is None else min(reusable(n), hi + 1)
    return [pos for pos in range(every, end, every) if pos > start and pos >= lo]


def prefill_saves(n: int, start: int, settings: SaveSettings, *, agent: int | None = None,
                  prompt_found: bool = False) -> list[tuple[int, str]]:
    """The rows a prompt of n tokens saves during its prefill, `start` tokens being in the KV
    already: (position, kind) in order of position, kind CHECKPOINT, PROMPT or AGENT_PREFIX.
    `agent`: the agent prefix's length; `prompt_found`: the row restored is the prompt's own."""
    points = {pos: CHECKPOINT for pos in checkpoints(n, start, settings)}
    last = reusable(n)
    if last >= settings.min_tokens and not prompt_found and last > start and agent != n:
        points[last] = PROMPT
    if agent is not None and agent > start:
        points[agent] = AGENT_PREFIX
    return sorted(points.items())


def finish_tokens(prompt_len: int, decoded: int) -> int:
    """Tokens of the finish row of a request that decoded `decoded` tokens in all (prompt
    included; its last sampled token is never decoded): 0 when that is not more than the
    prompt (nothing new to keep)."""
    return decoded if decoded > prompt_len else 0
