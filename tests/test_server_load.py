"""`clef-systemone` under load, as one real process on loopback (the session's shared server): answers that do not
move with what else is in flight, a 12 MB state answered beside small requests, memory that comes back, and
truncation made visible. An engine's death under load is checked where a server is killed (test_server_parallel.py).

The server reads at most 4096 tokens: on two cores a 16K-token prefill of even the tiny model takes seconds, and
what is shown (a 12 MB state costs one full-length prefill) does not depend on the length."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest
from servers import SHARED_AUTH, StartedServer, listening_process
from workloads import short_requests

from clef_quant.bench.workload import WORDS, sentence
from clef_vllm.format.state_cut import MAX_CALL_CHARS

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py): the
# requests here are the only ones in flight while these tests run.
pytestmark = [pytest.mark.slow, pytest.mark.unit("shared-servers", order=20)]

MAX_LEN = 4096
CLIENTS = 64
VARIED = 20  # requests before the four long states
DROPPED = "x-clef-state-tokens-dropped"
EXACT = "x-clef-state-tokens-dropped-exact"


@dataclass
class Server:
    url: str
    process: psutil.Process  # the server's own process (not its engine's)


@pytest.fixture(scope="module")
def server(shared_systemone: StartedServer) -> Server:
    return Server(shared_systemone.url, listening_process(shared_systemone.url))


def post(url: str, body: Any, timeout: float = 300) -> httpx.Response:
    content = body if isinstance(body, (bytes, Iterator)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **SHARED_AUTH}
    return httpx.post(f"{url}/v1/systemone", content=content, headers=headers, timeout=timeout)


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
    process = server.process
    huge = huge_body()
    for _ in range(2):
        assert post(server.url, huge).status_code == 200
    baseline = process.memory_info().rss
    for _ in range(6):
        assert post(server.url, huge).status_code == 200
    growth = process.memory_info().rss - baseline
    assert growth < 100 * 1024 * 1024, f"resident memory grew by {growth / 2**20:.0f} MiB over 6 requests of 12 MB"
