"""The one error shape, for every status and every source (our checks, FastAPI, Starlette, the unexpected).

The shape is `schemas.ErrorBody`, the model /openapi.json shows, and every error body is built from it here:
`{"error": {"type", "code", "message", "field"}, "detail": message, "code": code}`: `type` follows the status,
`code` is a stable reason a client can switch on, `field` names the part of the request at fault (null when
nothing in particular); `detail` and `code` repeat the message and the reason as top-level strings for clients
that read only those.
Under the Workers AI route the same error leaves in Cloudflare's envelope instead (`schemas.WorkersAIErrorBody`):
`{"success": false, "errors": [{"code": <HTTP status>, "message"}], "messages": [], "result": null}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from clef_vllm.errors import RequestError
from clef_vllm.server.schemas import ErrorBody, ErrorDetail, WorkersAIError, WorkersAIErrorBody

WORKERS_AI_PREFIX = "/accounts/"
RETRY_AFTER_SECONDS = 5

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "request_timeout",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "request_too_large",
    500: "server_error",
    501: "invalid_request_error",
    503: "service_unavailable",
}
STARLETTE_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 429: "rate_limited"}


class ApiError(Exception):
    """An error answer raised anywhere in request handling; turned into the one shape by `install`."""

    def __init__(
        self, status: int, code: str, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})
        if status == 503:
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))
        if status == 401:
            self.headers.setdefault("WWW-Authenticate", "Bearer")

    @classmethod
    def bad_request(cls, exc: RequestError) -> ApiError:
        return cls(400, exc.code, exc.message, exc.field)


def error_body(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """An `ErrorBody`, dumped to the JSON-ready dict a response (or a raw HTTP answer) is rendered from."""
    detail = ErrorDetail(type=ERROR_TYPES.get(status, "server_error"), code=code, message=message, field=field)
    return ErrorBody(error=detail, detail=message, code=code).model_dump(mode="json")


def workers_ai_error_body(status: int, message: str) -> dict[str, Any]:
    """A `WorkersAIErrorBody`, dumped to the JSON-ready dict a response is rendered from."""
    errors = [WorkersAIError(code=status, message=message)]
    return WorkersAIErrorBody(success=False, errors=errors, messages=[], result=None).model_dump(mode="json")


def error_payload(path: str, error: ApiError) -> dict[str, Any]:
    """The body of `error` as the route at `path` answers it: Cloudflare's envelope under Workers AI."""
    if path.startswith(WORKERS_AI_PREFIX):
        return workers_ai_error_body(error.status, error.message)
    return error_body(error.status, error.code, error.message, error.field)


def error_response(path: str, error: ApiError) -> JSONResponse:
    return JSONResponse(error_payload(path, error), status_code=error.status, headers=error.headers)


def install(app: FastAPI) -> None:
    """Route every error FastAPI and Starlette produce through the one shape."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(request.url.path, exc)

    async def on_request_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestError)
        return error_response(request.url.path, ApiError.bad_request(exc))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = STARLETTE_CODES.get(exc.status_code, f"http_{exc.status_code}")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        error = ApiError(exc.status_code, code, message, None, dict(exc.headers or {}))
        return error_response(request.url.path, error)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        field = ".".join(str(part) for part in first.get("loc", ()))
        error = ApiError(422, "invalid_parameter", f"{field}: {first.get('msg', 'invalid')}", field or None)
        return error_response(request.url.path, error)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after answering; the request-id layer logs the traceback once, with the id.
        error = ApiError(500, "internal_error", "internal error while handling the request")
        return error_response(request.url.path, error)

    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
