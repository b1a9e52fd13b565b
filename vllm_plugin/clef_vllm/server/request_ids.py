"""Request ids and the one log line per request, as the outermost ASGI layer.

Every response carries `x-request-id` and `x-typesafe-request-id`: the client's `X-Request-Id` when it is a
well-formed id, a fresh one otherwise. Handlers find it in `request.state.request_id`. An exception that
escapes the application is logged once with its id and answered with the JSON 500, without internals.
`on_done(scope, status, seconds)` sees every request once it is answered, as the log line does.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from clef_vllm.server.error_shape import ApiError, error_payload

logger = logging.getLogger("clef_vllm.server")

REQUEST_ID_HEADERS = (b"x-request-id", b"x-typesafe-request-id")
WELL_FORMED_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}")
INTERNAL_ERROR = ApiError(500, "internal_error", "internal error while handling the request")


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"x-request-id":
            incoming = value.decode("latin-1")
            if WELL_FORMED_ID.fullmatch(incoming):
                return incoming
            break
    return f"req_{uuid.uuid4().hex}"


class RequestContext:
    """ASGI middleware: assigns the id, adds the headers, logs the request line, turns escapes into 500s."""

    def __init__(self, app: Any, on_done: Callable[[dict[str, Any], int, float], None] | None = None) -> None:
        self.app = app
        self.on_done = on_done

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(scope["headers"])
        scope.setdefault("state", {})["request_id"] = request_id
        id_bytes = request_id.encode("latin-1")
        status = 0
        started = time.perf_counter()

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in REQUEST_ID_HEADERS]
                message = {**message, "headers": [*headers, *((name, id_bytes) for name in REQUEST_ID_HEADERS)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("%s unexpected error", request_id)
            if status == 0:
                body = json.dumps(error_payload(scope["path"], INTERNAL_ERROR)).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send_with_id({"type": "http.response.start", "status": 500, "headers": headers})
                await send_with_id({"type": "http.response.body", "body": body})
        finally:
            seconds = time.perf_counter() - started
            client = scope.get("client") or ("-", 0)
            logger.info(
                '%s %s "%s %s" %s %.1f ms',
                request_id,
                client[0],
                scope["method"],
                scope["path"],
                status or 499,
                seconds * 1000,
            )
            if self.on_done is not None:
                self.on_done(scope, status or 499, seconds)
