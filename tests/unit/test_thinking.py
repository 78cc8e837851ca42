"""The thinking splitter on hand-made piece sequences (no model): markers across piece
boundaries, multi-token markers, the budget, signatures."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from workbench.engine.events import Thinking, ThinkingEnd, Token
from workbench.chat.thinking import ThinkingMarkers, ThinkingSplitter, thinking_signature

THINK = ThinkingMarkers("<think>", "</think>")


def run(splitter: ThinkingSplitter, pieces: list[str]) -> list[object]:
    """Feed pieces as the engine would (a TokenId before each piece's text)."""
    out: list[object] = []
    for piece in pieces:
        splitter.count_token()
        out += splitter.feed(piece)
    return out + splitter.finish()


def collapse(events: list[object]) -> list[tuple[str, str]]:
    """Adjacent text events of one kind joined, for exact comparisons."""
    out: list[tuple[str, str]] = []
    for ev in events:
        kind, text = type(ev).__name__, getattr(ev, "text", getattr(ev, "signature", ""))
        if out and out[-1][0] == kind and kind in ("Thinking", "Token"):
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def test_markers_split_across_pieces_are_recognised():
    pieces = ["<th", "ink>", "\nLet me", " see.", "</", "thi", "nk>", "\n\nParis", "."]
    ev = collapse(run(ThinkingSplitter(THINK), pieces))
    assert ev == [("Thinking", "Let me see."), ("ThinkingEnd", ""), ("Token", "Paris.")]


def test_each_piece_is_released_as_soon_as_it_cannot_be_a_marker():
    sp = ThinkingSplitter(THINK)
    assert sp.feed("<think>") == []
    assert sp.feed("abc") == [Thinking("abc")]
    assert sp.feed("</th") == []                      # could be the end marker: held
    assert sp.feed("ey") == [Thinking("</they")]       # it was not
    assert sp.feed("</think>ok") == [ThinkingEnd(""), Token("ok")]


def test_multi_token_markers():
    m = ThinkingMarkers("[[begin reasoning]]", "[[end reasoning]]")
    pieces = ["[[", "begin", " reason", "ing]]", "a", "b", "[[end", " reasoning", "]]", "answer"]
    ev = collapse(run(ThinkingSplitter(m), pieces))
    assert ev == [("Thinking", "ab"), ("ThinkingEnd", ""), ("Token", "answer")]


def test_no_block_passes_text_through_unchanged():
    pieces = ["  Hello", " <think>", " world"]
    ev = collapse(run(ThinkingSplitter(THINK), pieces))
    assert ev == [("Token", "  Hello <think> world")]


def test_prompt_that_opens_the_block():
    ev = collapse(run(ThinkingSplitter(THINK, inside=True), ["\nhmm", "</think>", "\n\nyes"]))
    assert ev == [("Thinking", "hmm"), ("ThinkingEnd", ""), ("Token", "yes")]


def test_unterminated_block_is_closed_at_the_end():
    sp = ThinkingSplitter(THINK)
    ev = collapse(run(sp, ["<think>", "still ", "going </thi"]))
    assert ev == [("Thinking", "still going </thi"), ("ThinkingEnd", "")]
    assert sp.signature == ""


def test_signature_is_hmac_sha256_of_the_thinking_bytes():
    key = b"secret"
    sp = ThinkingSplitter(THINK, key=key)
    ev = run(sp, ["<think>", "caf", "\u00e9 ", "ok", "</think>", "done"])
    ends = [e for e in ev if isinstance(e, ThinkingEnd)]
    assert len(ends) == 1
    expected = hmac.new(key, "caf\u00e9 ok".encode(), hashlib.sha256).hexdigest()
    assert ends[0].signature == expected == thinking_signature(key, sp.thinking)
    assert thinking_signature(None, "x") == "" and thinking_signature(b"", "x") == ""


def test_budget_closes_the_block_and_routes_the_rest_as_text():
    sp = ThinkingSplitter(THINK, budget=3)
    pieces = ["<think>", "a", "b", "c", "d", "e", "</think>", "\n", "answer"]
    ev = collapse(run(sp, pieces))
    assert ev == [("Thinking", "abc"), ("ThinkingEnd", ""), ("Token", "de\nanswer")]
    assert sp.tokens == 3 and sp.cut_at == len("<think>abc")
    reply = "".join(pieces)
    # the parser sees the end marker moved to the cut, the model's own one dropped
    assert sp.reply_for_parser(reply) == "<think>abc</think>de\nanswer"


def test_budget_zero_closes_at_once():
    ev = collapse(run(ThinkingSplitter(THINK, budget=0), ["<think>", "x", "</think>", "y"]))
    assert ev == [("ThinkingEnd", ""), ("Token", "xy")]


def test_token_ids_before_the_block_do_not_count():
    sp = ThinkingSplitter(THINK, budget=2)
    ev = collapse(run(sp, ["  ", "<think>", "a", "b", "c"]))
    assert ev[0] == ("Thinking", "ab") and ev[1] == ("ThinkingEnd", "") and ev[2] == ("Token", "c")


def test_end_marker_required():
    with pytest.raises(ValueError):
        ThinkingSplitter(ThinkingMarkers("<t>", ""))
