"""What of a draft model's draft the target can still use, and where p_min cuts it: the
rules engine/draft_model.py applies to a draft that came back while the target went on."""

from __future__ import annotations

import math

from workbench.engine.draft_model import confident, continuation, extends


def test_a_draft_made_for_earlier_tokens_gives_what_follows_the_tokens_now():
    made_for, draft = [1, 2, 3], [4, 5, 6, 7]
    assert continuation([1, 2, 3], made_for, draft) == [4, 5, 6, 7]
    assert continuation([1, 2, 3, 4, 5], made_for, draft) == [6, 7]      # the target emitted 4, 5 meanwhile
    assert continuation([1, 2, 3, 4, 5, 6, 7], made_for, draft) == []
    assert continuation([1, 2, 3, 4, 5], made_for, [4]) == []            # the draft model is behind


def test_a_draft_the_target_has_left_is_stale():
    made_for, draft = [1, 2, 3], [4, 5, 6]
    assert continuation([1, 2, 3, 9], made_for, draft) is None             # the target chose 9, not 4
    assert continuation([1, 2, 3, 4, 5, 6, 7], made_for, draft) == []      # past its end, none left
    assert continuation([1, 2, 3, 4, 5, 9], made_for, draft) is None
    assert continuation([1, 2], made_for, draft) is None
    assert continuation([1, 8, 3], made_for, draft) is None
    assert extends([1, 2, 3, 4], [1, 2, 3]) and extends([1, 2], [1, 2]) and not extends([1, 2], [1, 2, 3])


def test_p_min_cuts_a_draft_before_its_first_unsure_token():
    tokens = [10, 11, 12, 13]
    logprobs = [math.log(p) for p in (0.9, 0.7, 0.4, 0.95)]
    assert confident(tokens, logprobs, 0.0) == tokens
    assert confident(tokens, logprobs, 0.5) == [10, 11]
    assert confident(tokens, logprobs, 0.8) == [10]
    assert confident(tokens, logprobs, 0.95) == []
    assert confident(tokens, logprobs, 0.4) == tokens          # 0.4 is not below 0.4
