"""The request body as /openapi.json describes it: every question type, with the server's limits.

Routes read their body themselves (strict JSON, decompression), so FastAPI cannot derive the schema; it is
written here once, into `components/schemas`, and referenced by both POST routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from clef_vllm.request import Limits
from clef_vllm.server.strict_json import MAX_DEPTH, MAX_INTEGER_DIGITS

REQUEST_SCHEMA = "SystemOneRequest"


def request_body() -> dict[str, Any]:
    """`openapi_extra` for a route whose body is the SystemOne request."""
    ref = {"$ref": f"#/components/schemas/{REQUEST_SCHEMA}"}
    return {
        "requestBody": {
            "required": True,
            "description": "JSON; Content-Encoding zstd, gzip or deflate accepted (the cap applies after decoding)",
            "content": {"application/json": {"schema": ref}},
        }
    }


def request_schemas(limits: Limits) -> dict[str, Any]:
    any_json = {
        "description": f"Any JSON value (nesting at most {MAX_DEPTH} levels, integers at most "
        f"{MAX_INTEGER_DIGITS} digits, no NaN/Infinity, no duplicate keys)"
    }
    option_id = {"type": "string", "minLength": 1, "maxLength": limits.max_id_length}
    instructions = {**any_json, "description": "Any JSON; the question id when missing or empty"}
    return {
        "NoulQuestion": {
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"const": "noul"},
                "instructions": instructions,
                "criteria": {
                    "type": ["object", "null"],
                    "description": "Optional descriptions of `true` and `false`",
                    "properties": {"true": any_json, "false": any_json},
                },
            },
        },
        "ChoiceQuestion": {
            "type": "object",
            "required": ["type", "criteria"],
            "properties": {
                "type": {"const": "choice"},
                "instructions": instructions,
                "criteria": {
                    "type": "object",
                    "description": "Option id -> description (any JSON; null for none)",
                    "minProperties": limits.min_options,
                    "maxProperties": limits.max_choice_options,
                    "propertyNames": option_id,
                    "additionalProperties": any_json,
                },
            },
        },
        "ScoreQuestion": {
            "type": "object",
            "required": ["type", "criteria"],
            "properties": {
                "type": {"const": "score"},
                "instructions": instructions,
                "criteria": {
                    "type": "array",
                    "description": "Level descriptions, level 0 first",
                    "minItems": limits.min_options,
                    "maxItems": limits.max_score_levels,
                    "items": any_json,
                },
            },
        },
        REQUEST_SCHEMA: {
            "type": "object",
            "description": "The SystemOne request (Jev / SystemOne). Images and videos are refused (400) for now.",
            "required": ["state", "questions"],
            "properties": {
                "model": {"type": "string", "description": "Echoed in the response; the served name when absent"},
                "state": {**any_json, "description": "Any JSON; rendered as text, cut from its end when too long"},
                "questions": {
                    "type": "object",
                    "description": "Question id -> question, in the order to encode",
                    "minProperties": 1,
                    "maxProperties": limits.max_questions,
                    "propertyNames": option_id,
                    "additionalProperties": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/NoulQuestion"},
                            {"$ref": "#/components/schemas/ChoiceQuestion"},
                            {"$ref": "#/components/schemas/ScoreQuestion"},
                        ]
                    },
                },
                "images": {"type": "array", "items": {"type": "string"}, "description": "Not supported yet (400)"},
                "videos": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "string"}},
                    "description": "Not supported yet (400)",
                },
            },
        },
    }


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
