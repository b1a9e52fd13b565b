"""`clef-systemone` at its front door: compressed bodies capped on what is read and refused when data follows
their end, what h11 itself refuses answered in the one error shape with request ids, no slash redirects, a
top-level `detail` in every error body, and the request forms SDKs send (`type` in media objects, choice
criteria as a list of names, the model list under /v1/systemone). One real server process."""

from __future__ import annotations

import base64
import gzip
import io
import json
import random
import re
import socket
import zlib
from collections.abc import Iterator

import httpx
import pytest
import zstandard
from servers import SHARED_API_KEY

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py),
# handed out right after the README's.
pytestmark = [pytest.mark.slow, pytest.mark.unit("shared-servers", order=20)]

API_KEY = SHARED_API_KEY
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CAP = 13 << 20  # the default --max-body-mb 13
BODY = {
    "state": "Customer: I was charged twice for order 1182.",
    "questions": {
        "billing": {"type": "noul", "instructions": "Is this about a payment?"},
        "team": {"type": "choice", "criteria": {"billing": "money", "tech": "bugs"}},
    },
}
RAW = json.dumps(BODY).encode()
MIB_OF_ZEROS = b"\x00" * (1 << 20)


class Server:
    def __init__(self, url: str) -> None:
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])

    def post(self, content: bytes | Iterator[bytes], path: str = "/v1/systemone", **headers: str) -> httpx.Response:
        sent = {"Content-Type": "application/json", **AUTH, **headers}
        return httpx.post(self.url + path, content=content, headers=sent, timeout=120)

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/health", timeout=10).status_code == 200

    def exchange(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send raw bytes on a fresh connection and read the answer until the server closes it."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(raw)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        return int(status_line.split()[1]), headers, body


@pytest.fixture(scope="module")
def server(shared_systemone):
    return Server(shared_systemone.url)


def assert_error(status: int, headers, body: bytes, expected: int, code: str, field: str | None = None) -> dict:
    """Our error shape: status, JSON content type, `error` with its four keys, `detail`, both request ids."""
    assert status == expected, body[:300]
    assert headers["content-type"] == "application/json"
    payload = json.loads(body)
    assert set(payload) == {"error", "detail", "code"}, payload
    error = payload["error"]
    assert set(error) == {"type", "code", "message", "field"}, error
    assert (error["code"], error["field"]) == (code, field)
    assert payload["code"] == code  # top-level too, for clients that read only that
    assert payload["detail"] == error["message"] and error["message"]
    assert re.fullmatch(r"req_[0-9a-f]{32}", headers["x-request-id"])
    assert headers["x-typesafe-request-id"] == headers["x-request-id"]
    return error


def assert_response_error(response: httpx.Response, expected: int, code: str, field: str | None = None) -> dict:
    return assert_error(response.status_code, response.headers, response.content, expected, code, field)


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


# (Content-Encoding, body): a whole stream of the body, then something after its end
TRAILING = [
    pytest.param("gzip", lambda: gzip.compress(RAW) + b"\x00" * 1024, id="gzip-then-zeros"),
    pytest.param("gzip", lambda: iter([gzip.compress(RAW), *[MIB_OF_ZEROS] * 128]), id="gzip-then-128MiB-chunked"),
    pytest.param("gzip", lambda: gzip.compress(RAW) + gzip.compress(RAW), id="gzip-two-members"),
    pytest.param("deflate", lambda: zlib.compress(RAW) + b"junk", id="deflate-then-junk"),
    pytest.param("deflate", lambda: zlib.compress(RAW)[2:-4] + b"junk", id="raw-deflate-then-junk"),
    pytest.param("zstd", lambda: zstd(RAW) + b"junk", id="zstd-then-junk"),
    pytest.param("zstd", lambda: zstd(RAW) + zstd(RAW), id="zstd-two-frames"),
]


@pytest.mark.parametrize(("encoding", "packed"), TRAILING)
def test_data_after_the_end_of_a_compressed_stream_is_refused(server, encoding, packed):
    response = server.post(packed(), **{"Content-Encoding": encoding})
    error = assert_response_error(response, 400, "trailing_data", "Content-Encoding")
    assert encoding in error["message"]
    assert server.healthy()
    assert server.post(zstd(RAW), **{"Content-Encoding": "zstd"}).status_code == 200


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        pytest.param("gzip", gzip.compress, id="gzip"),
        pytest.param("deflate", zlib.compress, id="deflate"),
        pytest.param("zstd", zstd, id="zstd"),
        pytest.param("gzip", lambda _: gzip.compress(RAW) + MIB_OF_ZEROS * 128, id="gzip-then-128MiB-declared"),
    ],
)
def test_the_cap_applies_to_the_bytes_read_too(server, encoding, compress):
    """A body that takes more than the cap to send is refused (413): one that decompresses to exactly the cap,
    and a small gzip stream followed by 128 MiB (its Content-Length alone refuses it)."""
    incompressible = b"{" + random.Random(0).randbytes(CAP - 1)  # not JSON either: only the cap decides
    packed = compress(incompressible)
    assert len(packed) > CAP
    response = server.post(packed, **{"Content-Encoding": encoding})
    assert_response_error(response, 413, "body_too_large")
    assert server.healthy()


# What h11 refuses before any application code runs: (raw request, status, code)
PROTOCOL = [
    pytest.param(b"GARBAGE\r\n\r\n", 400, "malformed_request", id="request-line-garbage"),
    pytest.param(b"GET /health HTTP/9.9 extra\r\n\r\n", 400, "malformed_request", id="request-line-extra-field"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400, "malformed_request",
                 id="header-without-colon"),
    pytest.param(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400, "malformed_request",
                 id="negative-content-length"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n", 431,
                 "headers_too_large", id="200KB-header"),
    pytest.param(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501,
                 "unsupported_transfer_encoding", id="transfer-encoding-gzip"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "status", "code"), PROTOCOL)
def test_what_h11_refuses_is_answered_in_the_one_shape(server, raw, status, code):
    answer_status, headers, body = server.exchange(raw)
    assert_error(answer_status, headers, body, status, code)
    assert headers["connection"] == "close"
    assert server.healthy()


def websocket_upgrade(path: str, *headers: str) -> bytes:
    lines = [
        f"GET {path} HTTP/1.1",
        "Host: localhost",
        "Connection: Upgrade, close",
        "Upgrade: websocket",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("path", "headers", "status", "code"),
    [
        pytest.param("/v1/systemone", (f"Authorization: Bearer {API_KEY}",), 405, "method_not_allowed", id="route"),
        pytest.param("/v1/models", (), 401, "invalid_api_key", id="keyed"),
        pytest.param("/v1/stream", (f"Authorization: Bearer {API_KEY}",), 404, "not_found", id="no-route"),
    ],
)
def test_a_websocket_upgrade_is_answered_as_plain_http_in_the_one_shape(server, path, headers, status, code):
    answer_status, answer_headers, body = server.exchange(websocket_upgrade(path, *headers))
    assert_error(answer_status, answer_headers, body, status, code)
    assert "upgrade" not in answer_headers and "sec-websocket-accept" not in answer_headers


def test_a_websocket_upgrade_of_health_gets_health(server):
    status, headers, body = server.exchange(websocket_upgrade("/health"))
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    assert re.fullmatch(r"req_[0-9a-f]{32}", headers["x-request-id"])
    assert server.healthy()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("POST", "/v1/systemone/", id="systemone-slash"),
        pytest.param("GET", "/v1/models/", id="models-slash"),
        pytest.param("GET", "/health/", id="health-slash"),
    ],
)
def test_a_trailing_slash_is_404_and_never_a_redirect_built_from_host(server, method, path):
    headers = {**AUTH, "Host": "evil.example", "Content-Type": "application/json"}
    response = httpx.request(method, server.url + path, content=RAW, headers=headers, timeout=60)
    assert "location" not in response.headers
    error = assert_response_error(response, 404, "not_found")
    assert path in error["message"] and "evil" not in response.text
    assert server.healthy()


def test_models_under_systemone_answer_like_v1_models(server):
    listing = httpx.get(f"{server.url}/v1/systemone/models", headers=AUTH, timeout=30)
    assert listing.status_code == 200
    assert listing.json() == httpx.get(f"{server.url}/v1/models", headers=AUTH, timeout=30).json()
    assert listing.json()["models"][0]["name"] == "tiny"
    refused = httpx.get(f"{server.url}/v1/systemone/models", timeout=30)
    assert_response_error(refused, 401, "invalid_api_key")


def png(colour: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_media_and_asset_objects_may_say_they_are_images(server):
    """`{"type": "image", ...}` as SDKs send it: in images and in assets, JSON and multipart, with the answer of
    the same image sent without `type`."""
    photo = png((200, 30, 30))
    encoded = base64.b64encode(photo).decode()
    plain = {**BODY, "images": [encoded]}
    expected = server.post(json.dumps(plain).encode())
    assert expected.status_code == 200, expected.text
    typed = {**BODY, "images": [{"type": "image", "data_base64": encoded, "format": "png"}]}
    assert server.post(json.dumps(typed).encode()).json() == expected.json()

    asset = {**BODY, "assets": {"<photo>": {"type": "image", "part": "asset-0"}}}
    response = httpx.post(
        f"{server.url}/v1/systemone",
        files={"request": (None, json.dumps(asset), "application/json"), "asset-0": ("asset-0", photo, "image/png")},
        headers=AUTH,
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json() == expected.json()  # one image, before the state, either way

    wrong = {**BODY, "images": [{"type": "video", "data_base64": encoded}]}
    assert_response_error(server.post(json.dumps(wrong).encode()), 400, "invalid_request", "images[0].type")
    unknown = {**BODY, "assets": {"<photo>": {"type": "audio", "data_base64": encoded}}}
    error = assert_response_error(
        server.post(json.dumps(unknown).encode()), 400, "invalid_request", "assets.<photo>.type"
    )
    assert error["message"].startswith("assets.<photo>.type: ")


def test_choice_criteria_may_list_option_names(server):
    def team(criteria):
        return {"state": BODY["state"], "questions": {"team": {"type": "choice", "criteria": criteria}}}

    listed, nulls = team(["tech", "billing"]), team({"tech": None, "billing": None})
    response = server.post(json.dumps(listed).encode())
    assert response.status_code == 200, response.text
    answer = response.json()["answers"]["team"]
    assert list(answer["probabilities"]) == ["tech", "billing"]
    assert response.json() == server.post(json.dumps(nulls).encode()).json()
    assert_response_error(
        server.post(json.dumps(team(["a", "a"])).encode()), 400, "invalid_request", "questions.team.criteria"
    )


@pytest.mark.parametrize(
    ("path", "content", "headers", "status"),
    [
        pytest.param("/v1/systemone", b"{not json", AUTH, 400, id="400"),
        pytest.param("/v1/systemone", RAW, {}, 401, id="401"),
        pytest.param("/v1/nothing", RAW, AUTH, 404, id="404"),
        pytest.param("/v1/systemone", RAW, {**AUTH, "Content-Encoding": "br"}, 415, id="415"),
    ],
)
def test_every_error_body_has_a_top_level_detail_but_the_workers_ai_envelope_stays(
    server, path, content, headers, status
):
    response = httpx.post(server.url + path, content=content, headers=headers, timeout=60)
    assert response.status_code == status
    assert response.json()["detail"] == response.json()["error"]["message"]
    workers = httpx.post(
        f"{server.url}/accounts/a/ai/run/@cf/cloudflare/clef-flash", content=content, headers=headers, timeout=60
    )
    if path == "/v1/systemone":
        assert set(workers.json()) == {"success", "errors", "messages", "result"}


def test_openapi_lists_the_new_route_and_fields(server):
    from openapi_spec_validator import validate

    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    validate(spec)
    assert spec["paths"]["/v1/systemone/models"]["get"]["responses"]["200"]
    schemas = spec["components"]["schemas"]
    assert "detail" in schemas["ErrorBody"]["required"]
    choice_forms = schemas["ChoiceQuestion"]["properties"]["criteria"]["anyOf"]
    assert [form["type"] for form in choice_forms] == ["object", "array"]
    images, _ = schemas["SystemOneRequest"]["properties"]["images"]["anyOf"]
    _, media_object = images["items"]["oneOf"]  # a string or an object, never both
    media_properties = schemas[media_object["$ref"].rsplit("/", 1)[-1]]["properties"]
    assert media_properties["type"]["anyOf"][0]["enum"] == ["image", "video"]


def blocks_flushed(data: bytes) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    flush_block = zstandard.COMPRESSOBJ_FLUSH_BLOCK
    return (
        compressor.compress(data[:100])
        + compressor.flush(flush_block)
        + compressor.compress(data[100:])
        + (compressor.flush())
    )


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(zstd(RAW), id="content-size"),
        pytest.param(
            zstandard.ZstdCompressor(write_content_size=False, write_checksum=True).compress(RAW), id="checksum"
        ),
        pytest.param(blocks_flushed(RAW * 50), id="several-blocks"),
        pytest.param(zstd(b"a" * 300_000), id="rle-blocks"),
        pytest.param(zstd(random.Random(1).randbytes(300_000)), id="raw-blocks"),
        pytest.param(zstd(b""), id="empty"),
    ],
)
def test_the_end_of_a_zstd_frame_is_found_wherever_the_chunks_split(frame):
    from clef_vllm.server.zstd_frames import FrameScanner

    assert zstandard.ZstdDecompressor().decompressobj().decompress(frame) is not None
    body = frame + b"after"
    for cut in sorted({0, 1, 3, 4, 5, 6, 9, len(frame) // 2, len(frame) - 1, len(frame), len(frame) + 2}):
        scanner = FrameScanner()
        inside = scanner.feed(body[:cut]) + scanner.feed(body[cut:])
        assert (inside, scanner.done) == (len(frame), True), cut
