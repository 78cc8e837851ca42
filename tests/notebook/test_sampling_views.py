"""logprobs= in the notebook: views.tokens, the live widget coloured by probability and
`%%generate --logprobs N`."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd
import pytest

import workbench as wb
from .conftest import magics_of
from workbench.engine.events import Token, TokenId, TopLogprob
from workbench.errors import InvalidOption
from workbench.notebook import transcript, views
from workbench.notebook.results import prob_span, reply_html
from workbench.notebook.widgets import GenerationWidget

PROMPT = "The capital of France is"


@pytest.mark.model
def test_tokens_view_lists_each_token_with_its_alternatives(model: str) -> None:
    r = wb.complete(model, PROMPT, response_tokens=6, logprobs=3, temperature=1.0, seed=5)
    df = views.tokens(r)
    assert list(df.index) == list(range(6)) and list(df["id"]) == list(r.tokens)
    assert "".join(df["text"]) == r.reply
    assert df["prob"].tolist() == pytest.approx([math.exp(lp.logprob) for lp in r.logprobs])
    for row, lp in zip(df.itertuples(), r.logprobs):
        assert len(row.alternatives) == 3 and row.alternatives[0][1] >= row.alternatives[-1][1]
        ids = [t.id for t in lp.top]
        assert row.rank == ids.index(lp.id) + 1 if lp.id in ids else pd.isna(row.rank)
    with pytest.raises(InvalidOption, match="logprobs=N"):
        views.tokens(wb.complete(model, PROMPT, response_tokens=2))


def test_the_widget_colours_each_piece_by_its_probability() -> None:
    w = GenerationWidget("m", throttle_s=0.0)
    top = (TopLogprob(1, "Hello", -0.1),)
    w.feed(TokenId(1, logprob=-0.1, top_logprobs=top))
    w.feed(Token("Hello", logprob=-0.1))
    w.feed(TokenId(2, logprob=-2.0))
    w.feed(Token(" world", logprob=-2.0))
    assert w.reply.value == reply_html("Hello world", probs=[("Hello", math.exp(-0.1)), (" world", math.exp(-2.0))])
    alphas = [float(a) for a in re.findall(r"rgba\(220,53,69,([0-9.]+)\)", w.reply.value)]
    assert len(alphas) == 2 and alphas[1] > alphas[0]          # the unlikely piece is redder
    assert 'title="p=0.905"' in w.reply.value and 'title="p=0.135"' in w.reply.value
    plain = GenerationWidget("m", throttle_s=0.0)
    plain.feed(TokenId(1))
    plain.feed(Token("Hi"))
    assert "wb-prob" not in plain.reply.value
    assert prob_span("<b>", None) == "&lt;b&gt;"


@pytest.mark.model
def test_a_live_stream_with_logprobs_is_coloured_to_the_end(model: str) -> None:
    w = GenerationWidget(model, throttle_s=0.0)
    result = transcript.consume(wb.stream(model, PROMPT, response_tokens=12, logprobs=2), w)
    pieces = w.transcript.prob_segments()
    assert pieces is not None and "".join(t for t, _ in pieces) == result.reply
    assert w.reply.value.count('class="wb-prob"') == len(pieces)


@pytest.mark.model
def test_generate_logprobs_flag(ip: Any, model: str) -> None:
    magics_of(ip).current_model = model
    assert ip.run_cell(f"%%generate --max-tokens 5 --logprobs 2 --as nbtest_lp\n{PROMPT}").success
    res = ip.user_ns["nbtest_lp"]
    assert res.logprobs is not None and len(res.logprobs) == len(res.tokens)
    assert all(len(lp.top) == 2 for lp in res.logprobs)
    assert len(views.tokens(res)) == len(res.tokens)
    failed = ip.run_cell("%%generate --logprobs 21\nHi")
    assert "logprobs" in str(failed.error_in_exec)
