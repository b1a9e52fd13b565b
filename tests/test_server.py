"""`clef-systemone` and `vllm serve` as real processes on loopback, on the tiny checkpoint."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from servers import SHARED_API_KEY
from workloads import short_requests

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py),
# handed out right after the README's.
pytestmark = [pytest.mark.slow, pytest.mark.unit("shared-servers", order=20)]

API_KEY = SHARED_API_KEY
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def systemone(shared_systemone):
    return shared_systemone.url, shared_systemone.health_while_starting


def post(url: str, body, headers=AUTH, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **headers}
    return httpx.post(f"{url}/v1/systemone", content=content, headers=headers, timeout=120, **kwargs)


def test_an_in_process_engine_gives_a_long_prompt_the_servers_bits(systemone, tiny_dir):
    """eval on a CPU runs its engines' cores in its own process, whose torch threads default to every core. A CPU
    engine's bits on a long prompt follow its thread count (2 threads moved a 3.4k-token prompt by up to 5e-3 from
    the server's 1 on two cores), so such an engine computes with the threads a server's worker gets, and answers
    as the server does."""
    import random

    import torch
    from plugins.engines import small_kv_cache, start_engine

    from clef_quant.bench.workload import sentence
    from clef_vllm.engine.cpu.threads import lone_engine_threads

    url, _ = systemone
    questions = {"q0": {"type": "choice", "criteria": {"a": "", "b": "", "c": ""}}, "q1": {"type": "noul"}}
    bodies = [
        {"model": "m", "id": f"long{seed}", "state": sentence(random.Random(seed), 1000), "questions": questions}
        for seed in (7, 8)
    ]
    served = [post(url, body) for body in bodies]
    assert [r.status_code for r in served] == [200, 200]
    own = torch.get_num_threads()
    torch._C.set_num_threads(lone_engine_threads() + 1)  # a process's default (vLLM may have replaced the setter)
    try:
        with small_kv_cache() as kv_cache:
            engine = start_engine(tiny_dir, max_model_len=4096, enforce_eager=True, **kv_cache)
        try:
            assert all(engine.encode(body)[1].num_tokens > 3000 for body in bodies)
            assert engine.score(bodies) == [r.json() for r in served]
        finally:
            engine.close()
    finally:
        torch._C.set_num_threads(own)


def test_health_is_503_until_warmed_up(systemone):
    _, statuses = systemone
    assert statuses[-1] == 200
    assert 503 in statuses, f"the server answered {statuses} while starting"


def test_concurrent_clients_get_the_sequential_answers(systemone):
    url, _ = systemone
    bodies = short_requests(16, seed=3)
    sequential = [post(url, body) for body in bodies]
    assert [r.status_code for r in sequential] == [200] * len(bodies)
    expected = [r.json() for r in sequential]

    def client(index: int) -> list[tuple[int, int, dict]]:
        results = []
        for round_ in range(2):
            body_index = (index + round_) % len(bodies)
            response = post(url, bodies[body_index])
            results.append((body_index, response.status_code, response.json()))
        return results

    with ThreadPoolExecutor(16) as pool:
        outcomes = [item for results in pool.map(client, range(16)) for item in results]
    assert len(outcomes) == 32
    for body_index, status, answer in outcomes:
        assert status == 200
        assert answer == expected[body_index]


BAD_REQUESTS = [
    pytest.param(b"{not json", 400, "JSON", id="invalid-json"),
    pytest.param({"model": "m", "questions": {"a": {"type": "noul"}}}, 400, "state", id="missing-state"),
    pytest.param({"model": "m", "state": 1, "questions": {}}, 400, "questions", id="no-questions"),
    pytest.param(
        {"model": "m", "state": 1, "questions": {"a": {"type": "choice", "criteria": {}}}},
        400,
        '"a"',
        id="no-options",
    ),
    pytest.param(
        {"model": "m", "state": 1, "questions": {f"q{i}": {"type": "noul"} for i in range(65)}},
        400,
        "too many questions",
        id="65-questions",
    ),
    pytest.param(
        {"model": "m", "state": 1, "images": ["aGVsbG8="], "questions": {"a": {"type": "noul"}}},
        400,
        "images",
        id="image",
    ),
    pytest.param(
        {
            "model": "m",
            "state": "word " * 5000,
            "questions": {"a": {"type": "choice", "criteria": {f"o{i}": "option " * 40 for i in range(100)}}},
        },
        400,
        "schema requires",
        id="schema-too-long",
    ),
    pytest.param(b'{"model": "m", "state": "' + b"x" * (14 * 1024 * 1024) + b'"}', 413, "exceeds", id="too-large"),
]


@pytest.mark.parametrize(("body", "status", "needle"), BAD_REQUESTS)
def test_bad_input_gets_its_4xx_and_the_server_stays_healthy(systemone, body, status, needle):
    url, _ = systemone
    response = post(url, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"]
    assert error["type"] in {"invalid_request_error", "request_too_large"}
    assert httpx.get(f"{url}/health").status_code == 200


def test_api_key_is_required(systemone):
    url, _ = systemone
    body = short_requests(1)[0]
    assert post(url, body, headers={}).status_code == 401
    assert post(url, body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert post(url, body).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200  # health stays open for load balancers


def test_models_and_openapi(systemone, tiny_dir):
    url, _ = systemone
    models = httpx.get(f"{url}/v1/models", headers=AUTH).json()
    assert models["data"][0]["id"] == tiny_dir.name  # a name, never the folder's path
    spec = httpx.get(f"{url}/openapi.json").json()
    operation = spec["paths"]["/v1/systemone"]["post"]
    schema_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert "questions" in json.dumps(spec["components"]["schemas"][schema_ref.rsplit("/", 1)[-1]])
    assert {"200", "400", "401", "413", "415"} <= set(operation["responses"])


def test_vllm_serve_answers_like_clef_systemone(systemone, vllm_serve):
    url, _ = systemone
    # vLLM's parser turns JSON descriptions into Python strings and caps choices at 26 options: use text.
    bodies = [body for body in short_requests(12, seed=5) if isinstance(body["state"], str)]
    for body in bodies:
        ours = post(url, body).json()
        theirs = post(vllm_serve, body, headers={}).json()
        assert "usage" in theirs, theirs
        assert theirs["usage"]["input_tokens"] == ours["usage"]["input_tokens"]
        for qid, answer in ours["answers"].items():
            other = theirs["answers"][qid]
            assert other["type"] == answer["type"]
            if answer["type"] == "noul":
                assert round(other["noul"], 4) == answer["noul"]
                continue
            assert {k: round(p, 4) for k, p in other["probabilities"].items()} == answer["probabilities"]
            if answer["type"] == "choice":
                assert other["choice"] == answer["choice"]
            else:
                assert round(other["score"], 4) == answer["score"]
