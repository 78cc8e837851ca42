"""The save rule (cache/save_rule.py): the one definition of which rows a request saves,
called by the engine's SavePoints and by the eviction lab's plan."""

from __future__ import annotations

from workbench.cache.save_rule import AGENT_PREFIX, CHECKPOINT, PROMPT, SaveSettings, finish_tokens, prefill_saves
from workbench.cache.types import HitKind, reusable

DEFAULT = SaveSettings()


def test_a_long_cold_prompt_saves_checkpoints_and_its_prompt_row() -> None:
    assert prefill_saves(5000, 0, DEFAULT) == [(2048, CHECKPOINT), (4096, CHECKPOINT), (4999, PROMPT)]
    assert prefill_saves(4097, 0, DEFAULT) == [(2048, CHECKPOINT), (4096, PROMPT)]   # no checkpoint at n - 1


def test_only_positions_past_the_reused_prefix_are_saved() -> None:
    assert prefill_saves(5000, 2048, DEFAULT) == [(4096, CHECKPOINT), (4999, PROMPT)]
    assert prefill_saves(5000, 4999, DEFAULT) == []   # an exact hit saves nothing during prefill


def test_the_checkpoint_band_and_interval() -> None:
    band = SaveSettings(checkpoint_every=1000, checkpoint_min=1500, checkpoint_max=3000)
    assert [p for p, k in prefill_saves(5000, 0, band) if k == CHECKPOINT] == [2000, 3000]
    assert prefill_saves(5000, 0, SaveSettings(checkpoint_every=None)) == [(4999, PROMPT)]


def test_short_prompts_and_prompts_found_by_their_own_row() -> None:
    assert prefill_saves(16, 0, DEFAULT) == []          # 15 tokens: under cache_min_tokens
    assert prefill_saves(17, 0, DEFAULT) == [(16, PROMPT)]
    assert prefill_saves(17, 0, DEFAULT, prompt_found=True) == []
    assert prefill_saves(1, 0, SaveSettings(min_tokens=0)) == []   # nothing before the last token


def test_the_agent_prefix_is_saved_past_start_and_wins_its_position() -> None:
    assert prefill_saves(3000, 0, DEFAULT, agent=2048) == [(2048, AGENT_PREFIX), (2999, PROMPT)]
    assert prefill_saves(3000, 0, DEFAULT, agent=2999) == [(2048, CHECKPOINT), (2999, AGENT_PREFIX)]
    # an agent prefix that is the whole prompt stands for the prompt row
    assert prefill_saves(3000, 0, DEFAULT, agent=3000) == [(2048, CHECKPOINT), (3000, AGENT_PREFIX)]
    # already in the KV: not saved again (the engine pins the stored row)
    assert prefill_saves(3000, 2500, DEFAULT, agent=2048) == [(2999, PROMPT)]


def test_a_finish_row_holds_what_was_decoded_beyond_the_prompt() -> None:
    assert finish_tokens(100, 112) == 112
    assert finish_tokens(100, 100) == 0    # a one-token reply: its token was never decoded
    assert finish_tokens(100, 99) == 0


def test_the_n_minus_one_rule_and_the_hit_kinds_agree() -> None:
    assert reusable(10) == 9
    assert HitKind.of(reusable(10), 10) is HitKind.EXACT
    assert HitKind.of(reusable(10) - 1, 10) is HitKind.PARTIAL
    assert HitKind.of(0, 10) is HitKind.COLD
