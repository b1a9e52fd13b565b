"""The request body as /openapi.json describes it: every question type, with the server's limits.

Routes read their body themselves (strict JSON, decompression), so FastAPI cannot derive the schema; it is
written here once, into `components/schemas`, and referenced by both POST routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from clef_vllm.request import MIN_SCHEMA_CHARS, SCHEMA_CHARS_PER_TOKEN, Limits
from clef_vllm.server.strict_json import MAX_DEPTH, MAX_INTEGER_DIGITS

REQUEST_SCHEMA = "SystemOneRequest"
SCHEMA_TEXT = (
    f"As text (JSON rendered compactly), instructions and each option at most {SCHEMA_CHARS_PER_TOKEN} characters "
    f"per token of the server's max model length (never fewer than {MIN_SCHEMA_CHARS:,}), and all of them together "
    "the same, else 400 schema_too_long naming the text"
)


def request_body() -> dict[str, Any]:
    """`openapi_extra` for a route whose body is the SystemOne request."""
    ref = {"$ref": f"#/components/schemas/{REQUEST_SCHEMA}"}
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


def _question(
    type_id: str, instructions: dict[str, Any], criteria: dict[str, Any], *, criteria_required: bool = True
) -> dict[str, Any]:
    """One question type's schema: its `type` constant, the shared `instructions` and its own `criteria`."""
    return {
        "type": "object",
        "required": ["type", "criteria"] if criteria_required else ["type"],
        "properties": {"type": {"const": type_id}, "instructions": instructions, "criteria": criteria},
    }


def request_schemas(limits: Limits) -> dict[str, Any]:
    any_json = {
        "description": f"Any JSON value (nesting at most {MAX_DEPTH} levels, integers at most "
        f"{MAX_INTEGER_DIGITS} digits, no NaN/Infinity, no duplicate keys)"
    }
    option_id = {"type": "string", "minLength": 1, "maxLength": limits.max_id_length}
    instructions = {**any_json, "description": "Any JSON; the question id when missing or empty. " + SCHEMA_TEXT}
    media = {
        "oneOf": [
            {"type": "string", "description": "base64 or a data URL"},
            {
                "type": "object",
                "description": "{data_base64 | data | base64 | part, format | media_type | content_type, type}",
                "properties": {"type": {"enum": ["image", "video"], "description": "Must fit the item's place"}},
            },
        ]
    }
    return {
        "NoulQuestion": _question(
            "noul",
            instructions,
            {
                "type": ["object", "null"],
                "description": "Optional descriptions of `true` and `false`",
                "properties": {"true": any_json, "false": any_json},
            },
            criteria_required=False,
        ),
        "ChoiceQuestion": _question(
            "choice",
            instructions,
            {
                "oneOf": [
                    {
                        "type": "object",
                        "description": "Option id -> description (any JSON; null for none)",
                        "minProperties": limits.min_options,
                        "maxProperties": limits.max_choice_options,
                        "propertyNames": option_id,
                        "additionalProperties": any_json,
                    },
                    {
                        "type": "array",
                        "description": "Option ids without descriptions (read as null descriptions)",
                        "minItems": limits.min_options,
                        "maxItems": limits.max_choice_options,
                        "uniqueItems": True,
                        "items": option_id,
                    },
                ]
            },
        ),
        "ScoreQuestion": _question(
            "score",
            instructions,
            {
                "type": "array",
                "description": "Level descriptions, level 0 first",
                "minItems": limits.min_options,
                "maxItems": limits.max_score_levels,
                "items": any_json,
            },
        ),
        REQUEST_SCHEMA: {
            "type": "object",
            "description": "The SystemOne request (Jev / SystemOne)",
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
                "images": {
                    "type": "array",
                    "maxItems": limits.max_images,
                    "items": media,
                    "description": "Base64 strings, data URLs or objects {data_base64, format}; PNG, JPEG, WebP, GIF",
                },
                "videos": {
                    "type": "array",
                    "maxItems": limits.max_videos,
                    "items": {"oneOf": [media, {"type": "array", "items": media, "minItems": 1}]},
                    "description": "Each a video file (MP4, WebM, MOV) sampled at 2 fps, or a list of frames",
                },
                "assets": {
                    "type": "object",
                    "additionalProperties": media,
                    "description": "Placeholder -> image, referenced by the placeholder inside strings",
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


def metrics_responses() -> dict[int | str, dict[str, Any]]:
    """`responses` for `GET /metrics`: Prometheus' text exposition format, not JSON."""
    return {
        200: {
            "description": "Prometheus text format: the server's `clef_*` metrics, then vLLM's `vllm:*` ones",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    }
