"""Cross-replica speculative decoding: the draft on one replica, verification on another.

    loop until response_tokens (or the target ends the reply):
        draft   = draft replica:  draft_tokens(context, max=n_draft)     (greedy)
        verdict = verify replica: verify(context, draft)                  (one forward pass)
        keep draft[:accepted], then the verifier's own next token

Each round is two calls over the speculative primitives (workbench/speculative.py), which
run as ordinary requests and leave no KV behind, so every round prefills the context again
on both replicas: this shows the split (a small draft model's replicas feeding a large
model's, on other machines), it is not a fast path on one machine. The reply is the
verifier's greedy reply: every kept token is one its argmax chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..options import check_int

if TYPE_CHECKING:
    from .cluster import Cluster


@dataclass(slots=True, frozen=True)
class SpeculationResult:
    tokens: tuple[int, ...]
    reply: str
    rounds: int
    drafted: int
    accepted: int
    draft_replica: str
    verify_replica: str
    finish_reason: str


def speculate(verifier: Cluster, prompt: str | Sequence[int], *, response_tokens: int = 64, n_draft: int = 8,
              verify_replica: str | int = 1, draft_replica: str | int = 0,
              drafter: Cluster | None = None) -> SpeculationResult:
    """Greedy generation on ``verify_replica`` of ``verifier`` with drafts from
    ``draft_replica`` of ``drafter`` (default: the same cluster)."""
    check_int("response_tokens", response_tokens, 1)
    check_int("n_draft", n_draft, 1, 256)
    drafter = drafter or verifier
    v, d = verifier.member(verify_replica), drafter.member(draft_replica)
    base = verifier.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    out: list[int] = []
    rounds = drafted = accepted = 0
    finish = "length"
    while len(out) < response_tokens:
        want = min(n_draft, response_tokens - len(out))
        draft = drafter.call_replica(d, "draft_tokens", (base + out,), {"max": want})
        rounds += 1
        if not draft:  # the drafter ended its reply: the verifier says what comes next
            draft = verifier.call_replica(v, "draft_tokens", (base + out,), {"max": 1})
            if not draft:
                finish = "stop"
                break
            out.extend(draft)
            continue
        verdict: dict[str, Any] = verifier.call_replica(v, "verify", (base + out, draft), {})
        drafted, accepted = drafted + len(draft), accepted + verdict["accepted"]
        out.extend(draft[: verdict["accepted"]])
        if verdict["next"] == "eos":
            finish = "stop"
            break
        if len(out) < response_tokens:
            out.append(int(verdict["next"]))
    out = out[:response_tokens]
    reply = verifier.call_replica(v, "detokenize", (out,), {})
    return SpeculationResult(tuple(out), reply, rounds, drafted, accepted, d.name, v.name, finish)
