"""Thinking on raw stream() / complete() (no chat rendering), on the real default model.

SmolLM2's template has no thinking tags, so the markers are given explicitly: the model
answers the ChatML prompt below with 'The capital of France is Paris.', and with the
(artificial) markers 'The capital' .. 'France is' the block is ' of '. The engine sees an
ordinary request: the tokens are those of the plain completion.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest

import workbench as wb
from workbench import _native, registry
from workbench.chat import TemplateCache
from workbench.chat.raw_thinking import ThinkingResult
from workbench.errors import InvalidOption, RequestTimeout, UnknownOption

pytestmark = pytest.mark.model

PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
          "What is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
MARKERS = {"start": "The capital", "end": "France is"}


def texts(events, kind):
    return "".join(e.text for e in events if isinstance(e, kind))


@pytest.mark.load(thinking_signing_key="k3y")
def test_a_raw_stream_splits_the_block_out_and_signs_it(fresh_model):
    m = fresh_model
    plain = wb.complete(m, PROMPT, response_tokens=16)
    assert plain.reply.startswith("The capital of France is Paris")
    events = list(wb.stream(m, PROMPT, response_tokens=16, thinking=True, thinking_markers=MARKERS))
    ends = [e for e in events if isinstance(e, wb.ThinkingEnd)]
    done = events[-1]
    assert texts(events, wb.Thinking) == "of " and len(ends) == 1
    assert ends[0].signature == hmac.new(b"k3y", b"of ", hashlib.sha256).hexdigest()
    assert texts(events, wb.Token).startswith("Paris") and "France is" not in texts(events, wb.Token)
    assert isinstance(done, wb.Done) and done.reply == plain.reply          # the raw reply is untouched
    assert [e.id for e in events if isinstance(e, wb.TokenId)] == list(plain.tokens)
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("Thinking") < kinds.index("ThinkingEnd") < kinds.index("Token")


def test_complete_with_thinking_returns_the_block_and_the_answer(model):
    plain = wb.complete(model, PROMPT, response_tokens=16)
    r = wb.complete(model, PROMPT, response_tokens=16, thinking="enabled", thinking_markers=MARKERS)
    assert isinstance(r, ThinkingResult) and isinstance(r, wb.CompletionResult)
    assert r.thinking == "of " and r.content.startswith("Paris") and r.thinking_signature == ""
    assert r.reply == plain.reply and r.tokens == plain.tokens and r.finish_reason == plain.finish_reason
    off = wb.complete(model, PROMPT, response_tokens=16, thinking=False)
    assert type(off) is wb.CompletionResult and off.tokens == plain.tokens


def test_a_prompt_that_opens_the_block_thinks_from_the_first_token(model):
    r = wb.complete(model, PROMPT + "The capital", response_tokens=12, thinking=True, thinking_markers=MARKERS)
    assert r.reply.startswith(" of France is Paris")
    assert r.thinking == "of " and r.content.startswith("Paris")


def test_the_budget_closes_the_block_for_the_model(model):
    """thinking_budget_tokens sets reasoning_budget: llama.cpp forces the end marker after 2
    tokens inside the block, so the model continues from a closed block."""
    markers = {"start": "The", "end": "Paris"}
    r = wb.complete(model, PROMPT, response_tokens=16, thinking=True, thinking_budget_tokens=2,
                    thinking_markers=markers)
    paris = wb.tokenize(model, "Paris", add_special=False)
    assert r.thinking == "capital of"                        # the two tokens after the start marker
    assert list(r.tokens[3:3 + len(paris)]) == paris and r.reply.startswith("The capital ofParis")
    assert r.content.strip() == r.reply[len("The capital ofParis"):].strip()   # the forced marker not shown
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, PROMPT, thinking=True, thinking_budget_tokens=2, thinking_markers=markers,
                    reasoning_budget={"tokens": 3, "end": "x"})
    assert e.value.key == "reasoning_budget"


def test_a_control_token_end_marker_is_shown_to_the_splitter(model):
    r = wb.complete(model, PROMPT, response_tokens=8, thinking=True, thinking_budget_tokens=2,
                    thinking_markers={"start": "The", "end": "<|im_start|>"})
    assert r.thinking == "capital of" and "<|im_start|>" in r.reply and "<|im_start|>" not in r.content


@pytest.mark.load(thinking_markers=MARKERS)
def test_the_load_options_markers_serve_and_the_requests_win(fresh_model):
    r = wb.complete(fresh_model, PROMPT, response_tokens=16, thinking=True)
    assert r.thinking == "of "
    own = wb.complete(fresh_model, PROMPT, response_tokens=16, thinking=True,
                      thinking_markers={"start": "The", "end": "of"})
    assert own.thinking == "capital " and own.content.startswith("France is Paris")


def test_a_timed_out_thinking_stream_raises(model):
    with pytest.raises(RequestTimeout):
        wb.complete(model, PROMPT, response_tokens=16, thinking=True, thinking_markers=MARKERS, token_timeout_s=1e-4)


def test_cancel_takes_a_thinking_stream(model):
    s = wb.stream(model, PROMPT, response_tokens=4000, ignore_eos=True, thinking=True, thinking_markers=MARKERS)
    assert isinstance(next(s), wb.TokenId)
    wb.cancel(s)
    assert s.result().finish_reason == "cancelled"


def test_bad_thinking_options_are_refused(model):
    with pytest.raises(InvalidOption) as e:
        wb.stream(model, PROMPT, thinking=True)        # SmolLM2's template has no thinking tags
    assert e.value.key == "thinking_markers" and "template" in str(e.value)
    cases = [({"thinking": "sometimes"}, "thinking"), ({"thinking": 1}, "thinking"),
             ({"thinking_budget_tokens": 3}, "thinking_budget_tokens"),
             ({"thinking_markers": MARKERS}, "thinking_markers"),
             ({"thinking": True, "thinking_markers": {"start": "", "end": "x"}}, "thinking_markers"),
             ({"thinking": True, "thinking_markers": {"end": "x"}}, "thinking_markers"),
             ({"thinking": True, "thinking_markers": MARKERS, "thinking_budget_tokens": -1}, "thinking_budget_tokens")]
    for opts, key in cases:
        with pytest.raises(InvalidOption) as e:
            wb.stream(model, PROMPT, **opts)
        assert e.value.key == key, opts
    with pytest.raises(UnknownOption) as u:
        wb.stream(model, PROMPT, thinkng=True)
    assert "'thinking'" in str(u.value)


TEMPLATES = Path(__file__).resolve().parents[2] / "vendor" / "llama.cpp" / "models" / "templates"


@pytest.mark.skipif(not (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").exists(), reason="llama.cpp's template files")
def test_markers_come_from_the_models_thinking_template(fresh_model):
    """No reasoning model is available here, so the fresh model's parsed template is set to
    Qwen3's (as if its GGUF carried it): the markers are then read from the template
    (<think> / </think>, through llama.cpp common), with no thinking_markers anywhere."""
    eng = registry.get(fresh_model)
    qwen3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    eng.attachment("chat_templates", TemplateCache).put(None, _native.ChatTemplates(eng.model, qwen3))
    prompt = PROMPT + "<think>\n"                     # the prompt opens the block
    free = wb.complete(fresh_model, prompt, response_tokens=3)
    r = wb.complete(fresh_model, prompt, response_tokens=16, thinking=True, thinking_budget_tokens=3)
    assert r.tokens[:3] == free.tokens[:3] and r.thinking == free.reply.strip()
    end = wb.tokenize(fresh_model, "</think>", add_special=False)
    assert list(r.tokens[3:3 + len(end)]) == end     # forced by the budget, from the template's end tag
    assert "</think>" in r.reply and "</think>" not in r.content and r.thinking_signature == ""
