"""serve(scope_header='X-Tenant'): each request's cache scope is its tenant header. A request
without one is refused, tenants never read each other's cache rows, and a body cannot
name another tenant's scope."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

import workbench as wb

from .conftest import extra, sdk

pytestmark = pytest.mark.model

PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 5)


@pytest.fixture(scope="module")
def tenant_server(model: str) -> Iterator[Any]:
    srv = wb.serve(scope_header="X-Tenant")
    yield srv
    srv.stop()


def tenant(srv: Any, name: str | None):
    return sdk(srv.url, default_headers={"X-Tenant": name} if name else None)


def test_a_request_without_the_header_is_refused(model, tenant_server):
    with tenant(tenant_server, None) as c, pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=model, prompt="Hi", max_tokens=2)
    assert e.value.body["param"].lower() == "x-tenant" and "x-tenant" in e.value.body["message"].lower()


def test_tenants_do_not_share_cached_tokens(model, tenant_server):
    with tenant(tenant_server, "acme") as a, tenant(tenant_server, "globex") as b:
        def ask(c):
            r = c.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0)
            return r, r.usage.prompt_tokens_details.cached_tokens

        (a1, a1_cached), (b1, b1_cached), (a2, a2_cached) = ask(a), ask(b), ask(a)
    assert a1_cached == 0 and b1_cached == 0                       # b's first: nothing of a's
    assert extra(b1)["requests"][0]["cache_hit_kind"] == "cold"
    assert a2_cached > 0 and a2_cached == extra(a2)["requests"][0]["cached_tokens"]
    assert a1.choices[0].text == b1.choices[0].text == a2.choices[0].text


def test_the_body_cannot_name_another_scope(model, tenant_server):
    def scoped(scope):
        return {"workbench": {"cache_scope": scope}}

    with tenant(tenant_server, "acme") as c:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body=scoped("globex"))
        assert e.value.body["param"] == "workbench.cache_scope"
        same = c.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body=scoped("acme"))
        assert same.usage.completion_tokens == 2
