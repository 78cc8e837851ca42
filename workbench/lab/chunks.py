"""The chunks a trace's rows are stored as, keyed exactly as the real cache keys them.

A row of n tokens is stored as the chain `keys.chunk_keys(namespace, tokens[:n], chunk_size,
ends)`: chunks of chunk_size positions, the grid restarting at each mark, then a shorter tail
chunk where the row ends. The marks are where a prefix some request of the trace pins ends
(`pinned_prefixes`: the agent prefix, passed to the engine as `prefix_checkpoint_len`, which
chunk storage makes a chunk boundary: chunk_catalog.py); every row through such a prefix
carries its mark, as every request of an agent names its prefix. (The store also lets a row
without the mark follow a stored boundary; with every row carrying it, the chains are the
same, which is what lets the lab cut each row once, up front.) A chunk's key names
(namespace, parent chunk key, its tokens), so two rows with a common prefix share its
chunks (how the store serves a tail from a longer chunk, and a prompt from a chain no row
names, is chunksim.py's part).

`ChunkChains` computes, for every row a plan saves, its last chunk, and for every chunk its
parent, its token count and its token bytes (what the store compares when it serves a tail
from a covering chunk, or a prompt from a chunk it leaves: chunksim.py), and for each
prompt its own chain (`chain`): the chunk tree a replay walks. The token ids are the trace's
real ones (`Trace.segment_bytes`), so the keys equal what the real cache computes for the
same prompts in the same namespace. The work is incremental: the chain state after each
segment path (the plan's trie node) is computed once, from its parent's state, because a
chained hash continues from the previous chunk's key exactly as it starts from the
namespace digest (`chunk_keys(key_of_chunk_k, tokens_after_it, size)` is the tail of
`chunk_keys(namespace, all_tokens, size)`).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workbench.cache.keys import chunk_keys
from workbench.lab.traces import Trace


@dataclass(slots=True)
class ChunkTree:
    """Every chunk a plan's rows and prompts are made of: parent (None for a first chunk),
    token count and token bytes, and each row's last chunk. Chunk keys are 32-character hex
    strings (xxh3-128)."""

    chunk_size: int
    parent: dict[str, str | None] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    raw: dict[str, bytes] = field(default_factory=dict)
    last: dict[str, str] = field(default_factory=dict)   # row key -> its last chunk

    def chain(self, row_key: str) -> list[str]:
        """The row's chunks, first to last."""
        return self.chain_to(self.last[row_key])

    def chain_to(self, last: str) -> list[str]:
        """The chunks from the first to ``last``."""
        out: list[str] = []
        key: str | None = last
        while key is not None:
            out.append(key)
            key = self.parent[key]
        out.reverse()
        return out

    def footprint_tokens(self) -> int:
        """Tokens of the distinct chunks of all rows: what storing every row at once costs."""
        seen: set[str] = set()
        total = 0
        for tail in self.last.values():
            key: str | None = tail
            while key is not None and key not in seen:
                seen.add(key)
                total += self.tokens[key]
                key = self.parent[key]
        return total


def pinned_prefixes(trace: Trace) -> set[tuple[int, ...]]:
    """The segment prefixes the trace's requests pin (their first `pin_segs` segments)."""
    ptr, segs, pins = trace.prompt_ptr.tolist(), trace.prompt_segs.tolist(), trace.pin_segs.tolist()
    return {tuple(segs[ptr[i]:ptr[i] + k]) for i, k in enumerate(pins) if k > 0}


def pinned_marks(trace: Trace) -> Callable[[Sequence[int]], tuple[int, ...]]:
    """Token ids -> the marks the lab's rows carry (the lengths of the pinned prefixes they
    start with): what a real store is given to cut the same chains."""
    pinned: dict[int, set[tuple[int, ...]]] = {}
    for prefix in pinned_prefixes(trace):
        tokens = tuple(t for s in prefix for t in trace.segment_tokens(s))
        pinned.setdefault(len(tokens), set()).add(tokens)

    def marks(tokens: Sequence[int]) -> tuple[int, ...]:
        return tuple(n for n, held in sorted(pinned.items()) if n < len(tokens) and tuple(tokens[:n]) in held)

    return marks


class ChunkChains:
    """Builds a `ChunkTree` for rows named by their segment path and length."""

    def __init__(self, trace: Trace, namespace: bytes, chunk_size: int) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        self.trace = trace
        self.namespace = namespace
        self.size = chunk_size
        self.tree = ChunkTree(chunk_size)
        # trie node -> (key of the last full chunk before the node's end, or None at the
        # root; the token bytes after that chunk up to the node's end)
        self._states: dict[int, tuple[str | None, bytes]] = {}
        self._segments: OrderedDict[int, bytes] = OrderedDict()
        self._pinned = pinned_prefixes(trace)

    def add_row(self, row_key: str, path: list[int], segs: list[int], ends: list[int], n: int) -> None:
        """Register the row of the first `n` tokens of the segments `segs` (trie nodes
        `path`, cumulative real lengths `ends`)."""
        if row_key not in self.tree.last:
            self.tree.last[row_key] = self._last(path, segs, ends, n)

    def chain(self, path: list[int], segs: list[int], ends: list[int], n: int) -> tuple[str, ...]:
        """The chunks of the first `n` tokens (a prompt's: registered, no row made of them)."""
        return tuple(self.tree.chain_to(self._last(path, segs, ends, n)))

    def _last(self, path: list[int], segs: list[int], ends: list[int], n: int) -> str:
        j = bisect.bisect_left(ends, n)       # the segment holding token n - 1
        start = ends[j - 1] if j else 0
        parent, leftover = self._state(path, segs, j - 1)
        raw = leftover + self._segment(segs[j])[:4 * (n - start)]
        return self._register(parent, raw)

    def _state(self, path: list[int], segs: list[int], j: int) -> tuple[str | None, bytes]:
        """The chain state after segment j of this path (-1: the root): from the deepest
        node before it whose state is known, forward (a loop, not recursion: a literal
        trace's path has a node per token)."""
        k = j
        while k >= 0 and path[k] not in self._states:
            k -= 1
        state: tuple[str | None, bytes] = (None, b"") if k < 0 else self._states[path[k]]
        for m in range(k + 1, j + 1):
            parent, leftover = state
            raw = leftover + self._segment(segs[m])
            n_full = len(raw) // (4 * self.size)
            if n_full:
                parent = self._register(parent, raw[:4 * self.size * n_full])
            leftover = raw[4 * self.size * n_full:]
            if leftover and self._pinned and tuple(segs[:m + 1]) in self._pinned:  # a mark: the grid restarts
                parent, leftover = self._register(parent, leftover), b""
            state = self._states[path[m]] = (parent, leftover)
        return state

    def _register(self, parent: str | None, raw: bytes) -> str:
        """Register the chunks of `raw` (token bytes following chunk `parent`); the last key."""
        seed = self.namespace if parent is None else bytes.fromhex(parent)
        step = 4 * self.size
        tree = self.tree
        for k, digest in enumerate(chunk_keys(seed, raw, self.size)):
            key = digest.hex()
            if key not in tree.parent:
                tree.parent[key] = parent
                tree.raw[key] = raw[k * step:(k + 1) * step]
                tree.tokens[key] = len(tree.raw[key]) // 4
            parent = key
        assert parent is not None
        return parent

    def _segment(self, seg: int) -> bytes:
        raw = self._segments.get(seg)
        if raw is None:
            raw = self._segments[seg] = self.trace.segment_bytes(seg)
            if len(self._segments) > 4096:
                self._segments.popitem(last=False)
        else:
            self._segments.move_to_end(seg)
        return raw
