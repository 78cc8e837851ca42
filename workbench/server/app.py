"""The ASGI application: Starlette's routing, the API key check, errors as OpenAI's error
object, and the server's own counts (connections, requests in flight).

Routes (workbench/server/routes.py): GET /health, GET /metrics, GET /v1/models,
POST /v1/completions, POST /v1/chat/completions, POST /v1/embeddings.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import WorkbenchError
from . import routes
from .fanout import ClientGone, Fanout
from .http_errors import ApiError, from_exception
from .routes import Settings

OPEN_PATHS = ("/health",)  # answered without the API key (load balancers, readiness checks)


class ServerState:
    """What /metrics and the handle read about the server itself."""

    def __init__(self, max_workers: int, connections: Callable[[], int]) -> None:
        self.max_workers = max_workers
        self.connections = connections
        self.in_flight = 0
        self.answered = 0
        self.open_fanouts: set[Fanout] = set()   # responses whose requests may still run

    def cancel_open(self) -> None:
        """From any thread: cancel every request an open response still waits for; their
        responses end at once (finish_reason 'cancelled'), so a stop need not wait out its
        grace."""
        for fan in list(self.open_fanouts):
            fan.cancel_requests()


def make_app(settings: Settings, state: ServerState) -> Starlette:
    app = Starlette(routes=[
        Route("/health", routes.health, methods=["GET"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
    ], exception_handlers={ApiError: _api_error, WorkbenchError: _workbench_error, ClientGone: _client_gone,
                          Exception: _bug, 404: _not_found, 405: _not_allowed},
        lifespan=_lifespan)
    app.state.settings = settings
    app.state.server = state
    app.add_middleware(_Guard, settings=settings, state=state)
    return app


class _Guard:
    """Pure ASGI (streaming and disconnects pass through untouched): the API key, then the
    server's counts."""

    def __init__(self, app: Any, settings: Settings, state: ServerState) -> None:
        self.app, self.settings, self.state = app, settings, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = self.settings.api_key
        if key is not None and scope["path"] not in OPEN_PATHS and not _authorised(Request(scope), key):
            err = ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                           type="authentication_error", code="invalid_api_key")
            await _json(err)(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1
            self.state.answered += 1


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    """Each streaming request waits for its next event in the loop's executor: give the
    loop one with a thread per concurrent request (the default has only cores + 4)."""
    workers = app.state.server.max_workers
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wb-serve")
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        yield
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def _authorised(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def _json(err: ApiError) -> Response:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _json(exc)


async def _workbench_error(request: Request, exc: Exception) -> Response:
    """A workbench error a route did not translate itself (no client field names known)."""
    return _json(from_exception(exc))


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it: the connection is closed


async def _bug(request: Request, exc: Exception) -> Response:
    return _json(from_exception(exc))


async def _not_found(request: Request, exc: Exception) -> Response:
    return _json(ApiError(404, f"no route {request.url.path!r}; this server answers /v1/models, "
                          "/v1/completions, /v1/chat/completions, /v1/embeddings, /health and /metrics",
                          code="not_found"))


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return _json(ApiError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed"))
