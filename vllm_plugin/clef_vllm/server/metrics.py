"""`GET /metrics`: the server's Prometheus metrics, followed by vLLM's own engine metrics.

Ours live in a registry per application, so that several apps in one process never share counts. vLLM's
AsyncLLM registers its `vllm:*` metrics (scheduler queue, token counters, latencies) in prometheus_client's
default registry when it starts, so they appear, with the process's own, once the engine is up, as they do
under `vllm serve`.

Routes are labelled by their template (`/accounts/{account_id}/ai/run/@cf/cloudflare/{name}`), and every path
that matches no route by one label, so hostile paths cannot grow the number of series.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from clef_vllm.server.backend import EngineBackend, Load

UNMATCHED = "unmatched"
# From a tiny model's few milliseconds on a GPU to a long state on a CPU.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def route_template(scope: dict[str, Any]) -> str:
    """The template of the route the router chose for this request (also for a 405), else `unmatched`."""
    return getattr(scope.get("route"), "path_format", None) or UNMATCHED


class _BackendCollector(Collector):
    """Read at every scrape: the engine's state and what the backend is working on."""

    def __init__(self, backend: EngineBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "clef_engine_state", "1 for the engine's current state (starting, ready or dead)", labels=["state"]
        )
        current = self.backend.state
        for name in EngineBackend.STATES:
            state.add_metric([name], 1.0 if name == current else 0.0)
        yield state
        load = self.backend.load
        in_progress = GaugeMetricFamily(
            "clef_requests_in_progress",
            "Scoring requests being encoded, or in the engine (queued in its scheduler or running)",
            labels=["stage"],
        )
        for stage in Load.STAGES:
            in_progress.add_metric([stage], load.in_progress[stage])
        yield in_progress
        yield CounterMetricFamily(
            "clef_prompt_tokens", "Prompt tokens sent to the engine, warm-up included", value=load.prompt_tokens
        )


class ServerMetrics:
    """The application's metrics; `record` is called once per finished HTTP request."""

    def __init__(self, backend: EngineBackend) -> None:
        self.backend = backend
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "clef_http_requests", "HTTP requests answered, by route and status", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "clef_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_BackendCollector(backend))

    def record(self, scope: dict[str, Any], status: int, seconds: float) -> None:
        route = route_template(scope)
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def response(self) -> Response:
        body = generate_latest(self.registry)
        # vLLM registers its metrics while the engine is made, and it is imported by then: importing it before
        # would block the event loop on the import the starting engine is doing in its thread.
        if self.backend.engine is not None:
            from vllm.v1.metrics.prometheus import get_prometheus_registry  # honours PROMETHEUS_MULTIPROC_DIR

            body += generate_latest(get_prometheus_registry())
        return Response(body, media_type=CONTENT_TYPE_LATEST)
