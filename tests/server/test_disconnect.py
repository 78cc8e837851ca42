"""A client that goes away cancels its request: the sequence is free at once (not after the
request's 4,000 tokens), the cancel is counted, the server forgets the request, and the
next request is served. Raw httpx: the SDK has no way to drop a connection mid-stream.
The other way round, a request cancelled in the notebook or by its time limit ends the
client's stream in a way the SDK reports."""

from __future__ import annotations

import httpx
import openai
import pytest

import workbench as wb
from waiting import wait_for

pytestmark = pytest.mark.model

LONG = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}   # tens of seconds if not cancelled


def gone(model: str) -> bool:
    return not any(r["model"] == model for r in wb.requests())


def assert_cancelled_and_serving(model, server, client, cancelled_before):
    assert wait_for(lambda: gone(model), timeout=10)
    assert wb.counters()["finished_cancelled"] == cancelled_before + 1
    assert wait_for(lambda: server.in_flight == 0, timeout=10)
    want = wb.complete(model, "Hello", response_tokens=4, temperature=0)
    r = client.completions.create(model=model, prompt="Hello", max_tokens=4, temperature=0)
    assert r.choices[0].text == want.reply


def test_closing_a_stream_mid_reply_cancels_its_request(model, server, client, server_errors):
    before = wb.counters()["finished_cancelled"]
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={"model": model, "stream": True, **LONG}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            # hold the iterator: a `break` out of a temporary one finalizes httpx's generator
            # chain at once, and httpcore closes the connection on that GeneratorExit, so the
            # client would already be gone (and, under load, the server done) before the checks
            lines = r.iter_lines()
            events = 0
            for line in lines:
                events += line.startswith("data: {")
                if events == 3:
                    break
            assert [q["model"] for q in wb.requests()] == [model]      # still generating
            assert server.in_flight >= 1 and server.connections >= 1, (server, server_errors())
    assert_cancelled_and_serving(model, server, client, before)
    assert server_errors() == []


def test_a_client_that_stops_waiting_cancels_its_request(model, server, client, server_errors):
    """A non-streaming request whose client times out: cancelled the same way, and the
    disconnect (the client's doing) is not logged as the server's exception."""
    before = wb.counters()["finished_cancelled"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"model": model, **LONG}, timeout=httpx.Timeout(60, read=1.0))
    assert_cancelled_and_serving(model, server, client, before)
    assert server_errors() == []


def test_a_cancel_in_the_notebook_ends_the_clients_stream(model, client):
    stream = client.completions.create(model=model, prompt=LONG["prompt"], max_tokens=4000, stream=True,
                                       extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
    chunks = iter(stream)
    assert next(chunks).choices
    [running] = [r for r in wb.requests() if r["model"] == model]
    wb.cancel(running["ref"])
    *rest, usage = list(chunks)                          # ends, long before 4,000 tokens
    assert rest[-1].choices[0].finish_reason == "cancelled"
    assert usage.choices == [] and 0 < usage.usage.completion_tokens < 4000
    assert wait_for(lambda: gone(model), timeout=10)


def test_a_timeout_mid_stream_reaches_the_client_as_an_error(model, client):
    """timeout_s expiring after the first tokens is an error event the SDK raises (before
    the first token, on a slow machine, it is the 504 itself): never a stream that just stops."""
    with pytest.raises(openai.APIError, match="timeout_s"):
        for _ in client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=4000, stream=True,
                extra_body={"ignore_eos": True, "workbench": {"timeout_s": 1.5}}):
            pass
    assert wait_for(lambda: gone(model), timeout=10)
