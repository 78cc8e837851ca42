"""GET /metrics: Prometheus text a scraper parses: wb.counters() as counters that move with
the traffic, per-model gauges that show a running request, the server's connections."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import workbench as wb
from waiting import wait_for

pytestmark = pytest.mark.model


def scrape(http: httpx.Client) -> dict:
    """{family name: (type, {(sample name, labels as a sorted tuple): value})}"""
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: (f.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
            for f in text_string_to_metric_families(r.text)}


def value(families: dict, family: str, sample: str, **labels: str) -> float:
    return families[family][1][(sample, tuple(sorted(labels.items())))]


def test_counters_go_up_with_the_requests(model, client, http):
    before = scrape(http)
    assert before["workbench_finished_length"][0] == "counter"
    counted = wb.counters()["finished_length"]
    for prompt in ("One", "Two", "Three"):
        assert client.completions.create(model=model, prompt=prompt, max_tokens=2).choices[0].finish_reason == "length"
    after = scrape(http)
    grew = (value(after, "workbench_finished_length", "workbench_finished_length_total")
            - value(before, "workbench_finished_length", "workbench_finished_length_total"))
    assert grew == 3 == wb.counters()["finished_length"] - counted


def test_queue_depth_shows_a_running_request(model, client, http):
    depth = ("workbench_model_queue_depth", "workbench_model_queue_depth")
    assert wait_for(lambda: wb.model_info(model)["queue_depth"] == 0, 10)
    assert scrape(http)[depth[0]][0] == "gauge"
    assert value(scrape(http), *depth, model=model) == 0
    stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4000, stream=True,
                                       extra_body={"ignore_eos": True})
    try:
        next(iter(stream))
        assert value(scrape(http), *depth, model=model) == 1
    finally:
        stream.close()
    assert wait_for(lambda: wb.model_info(model)["queue_depth"] == 0, 10)
    assert value(scrape(http), *depth, model=model) == 0


def test_server_connections(model):
    """A server of its own, so only this test's connections are open on it."""
    conn = ("workbench_server_connections", "workbench_server_connections")
    with wb.serve() as srv, httpx.Client(base_url=srv.url) as scraper:
        assert scrape(scraper)[conn[0]][0] == "gauge"
        assert value(scrape(scraper), *conn) == 1                      # the scraper's own
        with httpx.Client(base_url=srv.url) as other:
            assert other.get("/health").status_code == 200              # kept alive
            assert value(scrape(scraper), *conn) == 2
        assert wait_for(lambda: srv.connections == 1, 10)
        assert value(scrape(scraper), *conn) == 1
