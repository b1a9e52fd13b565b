"""The bf16 reference: a release folder in transformers plus our head, scoring records as the release does.

Records are scored in batches with right padding; records without media run through the text model alone,
records with media one at a time through the full vision-language model. Every quantized checkpoint is
compared with what this produces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clef_quant.progress import NoProgress, Progress
from clef_vllm.answers import response_from_logits
from clef_vllm.encoder import Encoder
from clef_vllm.encoding import DEFAULT_MAX_LENGTH, Encoding
from clef_vllm.head_files import find_head_dir, load_head
from clef_vllm.request import ClefRequest

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass
class ScoredRecord:
    encoding: Encoding
    logits: torch.Tensor  # flat option logits, questions and options in model order
    response: dict[str, Any]


class ReferenceScorer:
    """Loads a release once and scores requests with it."""

    def __init__(
        self,
        folder: Path,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: str = "cpu",
        max_length: int = DEFAULT_MAX_LENGTH,
    ) -> None:
        self.folder = Path(folder)
        self.device = torch.device(device)
        self.max_length = max_length
        self.dtype = dtype
        self.encoder = Encoder(self.folder, max_length=max_length)  # the processor only once media come
        self.tokenizer = self.encoder.tokenizer
        self.head_dir = find_head_dir(self.folder)
        self._model: Any = None
        self._head: Any = None
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    @property
    def model(self) -> Any:
        """The backbone, loaded on first use so that bad requests are refused before the slow part."""
        if self._model is None:
            from transformers import Qwen3_5ForConditionalGeneration

            from clef_vllm.cpu_conv1d import use_in_transformers

            use_in_transformers()
            model = Qwen3_5ForConditionalGeneration.from_pretrained(self.folder, dtype=self.dtype)
            self._model = model.to(self.device).eval()
        return self._model

    @property
    def head(self) -> Any:
        if self._head is None:
            self._head = load_head(self.head_dir, dtype=self.dtype, device=self.device)
        return self._head

    def encode(self, request: ClefRequest) -> Encoding:
        return self.encoder.encode(request)

    @torch.inference_mode()
    def hidden_states(self, encodings: Sequence[Encoding]) -> list[torch.Tensor]:
        """Final normed hidden states of each record's real tokens, text-only records batched together."""
        if any(e.media_inputs for e in encodings):
            if len(encodings) != 1:
                return [h for e in encodings for h in self.hidden_states([e])]
            return [self._media_hidden_states(encodings[0])]
        longest = max(e.num_tokens for e in encodings)
        ids = torch.full((len(encodings), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(encodings), longest), dtype=torch.long)
        for row, encoding in enumerate(encodings):
            ids[row, : encoding.num_tokens] = torch.tensor(encoding.input_ids)
            mask[row, : encoding.num_tokens] = 1
        text_model = self.model.model.language_model
        out = text_model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False)
        return [out.last_hidden_state[row, : e.num_tokens] for row, e in enumerate(encodings)]

    def _media_hidden_states(self, encoding: Encoding) -> torch.Tensor:
        ids = torch.tensor([encoding.input_ids], device=self.device)
        inputs = {k: v.to(self.device) for k, v in encoding.media_inputs.items() if isinstance(v, torch.Tensor)}
        for key in ("pixel_values", "pixel_values_videos"):
            if key in inputs:
                inputs[key] = inputs[key].to(self.model.dtype)
        out = self.model.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **inputs)
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def logits(self, encodings: Sequence[Encoding]) -> list[torch.Tensor]:
        hidden = self.hidden_states(encodings)
        ids = [torch.tensor(e.input_ids, device=self.device) for e in encodings]
        schemas = [e.schema() for e in encodings]
        return self.head(hidden, ids, schemas, self.model.lm_head.weight)

    def score(
        self,
        requests: Sequence[ClefRequest],
        *,
        batch_size: int = 8,
        progress: Progress | None = None,
        task: str = "scoring",
    ) -> list[ScoredRecord]:
        """Score requests in order, `batch_size` records per forward pass; all are encoded before any runs.

        `progress` is told each batch's records as `task`."""
        progress = progress or NoProgress()
        encodings = [self.encode(r) for r in requests]
        scored: list[ScoredRecord] = []
        for start in range(0, len(requests), batch_size):
            batch = list(requests[start : start + batch_size])
            batch_encodings = encodings[start : start + batch_size]
            for request, encoding, logits in zip(batch, batch_encodings, self.logits(batch_encodings), strict=True):
                logits = logits.float().cpu()
                response = response_from_logits(request, logits, encoding.num_tokens)
                scored.append(ScoredRecord(encoding, logits, response))
            progress.advance(task, len(batch))
        return scored
