"""wb.serve()'s own arguments: loopback unless told otherwise (and then only with a key), the
models must be loaded, a taken port is named, and stop() is idempotent and really stops."""

from __future__ import annotations

import socket

import httpx
import pytest

import workbench as wb
from workbench.errors import InvalidOption, NotLoaded


@pytest.mark.parametrize("kwargs", [{"host": "0.0.0.0"}, {"host": "0.0.0.0", "allow_remote": True},
                                    {"host": "0.0.0.0", "api_key": "k"}])
def test_a_remote_host_needs_allow_remote_and_a_key(kwargs):
    with pytest.raises(InvalidOption) as e:
        wb.serve(**kwargs)
    assert e.value.key == "host" and "allow_remote" in str(e.value)


def test_a_remote_host_with_both_serves_with_the_key():
    with wb.serve(host="0.0.0.0", allow_remote=True, api_key="sekret") as srv:
        url = f"http://127.0.0.1:{srv.port}"
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200


def test_models_must_be_loaded():
    with pytest.raises(NotLoaded, match="not-loaded"):
        wb.serve(models="not-loaded")


@pytest.mark.parametrize(("kwargs", "key"), [({"scope_header": "X Tenant"}, "scope_header"),
                                             ({"max_body_bytes": 10}, "max_body_bytes"),
                                             ({"max_concurrency": 0}, "max_concurrency"),
                                             ({"port": 70000}, "port"), ({"models": []}, "models")])
def test_bad_arguments_are_named(kwargs, key):
    with pytest.raises(InvalidOption) as e:
        wb.serve(**kwargs)
    assert e.value.key == key


def test_a_bad_api_key_is_not_echoed():
    with pytest.raises(InvalidOption) as e:
        wb.serve(api_key="hunter2\n")
    assert e.value.key == "api_key" and "hunter2" not in str(e.value)


def test_a_taken_port_is_named():
    with wb.serve() as first:
        with pytest.raises(InvalidOption) as e:
            wb.serve(port=first.port)
        assert e.value.key == "port" and str(first.port) in str(e.value)
    with socket.socket() as other:          # another program's listening socket
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(InvalidOption) as e:
            wb.serve(port=other.getsockname()[1])
        assert e.value.key == "port"


def test_stop_is_idempotent_and_closes_the_port():
    from workbench.server import running

    srv = wb.serve()
    assert srv.url == f"http://127.0.0.1:{srv.port}" and srv.port > 0
    assert httpx.get(srv.url + "/health").status_code == 200 and srv in running()
    srv.stop()
    srv.stop()
    assert not srv.running and srv not in running()
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.url + "/health")
    again = wb.serve(port=srv.port)              # the port is free again
    try:
        assert httpx.get(again.url + "/health").status_code == 200
    finally:
        again.stop()
