"""The front door under hostile input: bodies that are not strict JSON, slow or missing bytes, too many
connections, uploads abandoned halfway. Each gets its status in the one error shape and leaves the server
healthy. One real server process with short deadlines, so the tests measure them in seconds."""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import threading
import time

import httpx
import psutil
import pytest
from raw_json import NOUL, deep

from clef_quant.bench.long_inputs import CONTROL, LONG_INPUTS, behind, encode_body, small_latencies
from clef_quant.bench.processes import free_port, running, systemone_command

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = [pytest.mark.slow, pytest.mark.unit(order=110)]

HEADER_TIMEOUT, BODY_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTIONS = 2, 3, 2, 24
SLACK = 1.5  # scheduling on two busy cores
FLAGS = [
    "--max-model-len", "4096", "--enforce-eager", "--max-num-batched-tokens", "65536",
    "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
    "--idle-timeout", str(IDLE_TIMEOUT), "--max-connections", str(MAX_CONNECTIONS),
]  # fmt: skip


class Server:
    def __init__(self, port: int, log) -> None:
        self.port, self.log = port, log
        self.url = f"http://127.0.0.1:{port}"

    def pid(self) -> int:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == self.port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return conn.pid
        raise RuntimeError("server process not found")

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.settimeout(BODY_TIMEOUT + 10)
        return sock

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "systemone.log"
    with running(systemone_command(tiny_dir, port, *FLAGS), port, log):
        yield Server(port, log)


HOSTILE = [
    pytest.param(b'{"state": ' + deep(990) + b"," + NOUL + b"}", "json_too_deep", "state" + "[0]" * 63, id="depth-990"),
    pytest.param(b'{"state": ' + b"[" * 200_000, "json_too_deep", "state" + "[0]" * 63, id="depth-200k-unclosed"),
    pytest.param(b'{"state": {"x": NaN}, ' + NOUL + b"}", "invalid_number", "state.x", id="nan"),
    pytest.param(b'{"state": [Infinity], ' + NOUL + b"}", "invalid_number", "state[0]", id="infinity"),
    pytest.param(b'{"state": -Infinity, ' + NOUL + b"}", "invalid_number", "state", id="minus-infinity"),
    pytest.param(b'{"state": {"big": 1e400}, ' + NOUL + b"}", "invalid_number", "state.big", id="1e400"),
    pytest.param(b'{"state": ' + b"9" * 5000 + b", " + NOUL + b"}", "invalid_number", "state", id="5000-digit-int"),
    pytest.param(b'{"state": "\\ud800", ' + NOUL + b"}", "invalid_string", "state", id="surrogate-state"),
    pytest.param(b'{"model": "\\ud800", "state": 1, ' + NOUL + b"}", "invalid_string", "model", id="surrogate-model"),
    pytest.param(b'{"state": 1, "questions": {"\\udc00": {"type": "noul"}}}', "invalid_string", "questions.\\udc00",
                 id="surrogate-question-id"),
    pytest.param(b'{"state": 1, "questions": {"q": {"type": "choice", "criteria": {"\\ud800x": 1}}}}',
                 "invalid_string", "questions.q.criteria.\\ud800x", id="surrogate-option-id"),
    pytest.param(b'{"state": {"k": 1, "k": 2}, ' + NOUL + b"}", "duplicate_key", "state", id="duplicate-state-key"),
    pytest.param(b'{"state": 1, "questions": {"q": {"type": "noul"}, "q": {"type": "noul"}}}', "duplicate_key",
                 "questions", id="duplicate-question-id"),
    pytest.param(b'{"state": 1, "questions": {"q": {"type": "choice", "criteria": {"a": 1, "a": 2}}}}',
                 "duplicate_key", "questions.q.criteria", id="duplicate-option-id"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "code", "field"), HOSTILE)
def test_hostile_json_is_400_naming_the_place(server, raw, code, field):
    response = httpx.post(f"{server.url}/v1/systemone", content=raw, timeout=60)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert (error["type"], error["code"], error["field"]) == ("invalid_request_error", code, field)
    assert server.healthy()


def read_until_closed(sock: socket.socket) -> tuple[float, bytes]:
    started, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return time.monotonic() - started, data


def trickle(sock: socket.socket, payload: bytes) -> None:
    try:
        for byte in payload:
            sock.send(bytes([byte]))
            time.sleep(1.0)
    except OSError:
        pass  # the server closed the connection, as it should


def assert_408(data: bytes, phase: str) -> None:
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data[:200]
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert phase in json.loads(body)["error"]["message"]


REQUEST_HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
SLOW = [
    pytest.param(b"", REQUEST_HEAD, HEADER_TIMEOUT, "headers", id="headers-at-1-byte-per-s"),
    pytest.param(REQUEST_HEAD + b"Content-Length: 200\r\n\r\n", b'{"state": "' + b"x" * 180, BODY_TIMEOUT, "body",
                 id="body-at-1-byte-per-s"),
    pytest.param(REQUEST_HEAD + b"Content-Length: 100000\r\n\r\n" + b'{"state": 1}', b"", BODY_TIMEOUT, "body",
                 id="content-length-beyond-the-body"),
    pytest.param(b"", b"", HEADER_TIMEOUT, "headers", id="connected-and-silent"),
]  # fmt: skip


@pytest.mark.parametrize(("sent", "dribbled", "limit", "phase"), SLOW)
def test_slow_or_missing_bytes_are_cut_off_at_the_deadline(server, sent, dribbled, limit, phase):
    sock = server.connect()
    with sock:
        sock.sendall(sent)
        threading.Thread(target=trickle, args=(sock, dribbled), daemon=True).start()
        elapsed, data = read_until_closed(sock)
    assert limit - 0.5 <= elapsed <= limit + SLACK, elapsed
    assert_408(data, phase)
    assert server.healthy()


def test_idle_keep_alive_connections_are_closed(server):
    sock = server.connect()
    with sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        elapsed, data = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200")
    assert elapsed <= IDLE_TIMEOUT + SLACK


def test_connections_beyond_the_cap_get_503(server):
    socks = [server.connect() for _ in range(MAX_CONNECTIONS + 6)]
    try:
        answers = []
        for sock in socks:
            sock.settimeout(HEADER_TIMEOUT + 5)
            answers.append(read_until_closed(sock))
    finally:
        for sock in socks:
            sock.close()
    refused = [(t, data) for t, data in answers if data.startswith(b"HTTP/1.1 503")]
    assert len(refused) >= 6
    for _, data in refused:
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"retry-after: " in head.lower()
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    assert all(data.startswith((b"HTTP/1.1 503", b"HTTP/1.1 408")) for _, data in answers)
    assert server.healthy()


def test_an_abandoned_upload_logs_one_line_and_keeps_no_memory(server):
    declared = 11 << 20
    head = REQUEST_HEAD + f"Content-Length: {declared}\r\n".encode()

    def abandon(index: int) -> None:
        sock = server.connect()
        with sock:
            sock.sendall(head + f"X-Request-Id: abandon-{index}\r\n\r\n".encode())
            with contextlib.suppress(ConnectionError):  # on a busy machine the body deadline may come first
                sock.sendall(b'{"state": "' + b"x" * (declared - 1000))
        deadline = time.monotonic() + BODY_TIMEOUT + 10
        while f"abandon-{index} 127.0.0.1" not in server.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"abandon-{index} never logged"
            time.sleep(0.1)

    abandon(0)  # the first one warms allocator pools up
    time.sleep(0.5)
    process = psutil.Process(server.pid())
    before = process.memory_info().rss
    for index in range(1, 21):
        abandon(index)
    time.sleep(1.0)
    grown = process.memory_info().rss - before
    assert grown < 64 << 20, f"resident memory grew by {grown >> 20} MiB after 20 abandoned 11 MiB uploads"
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log
    for index in range(21):
        lines = [line for line in log.splitlines() if f"abandon-{index} " in line]
        assert len(lines) == 2, lines  # the abort, then the request line
        assert "went away" in lines[0] and '"POST /v1/systemone" 499' in lines[1]
    assert server.healthy()


# -- long inputs: cut or refused before the tokenizer sees them whole, and nobody waits behind them ------------

# Whole-text tokenization kept small requests waiting 14-18 s on a quiet machine. Beyond the engine step of a
# full-length prompt (the control), a small request may wait for one tokenizer call and the 12 MB body's parse.
SMALL_WAIT = 2.5
LONG_STATES = [name for name in LONG_INPUTS if name.startswith("state") and name != CONTROL]


@pytest.fixture(scope="module")
def control_wait(server) -> float:
    """The worst small-request wait behind a full-length prompt whose body is small: the engine step's share."""
    return behind(server.url, CONTROL, encode_body(LONG_INPUTS[CONTROL]()), clients=2).worst


@pytest.mark.parametrize("name", LONG_STATES)
def test_a_12_mb_state_without_a_split_point_is_cut_and_holds_up_nobody(server, control_wait, name):
    request_id = f"long-{LONG_STATES.index(name)}"
    idle = statistics.median(small_latencies(server.url, 5))
    result = behind(server.url, name, encode_body(LONG_INPUTS[name]()), clients=2, request_id=request_id)
    assert result.status == 200, result.error_code
    assert result.headers["content-type"] == "application/json"
    assert result.headers["x-request-id"] == request_id
    assert int(result.headers["x-clef-state-tokens-dropped"]) > 1_000_000
    assert result.headers["x-clef-state-tokens-dropped-exact"] == "false"
    assert result.small_seconds and result.small_errors == 0
    assert result.worst < control_wait + SMALL_WAIT + 3 * idle, (control_wait, idle, result.small_seconds)
    assert server.healthy()


def _instructions(text: str, questions: int = 1) -> dict:
    return {"state": "s", "questions": {f"q{i}": {"type": "noul", "instructions": text} for i in range(questions)}}


def _criteria(kind: str, criteria) -> dict:
    return {"state": "s", "questions": {"q": {"type": kind, "criteria": criteria}}}


M = 1_000_000
LONG_SCHEMAS = [  # bodies built when the test runs: 12 MB each
    pytest.param(lambda: _instructions(" " * 12 * M + "a"), "questions.q0.instructions", id="12M-spaces-instructions"),
    pytest.param(lambda: _instructions("a" * 12 * M), "questions.q0.instructions", id="12M-letters-instructions"),
    pytest.param(lambda: _instructions({"k": ["日本語" * M]}), "questions.q0.instructions", id="json-instructions"),
    pytest.param(lambda: _criteria("choice", {"x": "a" * 12 * M, "y": 1}), "questions.q.criteria.x",
                 id="12M-choice-description"),
    pytest.param(lambda: _criteria("score", ["low", " " * 3 * M + "a"]), "questions.q.criteria[1]",
                 id="3M-score-level"),
    pytest.param(lambda: _criteria("noul", {"false": "!" * 200_000}), "questions.q.criteria.false",
                 id="200k-noul-override"),
    pytest.param(lambda: _instructions("a" * 60_000, questions=3), "questions", id="3x60k-instructions-in-all"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "field"), LONG_SCHEMAS)
def test_a_long_schema_text_is_refused_before_tokenizing_naming_it(server, make, field):
    content = encode_body(make())
    started = time.monotonic()
    response = httpx.post(
        f"{server.url}/v1/systemone", content=content, headers={"X-Request-Id": "long-schema"}, timeout=60
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"] == "long-schema"
    error = response.json()["error"]
    assert (error["type"], error["code"], error["field"]) == ("invalid_request_error", "schema_too_long", field)
    assert "characters" in error["message"] and "131,072" in error["message"]  # 32 per token of 4,096
    assert elapsed < 3.0  # tokenizing 12 MB of instructions took 15 s
    assert server.healthy()


def test_a_panic_in_native_code_is_a_json_500_and_the_app_lives_on(tokenizer, tiny_dir, caplog):
    """The real tokenizer's panic on 12 M spaces (a BaseException) inside scoring, through the real app."""
    import asyncio

    from clef_vllm.server.app import create_app
    from clef_vllm.server.backend import ServeConfig

    class WholeStateTokenizing:
        config = ServeConfig(model=str(tiny_dir))
        ready, dead = True, False

        async def score(self, body, parts=None):
            await asyncio.to_thread(tokenizer, [body["state"]], add_special_tokens=False)

        def shutdown(self):
            pass

    async def post() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=create_app(WholeStateTokenizing(), start_engine=False))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"state": " " * 12_000_000 + "a", "questions": {"q": {"type": "noul"}}}
            answer = await client.post("/v1/systemone", json=body, headers={"X-Request-Id": "panic-1"})
            return answer, await client.get("/health")

    response, health = asyncio.run(post())
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"] == "panic-1"
    assert response.json()["error"]["code"] == "internal_error"
    logged = [r for r in caplog.records if "panic-1" in r.getMessage() and r.exc_info]
    assert logged and type(logged[0].exc_info[1]).__name__ == "PanicException"
    assert health.status_code == 200
