"""GET /metrics: the workbench's readings in Prometheus's text format (prometheus_client
writes it).

- every ``wb.counters()`` total as ``workbench_<name>_total`` (a counter), the cache's
  levels (bytes_<tier>, rows_<tier>, rows, chunks; cache/counters.py says which) as gauges;
- per served model, gauges labelled ``model``: queue_depth (requests on a sequence),
  pending_len (waiting for one), available_seqs, sessions, n_seq_max, and ``phase`` as one
  0/1 series per phase;
- the server's own: open HTTP connections and requests in flight.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import workbench as wb

from ..cache.counters import is_gauge
from ..engine.events import ModelPhase
from ..errors import NotLoaded

CACHE_PREFIX = "cache_"  # wb.counters() names the cache's counters cache_<name>
MODEL_GAUGES = ("queue_depth", "pending_len", "available_seqs", "sessions", "n_seq_max")


class _Readings:
    """A collector that reads the workbench when scraped."""

    def __init__(self, models: Sequence[str], server: Any) -> None:
        self.models, self.server = list(models), server

    def collect(self) -> Iterator[Metric]:
        yield from _totals(wb.counters())
        yield from _per_model(self.models)
        yield from _server(self.server)


def prometheus_text(models: Sequence[str], server: Any) -> bytes:
    """The exposition text; ``server`` has ``connections()`` and ``in_flight``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Readings(models, server))
    return generate_latest(registry)


def _totals(counters: dict[str, int]) -> Iterator[Metric]:
    for name, value in sorted(counters.items()):
        if name.startswith(CACHE_PREFIX) and is_gauge(name[len(CACHE_PREFIX):]):
            yield GaugeMetricFamily(f"workbench_{name}", f"wb.counters()['{name}'] (a level now)", value=value)
        else:
            yield CounterMetricFamily(f"workbench_{name}", f"wb.counters()['{name}']", value=value)


def _per_model(models: Sequence[str]) -> Iterator[Metric]:
    infos = []
    for m in models:
        try:
            infos.append(wb.model_info(m))
        except NotLoaded:  # unloaded between the list and now
            continue
    for key in MODEL_GAUGES:
        g = GaugeMetricFamily(f"workbench_model_{key}", f"model_info()['{key}']", labels=["model"])
        for info in infos:
            g.add_metric([info["model_id"]], info[key])
        yield g
    phase = GaugeMetricFamily("workbench_model_phase", "1 for the phase the model's loop is in",
                              labels=["model", "phase"])
    for info in infos:
        for p in get_args(ModelPhase):
            phase.add_metric([info["model_id"], p], 1 if info["phase"] == p else 0)
    yield phase


def _server(server: Any) -> Iterator[Metric]:
    yield GaugeMetricFamily("workbench_server_connections", "open HTTP connections", value=server.connections())
    yield GaugeMetricFamily("workbench_server_requests_in_flight", "HTTP requests being answered",
                            value=server.in_flight)
