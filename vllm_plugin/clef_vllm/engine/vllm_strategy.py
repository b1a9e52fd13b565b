"""`vllm serve`'s own `/v1/systemone` for Clef-Flash: a read strategy registered for our architecture.

vLLM parses the request into its question objects and maps the answers; this strategy turns those
questions back into a SystemOne request, encodes it with the Flash release's encoding (`clef_vllm.format.encoding`:
default max length 16,384, media placeholders together then one newline) and reads every option's
probability in one pooling request. Images and videos come as data URLs (or plain base64), decoded and
sampled by `clef_vllm.format.media` as in `clef-systemone`; they are taken unless the server runs with
`--language-model-only`. vLLM's parser turns non-string instructions and descriptions into Python strings
before we see them and caps choices at 26 options and scores at 10 levels; `clef-systemone` has neither
limitation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from vllm.inputs import tokens_input

from clef_vllm.engine.pooling_contract import check_token_ids, pooling_params
from clef_vllm.engine.prompt import engine_prompt
from clef_vllm.engine.vllm_decisions import decision_limits, decisions_module
from clef_vllm.errors import RequestError
from clef_vllm.format.answers import split_logits
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH, Encoding
from clef_vllm.format.limits import DEFAULT_LIMITS, Limits
from clef_vllm.format.request import ClefRequest
from clef_vllm.format.text import render

_questions, _strategies = decisions_module("question_types"), decisions_module("strategies")
if _questions is None or _strategies is None:
    raise ImportError("this vLLM has no structured decisions API (vllm serve's /v1/systemone)")
Question = _questions.Question
StructuredDecisionError = _questions.StructuredDecisionError
DecisionLimits = _strategies.DecisionLimits
QuestionRead = _strategies.QuestionRead
ReadContext = _strategies.ReadContext
ReadStrategy = _strategies.ReadStrategy


def _systemone_body(
    questions: list[Question], state: str, media: Mapping[str, Sequence[str]] | None = None
) -> dict[str, Any]:
    """The SystemOne request equivalent to vLLM's parsed questions."""
    body: dict[str, Any] = {}
    for q in questions:
        kind = q.type.name
        if kind == "choice":
            criteria: Any = {o.name: o.description for o in q.options}
        elif kind == "noul":
            criteria = {side: o.description for side, o in zip(("true", "false"), q.options, strict=True)}
            criteria = {side: text for side, text in criteria.items() if text is not None} or None
        else:
            criteria = [o.name for o in q.options]
        body[q.id] = {"type": kind, "instructions": q.instructions, "criteria": criteria}
    request: dict[str, Any] = {"model": "", "state": state, "questions": body}
    for modality, field in (("image", "images"), ("video", "videos")):
        if (media or {}).get(modality):
            request[field] = list(media[modality])
    return request


def _model_order_to_vllm_order(request: ClefRequest, logits: torch.Tensor) -> list[list[float]]:
    """Per-question probabilities in vLLM's order: it lists a choice's options in request order, the model
    scores them sorted by id."""
    counts = [len(question.options) for question in request.questions]
    per_question = []
    for question, probs in zip(request.questions, split_logits(logits, counts), strict=True):
        by_id = {o.id: p for o, p in zip(question.options, probs.tolist(), strict=True)}
        per_question.append([by_id[option_id] for option_id in question.answer_order])
    return per_question


class ClefFlashStrategy(ReadStrategy):
    """One pooling read per request; the joint schema head scores every option of every question."""

    task = "token_classify"
    modalities = frozenset({"image", "video"})

    def __init__(self, context: ReadContext) -> None:
        super().__init__(context)
        model_config = context.engine_client.model_config
        self.request_limits = _server_limits(model_config)
        self.encoder = Encoder(
            model_config.model,
            max_length=min(DEFAULT_MAX_LENGTH, model_config.max_model_len),
            media=self.request_limits.media_enabled,
            tokenizer=context.online_renderer.renderer.get_tokenizer(),
        )

    def limits(self) -> DecisionLimits:
        return decision_limits(DecisionLimits, max_questions=DEFAULT_LIMITS.max_questions, max_options=256)

    def render_state(self, state: Any) -> str:
        return render(state)

    def num_requests(self, questions: list[Question], joint: bool = False) -> int:
        return 1  # one pooling read answers every question (vLLM 0.34 also asks about joint reads)

    async def read(
        self,
        questions: list[Question],
        instructions: str | None,
        state: str,
        *,
        request_id: str,
        chat_template_kwargs: dict[str, Any] | None,
        lora_request: Any,
        priority: int,
        cache_salt: str | None = None,
        trace_headers: Mapping[str, str] | None = None,
        media: Mapping[str, Sequence[str]] | None = None,
    ) -> list[QuestionRead]:
        if instructions:
            raise StructuredDecisionError("Clef reads a fixed prompt, so it takes no top-level instructions")
        try:
            body = _systemone_body(questions, state, media)
            request, encoding = self.encoder.prepare(body, self.request_limits)
        except RequestError as exc:
            raise StructuredDecisionError(exc.message) from None
        result = None
        async for update in self.context.engine_client.encode(
            await self._engine_input(encoding, cache_salt),
            pooling_params(encoding),
            f"{request_id}-0",
            lora_request=lora_request,
            trace_headers=trace_headers,
            priority=priority,
        ):
            result = update
        if result is None or result.error is not None:
            raise ValueError("the engine did not score the request")
        # A RuntimeError, not a ValueError: vLLM answers ValueErrors as the client's fault (400).
        check_token_ids(result.prompt_token_ids, encoding)
        per_question = _model_order_to_vllm_order(request, result.outputs.data)
        return [
            QuestionRead(
                probs=probs,
                label_mass=1.0,
                argmax_is_label=True,
                input_tokens=encoding.num_tokens if index == 0 else 0,
                output_tokens=0,
            )
            for index, probs in enumerate(per_question)
        ]

    async def _engine_input(self, encoding: Encoding, cache_salt: str | None) -> Any:
        if not encoding.multi_modal_data:
            return tokens_input(encoding.input_ids, cache_salt=cache_salt)
        # vLLM's own Qwen3.5 processor expands the placeholders (checked against our ids after the read)
        prompt = engine_prompt(encoding)
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        try:
            return await self.context.online_renderer.renderer.process_for_engine_async(prompt, time.time())
        except ValueError as exc:
            raise StructuredDecisionError(f"media: {exc}") from None


def _server_limits(model_config: Any) -> Limits:
    """Media on unless the server runs `--language-model-only`; per-request counts from --limit-mm-per-prompt."""
    mm_config = model_config.get_multimodal_config() if model_config.is_multimodal_model else None
    if mm_config is None or getattr(mm_config, "language_model_only", False):
        return replace(DEFAULT_LIMITS, max_images=0, max_videos=0)
    counts = {modality: mm_config.get_limit_per_prompt(modality) for modality in ("image", "video")}
    return replace(
        DEFAULT_LIMITS,
        max_images=min(DEFAULT_LIMITS.max_images, counts["image"]),
        max_videos=min(DEFAULT_LIMITS.max_videos, counts["video"]),
    )
