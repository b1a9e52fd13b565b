"""The FastAPI application: routes and authentication; the body pipeline, errors and ids live next door.

A request goes: request id (request_ids) -> key check -> body read with cap and decompression (body) ->
strict JSON (strict_json) -> the engine (backend) -> the SystemOne body, or inside Cloudflare's envelope on
the Workers AI route. Every error leaves in one shape (error_shape).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from clef_vllm.errors import RequestError
from clef_vllm.format import strict_json
from clef_vllm.server import lifecycle, openapi
from clef_vllm.server.backend import EngineBackend
from clef_vllm.server.body import read_body
from clef_vllm.server.error_shape import ApiError, install
from clef_vllm.server.metrics import ServerMetrics
from clef_vllm.server.model_info import model_info
from clef_vllm.server.multipart import is_multipart, read_multipart
from clef_vllm.server.request_ids import RequestContext
from clef_vllm.server.schemas import (
    ErrorBody,
    Health,
    ModelCard,
    ModelEntry,
    ModelList,
    SystemOneResponse,
    WorkersAIErrorBody,
    WorkersAIResponse,
)

logger = logging.getLogger("clef_vllm.server")

ERROR_STATUSES = (400, 401, 408, 413, 415, 422, 500, 503)
HOSTED_NAMES = ("clef", "clef-flash")  # the Workers AI model ids a self-hosted release stands in for
CLIENT_CLOSED = 499
# The only routes answered without the API key: probes and scrapers carry none, and the API's own description.
# Every other route requires the key through `require_key` (tests/test_server_units.py walks the routes).
OPEN_ROUTES = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
KEY_MESSAGE = "missing or invalid API key: send it as a bearer token in the Authorization header"


class RequireKey:
    """The one key check, a dependency of every route not in `OPEN_ROUTES`; no key configured lets all in."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key

    def __call__(self, request: Request) -> None:
        if not self.api_key:
            return
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "invalid_api_key", KEY_MESSAGE)


def _responses(model: type, *extra: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": model, "description": "Error"} for status in sorted((*ERROR_STATUSES, *extra))}


def _cancel_on_disconnect(request: Request, work: asyncio.Task[Any]) -> asyncio.Task[None]:
    async def watch() -> None:
        while not work.done():
            if await request.is_disconnected():
                work.cancel()
                return
            await asyncio.sleep(0.1)

    return asyncio.create_task(watch())


# How often the server looks for a dead engine, and how long requests in flight get to receive their 503s.
ENGINE_WATCH_SECONDS = 0.5
ENGINE_DEATH_GRACE_SECONDS = 2.0
# The grace the rest of a dead engine gets: a data-parallel rank whose peer died never ends by itself.
ENGINE_ABANDON_SECONDS = 0.0


async def _watch_engine(backend: EngineBackend, on_engine_death: Callable[[], None]) -> None:
    """Once the engine is dead (or failed to start), let in-flight requests get their 503, then stop the server
    so that a supervisor (systemd, Docker, Kubernetes) restarts it.

    A process of the engine that ended is its death, before vLLM says so (`lifecycle`'s docstring): the others are
    ended at once, so that vLLM fails the requests in flight now instead of after their 5-second grace."""
    while not backend.dead:
        ended = lifecycle.exited(lifecycle.engine_processes(backend.engine))
        if ended:
            backend.failed = True
            logger.error("an engine process ended (%s); stopping the others", ", ".join(p.name for p in ended))
            await asyncio.to_thread(lifecycle.end_engine_processes, backend.engine, ENGINE_ABANDON_SECONDS)
            break
        await asyncio.sleep(ENGINE_WATCH_SECONDS)
    logger.error("the engine has stopped; the server exits in %.0f s", ENGINE_DEATH_GRACE_SECONDS)
    await asyncio.sleep(ENGINE_DEATH_GRACE_SECONDS)
    on_engine_death()


def create_app(
    backend: EngineBackend, *, start_engine: bool = True, on_engine_death: Callable[[], None] | None = None
) -> Any:
    """The ASGI application (FastAPI wrapped in the request-id layer); `.fastapi` is the FastAPI app.

    `on_engine_death` is called once the engine has died and in-flight requests were answered."""
    config = backend.config
    info = model_info(config.model, config.served_model_name)
    served_name = info.name

    engine_start = lifecycle.EngineStart(lambda: backend.start())

    async def start_and_warm_up() -> None:
        # The engine starts in a thread so that the server answers /health (503) while it loads.
        try:
            await engine_start.run()
            await backend.warm_up()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the engine failed to start")
            backend.failed = True

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup = asyncio.create_task(start_and_warm_up()) if start_engine else None
        watcher = asyncio.create_task(_watch_engine(backend, on_engine_death)) if on_engine_death else None
        try:
            yield
        finally:
            for task in (startup, watcher):
                if task is not None:
                    task.cancel()
            backend.shutdown()

    app = FastAPI(
        title="Clef SystemOne",
        summary="Joint schema decisions from a Clef-Flash checkpoint served by vLLM",
        lifespan=lifespan,
        # Starlette would answer `/v1/systemone/` with a redirect whose Location is built from the Host header.
        redirect_slashes=False,
    )
    install(app)
    openapi.install(app, config.limits)
    server_metrics = ServerMetrics(backend)

    keyed = [Depends(RequireKey(config.api_key))]

    async def answer(request: Request, response: Response) -> dict[str, Any]:
        if backend.dead:
            raise ApiError(503, "engine_dead", "the engine has stopped; restart the server")
        if not backend.ready:
            raise ApiError(503, "engine_starting", "the model is still loading")
        raw = await read_body(request, config.max_body_bytes)
        content_type = request.headers.get("content-type")
        parts: dict[str, bytes] = {}
        if is_multipart(content_type):
            body, parts = await asyncio.to_thread(read_multipart, content_type, raw)
        else:
            body = await asyncio.to_thread(strict_json.loads, raw)
        del raw
        work = asyncio.create_task(backend.score(body, parts))
        watcher = _cancel_on_disconnect(request, work)
        try:
            scored = await work
        except RequestError as exc:
            raise ApiError.bad_request(exc) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the server itself is stopping: let it
                raise
            raise ClientDisconnect from None  # the watcher cancelled the work: the client left
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException:  # also a panic in native code (pyo3's PanicException is not an Exception)
            logger.exception("%s scoring failed", request.state.request_id)
            if backend.dead:
                raise ApiError(503, "engine_dead", "the engine has stopped; restart the server") from None
            raise ApiError(500, "internal_error", "internal error while scoring the request") from None
        finally:
            watcher.cancel()
        response.headers.update(scored.headers)
        result = scored.body
        sent = body.get("model") if isinstance(body, dict) else None
        result["model"] = sent if isinstance(sent, str) else served_name
        return result

    async def answer_or_abort(request: Request, response: Response) -> dict[str, Any] | Response:
        try:
            return await answer(request, response)
        except ClientDisconnect:
            logger.info("%s client went away before the answer; request dropped", request.state.request_id)
            return Response(status_code=CLIENT_CLOSED)

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health() -> Any:
        if backend.dead:
            return JSONResponse(status_code=503, content={"status": "dead"}, headers={"Retry-After": "5"})
        if not backend.ready:
            return JSONResponse(status_code=503, content={"status": "starting"}, headers={"Retry-After": "5"})
        return {"status": "ok"}

    @app.get("/metrics", response_class=Response, responses=openapi.metrics_responses())
    async def metrics() -> Response:
        return server_metrics.response()

    async def models() -> ModelList:
        card = ModelCard(id=served_name, created=info.created, max_model_len=config.max_model_len)
        entry = ModelEntry(name=served_name, description=info.description, release_date=info.release_date)
        return ModelList(data=[card], models=[entry])

    # SystemOne clients that put every route under their base URL ask for the list there too.
    for path in ("/v1/models", "/v1/systemone/models"):
        app.add_api_route(
            path,
            models,
            methods=["GET"],
            response_model=ModelList,
            responses={401: {"model": ErrorBody}},
            dependencies=keyed,
        )

    @app.post(
        "/v1/systemone",
        response_model=SystemOneResponse,
        responses=_responses(ErrorBody),
        openapi_extra=openapi.request_body(),
        dependencies=keyed,
    )
    async def systemone(request: Request, response: Response) -> Any:
        return await answer_or_abort(request, response)

    @app.post(
        "/accounts/{account_id}/ai/run/@cf/cloudflare/{name:path}",
        response_model=WorkersAIResponse,
        responses=_responses(WorkersAIErrorBody, 404),
        openapi_extra=openapi.request_body(),
        summary="Workers AI compatible route (Cloudflare's envelope)",
        dependencies=keyed,
    )
    async def workers_ai(request: Request, response: Response, account_id: str, name: str) -> Any:
        if name not in (*HOSTED_NAMES, served_name):
            raise ApiError(404, "model_not_found", f"model @cf/cloudflare/{name} is not served here", "name")
        result = await answer_or_abort(request, response)
        if isinstance(result, Response):
            return result
        return {"success": True, "result": result, "errors": [], "messages": []}

    wrapped = RequestContext(app, on_done=server_metrics.record)
    wrapped.fastapi = app  # type: ignore[attr-defined]
    wrapped.engine_start = engine_start  # type: ignore[attr-defined]
    return wrapped
