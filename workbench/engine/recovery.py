"""What the loop does when a native decode does not return 0. A mixin of :class:`Engine`.

llama.cpp keeps the ubatches it already processed after an abort or a fatal error, so
every sequence in the batch is first rolled back to where it stood before the batch.
Then: a cancel-triggered abort just lets the others redo their rows; a step past its
budget fails what runs and recreates the context (the model stays loaded); a full KV cache
fails the newest request; any other code fails the batch's requests.
"""

from __future__ import annotations

from .. import _native
from ..errors import ContextOverflow, DecodeFailed, DecodeTimeout
from .request import Request
from .scheduler import BatchPlan


class Recovery:
    def _decode_failed(self, rc: int, plan: BatchPlan) -> None:
        # roll every sequence in the batch back to where it was: ubatches already
        # processed stay in the KV cache after an abort or a fatal error
        for s in plan.slices:
            self.ctx.seq_rm(s.request.seq, s.request.n_past, -1)
        reason = self.ctx.abort_reason if rc == 2 else ""
        self.ctx.clear_abort()
        if rc == 2 and reason == "cancelled":
            self.counters["decode_aborted"] += 1
            return  # cancelled requests finish next tick; the others redo their rows
        if rc == 2 and reason == "timeout":
            self.counters["decode_timeouts"] += 1
            self._recreate_context(DecodeTimeout(
                f"a decode step ran past decode_budget_ms={self.cfg.decode_budget_ms} and was aborted; "
                "the context was recreated"))
            return
        if rc == 1 and self.active:
            # no KV slot: the sequences together outgrew the shared context; the newest yields
            victim = self.active[-1]
            self._retire(victim, keep_kv=False)
            victim.fail(ContextOverflow(victim.n_past + len(victim.feed), self.ctx.n_ctx,
                                        "the KV cache is full with the other running sequences"))
            return
        err = DecodeFailed(rc)
        for s in plan.slices:
            req: Request = s.request  # type: ignore[assignment]
            self._retire(req, keep_kv=False)
            req.fail(err)

    def _recreate_context(self, err: Exception) -> None:
        """Fail what runs, rebuild the context (the model stays loaded), back to idle."""
        for req in list(self.active):
            self._retire(req, keep_kv=False)
            req.fail(err)
        self.ctx.close()
        self.ctx = _native.Context(self.model, self.ctx_params)
        live = [a for a in self.adapters if a.scale != 0.0]
        _native.set_adapters(self.ctx, [a.native for a in live], [a.scale for a in live])
        with self._cv:
            self.sessions.unpin_all()
            self._free_seqs = list(range(self.ctx.n_seq_max))
