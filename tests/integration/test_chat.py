"""Chat turns on the real default model (SmolLM2-135M-Instruct, ChatML template)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

import pytest

import workbench as wb
from workbench.errors import InvalidOption, NotLoaded, UnknownOption

pytestmark = pytest.mark.model

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
FRANCE = {"role": "user", "content": "What is the capital of France?"}


def test_chat_round_trip_answers_paris(model):
    r = wb.chat(model, [SYSTEM, FRANCE])
    assert isinstance(r, wb.ChatResult) and isinstance(r, wb.CompletionResult)
    assert r.message["role"] == "assistant" and "Paris" in r.message["content"]
    assert r.content == r.message["content"] and r.tool_calls == [] and r.reasoning_content is None
    assert r.finish_reason == "stop" and r.parse_error is None
    assert r.stats.generated_tokens == len(r.tokens) > 0


def test_chat_is_the_rendered_prompt_completed(model):
    """chat() = render with the template + the ordinary greedy completion of its tokens."""
    msgs = [FRANCE]  # the template adds SmolLM's own system prompt
    rendered = wb.render_chat_template(model, msgs)
    assert rendered.prompt.startswith("<|im_start|>system\n") and rendered.prompt.endswith("<|im_start|>assistant\n")
    assert rendered.tokens == wb.tokenize(model, rendered.prompt)
    r = wb.chat(model, msgs, response_tokens=24)
    plain = wb.complete(model, rendered.tokens, response_tokens=24)
    assert r.tokens == plain.tokens and r.content == plain.reply
    assert r.context_tokens[: len(rendered.tokens)] == tuple(rendered.tokens)


def test_multi_turn_uses_the_history(model):
    msgs = [SYSTEM, FRANCE]
    first = wb.chat(model, msgs, session_id="chat-multi")
    msgs += [first.message, {"role": "user", "content": "What is the capital of Germany?"}]
    second = wb.chat(model, msgs, session_id="chat-multi")
    assert "Berlin" in second.content
    rendered = wb.render_chat_template(model, msgs)
    assert "The capital of France is Paris" in rendered.prompt  # the first answer is in the second prompt
    wb.end_session(model, "chat-multi")


def test_chat_stream_events_end_with_the_parsed_message(model):
    events = list(wb.chat_stream(model, [SYSTEM, FRANCE]))
    *body, last = events
    assert isinstance(last, wb.ChatDone) and isinstance(last, wb.Done)
    assert {type(e) for e in body} <= {wb.Token, wb.TokenId}
    text = "".join(e.text for e in body if isinstance(e, wb.Token))
    assert text == last.reply and last.message["content"] == text
    assert [e.id for e in body if isinstance(e, wb.TokenId)] == list(last.tokens)


def test_chat_stream_async(model):
    async def run():
        out = []
        async for ev in wb.chat_stream(model, [SYSTEM, FRANCE], response_tokens=8):
            out.append(ev)
        return out

    events = asyncio.run(run())
    assert isinstance(events[-1], wb.ChatDone) and events[-1].finish_reason in ("stop", "length")


def test_chat_stream_cancel(model):
    s = wb.chat_stream(model, [SYSTEM, {"role": "user", "content": "Write a long story about a dragon."}],
                       response_tokens=400)
    for ev in s:
        if isinstance(ev, wb.Token):
            s.cancel()
            break
    last = list(s)[-1]
    assert isinstance(last, wb.ChatDone) and last.finish_reason == "cancelled"


def test_template_stop_strings_and_user_options_pass_through(model):
    r = wb.chat(model, [SYSTEM, FRANCE], stop_sequences=["Paris"], response_tokens=32)
    assert r.finish_reason == "stop" and r.stop_sequence == "Paris" and "Paris" not in r.content


def test_chat_errors_are_named(model):
    with pytest.raises(UnknownOption, match="tool_chioce"):
        wb.chat(model, [FRANCE], tool_chioce="auto")
    with pytest.raises(InvalidOption) as e:
        wb.chat(model, [{"role": "user", "content": 3}])
    assert e.value.key == "messages[0].content"
    with pytest.raises(InvalidOption) as e:
        wb.chat(model, [FRANCE], thinking="sometimes")
    assert e.value.key == "thinking"
    with pytest.raises(InvalidOption) as e:
        wb.chat(model, [FRANCE], thinking_budget_tokens=8)
    assert e.value.key == "thinking_budget_tokens"
    with pytest.raises(InvalidOption) as e:
        wb.chat(model, [FRANCE], temperature=-1)
    assert e.value.key == "temperature"
    with pytest.raises(NotLoaded):
        wb.chat("no-such-model", [FRANCE])


MARKERS = {"start": "The capital", "end": "France is"}


@pytest.mark.load(thinking_markers=MARKERS, thinking_signing_key="k3y")
def test_thinking_markers_split_the_real_stream(fresh_model):
    """Multi-token markers on real token boundaries: the model answers 'The capital of France
    is Paris.', so with these (artificial) markers ' of ' is the thinking block."""
    events = list(wb.chat_stream(fresh_model, [SYSTEM, FRANCE], thinking="enabled"))
    thinking = "".join(e.text for e in events if isinstance(e, wb.Thinking))
    ends = [e for e in events if isinstance(e, wb.ThinkingEnd)]
    text = "".join(e.text for e in events if isinstance(e, wb.Token))
    done = events[-1]
    assert thinking == "of " and len(ends) == 1
    assert ends[0].signature == hmac.new(b"k3y", b"of ", hashlib.sha256).hexdigest() == done.thinking_signature
    assert text.startswith("Paris") and "France is" not in text
    assert done.message["reasoning_content"] == "of " and done.message["content"] == text
    assert done.reply.startswith("The capital of France is Paris")   # the raw reply is untouched
    # thinking disabled: no Thinking events, the text as generated
    plain = list(wb.chat_stream(fresh_model, [SYSTEM, FRANCE]))
    assert not any(isinstance(e, (wb.Thinking, wb.ThinkingEnd)) for e in plain)


@pytest.mark.load(thinking_markers={"start": "The", "end": "Paris"})
def test_thinking_budget_closes_the_block(fresh_model):
    """The budget closes the block for the consumer and for the model: llama.cpp's
    reasoning-budget sampler forces the end marker right after the budget, so the model
    continues from a closed block (its KV holds the marker)."""
    r = wb.chat_stream(fresh_model, [SYSTEM, FRANCE], thinking="enabled", thinking_budget_tokens=2)
    events = list(r)
    kinds = [type(e).__name__ for e in events]
    first_end = kinds.index("ThinkingEnd")
    thinking = "".join(e.text for e in events if isinstance(e, wb.Thinking))
    after = "".join(e.text for e in events[first_end:] if isinstance(e, wb.Token))
    done = events[-1]
    assert thinking == "capital of"                  # the two tokens after the start marker
    assert kinds.count("ThinkingEnd") == 1 and "Thinking" not in kinds[first_end:]
    paris = wb.tokenize(fresh_model, "Paris", add_special=False)
    assert list(done.tokens[3:3 + len(paris)]) == paris  # forced: "The", 2 budget tokens, then the marker
    assert done.reply.startswith("The capital ofParis")  # (the model itself would say " of France is")
    assert after.strip() == done.reply[len("The capital ofParis"):].strip()  # the marker is not shown
    assert done.message["reasoning_content"] == "capital of" and done.message["content"] == after
    assert events[-1].thinking_signature == ""        # no signing key: unsigned


def test_reasoning_budget_forces_the_end_marker(model):
    """The request option under thinking_budget_tokens, on a plain completion: start '' means
    the reply opens inside the block; after 3 tokens the (multi-token) end marker is forced."""
    prompt = "The capital of France is"
    end = " ZZQ"
    ids = wb.tokenize(model, end, add_special=False)
    assert len(ids) >= 2
    free = wb.complete(model, prompt, response_tokens=10)
    assert end not in free.reply
    r = wb.complete(model, prompt, response_tokens=10, reasoning_budget={"tokens": 3, "start": "", "end": end})
    assert r.tokens[:3] == free.tokens[:3] and list(r.tokens[3:3 + len(ids)]) == ids
    marked = wb.complete(model, prompt, response_tokens=10,
                         reasoning_budget={"tokens": 3, "start": "", "end": end, "message": " Enough."})
    assert marked.tokens[:3] == free.tokens[:3]
    assert " Enough." + end in marked.reply
    for bad in ({"tokens": -1, "end": end}, {"tokens": 3}, {"tokens": 3, "end": ""}, {"tokens": 3, "end": "x", "x": 1},
                "3"):
        with pytest.raises(InvalidOption) as e:
            wb.complete(model, prompt, response_tokens=4, reasoning_budget=bad)
        assert e.value.key == "reasoning_budget"


def test_render_special_shows_control_tokens(model):
    """Control tokens render as '' unless asked for (llama.cpp's `special`); here one is
    forced into the reply by the budget sampler so the test does not depend on the model."""
    opts = dict(response_tokens=6, reasoning_budget={"tokens": 2, "start": "", "end": "<|im_start|>"})
    hidden = wb.complete(model, "The capital of France is", **opts)
    shown = wb.complete(model, "The capital of France is", render_special=["<|im_start|>"], **opts)
    every = wb.complete(model, "The capital of France is", render_special=True, **opts)
    assert hidden.tokens == shown.tokens == every.tokens and hidden.tokens[2] == wb.tokenize(model, "<|im_start|>")[-1]
    assert "<|im_start|>" not in hidden.reply and shown.reply.count("<|im_start|>") >= 1
    assert shown.reply == every.reply and shown.reply.replace("<|im_start|>", "") == hidden.reply
    with pytest.raises(InvalidOption) as e:
        wb.complete(model, "Hi", render_special=["hello"])
    assert e.value.key == "render_special" and "'hello' is not one" in str(e.value)


@pytest.mark.load(thinking_markers={"start": "The", "end": "<|im_start|>"})
def test_a_control_token_end_marker_is_seen_by_the_splitter(fresh_model):
    r = wb.chat(fresh_model, [SYSTEM, FRANCE], thinking="enabled", thinking_budget_tokens=2, response_tokens=8)
    assert r.reasoning_content == "capital of" and "<|im_start|>" in r.reply
    assert "<|im_start|>" not in r.content


def test_multi_turn_chat_hits_the_prefix_cache_turn_after_turn(model):
    msgs = [SYSTEM, {"role": "user", "content": "Name a red fruit."}]
    prev = wb.chat(model, msgs, response_tokens=16, cache_scope="chat-turns")
    assert prev.stats.cache_hit_kind == "cold" and prev.stats.cache_delta["read"] == 0
    for question in ("And a yellow one?", "And a green one?"):
        msgs = msgs + [prev.message, {"role": "user", "content": question}]
        r = wb.chat(model, msgs, response_tokens=16, cache_scope="chat-turns")
        read = r.stats.cache_delta["read"]
        assert r.stats.cache_hit_kind == "partial" and read == r.stats.prompt_tokens - r.stats.prefilled_tokens
        # at least the previous turn's prompt (its row ends one token short) came from the cache
        assert read >= prev.stats.prompt_tokens - 1
        prev = r


def test_unload_frees_the_models_templates(model, model_path):
    from workbench import registry
    from workbench.chat import TemplateCache

    other = wb.load_model(model_path=str(model_path), n_seq_max=1)
    wb.render_chat_template(other, [FRANCE])
    wb.embed(other, "hello")
    templates = registry.get(other).attachment("chat_templates", TemplateCache)
    assert templates.get(None) is not None
    wb.unload(other)                                  # frees its templates and embedding contexts with it
    assert templates.get(None) is None
    with pytest.raises(NotLoaded):
        wb.render_chat_template(other, [FRANCE])
    assert "Paris" in wb.chat(model, [SYSTEM, FRANCE]).content


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module", params=["0.5B", "1.5B"])
def qwen_coder(request):
    from .heavy_models import QWEN_CODER_05B, QWEN_CODER_15B, fetch_chunked

    spec = {"0.5B": QWEN_CODER_05B, "1.5B": QWEN_CODER_15B}[request.param]
    mid = wb.load_model(model_path=str(fetch_chunked(spec)), model_id=f"qwen-coder-{request.param}",
                        n_ctx=4096, n_seq_max=2)
    yield mid
    wb.unload(mid)


ASK = {"role": "user", "content": "What is the weather like in Paris right now?"}


@pytest.mark.heavy
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_call_with_qwen_coder(qwen_coder, tool_choice):
    """Qwen2.5-Coder-0.5B and 1.5B-Instruct: the template lists the tools in the system
    prompt; a required call opens the reply with the template's call marker ("<tool_call>"),
    the template's grammar constrains the rest and llama.cpp's parser reads the call."""
    rendered = wb.render_chat_template(qwen_coder, [ASK], tools=[WEATHER], tool_choice=tool_choice)
    assert '"name": "get_weather"' in rendered.prompt and rendered.prompt.rstrip().endswith("<tool_call>")
    r = wb.chat(qwen_coder, [ASK], tools=[WEATHER], tool_choice=tool_choice, response_tokens=64)
    assert r.parse_error is None and r.finish_reason == "stop", r.reply
    [call] = r.tool_calls
    assert call["name"] == "get_weather" and list(call["arguments"]) == ["city"]
    assert call["arguments"]["city"].lower() == "paris" and call["id"].startswith("call_")
    assert r.content == ""
    # the parsed call and its result render back into the next turn's prompt
    follow = [ASK, r.message, {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}]
    prompt = wb.render_chat_template(qwen_coder, follow, tools=[WEATHER]).prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


@pytest.mark.heavy
def test_auto_tool_choice_leaves_the_choice_to_the_model(qwen_coder):
    """With 'auto' nothing is forced: these small models answer greedily with the call as
    bare or fenced JSON, which the template's format does not define, so it stays content."""
    r = wb.chat(qwen_coder, [ASK], tools=[WEATHER], response_tokens=64)
    assert r.finish_reason == "stop" and r.tool_calls == []
    assert "get_weather" in r.content
    opened = wb.chat(qwen_coder, [ASK], tools=[WEATHER], tool_choice="required", tool_call_prefill=False,
                     response_tokens=32)
    assert opened.tool_calls == []     # llama.cpp's required grammar lets text come first


def test_a_huge_message_is_refused_before_tokenising(model):
    """~2 M characters of chat were rendered, then tokenised for seconds (llama.cpp's special
    token split is quadratic) only to be refused for n_ctx."""
    import time

    from workbench.errors import ContextOverflow

    started = time.perf_counter()
    with pytest.raises(ContextOverflow, match="refused before tokenising"):
        wb.chat(model, [{"role": "user", "content": "<|im_start|> word " * 110_000}], response_tokens=1)
    assert time.perf_counter() - started < 1.0
    assert wb.chat(model, [{"role": "user", "content": "Hi"}], response_tokens=1).finish_reason == "length"
