"""`clef-systemone` under load, as one real process on loopback: answers that do not move with what else is in
flight, a 12 MB state answered beside small requests, memory that comes back, truncation made
visible, and an engine death that /metrics shows before the server exits with a status a supervisor sees (the last
test: it ends the module's server).

The server reads at most 4096 tokens: on two cores a 16K-token prefill of even the tiny model takes seconds, and
what is shown (a 12 MB state costs one full-length prefill) does not depend on the length."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from workloads import short_requests

from clef_quant.bench.processes import free_port, server_env, systemone_command, wait_healthy
from clef_quant.bench.workload import WORDS, sentence
from clef_vllm.format.state_cut import MAX_CALL_CHARS
from clef_vllm.server.cli import EXIT_ENGINE_DIED

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = [pytest.mark.slow, pytest.mark.unit(order=120)]

MAX_LEN = 4096
CLIENTS = 64
VARIED = 20  # requests before the four long states
DROPPED = "x-clef-state-tokens-dropped"
EXACT = "x-clef-state-tokens-dropped-exact"


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path


@pytest.fixture(scope="module")
def server(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "systemone.log"
    command = systemone_command(tiny_dir, port, "--max-model-len", str(MAX_LEN), "--enforce-eager")
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True
        )
        try:
            wait_healthy(process, port, log)
            yield Server(f"http://127.0.0.1:{port}", process, log)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def post(url: str, body: Any, timeout: float = 300) -> httpx.Response:
    content = body if isinstance(body, (bytes, Iterator)) else json.dumps(body)
    return httpx.post(
        f"{url}/v1/systemone", content=content, headers={"Content-Type": "application/json"}, timeout=timeout
    )


def every_type(rng: random.Random) -> dict[str, Any]:
    return {
        "pick": {"type": "choice", "criteria": {w: sentence(rng, 3) for w in rng.sample(WORDS, 5)}},
        "yes": {"type": "noul", "instructions": sentence(rng, 5)},
        "level": {"type": "score", "criteria": [sentence(rng, 2) for _ in range(4)]},
    }


def long_state(rng: random.Random, tokenizer: Any, tokens: int) -> str:
    """The fewest words whose tokenization is at least `tokens` long (each word is at least one token)."""
    words = [rng.choice(WORDS) for _ in range(tokens)]

    def length(count: int) -> int:
        return len(tokenizer(" ".join(words[:count]), add_special_tokens=False)["input_ids"])

    low, high = 1, len(words)
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if length(middle) < tokens else (low, middle)
    return " ".join(words[:low])


def load_requests(tokenizer: Any) -> list[dict[str, Any]]:
    """24 requests: 20 varied ones (every question type, text and JSON states), and four long states around
    the limit: just under it, a few tokens over, thousands over (all counted exactly), and far beyond: more
    characters than the server reads to count, so the dropped count is an estimate."""
    rng = random.Random(24)
    bodies = short_requests(VARIED, seed=24)
    states = [long_state(rng, tokenizer, tokens) for tokens in (MAX_LEN - 500, MAX_LEN + 50, MAX_LEN + 3000)]
    states.append(" ".join(rng.choice(WORDS) for _ in range(MAX_CALL_CHARS)))  # over twice one call's characters
    for index, state in enumerate(states):
        bodies.append({"model": "clef", "id": f"long{index}", "state": state, "questions": every_type(rng)})
    return bodies


def answers(response: httpx.Response) -> tuple[dict[str, Any], str | None, str | None]:
    assert response.status_code == 200, response.text
    return response.json(), response.headers.get(DROPPED), response.headers.get(EXACT)


@pytest.fixture(scope="module")
def sequential(server: Server, tokenizer: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    bodies = load_requests(tokenizer)
    return bodies, [answers(post(server.url, body)) for body in bodies]


def test_64_concurrent_clients_get_exactly_the_sequential_answers(server: Server, sequential: Any) -> None:
    bodies, expected = sequential

    def client(index: int) -> tuple[int, Any]:
        # Every body once, the rest of the clients on the varied ones: the long states cost a full prefill each.
        body_index = index if index < len(bodies) else index % VARIED
        return body_index, answers(post(server.url, bodies[body_index]))

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(client, range(CLIENTS)))
    assert {i for i, _ in results} == set(range(len(bodies)))
    for index, got in results:
        assert got == expected[index], f"request {index} moved under load"


def test_every_question_type_and_the_limit_are_covered(sequential: Any) -> None:
    _, expected = sequential
    types = {answer["type"] for body, _, _ in expected for answer in body["answers"].values()}
    assert types == {"choice", "noul", "score"}
    lengths = [body["usage"]["input_tokens"] for body, _, _ in expected]
    assert max(lengths) == MAX_LEN and any(MAX_LEN - 600 < n < MAX_LEN for n in lengths)


def test_the_truncation_header_counts_the_dropped_state_tokens(server: Server, sequential: Any, tokenizer) -> None:
    from clef_vllm.format.encoding import encode_request
    from clef_vllm.format.request import parse_request

    bodies, expected = sequential
    for body, (answer, dropped, exact) in zip(bodies, expected, strict=True):
        encoding = encode_request(parse_request(body), tokenizer, max_length=MAX_LEN)
        assert dropped == str(encoding.state_tokens_dropped)
        assert exact == ("true" if encoding.state_tokens_dropped_exact else "false")
        assert set(answer) == {"model", "answers", "usage"}  # the body keeps the release's shape
    long = [(int(dropped), exact) for _, dropped, exact in expected[VARIED:]]
    assert long[0] == (0, "true")  # just under the limit
    assert [exact for dropped, exact in long[1:] if dropped > 0] == ["true", "true", "false"]


def huge_body(megabytes: int = 12) -> bytes:
    rng = random.Random(12)
    line = " ".join(rng.choice(WORDS) for _ in range(200)) + "\n"
    state = line * (megabytes * 1_000_000 // len(line))
    return json.dumps({"model": "clef", "state": state, "questions": {"q": {"type": "noul"}}}).encode()


def test_a_12_mb_state_is_answered_beside_small_requests_with_an_estimated_drop_count(
    server: Server, sequential: Any
) -> None:
    """What the server answers; how long others wait behind such a state is measured by
    `clef-quant bench serve --long-inputs` (bench/results/serve-cpu.md), not here.

    The huge body is sent in two halves, and its second half only once the small requests have their answers: so
    they are answered while it is in flight, by construction (a server that served one body at a time would never
    answer them, and the test would time out)."""
    bodies, expected = sequential
    huge = huge_body()
    small_answered = threading.Event()

    def two_halves() -> Iterator[bytes]:
        yield huge[: len(huge) // 2]
        small_answered.wait(timeout=240)
        yield huge[len(huge) // 2 :]

    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(huge=post(server.url, two_halves())))
    thread.start()
    try:
        small = [answers(post(server.url, body, timeout=120)) for body in bodies[:3]]
        assert thread.is_alive()  # the huge request is still being read
    finally:
        small_answered.set()
        thread.join()
    assert small == expected[:3]
    assert result["huge"].status_code == 200, result["huge"].text
    assert result["huge"].headers[EXACT] == "false" and int(result["huge"].headers[DROPPED]) > 1_000_000
    assert result["huge"].json()["usage"]["input_tokens"] == MAX_LEN


def test_memory_comes_back_after_large_requests(server: Server) -> None:
    process = psutil.Process(server.process.pid)
    huge = huge_body()
    for _ in range(2):
        assert post(server.url, huge).status_code == 200
    baseline = process.memory_info().rss
    for _ in range(6):
        assert post(server.url, huge).status_code == 200
    growth = process.memory_info().rss - baseline
    assert growth < 100 * 1024 * 1024, f"resident memory grew by {growth / 2**20:.0f} MiB over 6 requests of 12 MB"


def engine_core(server: Server) -> psutil.Process:
    children = psutil.Process(server.process.pid).children(recursive=True)
    cores = [child for child in children if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline())]
    assert cores, [(c.name(), c.cmdline()) for c in children]
    return cores[0]


def engine_state(metrics: str) -> dict[str, float]:
    """`clef_engine_state` by state, read with prometheus_client's parser."""
    return {
        sample.labels["state"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "clef_engine_state"
    }


def test_engine_death_shows_on_metrics_answers_503_then_the_server_exits_non_zero(
    server: Server, sequential: Any
) -> None:
    bodies, _ = sequential
    in_flight: list[httpx.Response] = []
    # Many more requests than finish in a moment (one prompt per engine step), and the kill as soon as the first
    # answer is back: the rest are then surely queued or running, however fast this machine is today.
    waiting = bodies * 2
    threads = [threading.Thread(target=lambda b=b: in_flight.append(post(server.url, b))) for b in waiting]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while not in_flight and time.monotonic() < deadline:
        time.sleep(0.005)
    engine_core(server).kill()
    # A scraper sees the engine dead while the server still answers (it exits a grace period later).
    states: list[dict[str, float]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not states or states[-1]["dead"] != 1.0):
        states.append(engine_state(httpx.get(f"{server.url}/metrics", timeout=30).text))
        time.sleep(0.05)
    assert states[-1] == {"starting": 0.0, "ready": 0.0, "dead": 1.0}, states
    for thread in threads:
        thread.join()
    assert {r.status_code for r in in_flight} <= {200, 503} and 503 in {r.status_code for r in in_flight}
    for response in in_flight:
        if response.status_code == 503:
            assert response.json()["error"]["type"] == "service_unavailable"
    try:
        assert post(server.url, bodies[0], timeout=10).status_code == 503
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 503
    except httpx.TransportError:
        pass  # already gone: the exit below is what a supervisor acts on
    assert server.process.wait(timeout=60) == EXIT_ENGINE_DIED
    assert "the engine has stopped" in server.log.read_text()
