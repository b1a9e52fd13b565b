"""`clef-systemone` as SystemOne clients speak it: one error shape, request ids, compressed bodies, optional
`model`, both model lists, the Workers AI route and a valid OpenAPI document. One real server process."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import pytest
import zstandard
from openapi_checks import assert_limits_documented, assert_models_described
from servers import PROBE, SHARED_API_KEY, SHARED_FLAGS

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py),
# handed out right after the README's.
pytestmark = [pytest.mark.slow, pytest.mark.unit("shared-servers", order=20)]

API_KEY = SHARED_API_KEY
AUTH = {"Authorization": f"Bearer {API_KEY}"}
WORKERS_AI = "/accounts/acct123/ai/run/@cf/cloudflare/clef-flash"
BODY = PROBE  # every question type, a JSON state


class Server:
    def __init__(self, url: str, log: Path, loading: list[httpx.Response]) -> None:
        self.url, self.log, self.loading = url, log, loading

    def post(self, body, path="/v1/systemone", headers=AUTH, encoding=None) -> httpx.Response:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **headers}
        if encoding:
            sent["Content-Encoding"] = encoding
        return httpx.post(self.url + path, content=raw, headers=sent, timeout=120)


@pytest.fixture(scope="module")
def server(shared_systemone):
    loading = [r for r in shared_systemone.answers_while_loading if r.status_code == 503]
    return Server(shared_systemone.url, shared_systemone.log, loading)


def assert_error_shape(response: httpx.Response, status: int, code: str, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "detail", "code"} and set(body["error"]) == {"type", "code", "message", "field"}
    assert body["detail"] == body["error"]["message"]
    assert body["code"] == body["error"]["code"] == code
    assert body["error"]["field"] == field
    assert body["error"]["message"] and isinstance(body["error"]["type"], str)
    return body["error"]


def test_loading_is_503_with_retry_after_in_the_error_shape(server):
    assert server.loading, "no request reached the server while it was loading"
    for response in server.loading:
        assert_error_shape(response, 503, "engine_starting")
        assert int(response.headers["retry-after"]) > 0


# (method, path, body, headers, status, code, field)
ERRORS = [
    pytest.param("POST", "/v1/systemone", b"{not json", AUTH, 400, "invalid_json", None, id="400-json"),
    pytest.param("POST", "/v1/systemone", {"questions": {"q": {"type": "noul"}}}, AUTH, 400, "invalid_request", "state",
                 id="400-missing-state"),
    pytest.param("POST", "/v1/systemone", {"state": 1, "questions": {"q": {"type": "choice", "criteria": [1]}}}, AUTH,
                 400, "invalid_request", "questions.q.criteria", id="400-field"),
    pytest.param("POST", "/v1/systemone", BODY, {}, 401, "invalid_api_key", None, id="401-no-key"),
    pytest.param("POST", "/v1/systemone", BODY, {"Authorization": "Bearer nope"}, 401, "invalid_api_key", None,
                 id="401-wrong-key"),
    pytest.param("GET", "/v1/models", None, {"Authorization": f"Basic {API_KEY}"}, 401, "invalid_api_key", None,
                 id="401-other-scheme"),
    pytest.param("GET", "/v1/nothing", None, AUTH, 404, "not_found", None, id="404"),
    pytest.param("GET", "/v1/systemone", None, AUTH, 405, "method_not_allowed", None, id="405"),
    pytest.param("POST", "/v1/systemone", b'{"state": "' + b"x" * (14 << 20) + b'"}', AUTH, 413, "body_too_large",
                 None, id="413"),
    pytest.param("POST", "/v1/systemone", BODY, {**AUTH, "Content-Encoding": "br"}, 415,
                 "unsupported_content_encoding", "Content-Encoding", id="415"),
    pytest.param("POST", "/v1/systemone", b"not gzip at all", {**AUTH, "Content-Encoding": "gzip"}, 400,
                 "invalid_content_encoding", "Content-Encoding", id="400-bad-gzip"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "headers", "status", "code", "field"), ERRORS)
def test_every_error_has_one_shape(server, method, path, body, headers, status, code, field):
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = httpx.request(method, server.url + path, content=content, headers=headers, timeout=120)
    assert_error_shape(response, status, code, field)
    assert response.headers["x-request-id"]
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"
        assert "Bearer KEY" not in response.text  # secret maskers garble a literal key placeholder
    if status == 405:
        assert response.headers["allow"] == "POST"
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(server, scheme):
    response = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"{scheme} {API_KEY}"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [
        pytest.param("client-id-42", True, id="well-formed"),
        pytest.param("0f8fad5b-d9cb-469f-a165-70867728950e", True, id="uuid"),
        pytest.param("has spaces in it", False, id="spaces"),
        pytest.param("x" * 300, False, id="too-long"),
        pytest.param(None, False, id="absent"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/nothing"])
def test_request_ids_are_echoed_or_made_and_logged(server, sent, echoed, path):
    headers = {**AUTH, **({"X-Request-Id": sent} if sent else {})}
    response = server.post(BODY, path=path, headers=headers)
    request_id = response.headers["x-request-id"]
    assert response.headers["x-typesafe-request-id"] == request_id
    if echoed:
        assert request_id == sent
    else:
        assert re.fullmatch(r"req_[0-9a-f]{32}", request_id)
    status = response.status_code
    deadline = time.monotonic() + 5
    while f'{request_id} 127.0.0.1 "POST {path}" {status}' not in server.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no log line for {request_id}"
        time.sleep(0.1)


def test_model_is_optional_and_echoed(server):
    without = server.post({k: v for k, v in BODY.items() if k != "model"})
    named = server.post({**BODY, "model": "whatever-the-client-calls-it"})
    assert without.status_code == named.status_code == 200
    assert without.json()["model"] == "tiny"  # the served name: the folder's name, not its path
    assert named.json()["model"] == "whatever-the-client-calls-it"
    assert named.json()["answers"] == without.json()["answers"]
    refused = server.post({**BODY, "model": None})
    assert_error_shape(refused, 400, "invalid_request", "model")


def test_one_option_choices_and_one_level_scores_are_answered(server):
    body = {"state": "x", "questions": {"c": {"type": "choice", "criteria": {"only": "it"}},
                                        "s": {"type": "score", "criteria": ["one"]}}}  # fmt: skip
    answers = server.post(body).json()["answers"]
    assert answers["c"] == {"type": "choice", "choice": "only", "confidence": 1.0, "probabilities": {"only": 1.0}}
    assert answers["s"] == {"type": "score", "score": 0.0, "confidence": 1.0, "legend": {"0": "one"},
                            "probabilities": {"0": 1.0}}  # fmt: skip


COMPRESSORS = [
    pytest.param("zstd", zstandard.ZstdCompressor().compress, id="zstd"),
    pytest.param("gzip", gzip.compress, id="gzip"),
    pytest.param("deflate", zlib.compress, id="deflate"),
    pytest.param("deflate", lambda data: zlib.compress(data, wbits=-15), id="deflate-raw"),
    pytest.param("GZIP", gzip.compress, id="gzip-upper-case"),
]


@pytest.mark.parametrize(("encoding", "compress"), COMPRESSORS)
def test_compressed_bodies_get_the_same_answers(server, encoding, compress):
    plain = server.post(BODY)
    raw = json.dumps(BODY).encode()
    assert len(raw) > 1024
    response = server.post(compress(raw), encoding=encoding)
    assert response.status_code == 200, response.text
    assert response.json() == plain.json()


@pytest.mark.parametrize(("encoding", "compress"), COMPRESSORS[:3])
def test_the_cap_applies_after_decompression(server, encoding, compress):
    bomb = b'{"state": "' + b"a" * (20 << 20) + b'", "questions": {"q": {"type": "noul"}}}'
    packed = compress(bomb)
    assert len(packed) < 1 << 20
    assert_error_shape(server.post(packed, encoding=encoding), 413, "body_too_large")
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_models_lists_both_shapes(server):
    listing = httpx.get(f"{server.url}/v1/models", headers=AUTH).json()
    (card,) = listing["data"]
    assert card["id"] == "tiny" and card["object"] == "model" and card["owned_by"]
    assert isinstance(card["created"], int) and card["max_model_len"] == 4096
    (entry,) = listing["models"]
    assert entry["name"] == "tiny"
    assert all(isinstance(entry[key], str) and entry[key] for key in ("name", "description", "release_date"))
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["release_date"])


@pytest.mark.parametrize("name", ["clef-flash", "clef", "tiny"])
def test_workers_ai_route_answers_in_cloudflare_envelope(server, name):
    path = f"/accounts/acct123/ai/run/@cf/cloudflare/{name}"
    body = {**BODY, "model": name}
    response = server.post(body, path=path)
    assert response.status_code == 200
    envelope = response.json()
    assert envelope == {"success": True, "result": server.post(body).json(), "errors": [], "messages": []}


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"),
    [
        pytest.param(WORKERS_AI, {"state": 1}, AUTH, 400, id="400"),
        pytest.param(WORKERS_AI, BODY, {}, 401, id="401"),
        pytest.param("/accounts/a/ai/run/@cf/cloudflare/other-model", BODY, AUTH, 404, id="404-model"),
        pytest.param(WORKERS_AI, BODY, {**AUTH, "Content-Encoding": "br"}, 415, id="415"),
    ],
)
def test_workers_ai_errors_in_cloudflare_envelope(server, path, body, headers, status):
    response = server.post(body, path=path, headers=headers)
    assert response.status_code == status
    envelope = response.json()
    assert envelope["success"] is False and envelope["result"] is None and envelope["messages"] == []
    (error,) = envelope["errors"]
    assert error["code"] == status and isinstance(error["message"], str) and error["message"]


def test_openapi_document_is_valid_and_complete(server):
    from openapi_spec_validator import validate

    from clef_vllm.server.cli import parse_args

    spec = httpx.get(f"{server.url}/openapi.json").json()
    validate(spec)
    assert_models_described(spec)
    # The limits of the server's own command line, which names none: each default as parse_request applies it.
    assert_limits_documented(spec, parse_args(["--model", "m", *SHARED_FLAGS]).limits)
    for path in ("/v1/systemone", "/accounts/{account_id}/ai/run/@cf/cloudflare/{name}"):
        operation = spec["paths"][path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/SystemOneRequest"
        }
        assert {"200", "400", "401", "413", "415", "500", "503"} <= set(operation["responses"])
    assert "$defs" not in json.dumps(spec)


def test_schemathesis_finds_no_5xx_and_only_documented_errors(server, tmp_path):
    checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
    command = [
        str(Path(sys.executable).parent / "schemathesis"), "run", f"{server.url}/openapi.json",
        "-H", f"Authorization: Bearer {API_KEY}", "--checks", checks, "--max-examples", "100", "--seed", "7",
        "--generation-database", "none", "--request-timeout", "60",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=480, cwd=tmp_path)  # it writes files
    assert done.returncode == 0, done.stdout[-4000:]
    generated = int(re.search(r"(\d+) generated", done.stdout).group(1))
    assert generated >= 300, done.stdout[-2000:]
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log
