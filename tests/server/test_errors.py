"""Every refusal is OpenAI's error object with the status a client expects, naming the
client's own field: 400 bad values and hostile bodies (never a 500, and the server answers
on), 404, 405, 401, 413, 429 with Retry-After, 504; and no refusal leaves a traceback in
the server's log or breaks the client's connection."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import workbench as wb
from waiting import wait_for

from .conftest import error_of, sdk

pytestmark = pytest.mark.model

LONG = {"max_tokens": 4000, "extra_body": {"ignore_eos": True}}     # tens of seconds if nothing stopped it


def idle(model: str) -> bool:
    return not any(r["model"] == model for r in wb.requests())


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"max_tokens": -1}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"n": 0}, "n"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"n": 1, "best_of": 3, "stream": True}, "best_of"),             # the best are known only at the end
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"extra_body": {"workbench": {"cache_scope": 5}}}, "workbench.cache_scope"),
    ({"extra_body": {"workbench": {"no_such_option": 1}}}, "workbench.no_such_option"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),                 # a token id the model does not have
])
def test_a_bad_value_is_a_400_naming_the_clients_field(model, client, kwargs, param):
    opts = {"max_tokens": 2, **kwargs}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="Hi", **opts)
    err = e.value.body
    assert e.value.status_code == 400 and err["type"] == "invalid_request_error"
    assert err["param"] == param and repr(param) in err["message"]


def test_a_bad_chat_value_names_the_message(model, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": 5}], max_tokens=2)
    assert e.value.body["param"] == "messages[0].content"


def test_an_out_of_range_token_in_an_embedding_input_names_input(model, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model, input=[99999999])
    assert e.value.body["param"] == "input"


def test_echo_of_an_out_of_range_token_names_prompt(model, client):
    """The echo text is made from the prompt's token ids: a bad id is the client's 'prompt'."""
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt=[99999999], max_tokens=2, echo=True)
    assert e.value.body["param"] == "prompt"


def test_a_refused_echo_leaves_no_traceback_and_the_client_goes_on(model, client, server_errors):
    """A 400 is the client's mistake, not the server's: nothing in the kernel's log (an
    exception escaping the route is logged as 'Exception in ASGI application' and its
    connection dropped), and the client's next call goes through."""
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=[99999999], max_tokens=2, echo=True)
    assert client.completions.create(model=model, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    assert server_errors() == []


@pytest.mark.parametrize("route", ["completions", "chat", "embeddings"])
def test_an_unknown_model_is_a_404_naming_model(client, route):
    call = {"completions": lambda: client.completions.create(model="no-such-model", prompt="Hi", max_tokens=2),
            "chat": lambda: client.chat.completions.create(model="no-such-model", max_tokens=2,
                                                           messages=[{"role": "user", "content": "Hi"}]),
            "embeddings": lambda: client.embeddings.create(model="no-such-model", input="Hi")}[route]
    with pytest.raises(openai.NotFoundError) as e:
        call()
    assert e.value.status_code == 404 and e.value.body["param"] == "model"
    assert "no-such-model" in e.value.body["message"]


def test_unknown_route_and_wrong_method(http):
    r = http.post("/v1/responses", json={})
    assert r.status_code == 404 and "/v1/responses" in error_of(r)["message"]
    for method, path in (("GET", "/v1/completions"), ("GET", "/v1/chat/completions"), ("DELETE", "/v1/models"),
                         ("POST", "/health")):
        r = http.request(method, path)
        assert r.status_code == 405, (method, path)
        assert method in error_of(r)["message"]


def test_api_key(model):
    with wb.serve(api_key="sekret") as srv:
        for key in ("unused", "sekret-not", "Sekret"):
            with sdk(srv.url, api_key=key) as c, pytest.raises(openai.AuthenticationError) as e:
                c.completions.create(model=model, prompt="Hi", max_tokens=2)
            assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
        no_key = httpx.post(srv.url + "/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 2})
        assert no_key.status_code == 401 and error_of(no_key)["code"] == "invalid_api_key"
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200
        with sdk(srv.url, api_key="sekret") as c:
            assert c.completions.create(model=model, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_a_body_over_max_body_bytes_is_a_413(model):
    with wb.serve(max_body_bytes=1024) as srv, sdk(srv.url) as c:
        with pytest.raises(openai.APIStatusError) as e:
            c.completions.create(model=model, prompt="x" * 2000, max_tokens=2)
        assert e.value.status_code == 413 and "1024" in e.value.body["message"]

        def chunked():           # no Content-Length: refused while it arrives
            for _ in range(8):
                yield b" " * 500

        r = httpx.post(srv.url + "/v1/completions", content=chunked(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"
        assert c.completions.create(model=model, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


@pytest.mark.load(n_seq_max=1, max_queue=0)
def test_a_full_queue_is_a_429_with_retry_after(fresh_model, client):
    m = fresh_model
    holder = client.completions.create(model=m, prompt="Once upon a time", stream=True, **LONG)
    try:
        assert next(iter(holder)).choices                        # the only sequence is taken
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=m, prompt="Hi", max_tokens=2)
        assert e.value.status_code == 429
        assert int(e.value.response.headers["Retry-After"]) > 0
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=m, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    finally:
        holder.close()
    assert wait_for(lambda: wb.model_info(m)["available_seqs"] == 1, 10)
    assert client.completions.create(model=m, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    # n=2 on one sequence: the second choice is refused, and the first (admitted) is not left running
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=m, prompt="Hi", n=2, **LONG)
    assert wait_for(lambda: idle(m) and wb.model_info(m)["available_seqs"] == 1, 10)


def test_a_request_past_its_timeout_is_a_504(model, client):
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=model, prompt="Once upon a time", max_tokens=4000,
                                  extra_body={"ignore_eos": True, "workbench": {"timeout_s": 0.05}})
    assert e.value.status_code == 504 and "timeout_s" in e.value.body["message"]
    assert wait_for(lambda: idle(model), 10)


# --- hostile bodies ------------------------------------------------------------------------

def deep(n: int) -> bytes:
    return ('{"a":' * n + "1" + "}" * n).encode()


HOSTILE = {
    "not json": ("completions", b'{"model": "shared-default", "prompt": '),
    "empty": ("completions", b""),
    "a json array": ("completions", b'[{"model": "shared-default", "prompt": "Hi"}]'),
    "a json string": ("completions", b'"Hi"'),
    "invalid utf-8": ("completions", b'{"model": "shared-default", "prompt": "\xff\xfe"}'),
    "NaN": ("completions", b'{"model": "shared-default", "prompt": "Hi", "temperature": NaN}'),
    "Infinity": ("completions", b'{"model": "shared-default", "prompt": "Hi", "max_tokens": Infinity}'),
    "a 5000-digit integer": ("completions", b'{"model": "shared-default", "prompt": "Hi", "seed": '
                             + b"9" * 5000 + b"}"),
    "100 deep": ("completions", deep(100)),
    "100000 deep": ("chat", b"[" * 100_000 + b"]" * 100_000),
    "a lone surrogate in the prompt": ("completions", b'{"model": "shared-default", "prompt": "Hi \\ud800"}'),
    "a lone surrogate in a key": ("chat", b'{"model": "shared-default", "\\udfff": 1}'),
    "messages not a list": ("chat", json.dumps({"model": "shared-default", "messages": "Hi"}).encode()),
    "a message not an object": ("chat", json.dumps({"model": "shared-default", "messages": ["Hi"]}).encode()),
    "prompt an object": ("completions", json.dumps({"model": "shared-default", "prompt": {"a": 1}}).encode()),
    "prompt a list of lists of text": ("completions", json.dumps({"model": "shared-default",
                                                                  "prompt": [["Hi"]]}).encode()),
    "n a string": ("completions", json.dumps({"model": "shared-default", "prompt": "Hi", "n": "2"}).encode()),
    "n true": ("completions", json.dumps({"model": "shared-default", "prompt": "Hi", "n": True}).encode()),
    "stream a string": ("chat", json.dumps({"model": "shared-default", "stream": "yes",
                                            "messages": [{"role": "user", "content": "Hi"}]}).encode()),
    "input a number": ("embeddings", json.dumps({"model": "shared-default", "input": 5}).encode()),
    "model a list": ("completions", json.dumps({"model": ["shared-default"], "prompt": "Hi"}).encode()),
}
ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_body_is_a_400_and_the_server_answers_on(model, http, server_errors, case):
    route, body = HOSTILE[case]
    r = http.post(ROUTES[route], content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert error_of(r)["type"] == "invalid_request_error"
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1
    assert server_errors() == []


def test_an_embeddings_batch_over_openais_2048_inputs_is_refused(model, http):
    """OpenAI caps an embeddings request at 2048 inputs. Without a cap, a body well within
    max_body_bytes (8 MB holds a million one-token inputs, ~11 ms each here) holds the
    embedder for hours, and a client that gives up cannot stop it."""
    try:
        r = http.post("/v1/embeddings", json={"model": model, "input": [[1]] * 2049}, timeout=10)
    except httpx.ReadTimeout:
        pytest.fail("no answer within 10 s: the server is embedding all 2049 inputs instead of refusing them")
    assert r.status_code == 400 and error_of(r)["param"] == "input"
