"""Many requests on one model: one decode per tick, queueing, capacity, grammar, stress."""

from __future__ import annotations

import gc
import json
import random
import threading
import time
from typing import Any

import psutil
import pytest

import workbench as wb
from workbench.errors import InvalidOption, QueueFull, SeqCapacity

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "Water boils at", "The largest planet is", "def fibonacci(n):",
           "Once upon a time", "1, 2, 3, 4,", "The opposite of hot is", "My favourite colour is"]


def run_together(model: str, jobs: list[dict]) -> list[wb.CompletionResult]:
    streams = [wb.stream(model, **job) for job in jobs]
    return [s.result() for s in streams]


def test_eight_requests_on_four_sequences_with_mixed_sampling(model):
    assert wb.model_info(model)["n_seq_max"] == 4
    jobs = []
    for i, p in enumerate(PROMPTS):
        job = {"prompt": p, "response_tokens": 12 + i, "ignore_eos": True}
        if i % 3 == 1:
            job.update(temperature=0.8, top_k=20, top_p=0.9, seed=i)
        if i % 3 == 2:
            job.update(temperature=1.2, min_p=0.05, repetition_penalty=1.1, seed=100 + i)
        jobs.append(job)
    calls_before = wb.counters()["decode_calls"]
    results = run_together(model, jobs)
    for job, r in zip(jobs, results):
        assert r.finish_reason == "length" and len(r.tokens) == job["response_tokens"]
    # batched: far fewer decode calls than tokens decoded
    n_calls = wb.counters()["decode_calls"] - calls_before
    assert n_calls < sum(len(r.tokens) for r in results) / 2
    # seeded sampling is reproducible when run alone
    again = wb.complete(model, **jobs[1])
    assert again.tokens == results[1].tokens


def test_greedy_together_equals_alone(model):
    jobs = [{"prompt": p, "response_tokens": 24} for p in PROMPTS[:4]]
    alone = [wb.complete(model, **job) for job in jobs]
    together = run_together(model, jobs)
    same = [a.tokens == t.tokens for a, t in zip(alone, together)]
    # llama.cpp computes each row independently of the batch's other rows on this CPU
    # backend, so batched greedy decoding must reproduce the solo runs token for token.
    assert all(same), [(j["prompt"], a.reply, t.reply) for j, a, t, ok in zip(jobs, alone, together, same) if not ok]


@pytest.mark.load(n_seq_max=1, max_queue=2)
def test_queue_bound_and_fifo(fresh_model):
    hold = wb.stream(fresh_model, PROMPTS[0], response_tokens=400, ignore_eos=True)
    next(iter(hold))
    queued = [wb.stream(fresh_model, p, response_tokens=3) for p in PROMPTS[1:3]]
    assert wb.pending_len(fresh_model) == 2 and wb.queue_depth(fresh_model) == 1
    with pytest.raises(QueueFull) as e:
        wb.stream(fresh_model, PROMPTS[3], response_tokens=3)
    assert e.value.max_queue == 2
    with pytest.raises(SeqCapacity):
        wb.complete(fresh_model, PROMPTS[3], on_full="error")
    # cancel one queued request: it ends cancelled without ever running
    queued[0].cancel()
    hold.cancel()
    r0 = queued[0].result()
    assert r0.finish_reason == "cancelled" and r0.tokens == () and r0.stats.prefilled_tokens == 0
    assert hold.result().finish_reason == "cancelled"
    assert queued[1].result().finish_reason == "length"
    assert wb.pending_len(fresh_model) == 0


def test_grammar_and_json_schema(model):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    before = wb.counters()
    prompt = "<|im_start|>user\nGive a person as JSON.<|im_end|>\n<|im_start|>assistant\n"
    r = wb.complete(model, prompt, json_schema=schema, response_tokens=60)
    obj = json.loads(r.reply)
    assert set(obj) == {"name", "age"} and isinstance(obj["name"], str) and isinstance(obj["age"], int)
    r2 = wb.complete(model, prompt, json_schema=json.dumps(schema), response_tokens=60)
    assert r2.reply == r.reply
    # a grammar no other test compiles: the miss counted is this test's whatever ran before
    yes_no = wb.complete(model, "Is the sky blue?", grammar='root ::= "yes" | "no" ', response_tokens=8)
    assert yes_no.reply in ("yes", "no") and yes_no.finish_reason == "stop"
    after = wb.counters()
    assert after["grammar_cache_misses"] - before.get("grammar_cache_misses", 0) == 2
    assert after["grammar_cache_hits"] - before.get("grammar_cache_hits", 0) == 1


def test_invalid_grammar_and_schema_fail_at_admission(model):
    with pytest.raises(InvalidOption, match="grammar"):
        wb.stream(model, "x", grammar="root ::= ((")
    with pytest.raises(InvalidOption, match="json_schema"):
        wb.stream(model, "x", json_schema="{not json")
    with pytest.raises(InvalidOption, match="json_schema"):
        wb.stream(model, "x", json_schema={"type": "object"}, grammar='root ::= "a"')
    assert wb.complete(model, "x", response_tokens=2).finish_reason in ("length", "stop")


@pytest.mark.load(prefill_chunk_size=None, n_seq_max=2, decode_budget_ms=5000, n_ctx=8192, n_batch=4096)
def test_decode_timeout_recreates_the_context(fresh_model):
    # 4,096 prompt rows in one decode: ~10 s quiet (about 500 tok/s at depth 0), more under
    # load. A short prompt's first decode (its rows padded to 64 for the tiled kernel) takes
    # ~0.1 s quiet but 1-2 s beside CPU burners and another test run (the budget was 700 ms,
    # then 2,000: both passed there; issue 27's loaded runs)
    long_prompt = " ".join(f"word{i}" for i in range(1300))
    r = wb.stream(fresh_model, long_prompt, response_tokens=4)
    events = list(r)
    assert isinstance(events[-1], wb.Error)
    assert type(events[-1].reason).__name__ == "DecodeTimeout"
    assert wb.counters()["decode_timeouts"] >= 1
    for _ in range(100):
        if wb.phase(fresh_model) == "idle":
            break
        time.sleep(0.01)
    assert wb.phase(fresh_model) == "idle"
    info = wb.model_info(fresh_model)
    assert info["available_seqs"] == 2
    ok = _complete_within_budget(fresh_model, PROMPTS[0])     # short steps fit the budget
    assert ok.finish_reason == "length" and ok.reply == _complete_within_budget(fresh_model, PROMPTS[0]).reply


def _complete_within_budget(model: str, prompt: str, tries: int = 5) -> Any:
    """A short completion on the recreated context. On a loaded 2-core machine one short step
    can still pass the budget now and then (three in a row were seen at 400 ms beside other
    tests, five at 700 ms); a context left unusable would fail every try, so up to `tries` are allowed
    (each timeout recreates the context again). The long prompt's one decode takes seconds."""
    for attempt in range(tries):
        try:
            return wb.complete(model, prompt, response_tokens=8)
        except wb.errors.DecodeTimeout:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _stress_round(model: str, rng: random.Random, n: int = 32) -> list[object]:
    """n concurrent streams; some cancelled, some consumers dropped mid-way."""
    endings: list[object] = []
    lock = threading.Lock()

    def consumer(i: int) -> None:
        s = wb.stream(model, PROMPTS[i % len(PROMPTS)], response_tokens=rng.randrange(4, 24),
                      temperature=0.7, seed=i)
        fate = i % 4
        last = None
        for k, ev in enumerate(s):
            last = ev
            if fate == 1 and k == 3:
                s.cancel()
            if fate == 2 and k == 2:
                break          # dropped consumer: the Stream is closed / collected below
        if fate == 2:
            s.close()
            last = s.result()
        with lock:
            endings.append(last)

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return endings


def test_stress_no_leaks(model):
    rng = random.Random(7)
    proc = psutil.Process()
    _stress_round(model, rng)
    gc.collect()
    rss_1 = proc.memory_info().rss
    endings = _stress_round(model, rng) + _stress_round(model, rng)
    gc.collect()
    rss_2 = proc.memory_info().rss
    assert len(endings) == 64
    assert all(isinstance(e, (wb.Done, wb.Error, wb.CompletionResult)) for e in endings)
    assert not any(isinstance(e, wb.Error) for e in endings)
    for _ in range(200):
        info = wb.model_info(model)
        if info["available_seqs"] + info["pinned_idle_seqs"] == info["n_seq_max"] and not wb.requests():
            break
        time.sleep(0.01)
    info = wb.model_info(model)
    assert info["available_seqs"] + info["pinned_idle_seqs"] == info["n_seq_max"]
    assert wb.requests() == [] and wb.queue_depth(model) == 0 and wb.pending_len(model) == 0
    assert rss_2 - rss_1 < 32 * 2**20, f"RSS grew by {(rss_2 - rss_1) / 2**20:.1f} MiB over two rounds"
