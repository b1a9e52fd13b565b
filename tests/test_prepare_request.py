"""`prepare_request`: the parse-and-encode step that the offline engine and both servers share, and `Encoder`, the
one way every front end loads a release's tokenizer and processor to encode with them."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
from media_files import image_b64

from clef_vllm.errors import RequestError
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.encoding import encode_request, prepare_request
from clef_vllm.format.limits import DEFAULT_LIMITS
from clef_vllm.format.request import parse_request

TEXT_BODY = {"state": "a ticket", "questions": {"q": {"type": "noul"}, "r": {"type": "score", "criteria": ["a", "b"]}}}


class CountingLock(contextlib.AbstractContextManager):
    def __init__(self) -> None:
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc_info) -> None:
        return None


def test_a_body_is_parsed_and_encoded_as_encode_request_does(tokenizer) -> None:
    request, encoding = prepare_request(TEXT_BODY, DEFAULT_LIMITS, tokenizer, None, 512)
    assert request == parse_request(TEXT_BODY)
    assert encoding == encode_request(parse_request(TEXT_BODY), tokenizer, max_length=512)


def test_a_parsed_request_is_taken_as_it_is(tokenizer) -> None:
    parsed = parse_request(TEXT_BODY)
    request, encoding = prepare_request(parsed, DEFAULT_LIMITS, tokenizer, None, 512)
    assert request is parsed
    assert encoding.num_tokens > 0


def test_the_given_limits_apply(tokenizer) -> None:
    with pytest.raises(RequestError, match="questions"):
        prepare_request(TEXT_BODY, replace(DEFAULT_LIMITS, max_questions=1), tokenizer, None, 512)


def test_the_processor_lock_is_held_only_for_media(tokenizer, processor) -> None:
    lock = CountingLock()
    _, text_only = prepare_request(TEXT_BODY, DEFAULT_LIMITS, tokenizer, processor, 4096, processor_lock=lock)
    assert lock.entered == 0
    with_image = {**TEXT_BODY, "images": [image_b64()]}
    request, encoding = prepare_request(with_image, DEFAULT_LIMITS, tokenizer, processor, 4096, processor_lock=lock)
    assert lock.entered == 1
    assert request.has_media
    assert encoding.num_tokens > text_only.num_tokens  # the image's placeholder tokens


IMAGE_BODY = {**TEXT_BODY, "images": [image_b64()]}


def test_an_encoder_encodes_as_encode_request_does_with_the_folder_files(tiny_dir, tokenizer, processor) -> None:
    encoder = Encoder(tiny_dir, max_length=512)
    for body in (TEXT_BODY, IMAGE_BODY):
        request = parse_request(body)
        expected = encode_request(request, tokenizer, processor=processor, max_length=512)
        assert encoder.encode(request).input_ids == expected.input_ids
        assert encoder.prepare(body, DEFAULT_LIMITS)[1].input_ids == expected.input_ids
    assert encoder.encode(parse_request(TEXT_BODY), max_length=300).max_length == 300


def test_an_encoder_loads_the_processor_only_once_media_come(tiny_dir) -> None:
    encoder = Encoder(tiny_dir)
    encoder.encode(parse_request(TEXT_BODY))
    assert encoder._processor is None  # a text-only run never reads the processor files
    encoder.encode(parse_request(IMAGE_BODY))
    assert encoder._processor is not None


def test_an_encoder_without_media_refuses_a_request_with_an_image(tiny_dir) -> None:
    with pytest.raises(RequestError, match="has no processor"):
        Encoder(tiny_dir, media=False).encode(parse_request(IMAGE_BODY))


def test_a_given_tokenizer_is_the_one_used(tiny_dir, tokenizer) -> None:
    calls = []

    def counting(texts, **kwargs):
        calls.append(len(texts))
        return tokenizer(texts, **kwargs)

    counting.backend_tokenizer = tokenizer.backend_tokenizer  # the state cut reads its configuration
    counting.decode = tokenizer.decode
    encoding = Encoder(tiny_dir, tokenizer=counting, media=False).encode(parse_request(TEXT_BODY))
    assert calls and encoding.input_ids == encode_request(parse_request(TEXT_BODY), tokenizer).input_ids
