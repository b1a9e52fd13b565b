"""Time limits and a cap on connections, at the HTTP/1.1 protocol level (uvicorn's h11 protocol, extended).

uvicorn closes idle keep-alive connections (`--idle-timeout`) but waits forever for a request that is still
arriving. Here each request has deadlines measured from its first byte: its headers within
`--header-timeout` seconds, then its whole body within `--body-timeout` seconds (so a client sending one
byte a second, or declaring a Content-Length it never sends, is cut off). A connection past a deadline gets
a JSON 408 when nothing was answered yet, and is closed; the application then sees a disconnect and drops
what it had buffered. Connections beyond `--max-connections` are answered 503 and closed at once.

What h11 itself refuses (a malformed request line or header, request headers beyond uvicorn's 16 KiB, a
Transfer-Encoding other than chunked) is answered here too, instead of uvicorn's plain-text 400: in the one
error shape, with the status h11 suggests (400, 431 or 501), request id headers and one log line.
Every answer made here carries a fresh request id. An `Upgrade` (WebSocket or any other) is never taken: the
request is answered as plain HTTP by the application, in its shape and with its request id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, H11Protocol

from clef_vllm.server.error_shape import RETRY_AFTER_SECONDS, error_body
from clef_vllm.server.request_ids import REQUEST_ID_HEADERS, request_id_from
from clef_vllm.server.settings import ConnectionLimits

logger = logging.getLogger("clef_vllm.server")


# How long a connection cut off with an error keeps reading (and dropping) what its client still sends. Closing
# a socket with unread input makes the kernel answer with a reset, which can destroy the error response in the
# client's receive buffer before the client reads it; a half-close first lets the response arrive intact.
LINGER_SECONDS = 2.0


# What h11 refuses, by the status it suggests: (reason phrase, code).
PROTOCOL_ERRORS = {
    400: ("Bad Request", "malformed_request"),
    431: ("Request Header Fields Too Large", "headers_too_large"),
    501: ("Not Implemented", "unsupported_transfer_encoding"),
}
MAX_QUOTED_PROTOCOL_ERROR = 120  # characters of h11's own message kept in ours
_QUOTED_INPUT = re.compile(r": bytearray\(b.*\)$", re.DOTALL)  # h11 appends the offending bytes; not echoed


def _raw_response(status: int, reason: str, code: str, message: str, extra: str = "") -> tuple[str, bytes]:
    """A fresh request id and a whole HTTP/1.1 response in the one error shape, for a connection to close."""
    request_id = request_id_from([])
    body = json.dumps(error_body(status, code, message)).encode()
    ids = "".join(f"{name.decode()}: {request_id}\r\n" for name in REQUEST_ID_HEADERS)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n{ids}{extra}\r\n"
    )
    return request_id, head.encode("latin-1") + body


class _RecordingConnection(h11.Connection):
    """h11's connection, remembering the protocol error it raised so that the answer can use its status."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """An `H11Protocol` class enforcing `limits`; pass it to uvicorn as `http=`."""

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _phase: str | None = None
        _lingering = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._max_head_bytes = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
            self.conn = _RecordingConnection(h11.SERVER, self._max_head_bytes)

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                logger.warning("refused a connection: %d open (--max-connections)", len(self.connections) - 1)
                _, response = _raw_response(
                    503,
                    "Service Unavailable",
                    "too_many_connections",
                    "too many open connections; retry later",
                    f"retry-after: {RETRY_AFTER_SECONDS}\r\n",
                )
                transport.write(response)
                self._close_lingering()
                return
            self._arm("headers", limits.header_timeout)

        def _unsupported_upgrade_warning(self) -> None:
            """uvicorn would suggest installing a WebSocket library; the server has no WebSocket route, so an
            upgrade request is answered as a plain HTTP request (and logged as one), without a warning."""

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to anything h11 refuses, made in the one error shape."""
            error = self.conn.last_error
            status = error.error_status_hint if error is not None else 400
            reason, code = PROTOCOL_ERRORS.get(status, PROTOCOL_ERRORS[400])
            if status == 431:
                message = f"request line and headers exceed {self._max_head_bytes} bytes"
            else:
                detail = _QUOTED_INPUT.sub("", str(error or ""))[:MAX_QUOTED_PROTOCOL_ERROR]
                message = f"malformed HTTP request: {detail}" if detail else "malformed HTTP request"
            request_id, response = _raw_response(status, reason, code, message)
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            logger.info('%s %s "- -" %d %s', request_id, client, status, message)
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # nothing of an answer was sent yet
                self.transport.write(response)
            self._drop_cycle()
            self._close_lingering()

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # the answer was sent and the connection is closing: drop the rest
            super().data_received(data)
            self._follow_state()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow_state()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _follow_state(self) -> None:
            if self.transport.is_closing():
                self._disarm()
                return
            state = self.conn.their_state
            if state is h11.SEND_BODY:
                if self._phase != "body":
                    self._arm("body", limits.body_timeout)
            elif state is h11.IDLE:
                # Between requests uvicorn's keep-alive timer runs until the first byte of the next one.
                if self._phase != "headers" and self.timeout_keep_alive_task is None:
                    self._arm("headers", limits.header_timeout)
            else:
                self._disarm()

        def _arm(self, phase: str, seconds: float) -> None:
            self._disarm()
            self._phase = phase
            self._deadline = self.loop.call_later(seconds, self._timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = None
            self._phase = None

        def _timed_out(self) -> None:
            phase, self._deadline = self._phase, None
            if self.transport.is_closing():
                return
            seconds = limits.header_timeout if phase == "headers" else limits.body_timeout
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            cycle = self.cycle if phase == "body" else None
            logger.info("closed the connection of %s: request %s not received within %g s", client, phase, seconds)
            if cycle is None or not cycle.response_started:
                message = f"request {phase} not received within {seconds:g} s"
                self.transport.write(_raw_response(408, "Request Timeout", "request_timeout", message)[1])
            if cycle is not None:
                self._drop_cycle()
            self._close_lingering()

        def _drop_cycle(self) -> None:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True  # the application's receive() now reports a disconnect, send() no-ops
                cycle.message_event.set()

        def _close_lingering(self) -> None:
            self._disarm()
            self._lingering = True
            if not self.transport.can_write_eof():
                self.transport.close()
                return
            self.transport.write_eof()  # the client reads the answer, then end of stream
            self.transport.resume_reading()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)

    return GuardedH11Protocol
