"""POST /v1/embeddings (the vectors are wb.embed_batch's, as floats or base64), GET /v1/models
(what serve() was told to serve, nothing else) and GET /health (open without the API key)."""

from __future__ import annotations

import base64
import struct

import httpx
import openai
import pytest

import workbench as wb

from .conftest import error_of, sdk

pytestmark = pytest.mark.model

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today."]


def assert_close(got, want):
    assert len(got) == len(want) == 576
    assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-6


def test_one_string(model, client):
    r = client.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
    [item] = r.data
    assert item.index == 0 and item.object == "embedding" and r.model == model
    assert_close(item.embedding, wb.embed(model, TEXTS[0]))
    assert r.usage.prompt_tokens == r.usage.total_tokens == len(wb.tokenize(model, TEXTS[0]))


def test_a_list_of_strings_equals_embed_batch(model, client):
    want = wb.embed_batch(model, TEXTS)
    for fmt in ("float", openai.NOT_GIVEN):        # the SDK's default asks for base64 and decodes it
        r = client.embeddings.create(model=model, input=TEXTS, encoding_format=fmt)
        assert [d.index for d in r.data] == [0, 1]
        for d, w in zip(r.data, want):
            assert_close(d.embedding, w)
    assert r.usage.prompt_tokens == sum(len(wb.tokenize(model, t)) for t in TEXTS)


def test_token_ids(model, client):
    ids = wb.tokenize(model, TEXTS[1])
    r = client.embeddings.create(model=model, input=ids, encoding_format="float")
    assert_close(r.data[0].embedding, wb.embed_batch(model, [ids])[0])
    assert r.usage.prompt_tokens == len(ids)
    two = client.embeddings.create(model=model, input=[ids, ids[:3]], encoding_format="float")
    assert len(two.data) == 2 and two.usage.prompt_tokens == len(ids) + 3


def test_base64_is_little_endian_float32(model, client):
    r = client.embeddings.create(model=model, input=TEXTS[0], encoding_format="base64")
    raw = base64.b64decode(r.data[0].embedding)
    assert len(raw) == 4 * 576
    assert_close(list(struct.unpack("<576f", raw)), wb.embed(model, TEXTS[0]))


def test_dimensions_is_honoured_or_refused(model, http):
    """OpenAI's ``dimensions`` shortens the vectors; a server that cannot must say so (400
    naming the field), not answer with vectors of another length."""
    r = http.post("/v1/embeddings", json={"model": model, "input": TEXTS[0], "dimensions": 8})
    if r.status_code == 400:
        assert error_of(r)["param"] == "dimensions"
    else:
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 8


def test_models_lists_every_loaded_model(model, client, http):
    ids = [m.id for m in client.models.list()]
    assert ids == [m["model_id"] for m in wb.list_models()] and model in ids
    [entry] = [e for e in http.get("/v1/models").json()["data"] if e["id"] == model]
    assert entry["object"] == "model" and entry["owned_by"] == "llama-workbench"
    assert entry["workbench"]["n_ctx"] == wb.model_info(model)["n_ctx"]


@pytest.mark.load(n_seq_max=1)
def test_serve_models_restricts_what_is_served(model, fresh_model):
    with wb.serve(models=[fresh_model], api_key="sekret") as srv, sdk(srv.url, api_key="sekret") as c:
        assert [m.id for m in c.models.list()] == [fresh_model]
        assert c.completions.create(model=fresh_model, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.NotFoundError) as e:
            c.completions.create(model=model, prompt="Hi", max_tokens=2)        # loaded, not served
        assert e.value.status_code == 404 and e.value.body["param"] == "model"
        with pytest.raises(openai.NotFoundError):
            c.embeddings.create(model=model, input="Hi")
        health = httpx.get(srv.url + "/health")                                  # no key needed
        assert health.status_code == 200 and health.json() == {"status": "ok", "models": [fresh_model]}
