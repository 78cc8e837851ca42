"""Step 3 of a tick: apply a decode's results to its requests.

Each slice's request advances past the tokens it decoded; a prefill that reached a save
point saves its row there (cache_saves); where the decode produced logits the request
samples its next token, emits its events, and finishes on end-of-generation, a stop
string, its token limit or the end of the context.

State: none of its own; it acts through the parts it is given.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from .. import _native
from .batch import DecodeBatch
from .cache_saves import SavePoints
from .grammars import sampler_refused, sampling_failed
from .logprobs import next_logprob, record_sample
from .request import Request
from .request_table import RequestTable
from .seq_pool import SeqPool


class BatchResults:
    def __init__(self, model: Any, pool: SeqPool, table: RequestTable, saves: SavePoints,
                 counters: collections.Counter[str]) -> None:
        self._model = model
        self._pool = pool
        self._table = table
        self._saves = saves
        self._counters = counters

    def apply(self, batch: DecodeBatch) -> None:
        """Advance each slice's request; save where a prefill reached a save point; sample
        where the decode produced logits."""
        now = time.perf_counter()
        for s in batch.slices:
            if s.rows is not None:
                continue                       # verify rows: engine/speculation.py
            req = s.request
            self.advance(req, s.take, s.tiled)
            if s.logits_row is None:
                continue
            if req.phase == "prefilling":
                req.prefill_done(now)
            if req.opts.response_tokens == 0:
                self.finish(req, "length")     # prefill only: nothing to sample
            else:
                self.sample(req, s.logits_row)

    def advance(self, req: Request, take: int, tiled: bool = False) -> None:
        """``take`` tokens of the feed are in the KV now (``tiled``: as prompt rows on the
        tiled kernel, extending the KV a cold prefill computes alike); a prefill saves at its
        save points."""
        req.advance(take, tiled)
        if req.phase == "prefilling":
            self._saves.reached(req)

    def sample(self, req: Request, row: int) -> None:
        token = self.draw(req, row)
        if token is None:
            return
        reason = self.take(req, token)
        if reason is None:
            req.next_input(token)
        else:
            self.finish(req, reason)

    def draw(self, req: Request, row: int) -> int | None:
        """The request's sampler's token at output ``row`` (accepted into its chain); None
        when sampling failed, and the request has then failed."""
        try:
            token = int(req.sampler.sample(self._pool.ctx, row))
            if req.opts.logprobs is not None:   # the check inlined: this runs once per token
                record_sample(req)
            return token
        except ValueError as e:  # no token is left to sample (csrc/sampler.cpp says what ruled them out)
            self._table.fail(req, sampler_refused(req.opts, e))
        except _native.NativeError as e:  # llama.cpp threw inside the chain: this request ends
            self._table.fail(req, sampling_failed(req.opts.grammar, req.opts.json_schema, e))
        return None

    def take(self, req: Request, token: int, draft: bool = False) -> str | None:
        """A sampled token into the reply (events; ``draft``: an accepted draft token); the
        finish reason it causes, if any: end-of-generation, a stop string, the token limit
        or the end of the context."""
        now = time.perf_counter()
        if req.first_token_at is None:
            req.first_token(now)
        if self._model.is_eog(token):
            return "stop"
        req.append_token(token, now)
        special = req.special if isinstance(req.special, bool) else token in req.special
        lp = next_logprob(self._model, req, token) if req.opts.logprobs is not None else None
        req.emit_token(token, self._model.token_to_piece(token, special), draft, lp)
        if req.text is not None and req.text.stop_hit is not None:
            return "stop"
        if len(req.generated) >= req.opts.response_tokens or req.n_past + 1 >= self._pool.ctx.n_ctx:
            return "length"
        return None

    def finish(self, req: Request, reason: str) -> None:
        key = self._saves.at_finish(req, reason)
        self._table.retire(req, keep_kv=True)
        req.finish(reason, key)  # type: ignore[arg-type]
        self._counters[f"finished_{reason}"] += 1
