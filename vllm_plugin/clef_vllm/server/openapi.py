"""The request body as /openapi.json describes it: every question type, with the server's limits.

Routes read their body themselves (strict JSON, decompression), so FastAPI cannot derive the schema; it is
generated from the request models in `clef_vllm.format.wire_models` (descriptions, shapes and the bounds they
name), with this server's limits written in, into `components/schemas`, and referenced by both POST routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from clef_vllm.format.limits import Limits
from clef_vllm.format.strict_json import MAX_DEPTH, MAX_INTEGER_DIGITS
from clef_vllm.format.wire_checks import resolve_limits
from clef_vllm.format.wire_models import SystemOneRequest

REQUEST_SCHEMA = SystemOneRequest.__name__
REF_TEMPLATE = "#/components/schemas/{model}"
JSON_VALUE = (
    f"Any JSON value (nesting at most {MAX_DEPTH} levels, integers at most {MAX_INTEGER_DIGITS} digits, "
    "no NaN/Infinity, no duplicate keys)"
)


def request_body() -> dict[str, Any]:
    """`openapi_extra` for a route whose body is the SystemOne request."""
    ref = {"$ref": REF_TEMPLATE.format(model=REQUEST_SCHEMA)}
    return {
        "requestBody": {
            "required": True,
            "description": "JSON; Content-Encoding zstd, gzip or deflate accepted (one frame, member or stream; "
            "the cap applies as sent and after decoding)",
            "content": {
                "application/json": {"schema": ref},
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["request"],
                        "properties": {"request": ref},
                        "additionalProperties": {"type": "string", "format": "binary"},
                        "description": "The JSON in part `request`; media objects name file parts as {part: NAME}",
                    },
                    "encoding": {"request": {"contentType": "application/json"}},
                },
            },
        }
    }


def request_schemas(limits: Limits) -> dict[str, Any]:
    """The request model and every model it refers to, as `components/schemas` entries under `limits`."""
    _, document = models_json_schema([(SystemOneRequest, "validation")], ref_template=REF_TEMPLATE)
    schemas = resolve_limits(document["$defs"], limits)
    schemas["JsonValue"] = {**schemas.get("JsonValue", {}), "description": JSON_VALUE}
    return schemas


def install(app: FastAPI, limits: Limits) -> None:
    """Add the request schemas to the generated document (built once, then cached by FastAPI)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        document = generate()  # FastAPI caches the document; the schemas are added to it once
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        if REQUEST_SCHEMA not in schemas:
            schemas.update(request_schemas(limits))
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def metrics_responses() -> dict[int | str, dict[str, Any]]:
    """`responses` for `GET /metrics`: Prometheus' text exposition format, not JSON."""
    return {
        200: {
            "description": "Prometheus text format: the server's `clef_*` metrics, then vLLM's `vllm:*` ones",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    }
