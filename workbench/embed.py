"""Embeddings: pooled (or per-token) vectors from a context of their own.

Embedding never goes through the generation loop: each (model, pooling) pair gets its own
native context (embeddings on, that pooling type, ``embed_n_seq_max`` sequences), made on
first use and freed when the model is unloaded. One native call embeds a whole batch,
packing as many inputs into each llama_decode as fit; the GIL is released while it runs
and a per-context lock serialises callers (a context is not re-entrant).

Texts are tokenised as llama.cpp's embedding tools do (special tokens added and parsed),
so BERT-style models get their [CLS]/[SEP] and decoder models their BOS.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from . import _native
from .engine.tokens import tokenize_within
from .errors import ContextOverflow, EmptyPrompt, InvalidOption, NotLoaded

POOLINGS = ("mean", "cls", "last", "none")


class Embedders:
    """A model's embedding contexts, one per pooling type, each with the lock that
    serialises its callers; owned by the model's engine (`Engine.attachment`), closed
    before the model is freed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pooling: dict[str, tuple[Any, threading.Lock]] = {}

    def get(self, engine: Any, pooling: str) -> tuple[Any, threading.Lock]:
        with self._lock:
            entry = self._by_pooling.get(pooling)
            if entry is None:
                n_ctx, n_seq = engine.cfg.embed_params(engine.model.n_ctx_train)
                embedder = _native.Embedder(engine.model, pooling, n_ctx, n_seq, engine.ctx.n_threads)
                entry = self._by_pooling[pooling] = (embedder, threading.Lock())
            return entry

    def close(self) -> None:
        with self._lock:
            entries, self._by_pooling = list(self._by_pooling.values()), {}
        for embedder, lock in entries:
            with lock:
                embedder.close()


def embed_inputs(engine: Any, inputs: Sequence[Any], pooling: str, normalize: bool) -> list[Any]:
    """Vectors for ``inputs`` (texts or token lists), in order."""
    if not isinstance(pooling, str) or pooling not in POOLINGS:
        raise InvalidOption("pooling", pooling, "one of " + ", ".join(repr(p) for p in POOLINGS))
    if not isinstance(normalize, bool):
        raise InvalidOption("normalize", normalize, "True or False")
    if not inputs:
        return []
    embedder, lock = engine.attachment("embedders", Embedders).get(engine, pooling)
    limit = embedder.n_batch
    token_lists = [_tokens(engine, x, f"inputs[{i}]", limit) for i, x in enumerate(inputs)]
    for toks in token_lists:
        if len(toks) > limit:
            raise ContextOverflow(len(toks), limit, "the embedding context; raise embed_n_ctx at load_model")
    with lock:
        if embedder.closed:
            raise NotLoaded(engine.model_id)
        return embedder.embed(token_lists, normalize)


def _tokens(engine: Any, x: Any, key: str, limit: int) -> list[int]:
    model = engine.model
    if isinstance(x, str):
        if not x:
            raise EmptyPrompt()
        toks = tokenize_within(model, x, True, True, limit, "the embedding context; raise embed_n_ctx at load_model")
    elif isinstance(x, Sequence) and not isinstance(x, (bytes, bytearray)):
        n_vocab = model.n_vocab
        toks = list(x)
        for t in toks:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
                raise InvalidOption(key, t, f"token ids in [0, {n_vocab})")
    else:
        raise InvalidOption(key, x, "a string or a list of token ids")
    if not toks:
        raise EmptyPrompt()
    return toks
