"""Fixtures of the HTTP endpoint's tests: one server per module over the shared default
model (stopped at the module's end), the official OpenAI SDK as its client, and what the
server wrote to its log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

import workbench as wb

SERVER_LOGGERS = ("uvicorn", "workbench.server")


def sdk(url: str, api_key: str = "unused", **kw: Any) -> OpenAI:
    """The official client, as a user would make it (no retries: every error shows)."""
    return OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=60, **kw)


def extra(response: Any) -> dict[str, Any]:
    """The response's ``workbench`` field (the SDK keeps unknown fields as extras)."""
    return response.model_extra["workbench"]


def error_of(r: httpx.Response) -> dict[str, Any]:
    """OpenAI's error object of a raw response: exactly message, type, param and code."""
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


@pytest.fixture(scope="module")
def server(model: str) -> Iterator[Any]:
    srv = wb.serve()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[OpenAI]:
    c = sdk(server.url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture
def server_errors(caplog: pytest.LogCaptureFixture) -> Any:
    """A call that returns the ERROR records the server (uvicorn, workbench.server) logged
    during the test: an exception that escaped a route is a traceback in the notebook."""
    caplog.set_level(logging.WARNING)

    def errors() -> list[str]:
        return [r.getMessage() + (f" ({r.exc_info[1]!r})" if r.exc_info else "") for r in caplog.records
                if r.levelno >= logging.ERROR and r.name.startswith(SERVER_LOGGERS)]

    return errors
