"""`multipart/form-data` requests: the SystemOne JSON in a part named `request`, images and videos as file
parts that media objects name with `{"part": "<name>"}` (raw bytes, no base64 inflation)."""

from __future__ import annotations

from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from clef_vllm.errors import RequestError
from clef_vllm.format import strict_json

REQUEST_PART = "request"


def is_multipart(content_type: str | None) -> bool:
    return (content_type or "").lower().startswith("multipart/form-data")


def read_multipart(content_type: str, raw: bytes) -> tuple[Any, dict[str, bytes]]:
    """The JSON body and the other parts by name, from a (size-capped) multipart body."""
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + raw
    )
    if not message.is_multipart():
        raise RequestError("the multipart body has no parts (is the boundary right?)")
    parts: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise RequestError("every part of a multipart request needs a name (Content-Disposition: form-data)")
        if name in parts:
            raise RequestError(f'the multipart request has two parts named "{name}"')
        parts[str(name)] = part.get_payload(decode=True) or b""
    if REQUEST_PART not in parts:
        raise RequestError(f'a multipart request needs a part named "{REQUEST_PART}" holding the JSON body')
    try:
        body = strict_json.loads(parts.pop(REQUEST_PART))
    except RequestError as exc:
        raise RequestError(f'the "{REQUEST_PART}" part: {exc.message}', exc.field, exc.code) from None
    return body, parts
