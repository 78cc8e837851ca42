"""``wb.serve()``: uvicorn on a background thread of the kernel's own process, over the
engines the notebook has loaded, and the handle that stops it.

The socket is bound here (so ``port=0`` picks a free port and ``.url`` is known at once);
uvicorn gets it with its own event loop, no signal handlers (not the main thread) and no
logging set-up (the kernel's logging stays as the user left it).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
from collections.abc import Sequence
from typing import Any

import uvicorn

from .. import registry
from ..errors import InvalidOption
from ..options import check_bool, check_int
from .app import ServerState, make_app
from .routes import Settings

DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_MAX_CONCURRENCY = 256
START_TIMEOUT_S = 15.0
_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # an HTTP header name (RFC 9110 token)

_running: list[Server] = []
_running_lock = threading.Lock()


class Server:
    """A running endpoint: ``.url``, ``.stop()``, ``.connections`` (open now),
    ``.in_flight`` (requests being answered) and ``.answered`` (so far)."""

    def __init__(self, host: str, sock: socket.socket, settings: Settings, max_concurrency: int) -> None:
        self.host, self.port = host, sock.getsockname()[1]
        self.settings = settings
        self.state = ServerState(max_concurrency, lambda: len(self._uvicorn.server_state.connections))
        config = uvicorn.Config(make_app(settings, self.state), loop="asyncio", lifespan="on", log_config=None,
                                log_level="warning", access_log=False, timeout_graceful_shutdown=3)
        self._uvicorn = uvicorn.Server(config)
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name=f"wb-serve:{self.port}", daemon=True)
        self._failure: BaseException | None = None

    def _run(self) -> None:
        try:
            self._uvicorn.run(sockets=[self._sock])
        except BaseException as e:  # noqa: BLE001 - kept for start() to report
            self._failure = e

    def start(self) -> Server:
        self._thread.start()
        waited = threading.Event()
        while not self._uvicorn.started and self._thread.is_alive():
            waited.wait(0.01)
        if not self._uvicorn.started:
            self._sock.close()
            raise RuntimeError(f"the server did not start: {self._failure!r}")
        with _running_lock:
            _running.append(self)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def connections(self) -> int:
        return self.state.connections()

    @property
    def in_flight(self) -> int:
        return self.state.in_flight

    @property
    def answered(self) -> int:
        return self.state.answered

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the requests open responses wait for, stop accepting, join the thread.
        Idempotent."""
        self.state.cancel_open()
        self._uvicorn.should_exit = True
        self._thread.join(timeout)
        self._sock.close()
        with _running_lock:
            if self in _running:
                _running.remove(self)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        models = "every loaded model" if self.settings.models is None else ", ".join(self.settings.models)
        state = "running" if self.running else "stopped"
        return (f"<wb.serve {self.url} ({state}; {models}; {self.connections} connections, "
                f"{self.answered} requests answered)>")


def serve(models: str | Sequence[str] | None = None, host: str = "127.0.0.1", port: int = 0,
          api_key: str | None = None, *, allow_remote: bool = False, scope_header: str | None = None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_concurrency: int = DEFAULT_MAX_CONCURRENCY) -> Server:
    """Serve the loaded models over OpenAI's HTTP API from this process (docs/serving.md).

    ``models``: model ids to serve (None: every model loaded, now or later). Loopback only
    unless ``allow_remote=True`` and an ``api_key`` are given. ``scope_header``: the header
    that names each request's cache scope (tenant); requests without it are refused.
    Returns the running :class:`Server` (``.url``, ``.stop()``).
    """
    settings = Settings(_models(models), _api_key(api_key), _scope_header(scope_header),
                        check_int("max_body_bytes", max_body_bytes, 1024, 1 << 30))
    check_int("max_concurrency", max_concurrency, 1, 4096)
    check_bool("allow_remote", allow_remote)
    _check_host(host, allow_remote, settings.api_key)
    check_int("port", port, 0, 65535)
    return Server(host, _bind(host, port), settings, max_concurrency).start()


def running() -> list[Server]:
    """The servers started in this process and not stopped."""
    with _running_lock:
        return [s for s in _running if s.running]


def stop_all() -> int:
    servers = running()
    for s in servers:
        s.stop()
    return len(servers)


# --- checks ------------------------------------------------------------------------------------

def _models(models: Any) -> tuple[str, ...] | None:
    if models is None:
        return None
    ids = (models,) if isinstance(models, str) else models
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(m, str) for m in ids):
        raise InvalidOption("models", models, "None (every loaded model), a model id or a list of model ids")
    for m in ids:
        registry.get(m)  # NotLoaded names it
    return tuple(ids)


def _api_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip() or not key.isprintable():
        raise InvalidOption("api_key", "<hidden>", "None or a non-empty printable string")
    return key


def _scope_header(name: Any) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not _HEADER.fullmatch(name):
        raise InvalidOption("scope_header", name, "None or an HTTP header name such as 'X-Tenant'")
    return name.lower()


def _check_host(host: Any, allow_remote: bool, api_key: str | None) -> None:
    if not isinstance(host, str) or not host:
        raise InvalidOption("host", host, "an address to listen on, e.g. '127.0.0.1'")
    if _is_loopback(host):
        return
    if not allow_remote or api_key is None:
        raise InvalidOption("host", host, "a loopback address ('127.0.0.1', '::1', 'localhost'); another "
                                          "interface needs allow_remote=True and an api_key")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InvalidOption("port", port, f"a port free on {host} ({e.strerror})") from None
    sock.set_inheritable(True)
    return sock
