"""Response and error bodies of the HTTP API, as pydantic models so that /openapi.json describes them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, JsonValue


class NoulAnswer(BaseModel):
    type: Literal["noul"]
    noul: float = Field(description="Probability that the proposition is true, rounded to 4 decimals")


class ChoiceAnswer(BaseModel):
    type: Literal["choice"]
    choice: str
    confidence: float
    probabilities: dict[str, float] = Field(description="Every option, in the request's criteria order")


class ScoreAnswer(BaseModel):
    type: Literal["score"]
    score: float = Field(description="Expected level, sum of level x probability")
    confidence: float
    legend: dict[str, JsonValue]
    probabilities: dict[str, float]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int = 0


class SystemOneResponse(BaseModel):
    model: str
    answers: dict[str, NoulAnswer | ChoiceAnswer | ScoreAnswer]
    usage: Usage


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "clef"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "starting", "dead"]
