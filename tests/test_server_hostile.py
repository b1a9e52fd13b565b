"""The front door under hostile input: bodies that are not strict JSON, slow or missing bytes, too many
connections, uploads abandoned halfway. Each gets its status in the one error shape and leaves the server
healthy. One real server process with short deadlines, so the tests measure them in seconds."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import psutil
import pytest
from raw_json import NOUL, deep

from clef_quant.bench.processes import free_port, running, systemone_command

pytestmark = pytest.mark.slow

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
