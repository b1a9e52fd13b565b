"""Images and videos through `clef-systemone` and `vllm serve` as real processes on loopback (tiny checkpoint)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from media_files import b64, image_b64, image_bytes, video_b64, video_bytes
from servers import SHARED_AUTH, StartedServer
from test_media import png_bomb

from clef_quant.bench.workload import image_requests

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py),
# handed out right after the README's.
pytestmark = [pytest.mark.slow, pytest.mark.unit("shared-servers", order=20)]

QUESTIONS = {
    "red": {"type": "noul", "instructions": "Is it red?"},
    "kind": {"type": "choice", "criteria": {"a": "x", "b": "y"}},
}


def body(**media) -> dict:
    return {"model": "clef", "state": "what do you see", "questions": QUESTIONS, **media}


def post(url: str, request, **kwargs) -> httpx.Response:
    content = request if isinstance(request, (bytes, str)) else json.dumps(request)
    headers = {"Content-Type": "application/json", **SHARED_AUTH}  # vllm serve, which has no key, ignores it
    return httpx.post(f"{url}/v1/systemone", content=content, headers=headers, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def systemone(shared_systemone: StartedServer) -> str:
    """The session's shared server: its media limits are the ones the refusals below reach."""
    return shared_systemone.url


def assert_answered_with_media(url: str, requests: list[dict]) -> None:
    """Every request is answered, and its prompt is longer than the same request's without media."""
    text = post(url, body()).json()
    for request in requests:
        response = post(url, request)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert set(answer["answers"]) == {"red", "kind"}
        assert answer["usage"]["input_tokens"] > text["usage"]["input_tokens"] + 16  # the expanded media


def test_systemone_answers_image_and_video_requests(systemone):
    requests = [
        body(images=[image_b64()]),
        body(
            images=[f"data:image/png;base64,{image_b64(96, 64)}", {"data_base64": image_b64(48, 48), "format": "png"}]
        ),
        body(videos=[video_b64(2.0, 8)]),
        body(videos=[[image_b64(), image_b64(color=(0, 0, 250))]]),
        body(images=[image_b64()], videos=[f"data:video/webm;base64,{video_b64(2.0, 8, fmt='webm', codec='libvpx')}"]),
        dict(body(assets={"<photo>": {"format": "png", "data_base64": image_b64()}}), state="look at <photo>"),
    ]
    assert_answered_with_media(systemone, requests)


def test_multipart_request_with_image_parts(systemone):
    """The JSON in a part named `request`, the image as raw bytes in a file part it names."""
    json_body = body(images=[image_b64()])
    as_json = post(systemone, json_body).json()
    multipart = dict(json_body, images=[{"part": "photo", "format": "png"}])
    files = {"photo": ("photo.png", image_bytes(), "image/png")}
    response = httpx.post(
        f"{systemone}/v1/systemone",
        data={"request": json.dumps(multipart)},
        files=files,
        headers=SHARED_AUTH,
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json() == as_json
    missing = httpx.post(f"{systemone}/v1/systemone", files=files, headers=SHARED_AUTH, timeout=120)
    assert missing.status_code == 400
    assert 'part named "request"' in missing.json()["error"]["message"]


def test_sixteen_concurrent_image_requests_all_answer_as_alone(systemone):
    requests = image_requests(16, seed=7)
    alone = [post(systemone, request).json() for request in requests]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda request: post(systemone, request), requests))
    assert [r.status_code for r in together] == [200] * 16
    assert [r.json() for r in together] == alone


def _bad_cases():
    png, mp4 = image_bytes(), video_bytes(2.0, 8)
    big = image_bytes(2048, 1536)  # 3,072 visual tokens: with the schema over --max-model-len 4096
    return [
        (body(images=["not base64 !!"]), "images[0]", "base64"),
        (body(images=[b64(b"plain text")]), "images[0]", "not a readable image"),
        (body(images=[image_b64(), b64(png[: len(png) // 2])]), "images[1]", "cut short"),
        (body(images=[b64(png_bomb(10_000, 10_000))]), "images[0]", "10000x10000 pixels"),
        (body(images=[image_b64()] * 4), "images", "too many images: 4 (at most 3"),
        (body(videos=[video_b64(), video_b64()]), "videos", "too many videos: 2 (at most 1"),
        (body(videos=[b64(mp4[:300])]), "videos[0]", "not a readable video"),
        (body(videos=[video_b64(6.0, 8)]), "videos[0]", "samples to 12 frames; at most 8"),
        (body(videos=[[image_b64()] * 9]), "videos[0]", "9 frames; at most 8"),
        (body(assets={"<x>": {"format": "png", "data_base64": "%%%"}}), "assets.<x>", "base64"),
        (body(images=[{"part": "nope"}]), "images[0]", "part"),
        (
            dict(body(), questions={"where": {"type": "box", "instructions": "the cat"}}),
            None,
            '"where": type box',
        ),
        (dict(body(images=[b64(big), b64(big)]), state="x"), None, "schema requires"),
        (body(audio=b64(b"RIFF\x24\x00\x00\x00WAVE")), "audio", "audio is not read"),
        (body(audios=[{"data_base64": b64(b"ID3"), "format": "mp3"}]), "audios", "audio is not read"),
    ]


@pytest.mark.parametrize(("request_body", "where", "needle"), _bad_cases())
def test_bad_media_gets_a_400_naming_it_and_the_server_stays_healthy(systemone, request_body, where, needle):
    response = post(systemone, request_body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert needle in message
    if where is not None:
        assert where in message
    if where in ("audio", "audios"):
        assert response.json()["error"]["field"] == where
    assert httpx.get(f"{systemone}/health").status_code == 200


def test_vllm_serve_answers_image_and_video_requests(vllm_serve):
    requests = [
        body(images=[f"data:image/png;base64,{image_b64()}"]),
        body(videos=[f"data:video/mp4;base64,{video_b64(2.0, 8)}"]),
        body(images=[image_b64(64, 64)], videos=[video_b64(1.5, 8)]),
    ]
    assert_answered_with_media(vllm_serve, requests)
    bad = post(vllm_serve, body(images=[b64(b"plain text")]))
    assert bad.status_code == 400
    assert "images[0]" in bad.json()["error"]["message"]
