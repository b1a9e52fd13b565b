"""`GET /metrics` of a real `clef-systemone` process (the session's shared server), read with prometheus_client's
own parser: counters that move with requests, latency histograms, queue depth, prompt tokens, the engine's state
from loading to ready, vLLM's engine metrics, and the key rule of /health. The engine's death on /metrics is
checked where a server is killed (test_server_parallel.py)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import SHARED_API_KEY, StartedServer
from workloads import TEST_STATE_WORDS, short_requests

from clef_quant.bench.workload import varied_requests

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py),
# whose API key the requests here carry.
pytestmark = [pytest.mark.slow, pytest.mark.unit("shared-servers", order=20)]

API_KEY = SHARED_API_KEY
AUTH = {"Authorization": f"Bearer {API_KEY}"}
WORKERS_AI = "/accounts/{account}/ai/run/@cf/cloudflare/clef-flash"
WORKERS_AI_TEMPLATE = "/accounts/{account_id}/ai/run/@cf/cloudflare/{name}"
STAGES = ("encoding", "engine")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a labelled series not yet created (a counter that has not moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


@dataclass
class Server:
    url: str
    while_loading: list[Samples]

    def scrape(self, headers: dict[str, str] | None = None) -> Samples:
        response = httpx.get(f"{self.url}/metrics", headers=headers or {}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain")
        return parse(response.text)

    def post(self, body: Any, path: str = "/v1/systemone") -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {**AUTH, "Content-Type": "application/json"}
        return httpx.post(self.url + path, content=content, headers=headers, timeout=300)


@pytest.fixture(scope="module")
def server(shared_systemone: StartedServer) -> Server:
    """The shared server, with what a scraper read while it loaded. The tests here read counters as differences,
    since the other modules on it post too (one after another: they are one unit of work)."""
    return Server(shared_systemone.url, [parse(text) for text in shared_systemone.metrics_while_loading])


def engine_state(samples: Samples) -> dict[str, float]:
    return {state: value(samples, "clef_engine_state", state=state) for state in ("starting", "ready", "dead")}


def test_metrics_show_the_engine_starting_then_ready(server: Server) -> None:
    assert server.while_loading, "no scrape reached the server while it was loading"
    assert engine_state(server.while_loading[0]) == {"starting": 1.0, "ready": 0.0, "dead": 0.0}
    assert engine_state(server.scrape()) == {"starting": 0.0, "ready": 1.0, "dead": 0.0}


def test_metrics_are_open_like_health_while_the_api_needs_the_key(server: Server) -> None:
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, AUTH):
        assert value(server.scrape(headers), "clef_engine_state", state="ready") == 1.0


def test_a_200_and_a_400_move_the_counters_histogram_and_prompt_tokens(server: Server) -> None:
    route = "/v1/systemone"
    before = server.scrape()
    answered = server.post(short_requests(1, seed=5)[0])
    assert answered.status_code == 200, answered.text
    assert server.post(b"{not json").status_code == 400
    after = server.scrape()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("clef_http_requests_total", route=route, status="200") == 1
    assert moved("clef_http_requests_total", route=route, status="400") == 1
    assert moved("clef_http_request_duration_seconds_count", route=route) == 2
    assert moved("clef_http_request_duration_seconds_sum", route=route) > 0
    buckets = sorted(
        (float(dict(labels)["le"]), count)
        for (name, labels), count in after.items()
        if name == "clef_http_request_duration_seconds_bucket" and dict(labels)["route"] == route
    )
    assert buckets[-1] == (float("inf"), value(after, "clef_http_request_duration_seconds_count", route=route))
    assert [count for _, count in buckets] == sorted(count for _, count in buckets)  # cumulative
    # Only the 200 reached the engine: the 400 was refused before encoding.
    assert moved("clef_prompt_tokens_total") == answered.json()["usage"]["input_tokens"]


def test_routes_are_labelled_by_template_whatever_the_path(server: Server) -> None:
    accounts = [f"acct-{uuid.uuid4().hex}" for _ in range(3)]
    strays = [f"/stray-{uuid.uuid4().hex}/x" for _ in range(3)]
    before = server.scrape()
    for account in accounts:
        assert server.post(b"{not json", path=WORKERS_AI.format(account=account)).status_code == 400
    for stray in strays:
        assert httpx.get(server.url + stray, headers=AUTH).status_code == 404
    response = httpx.get(f"{server.url}/metrics", timeout=30)
    after = parse(response.text)
    for raw in (*accounts, *strays):
        assert raw not in response.text
    route, unmatched = {"route": WORKERS_AI_TEMPLATE, "status": "400"}, {"route": "unmatched", "status": "404"}
    assert value(after, "clef_http_requests_total", **route) - value(before, "clef_http_requests_total", **route) == 3
    assert (
        value(after, "clef_http_requests_total", **unmatched) - value(before, "clef_http_requests_total", **unmatched)
        == 3
    )


def test_queue_depth_rises_under_load_and_falls_back_to_zero(server: Server) -> None:
    # Twelve clients keep posting the longest test states until a scrape sees two or more requests in progress:
    # on two busy cores one round of requests can end between two scrapes, so the load lasts until it is seen
    # (or a minute passes, which fails the test).
    bodies = varied_requests(12, seed=11, state_words=(max(TEST_STATE_WORDS),))
    contents = [json.dumps(body).encode() for body in bodies]
    headers = {**AUTH, "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=len(bodies))
    seen = threading.Event()
    deadline = time.monotonic() + 60

    def scrape_until_seen() -> None:
        while not seen.is_set() and time.monotonic() < deadline:
            samples = server.scrape()
            if sum(value(samples, "clef_requests_in_progress", stage=s) for s in STAGES) >= 2:
                seen.set()
            time.sleep(0.02)

    scraper = threading.Thread(target=scrape_until_seen)
    scraper.start()
    with httpx.Client(base_url=server.url, headers=headers, timeout=300, limits=limits) as client:

        def post_until_seen(content: bytes) -> list[int]:
            codes = [client.post("/v1/systemone", content=content).status_code]
            while not seen.is_set() and time.monotonic() < deadline:
                codes.append(client.post("/v1/systemone", content=content).status_code)
            return codes

        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = [code for codes in pool.map(post_until_seen, contents) for code in codes]
    scraper.join()
    assert set(answers) == {200}
    assert seen.is_set(), "no scrape saw two requests in progress while twelve clients posted for a minute"
    after = server.scrape()
    assert [value(after, "clef_requests_in_progress", stage=stage) for stage in STAGES] == [0, 0]


def test_vllm_engine_metrics_follow_ours_under_the_served_name(server: Server, tiny_dir: Path) -> None:
    before = server.scrape()
    answered = server.post(short_requests(1, seed=6)[0])
    assert answered.status_code == 200, answered.text
    response = httpx.get(f"{server.url}/metrics", timeout=30)
    after = parse(response.text)
    engine = {"model_name": tiny_dir.name, "engine": "0"}  # the name /v1/models shows
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert after[(name, frozenset(engine.items()))] == 0
    tokens = answered.json()["usage"]["input_tokens"]
    assert (
        value(after, "vllm:prompt_tokens_total", **engine) - value(before, "vllm:prompt_tokens_total", **engine)
        == tokens
    )
    assert str(tiny_dir) not in response.text


def test_openapi_lists_metrics_as_plain_text(server: Server) -> None:
    from openapi_spec_validator import validate

    spec = httpx.get(f"{server.url}/openapi.json").json()
    validate(spec)
    assert set(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
