"""Error bodies and the model list of the HTTP API, as pydantic models so that /openapi.json describes them; the
answer body's models live with the code that builds it (`clef_vllm.format.answers`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from clef_vllm.format.answers import SystemOneResponse


class ErrorDetail(BaseModel):
    type: str = Field(description="Follows the status: invalid_request_error, authentication_error, ...")
    code: str = Field(description="Stable reason, e.g. invalid_json, duplicate_key, body_too_large, not_found")
    message: str = Field(description="One line meant for people; names the field at fault")
    field: str | None = Field(description="The part of the request at fault (`questions.q1.criteria`), or null")


class ErrorBody(BaseModel):
    error: ErrorDetail
    detail: str = Field(description="The message again, as a top-level string (for clients that read only that)")
    code: str = Field(description="The code again, as a top-level string (for clients that read only that)")


class WorkersAIError(BaseModel):
    code: int = Field(description="The HTTP status")
    message: str


class WorkersAIResponse(BaseModel):
    success: Literal[True]
    result: SystemOneResponse
    errors: list[Any] = Field(max_length=0)
    messages: list[Any] = Field(max_length=0)


class WorkersAIErrorBody(BaseModel):
    # The order of the keys in the bodies clients get: a dump writes the fields in this order.
    success: Literal[False]
    errors: list[WorkersAIError] = Field(min_length=1)
    messages: list[Any]
    result: None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "clef"
    max_model_len: int


class ModelEntry(BaseModel):
    name: str
    description: str
    release_date: str = Field(description="YYYY-MM-DD")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(description="OpenAI shape")
    models: list[ModelEntry] = Field(description="SystemOne shape")


class Health(BaseModel):
    status: Literal["ok", "starting", "dead"]
