"""The real default model through the public API: what a user notices."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import threading
import time

import pytest

import workbench as wb
from workbench.errors import (ContextOverflow, EmptyPrompt, InvalidOption, NotLoaded, UnknownOption)

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"
CHAT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"


def test_greedy_is_deterministic_and_equal_across_loads(model, model_path):
    first = wb.complete(model, PROMPT, response_tokens=24)
    again = wb.complete(model, PROMPT, response_tokens=24)
    assert first.reply == again.reply and first.tokens == again.tokens
    assert first.finish_reason == "length" and len(first.tokens) == 24
    other = wb.load_model(model_path=str(model_path), n_seq_max=1)
    try:
        assert wb.complete(other, PROMPT, response_tokens=24).tokens == first.tokens
    finally:
        wb.unload(other)


def test_result_carries_tokens_context_and_stats(model):
    r = wb.complete(model, CHAT, response_tokens=48)
    prompt = wb.tokenize(model, CHAT)
    assert r.context_tokens == tuple(prompt) + r.tokens
    assert r.finish_reason in ("stop", "length")
    assert wb.detokenize(model, list(r.tokens)) == r.reply
    s = r.stats
    assert s.prompt_tokens == len(prompt) and s.generated_tokens == len(r.tokens)
    assert s.ttft_s is not None and s.ttft_s > 0 and s.prefill_tps and s.decode_tps
    assert s.cache_hit_kind == "cold"


def test_chat_prompt_special_tokens_are_parsed(model):
    toks = wb.tokenize(model, CHAT)
    assert wb.tokenize(model, "<|im_start|>", add_special=False) == [toks[0]]
    assert len(wb.tokenize(model, "<|im_start|>", add_special=False, parse_special=False)) > 1
    r = wb.complete(model, CHAT, response_tokens=64)
    assert r.finish_reason == "stop"       # the model ends its turn with <|im_end|> (an EOG token)


def test_greedy_reply_equals_llama_cpps_simple_example(model, model_path):
    from _paths import tool
    from conftest import require_tools

    try:
        simple = tool("llama-simple")
    except FileNotFoundError:
        if require_tools():
            raise
        pytest.skip("llama-simple not built (make tools)")
    out = subprocess.run([str(simple), "-m", str(model_path), "-n", "32", PROMPT],
                         capture_output=True, check=True).stdout.decode()
    ours = wb.complete(model, PROMPT, response_tokens=32)
    assert len(ours.reply) > 20
    assert out == PROMPT + ours.reply + "\n"


def test_stop_sequences_trim_reply_and_stream(model):
    full = wb.complete(model, PROMPT, response_tokens=32).reply
    assert "\n\n" in full
    cut = wb.complete(model, PROMPT, response_tokens=32, stop_sequences=["\n\n"])
    assert cut.finish_reason == "stop" and cut.stop_sequence == "\n\n"
    assert cut.reply == full[: full.index("\n\n")]
    streamed = "".join(e.text for e in wb.stream(model, PROMPT, response_tokens=32,
                                                  stop_sequences=["\n\n"]) if isinstance(e, wb.Token))
    assert streamed == cut.reply


def test_stream_events_are_typed_and_end_with_done(model):
    events = list(wb.stream(model, PROMPT, response_tokens=8))
    ids = [e.id for e in events if isinstance(e, wb.TokenId)]
    text = "".join(e.text for e in events if isinstance(e, wb.Token))
    assert isinstance(events[-1], wb.Done)
    assert tuple(ids) == events[-1].tokens and text == events[-1].reply
    assert isinstance(events[0], wb.TokenId)


def test_async_for(model):
    async def run() -> list:
        return [e async for e in wb.stream(model, PROMPT, response_tokens=6)]

    events = asyncio.run(run())
    assert isinstance(events[-1], wb.Done) and len(events[-1].tokens) == 6


def test_cancel_mid_stream_is_idempotent_and_ends_with_done(model):
    s = wb.stream(model, PROMPT, response_tokens=200)
    seen = 0
    for ev in s:
        if isinstance(ev, wb.TokenId):
            seen += 1
            if seen == 3:
                wb.cancel(s)
                wb.cancel(s.ref)
                s.cancel()
        if isinstance(ev, wb.Done):
            break
    assert ev.finish_reason == "cancelled"
    assert 3 <= len(ev.tokens) < 200
    wb.cancel(s)    # after the end: still fine


@pytest.mark.load(prefill_chunk_size=None, n_seq_max=1, n_ctx=4096)
def test_cancel_interrupts_a_long_prefill(fresh_model):
    long_prompt = " ".join(f"word{i}" for i in range(900))   # ~3,000 tokens, one decode call
    s = wb.stream(fresh_model, long_prompt, response_tokens=8)
    time.sleep(0.5)
    assert wb.phase(fresh_model) == "prefilling"
    s.cancel()
    done = s.result()
    assert done.finish_reason == "cancelled"
    assert done.stats.prefilled_tokens == 0 and done.tokens == ()
    assert wb.counters().get("decode_aborted", 0) >= 1
    # the model is usable right after
    assert wb.complete(fresh_model, PROMPT, response_tokens=4).finish_reason == "length"


@pytest.mark.load(n_seq_max=1)
def test_dropping_a_stream_frees_the_model(fresh_model):
    s = wb.stream(fresh_model, PROMPT, response_tokens=500)
    next(iter(s)), next(iter(s))
    del s
    gc.collect()
    r = wb.complete(fresh_model, PROMPT, response_tokens=4)      # would wait ~6 s behind 500 tokens
    assert r.finish_reason == "length" and r.stats.queued_s < 1.0
    for _ in range(100):
        if wb.model_info(fresh_model)["available_seqs"] == 1:
            break
        time.sleep(0.01)
    assert wb.model_info(fresh_model)["available_seqs"] == 1


def test_calls_from_several_threads(model):
    results: dict[int, str] = {}

    def worker(i: int) -> None:
        results[i] = wb.complete(model, f"{i} + {i} =", response_tokens=6).reply

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(6))
    assert results[2] == wb.complete(model, "2 + 2 =", response_tokens=6).reply


# --- bad input: clear errors, process keeps running ----------------------------------------

def test_empty_prompt(model):
    with pytest.raises(EmptyPrompt):
        wb.complete(model, "")
    with pytest.raises(EmptyPrompt):
        wb.complete(model, [])


@pytest.mark.load(n_ctx=256)
def test_prompt_longer_than_context(fresh_model):
    n_ctx = wb.model_info(fresh_model)["n_ctx"]
    assert n_ctx == 256
    with pytest.raises(ContextOverflow) as e:
        wb.complete(fresh_model, "word " * 400)
    assert e.value.n_ctx == n_ctx and e.value.n_prompt > n_ctx
    long = "word " * 200
    r = wb.complete(fresh_model, long, response_tokens=200, repetition_penalty=1.3)
    assert r.finish_reason == "length" and len(r.context_tokens) == n_ctx


def test_bad_options(model):
    with pytest.raises(UnknownOption, match="max_tokens"):
        wb.complete(model, PROMPT, max_tokens=3)
    with pytest.raises(InvalidOption, match="temperature"):
        wb.complete(model, PROMPT, temperature="warm")
    with pytest.raises(InvalidOption, match="prompt"):
        wb.complete(model, [1, -5])
    with pytest.raises(InvalidOption, match="prompt"):
        wb.complete(model, 42)


def test_unknown_model_is_not_loaded_everywhere():
    calls = [
        lambda: wb.complete("nope", PROMPT), lambda: wb.stream("nope", PROMPT),
        lambda: wb.tokenize("nope", "x"), lambda: wb.detokenize("nope", [1]),
        lambda: wb.model_info("nope"), lambda: wb.unload("nope"), lambda: wb.phase("nope"),
        lambda: wb.queue_depth("nope"),
    ]
    for call in calls:
        with pytest.raises(NotLoaded, match="'nope' is not loaded"):
            call()
