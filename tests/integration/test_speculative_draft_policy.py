"""A draft model's engine under the adaptive policy, on the real default model as both
target and draft: while the policy is off for a request the draft engine does nothing for
it (its draft request is cancelled, none is asked for but a probe's one draft), its time
is charged to speculation, and the reply is plain greedy decoding's. What a user notices:
a speculative request whose drafts do not pay leaves the draft model idle.

The on / off decisions are scripted (a SpecPolicy whose next_length follows a script) so
that the engine's side is tested whatever this machine's timings; the policy's own
decisions are tests/unit/test_spec_policy_draft_model.py's.
"""

from __future__ import annotations

import pytest

import workbench as wb
from workbench import registry
from workbench.engine import speculation
from workbench.engine.spec_policy import SpecPolicy

pytestmark = pytest.mark.model

STORY = ("<|im_start|>user\nWrite a long story about a dragon who learns to bake bread.<|im_end|>\n"
         "<|im_start|>assistant\n")
N = 96
PROBE_STEPS = 4


@pytest.fixture(scope="module")
def target(model_path):
    mid = wb.load_model(model_path=str(model_path), model_id="spec-policy-target", n_seq_max=2)
    yield mid
    wb.unload(mid)


@pytest.fixture(scope="module")
def drafter(model_path):
    mid = wb.load_model(model_path=str(model_path), model_id="spec-policy-drafter", n_seq_max=2)
    yield mid
    wb.unload(mid)


def scripted(draft_model: str) -> type[SpecPolicy]:
    """On from the warm-up until the draft engine is generating a draft request (its
    prompt prefilled, so a cancel stops it within a decode), off from then on but for one
    probe of PROBE_STEPS steps 15 steps later. Each step logs (step, on, asked, the draft
    engine's decoded tokens, whether it has any request, the target's tokens so far)."""
    eng = registry.get(draft_model)

    class Scripted(SpecPolicy):
        log: list[tuple[int, bool, int, int, bool, int]] = []

        def __init__(self, n_min: int = 1, adaptive: bool = True) -> None:
            super().__init__(n_min, adaptive)
            self.i, self.off_at, self.emitted = 0, None, 0
            Scripted.log = []

        def next_length(self, cap: int, setup_s: float = 0.0) -> int:
            i, self.i = self.i, self.i + 1
            if self.off_at is None and i >= 4 and any(len(q.generated) >= 2 for q in list(eng.requests.values())):
                self.off_at = i
            self.on = self.off_at is None
            probe = self.off_at is not None and self.off_at + 15 <= i < self.off_at + 15 + PROBE_STEPS
            return 0 if i < 2 else cap if self.on else min(cap, 4) if probe else 0

        def observe(self, asked: int, drafted: int, accepted: int, draft_s: float, step_s: float | None) -> None:
            super().observe(asked, drafted, accepted, draft_s, step_s)
            self.emitted += accepted + 1
            Scripted.log.append((self.i - 1, self.on, asked, eng.counters["decoded_tokens"], bool(eng.requests),
                                 self.emitted))

    return Scripted


def test_while_off_the_draft_engine_decodes_nothing_for_the_request_but_a_probe(target, drafter, monkeypatch):
    plain = wb.complete(target, STORY, response_tokens=N, ignore_eos=True)
    policy = scripted(drafter)
    monkeypatch.setattr(speculation, "SpecPolicy", policy)
    r = wb.complete(target, STORY, response_tokens=N, ignore_eos=True, speculative={"draft": drafter, "n_max": 16})
    after = registry.get(drafter).counters["decoded_tokens"]
    s, log = r.stats.speculative, policy.log
    assert r.tokens == plain.tokens
    off = [e for e in log if not e[1]]
    assert off, "the script never switched off: the draft engine never generated"
    off_at = off[0][0]
    probe = [e for e in off if e[2] > 0]
    assert len(probe) == PROBE_STEPS
    # the draft request in flight at the switch (up to 16 tokens) was cancelled: a decode or two at most
    before_probe = [e[3] for e in off if e[0] < probe[0][0]]
    assert before_probe[-1] - before_probe[0] <= 2, log
    # the probe asked for one draft (its catch-up prefill: at most what the target emitted
    # since the first draft request, at step 2; and 4 tokens), none ahead (16 more)
    assert probe[-1][3] - before_probe[-1] <= probe[-1][5] - log[1][5] + 1 + 4 + 2, log
    # once its engine had no request left after the probe: not one token more, to the end
    idle = [e for e in off if e[0] > probe[-1][0] and not e[4]]
    assert len(idle) >= 20, log
    assert all(e[3] == idle[0][3] for e in idle) and after == idle[0][3], log
    assert s["draft_paused"] >= 1 and s["draft_requests"] >= 2 and s["draft_engine_s"] > 0
    assert s["draft_engine_tokens"] > len(wb.tokenize(target, STORY))
    print(f"off at step {off_at}; {s['draft_requests']} draft requests, {s['draft_paused']} paused, "
          f"draft engine {s['draft_engine_s']:.3f} s for {s['draft_engine_tokens']} tokens")


def test_with_the_adaptive_policy_the_draft_engine_works_only_for_drafts_it_charges(target, drafter):
    plain = wb.complete(target, STORY, response_tokens=N, ignore_eos=True)
    eng = registry.get(drafter)
    before = eng.counters["decoded_tokens"]
    r = wb.complete(target, STORY, response_tokens=N, ignore_eos=True, speculative={"draft": drafter, "n_max": 8})
    s = r.stats.speculative
    assert r.tokens == plain.tokens
    # every token the draft engine decoded was for this request's draft requests, and charged
    assert eng.counters["decoded_tokens"] - before <= s["draft_engine_tokens"]
    assert (s["draft_requests"] == 0) == (s["draft_engine_tokens"] == 0) == (s["draft_engine_s"] == 0.0)
    assert s["deferred_steps"] + s["off_steps"] + s["steps"] + s["plain_steps"] > 0
    print({k: s[k] for k in ("steps", "drafted", "accepted", "deferred_steps", "off_steps", "draft_requests",
                             "draft_paused", "draft_engine_s", "draft_engine_tokens")})
