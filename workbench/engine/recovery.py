"""What the loop does when a native decode does not return 0.

llama.cpp keeps the ubatches it already processed after an abort or a fatal error, so
every sequence in the batch is first rolled back to where it stood before the batch.
Then: a cancel-triggered abort just lets the others redo their rows; a step past its
budget fails what runs and recreates the context (the model stays loaded); a full KV cache
first frees an idle session's cells (the pool's ``kv_full``: saved to the prefix cache,
least recently used first) and runs the batch again next tick, and only when no session is
idle fails the newest request; any other code fails the batch's requests.

State: none of its own; it acts through the sequence pool, the request table and the
adapter set it is given.
"""

from __future__ import annotations

import collections

from ..errors import ContextOverflow, DecodeFailed, DecodeTimeout
from .adapter_ops import AdapterSet
from .batch import DecodeBatch
from .request_table import RequestTable
from .seq_pool import SeqPool

ABORTED, KV_FULL = 2, 1     # llama_decode's codes: aborted by the callback; no KV slot


class Recovery:
    def __init__(self, pool: SeqPool, table: RequestTable, adapters: AdapterSet,
                 counters: collections.Counter[str], decode_budget_ms: int) -> None:
        self._pool = pool
        self._table = table
        self._adapters = adapters
        self._counters = counters
        self._budget_ms = decode_budget_ms

    def decode_failed(self, rc: int, batch: DecodeBatch) -> None:
        for s in batch.slices:
            assert s.request.seq is not None
            self._pool.trim(s.request.seq, s.request.n_past)
        ctx = self._pool.ctx
        reason = ctx.abort_reason if rc == ABORTED else ""
        ctx.clear_abort()
        if rc == ABORTED and reason == "cancelled":
            self._counters["decode_aborted"] += 1   # cancelled requests finish next tick; the others redo
        elif rc == ABORTED and reason == "timeout":
            self._counters["decode_timeouts"] += 1
            self.recreate_context(DecodeTimeout(
                f"a decode step ran past decode_budget_ms={self._budget_ms} and was aborted; "
                "the context was recreated"))
        elif rc == KV_FULL and self._pool.kv_full():
            pass   # an idle session's cells were freed: the batch is planned again next tick
        elif rc == KV_FULL and self._table.active:
            # the sequences together outgrew the shared context; the newest yields
            victim = self._table.active[-1]
            self._table.fail(victim, ContextOverflow(victim.n_past + len(victim.feed), ctx.n_ctx,
                                                     "the KV cache is full with the other running sequences"))
        else:
            err = DecodeFailed(rc)
            for s in batch.slices:
                self._table.fail(s.request, err)

    def recreate_context(self, err: Exception) -> None:
        """Fail what runs, rebuild the context (the model stays loaded), back to idle."""
        for req in list(self._table.active):
            self._table.fail(req, err)
        self._pool.reset()
        self._adapters.reapply()
