"""The FastAPI application: routes, authentication, body cap and the one error shape.

Every error leaves as `{"error": {"type", "message"}}`: 400 for anything wrong with the request (the
message names the field), 401 without the right key, 413 over the body cap, 503 while starting or once the
engine has died, 500 (without internal details) for our own failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from clef_vllm.errors import RequestError
from clef_vllm.request import SystemOneRequestBody
from clef_vllm.server.backend import EngineBackend
from clef_vllm.server.multipart import is_multipart, read_multipart
from clef_vllm.server.schemas import ErrorBody, Health, ModelCard, ModelList, SystemOneResponse

logger = logging.getLogger("clef_vllm.server")

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (400, 401, 413, 500, 503)
}


def error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"type": kind, "message": message}})


class BodyTooLarge(Exception):
    pass


async def read_capped(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _cancel_on_disconnect(request: Request, work: asyncio.Task[Any]) -> None:
    while not work.done():
        if await request.is_disconnected():
            work.cancel()
            return
        await asyncio.sleep(0.1)


def create_app(backend: EngineBackend, *, start_engine: bool = True) -> FastAPI:
    config = backend.config

    async def start_and_warm_up() -> None:
        # The engine starts in a thread so that the server answers /health (503) while it loads.
        try:
            await asyncio.to_thread(backend.start)
            await backend.warm_up()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the engine failed to start")
            backend.failed = True

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup = asyncio.create_task(start_and_warm_up()) if start_engine else None
        try:
            yield
        finally:
            if startup is not None:
                startup.cancel()
            backend.shutdown()

    app = FastAPI(
        title="Clef SystemOne",
        summary="Joint schema decisions from a Clef-Flash checkpoint served by vLLM",
        lifespan=lifespan,
    )

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Any:
        if config.api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            expected = f"Bearer {config.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return error(401, "authentication_error", "missing or invalid API key (Authorization: Bearer ...)")
        return await call_next(request)

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health() -> Any:
        if backend.dead:
            return JSONResponse(status_code=503, content={"status": "dead"})
        if not backend.ready:
            return JSONResponse(status_code=503, content={"status": "starting"})
        return {"status": "ok"}

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=config.model_name, max_model_len=config.max_model_len)])

    @app.post(
        "/v1/systemone",
        response_model=SystemOneResponse,
        responses=ERROR_RESPONSES,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": SystemOneRequestBody.model_json_schema()}},
            }
        },
    )
    async def systemone(request: Request) -> Any:
        if backend.dead:
            return error(503, "service_unavailable", "the engine has stopped; restart the server")
        if not backend.ready:
            return error(503, "service_unavailable", "the model is still loading")
        try:
            raw = await read_capped(request, config.max_body_bytes)
        except BodyTooLarge:
            return error(413, "request_too_large", f"request body exceeds {config.max_body_bytes} bytes")
        parts: dict[str, bytes] = {}
        content_type = request.headers.get("content-type")
        try:
            if is_multipart(content_type):
                body, parts = read_multipart(content_type, raw)
            else:
                body = json.loads(raw)
        except RequestError as exc:
            return error(400, "invalid_request_error", exc.message)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(400, "invalid_request_error", f"body is not valid JSON: {exc}")
        work = asyncio.create_task(backend.score(body, parts))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, work))
        try:
            return await work
        except RequestError as exc:
            return error(400, "invalid_request_error", exc.message)
        except asyncio.CancelledError:
            return error(499, "client_closed_request", "client disconnected")
        except Exception:
            logger.exception("scoring failed")
            if backend.dead:
                return error(503, "service_unavailable", "the engine has stopped; restart the server")
            return error(500, "server_error", "internal error while scoring the request")
        finally:
            watcher.cancel()

    return app
