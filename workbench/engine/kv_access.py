"""The adapter the prefix cache moves KV through: one sequence of a SeqPool's context
(``workbench.cache.interface.SequenceKv``).

The cache decides what to store and what to restore; this is the only place its bytes meet
llama.cpp: the native chunk cut and join (``kv_chunks``). What llama.cpp (or the native checks before it)
refuses is counted here, in the engine's counters: ``cache_restore_failed`` for a restore
refused (the sequence is emptied and verified empty, else ``cache_seq_not_cleared``),
``cache_chunk_cut_refused`` for a state that cannot be cut into chunks (a SWA window cache,
a recurrent model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import KvChunksRefused
from . import kv_chunks


class SeqKv:
    """Sequence ``seq`` of the SeqPool ``pool``."""

    def __init__(self, pool: Any, seq: int, counters: Any) -> None:
        self._pool = pool
        self._seq = seq
        self._counters = counters

    def cut(self, keys: Sequence[bytes], chunk_size: int, first: int, ends: Sequence[int]) -> list[bytes] | None:
        if first >= len(keys):
            return []
        try:
            return kv_chunks.cut(self._pool.ctx, self._seq, keys, chunk_size, first, ends)
        except KvChunksRefused:
            self._counters["cache_chunk_cut_refused"] += 1
            return None

    def load_chunks(self, pieces: Sequence[bytes], keys: Sequence[bytes], n_tokens: int) -> bool:
        self._pool.trim(self._seq, 0)
        try:
            nread = kv_chunks.load(self._pool.ctx, self._seq, pieces, keys, n_tokens=n_tokens)
        except KvChunksRefused:
            nread = 0
        return self._loaded(nread > 0, n_tokens)

    def _loaded(self, read: bool, n_tokens: int) -> bool:
        """True when the sequence holds exactly positions 0 .. n_tokens - 1; else it is
        emptied (and verified empty) and the refusal counted."""
        ctx, seq = self._pool.ctx, self._seq
        if read and ctx.seq_pos_min(seq) == 0 and ctx.seq_pos_max(seq) == n_tokens - 1:
            return True
        self._pool.trim(seq, 0)
        if not self._pool.empty(seq):
            self._counters["cache_seq_not_cleared"] += 1
        self._counters["cache_restore_failed"] += 1
        return False
