"""Cross-replica speculative decoding: the draft on one replica, verification on another.

    loop until response_tokens (or the target ends the reply):
        draft   = draft replica:  up to n_draft greedy tokens after the context
        verdict = verify replica: one forward pass over context + draft, argmax at each
        keep draft[:accepted], then the verifier's own next token

With ``sessions=True`` (the default) each side keeps a session for the whole loop, so a
round prefills only what is new on that side: the drafter's turn is a sticky turn on its
session (its KV holds the context and its last drafts; a turn keeps the common prefix,
so it prefills the verifier's token, and the last draft when all were accepted); the
verifier's pass extends its session (its KV holds the context and the drafts it checked:
it prefills its own token and the new drafts). Both sessions end with the loop. With
``sessions=False``, the speculative primitives (workbench/speculative.py), which keep no
KV: every round prefills the whole context on both replicas. The reply is the verifier's
greedy reply either way: every kept token is one its argmax chose.

The replica side of the session form is here too (:func:`draft_in_session`,
:func:`verify_in_session`), served through ``Replica.call``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..options import check_bool, check_int

if TYPE_CHECKING:
    from .cluster import Cluster
    from .members import Member

SPEC_SCOPE = "default"


@dataclass(slots=True, frozen=True)
class SpeculationResult:
    """The reply, and per round what each side prefilled (tokens its KV did not hold)."""

    tokens: tuple[int, ...]
    reply: str
    rounds: int
    drafted: int
    accepted: int
    draft_replica: str
    verify_replica: str
    finish_reason: str
    sessions: bool
    draft_prefilled: tuple[int, ...]
    verify_prefilled: tuple[int, ...]


class _Sides:
    """The two calls of a round on their replicas; ``sessions`` keeps a session on each."""

    def __init__(self, verifier: Cluster, v: Member, drafter: Cluster, d: Member, sessions: bool) -> None:
        self.verifier, self.v, self.drafter, self.d, self.sessions = verifier, v, drafter, d, sessions
        tag = uuid.uuid4().hex[:12]
        self.draft_sid, self.verify_sid = f"speculate-draft-{tag}", f"speculate-verify-{tag}"
        self.draft_prefilled: list[int] = []
        self.verify_prefilled: list[int] = []

    def draft(self, context: list[int], want: int) -> list[int]:
        if self.sessions:
            tokens, n = self.drafter.call_replica(self.d, "draft_in_session", (self.draft_sid, context, want), {})
        else:
            tokens, n = self.drafter.call_replica(self.d, "draft_tokens", (context,), {"max": want}), len(context)
        self.draft_prefilled.append(n)
        return list(tokens)

    def verify(self, context: list[int], draft: list[int]) -> dict[str, Any]:
        """{'accepted', 'next'} (next: a token id or 'eos'); with no draft, the next token."""
        if self.sessions:
            verdict, n = self.verifier.call_replica(self.v, "verify_in_session", (self.verify_sid, context, draft), {})
        elif draft:
            verdict, n = self.verifier.call_replica(self.v, "verify", (context, draft), {}), len(context) + len(draft)
        else:
            nxt = self.verifier.call_replica(self.v, "draft_tokens", (context,), {"max": 1})
            verdict, n = {"accepted": 0, "next": nxt[0] if nxt else "eos"}, len(context)
        self.verify_prefilled.append(n)
        return dict(verdict)

    def close(self) -> None:
        if not self.sessions:
            return
        for cluster, m, sid in ((self.drafter, self.d, self.draft_sid), (self.verifier, self.v, self.verify_sid)):
            try:
                cluster.call_replica(m, "end_session", (sid, SPEC_SCOPE), {})
            except Exception:  # never opened (the first call failed), or the replica is gone
                pass


def speculate(verifier: Cluster, prompt: str | Sequence[int], *, response_tokens: int = 64, n_draft: int = 8,
              verify_replica: str | int = 1, draft_replica: str | int = 0,
              drafter: Cluster | None = None, sessions: bool = True) -> SpeculationResult:
    """Greedy generation on ``verify_replica`` of ``verifier`` with drafts from
    ``draft_replica`` of ``drafter`` (default: the same cluster); ``sessions``: keep a
    session on each side (see the module doc)."""
    check_int("response_tokens", response_tokens, 1)
    check_int("n_draft", n_draft, 1, 256)
    check_bool("sessions", sessions)
    drafter = drafter or verifier
    v, d = verifier.member(verify_replica), drafter.member(draft_replica)
    base = verifier.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    sides = _Sides(verifier, v, drafter, d, sessions)
    try:
        out, rounds, drafted, accepted, finish = _rounds(sides, base, response_tokens, n_draft)
    finally:
        sides.close()
    reply = verifier.call_replica(v, "detokenize", (out,), {})
    return SpeculationResult(tuple(out), reply, rounds, drafted, accepted, d.name, v.name, finish, sessions,
                             tuple(sides.draft_prefilled), tuple(sides.verify_prefilled))


def _rounds(sides: _Sides, base: list[int], response_tokens: int, n_draft: int) -> tuple[list[int], int, int, int, str]:
    out: list[int] = []
    rounds = drafted = accepted = 0
    while len(out) < response_tokens:
        draft = sides.draft(base + out, min(n_draft, response_tokens - len(out)))
        verdict = sides.verify(base + out, draft)  # no draft (the drafter ended): the verifier's next token
        rounds, drafted, accepted = rounds + 1, drafted + len(draft), accepted + verdict["accepted"]
        out.extend(draft[: verdict["accepted"]])
        if verdict["next"] == "eos":
            return out[:response_tokens], rounds, drafted, accepted, "stop"
        if len(out) < response_tokens:
            out.append(int(verdict["next"]))
    return out[:response_tokens], rounds, drafted, accepted, "length"


# --- the replica side of the session form ---------------------------------------------------

def draft_in_session(model: str, session_id: str, context: Sequence[int], n: int) -> tuple[list[int], int]:
    """Up to ``n`` greedy tokens after ``context`` as a turn of the drafter's session (the
    common prefix with its KV is kept); the tokens and how many were prefilled."""
    import workbench as wb

    r = wb.complete(model, list(context), session_id=session_id, cache_scope=SPEC_SCOPE, response_tokens=n,
                    temperature=0.0, cache=False)
    return list(r.tokens), r.stats.prefilled_tokens


def verify_in_session(model: str, session_id: str, context: Sequence[int],
                      candidates: Sequence[int]) -> tuple[dict[str, Any], int]:
    """``wb.verify`` as a turn of the verifier's session: one pass over ``context`` +
    ``candidates`` (none: just the next token), only what its KV does not hold prefilled;
    the verdict and how many tokens were prefilled. A pass that reused past the context's
    last token (no argmax for the first candidate) is verified again without the session."""
    import workbench as wb
    from .. import registry
    from ..generation import collect, token_list
    from ..engine.stream import Stream
    from ..options import RequestOptions, build

    eng = registry.get(model)
    ctx, cands = token_list(eng, context, "prefix_tokens"), token_list(eng, candidates, "candidates")
    opts = build(RequestOptions, None, response_tokens=1, cache=False, session_id=session_id, cache_scope=SPEC_SCOPE)
    req = eng.submit(ctx + cands, opts, verify_from=len(ctx) - 1)
    stats = collect(Stream(eng, req)).stats
    argmax = list(req.argmax)
    if len(argmax) != len(cands) + 1:
        if not cands:
            own = wb.draft_tokens(model, ctx, max=1)
            return {"accepted": 0, "next": own[0] if own else "eos"}, len(ctx) + stats.prefilled_tokens
        return wb.verify(model, ctx, cands), len(ctx) + len(cands) + stats.prefilled_tokens
    n_ok = 0  # the acceptance rule of wb.verify
    while n_ok < len(cands) and argmax[n_ok] == cands[n_ok]:
        n_ok += 1
    nxt = argmax[n_ok]
    return {"accepted": n_ok, "next": "eos" if eng.model.is_eog(nxt) else nxt}, stats.prefilled_tokens
