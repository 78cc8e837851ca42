"""A sequence's KV state as content-addressed chunks (the native cut and join).

``cut`` takes the KV of a sequence holding exactly ``tokens`` and returns it as chunks of
``chunk_size`` positions (the tail chunk may be shorter), chunk ``i`` tagged with the key
``keys.chunk_keys`` gives it: a chunk's key names (namespace, parent chunk key, its tokens).
``load`` joins chunks back into one llama.cpp state and restores it into a sequence, after
the native layer checked that each chunk carries the expected key, that their positions
follow each other from 0, that they share one KV layout and that each holds exactly the
bytes its layout says; anything else raises :class:`~workbench.errors.KvChunksRefused` and
leaves the sequence untouched. The format and its limits: docs/cache.md, "Chunked state".

Both pass the whole state once through a buffer kept per context (``ScratchBuffers``), as
large as the largest state it has held: writing 47 MB into freshly mapped memory costs its
page faults, several times the copy itself (docs/cache.md, "Issue 14: what stands, what is
left", warm restore cost).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..cache.chunk_store import DEFAULT_CHUNK_SIZE
from ..cache.keys import Tokens, chunk_keys
from ..errors import KvChunksRefused


def keys_for(namespace_digest: bytes, tokens: Tokens, chunk_size: int = DEFAULT_CHUNK_SIZE,
             ends: Sequence[int] | None = None) -> list[bytes]:
    """The chunk keys of a row of ``tokens`` cut at ``ends`` (default: the fixed grid; the
    one definition: ``keys.chunk_keys``)."""
    return chunk_keys(namespace_digest, tokens, chunk_size, ends)


class ScratchBuffers:
    """One bytearray per context, lent to one call at a time: a call that finds it lent out
    (another thread on the same context) gets a fresh one, so two joins never share memory.
    It goes with its context."""

    def __init__(self) -> None:
        self._free: weakref.WeakKeyDictionary[Any, bytearray] = weakref.WeakKeyDictionary()

    @contextmanager
    def lend(self, ctx: Any) -> Iterator[bytearray]:
        buf = self._free.pop(ctx, None)
        if buf is None:
            buf = bytearray()
        try:
            yield buf
        finally:
            self._free[ctx] = buf

    def __len__(self) -> int:
        """Contexts holding a buffer now (not lent out)."""
        return len(self._free)


scratch_buffers = ScratchBuffers()


def _refused(exc: ValueError) -> KvChunksRefused:
    operation, _, reason = str(exc).partition(": ")
    return KvChunksRefused(operation or "kv_chunks", reason or str(exc))


def cut(ctx: Any, seq: int, keys: Sequence[bytes], chunk_size: int = DEFAULT_CHUNK_SIZE,
        first: int = 0, ends: Sequence[int] = ()) -> list[bytes]:
    """Chunks ``first ..`` of the state of ``seq``, whose chunk keys are ``keys``, the chunks
    ending at ``ends`` (``ChunkCatalog.plan``'s; default every ``chunk_size`` positions)."""
    try:
        with scratch_buffers.lend(ctx) as buf:
            return list(ctx.state_seq_get_chunks(seq, list(keys), chunk_size, first, buf, list(ends)))
    except ValueError as exc:
        raise _refused(exc) from None


def cut_state(ctx: Any, state: bytes, keys: Sequence[bytes], chunk_size: int = DEFAULT_CHUNK_SIZE,
              first: int = 0, ends: Sequence[int] = ()) -> list[bytes]:
    """``cut`` over a state already copied out of llama.cpp."""
    try:
        return list(ctx.state_cut(state, list(keys), chunk_size, first, list(ends)))
    except ValueError as exc:
        raise _refused(exc) from None


def join(ctx: Any, pieces: Sequence[bytes], keys: Sequence[bytes], n_tokens: int = 0) -> bytes:
    """One llama.cpp sequence state from verified chunks (see the module's docstring): all
    their positions, or the first ``n_tokens`` (which must end inside the last chunk: a row
    served by the first positions of a longer row's chunk, a prompt that leaves a chunk)."""
    try:
        return bytes(ctx.state_join(list(pieces), list(keys), n_tokens))
    except ValueError as exc:
        raise _refused(exc) from None


def load(ctx: Any, seq: int, pieces: Sequence[bytes], keys: Sequence[bytes], n_tokens: int = 0) -> int:
    """Join ``pieces`` and restore them into ``seq``: the bytes llama.cpp read (0: it refused
    the state, and emptied the sequence). KvChunksRefused, nothing restored, when the chunks do
    not verify or the joined state does not fit this context. ``n_tokens``: as for ``join``."""
    try:
        with scratch_buffers.lend(ctx) as buf:
            return int(ctx.state_seq_set_chunks(seq, list(pieces), list(keys), n_tokens, buf))
    except ValueError as exc:
        raise _refused(exc) from None
