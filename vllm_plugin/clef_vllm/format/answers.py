"""From per-option probabilities to the SystemOne response body, mapped exactly as the release does.

The body's shape is the models below, once: every answer is built as one of them and the body is their dump,
and the servers' /openapi.json documents the same models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, JsonValue

from clef_vllm.format.request import ClefRequest, Question
from clef_vllm.format.schema import QuestionType

DECIMALS = 4


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


Answer = NoulAnswer | ChoiceAnswer | ScoreAnswer


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int = 0


class SystemOneResponse(BaseModel):
    model: str | None = Field(
        description="The request's `model` as sent, else the served model name (the servers always name one)"
    )
    answers: dict[str, Answer]
    usage: Usage


def split_logits(logits: torch.Tensor, option_counts: Sequence[int]) -> list[torch.Tensor]:
    """Per-question probabilities (softmax over each question's options, float32) from one record's flat logits:
    the one softmax of every front end (the pooler, the reference, eval, scan)."""
    return [chunk.float().softmax(dim=-1) for chunk in torch.split(logits, list(option_counts))]


def flat_probabilities(logits: torch.Tensor, option_counts: Sequence[int]) -> torch.Tensor:
    """`split_logits` laid flat again, in the logits' order: what the pooler returns for each prompt."""
    return torch.cat(split_logits(logits, option_counts))


def answer(question: Question, probabilities: Sequence[float]) -> Answer:
    """One answer; `probabilities` are in model order (`question.options`)."""
    by_id = {option.id: float(p) for option, p in zip(question.options, probabilities, strict=True)}
    if question.type is QuestionType.NOUL:
        return NoulAnswer(type="noul", noul=round(by_id["true"], DECIMALS))
    ordered = [(option_id, by_id[option_id]) for option_id in question.answer_order]
    best_id, best_p = ordered[0]
    for option_id, p in ordered[1:]:
        if p > best_p:  # strict: ties go to the first option in request order
            best_id, best_p = option_id, p
    rounded = {option_id: round(p, DECIMALS) for option_id, p in ordered}
    if question.type is QuestionType.CHOICE:
        return ChoiceAnswer(type="choice", choice=best_id, confidence=round(best_p, DECIMALS), probabilities=rounded)
    return ScoreAnswer(
        type="score",
        score=round(sum(level * p for level, (_, p) in enumerate(ordered)), DECIMALS),
        confidence=round(best_p, DECIMALS),
        legend={option.id: option.description for option in question.options},
        probabilities=rounded,
    )


def build_response(request: ClefRequest, probabilities: Sequence[Sequence[float]], input_tokens: int) -> dict[str, Any]:
    """The response body: one answer per question in request order, and the prompt length as usage."""
    answers = {
        question.id: answer(question, probs) for question, probs in zip(request.questions, probabilities, strict=True)
    }
    body = SystemOneResponse(model=request.model, answers=answers, usage=Usage(input_tokens=input_tokens))
    return body.model_dump(mode="json")


def response_from_logits(request: ClefRequest, logits: torch.Tensor, input_tokens: int) -> dict[str, Any]:
    counts = [len(q.options) for q in request.questions]
    return build_response(request, [p.tolist() for p in split_logits(logits, counts)], input_tokens)
