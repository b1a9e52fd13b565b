"""The bf16 reference: a release folder in transformers plus our head, scoring records as the release does.

Every record runs through the model and the head on its own, as the vLLM plugin runs it: padded into a batch
(to the longest record, and the head to the most questions and options), a record's bf16 logits moved by up to
0.03 on the tiny checkpoint on CPU, so its probabilities depended on which records were scored beside it and a
rescored record did not match its first score. On CPU one record at a time was also faster (no padded tokens:
14 fixture records in 1.1 s instead of 5.4 s in batches of 8). Records without media run through the text model
alone, records with media through the full vision-language model. Every quantized checkpoint is compared with
what this produces.

A quantized release (compressed-tensors, as `clef-quant quantize` writes it) is loaded dequantized: transformers
decompresses every stored weight to the scorer's dtype, and compressed-tensors' forward quantizes and dequantizes the
activations of the layers whose scheme quantizes them, as the release's config says. That is the release's own math
in transformers' kernels, so it answers as the servers do up to a noise floor. A release transformers cannot run
faithfully is refused with one line instead of answering with weights it did not load.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clef_quant.progress import NoProgress, Progress
from clef_vllm.errors import CheckpointError
from clef_vllm.format.answers import response_from_logits
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH, Encoding
from clef_vllm.format.release_config import QuantizationConfig, read_release_config
from clef_vllm.format.release_source import BACKBONE_CONFIG
from clef_vllm.format.request import ClefRequest
from clef_vllm.head.files import find_head_dir, load_head

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
SERVED_INSTEAD = "serve it with clef-systemone or ClefEngine, which run it through vLLM's quantized kernels"
# compressed-tensors' per-module tensors besides `weight` (scales, global scales, zero points, packed weights and
# their shapes, group indices): one that transformers loads nowhere leaves its weight dequantized without it.
QUANTIZATION_TENSOR = re.compile(r"\.(?:weight|input|output)_[a-z_]+$")


def quantization_config(folder: Path) -> QuantizationConfig | None:
    """config.json's `quantization_config` (None for a bf16 release, or a folder without a readable config)."""
    try:
        return read_release_config(folder).quantization_config
    except CheckpointError:
        return None


def load_backbone(folder: Path, dtype: torch.dtype) -> Any:
    """The release's transformers model in `dtype`; a quantized release with its weights dequantized to `dtype`.

    Raises CheckpointError naming the servers to use when transformers cannot run the release's quantization."""
    import transformers

    config = read_release_config(folder)
    # The class config.json names: Qwen3_5ForConditionalGeneration (clef-flash, clef) or
    # Qwen3OmniMoeForConditionalGeneration (Clef-Omni, the thinker only).
    named = config.architectures[0] if config.architectures else None
    model_class = getattr(transformers, named, None) if named else None
    if model_class is None:
        raise CheckpointError(f"{Path(folder) / BACKBONE_CONFIG} names no transformers architecture ({named})")
    quantization = config.quantization_config
    if quantization is None:
        return model_class.from_pretrained(folder, dtype=dtype)
    method = quantization.quant_method
    if not quantization.is_compressed_tensors:
        raise CheckpointError(_cannot_run(folder, f"it is quantized by {method!r}, not compressed-tensors"))
    # dequantize=True: the weights are decompressed once at load. Left compressed, they are decompressed by a hook
    # on the first forward pass of the whole model, which the text model alone (what records without media run
    # through) never calls: its first Linear then met FP8 weights with bf16 inputs.
    options = transformers.CompressedTensorsConfig(dequantize=True)
    with warnings.catch_warnings():
        # said for every quantized release: the options above are merged into the release's own config
        warnings.filterwarnings("ignore", message="You passed `quantization_config`")
        try:
            model, info = model_class.from_pretrained(
                folder, dtype=dtype, quantization_config=options, output_loading_info=True
            )
        except Exception as exc:  # whatever transformers or compressed-tensors refuse, the answer is one line
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise CheckpointError(_cannot_run(folder, f"loading it failed: {type(exc).__name__}: {reason}")) from exc
    unplaced = [str(k) for k in info["missing_keys"]] + [str(k) for k in info["mismatched_keys"]]
    unplaced += [k for k in info["unexpected_keys"] if QUANTIZATION_TENSOR.search(k)]
    if unplaced:
        shown = ", ".join(sorted(unplaced)[:2]) + (", ..." if len(unplaced) > 2 else "")
        why = f"{len(unplaced)} of its tensors would be left out of the dequantized weights ({shown})"
        raise CheckpointError(_cannot_run(folder, why))
    return model


def _cannot_run(folder: Path, why: str) -> str:
    return f"transformers cannot run the quantized release {Path(folder).name}: {why}; {SERVED_INSTEAD}"


def is_omni(model: Any) -> bool:
    """A Clef-Omni model (transformers' Qwen3-Omni with its thinker), not a Qwen3.5 one."""
    return hasattr(model, "thinker")


def output_embeddings(model: Any) -> torch.Tensor:
    """The `lm_head` weight, whose rows the head reads as lexical features."""
    return (model.thinker.lm_head if is_omni(model) else model.lm_head).weight


@torch.inference_mode()
def record_hidden_states(model: Any, encoding: Encoding, device: torch.device | str) -> torch.Tensor:
    """Final normed hidden states of one record's tokens, the record alone in its forward pass (no padding)."""
    ids = torch.tensor([encoding.input_ids], device=device)
    if not encoding.media_inputs:
        text_model = model.thinker.model if is_omni(model) else model.model.language_model
        return text_model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state[0]
    inputs = {k: v.to(device) for k, v in encoding.media_inputs.items() if isinstance(v, torch.Tensor)}
    for key in ("pixel_values", "pixel_values_videos"):
        if key in inputs:
            inputs[key] = inputs[key].to(model.dtype)
    if is_omni(model):
        return _omni_media_hidden_states(model, ids, inputs)
    out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **inputs)
    return out.last_hidden_state[0]


def _omni_media_hidden_states(model: Any, ids: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The Omni thinker merges the media features and computes their positions only in its full forward, which
    ends in `lm_head`; with `lm_head` swapped for the identity its logits are the final normed hidden states."""
    thinker = model.thinker
    lm_head = thinker.lm_head
    thinker.lm_head = torch.nn.Identity()
    try:
        out = thinker(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **inputs)
    finally:
        thinker.lm_head = lm_head
    return out.logits[0].to(model.dtype)


@torch.inference_mode()
def record_logits(model: Any, head: Any, encoding: Encoding, device: torch.device | str) -> torch.Tensor:
    """One record's flat option logits (questions and options in model order), on `device`: the one way the
    transformers side scores a record, for eval's reference and for scan's bf16 and fake-quantized models alike."""
    ids = torch.tensor(encoding.input_ids, device=device)
    hidden = record_hidden_states(model, encoding, device)
    (logits,) = head([hidden], [ids], [encoding.schema()], output_embeddings(model))
    return logits


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

    @property
    def model(self) -> Any:
        """The backbone, loaded on first use so that bad requests are refused before the slow part."""
        if self._model is None:
            from clef_vllm.engine.cpu.conv1d import use_in_transformers

            use_in_transformers()
            self._model = load_backbone(self.folder, self.dtype).to(self.device).eval()
        return self._model

    @property
    def quantization(self) -> QuantizationConfig | None:
        """The release's `quantization_config` (None for bf16): what loading dequantizes."""
        return quantization_config(self.folder)

    @property
    def head(self) -> Any:
        if self._head is None:
            self._head = load_head(self.head_dir, dtype=self.dtype, device=self.device)
        return self._head

    def encode(self, request: ClefRequest) -> Encoding:
        return self.encoder.encode(request)

    def hidden_states(self, encoding: Encoding) -> torch.Tensor:
        """Final normed hidden states of the record's tokens."""
        return record_hidden_states(self.model, encoding, self.device)

    def logits(self, encoding: Encoding) -> torch.Tensor:
        """The record's flat option logits (questions and options in model order), on the scorer's device."""
        return record_logits(self.model, self.head, encoding, self.device)

    def score(
        self, requests: Sequence[ClefRequest], *, progress: Progress | None = None, task: str = "scoring"
    ) -> list[ScoredRecord]:
        """Score requests in order, one record at a time; all are encoded before any runs.

        `progress` is told each record as `task`."""
        progress = progress or NoProgress()
        encodings = [self.encode(r) for r in requests]
        scored: list[ScoredRecord] = []
        for request, encoding in zip(requests, encodings, strict=True):
            logits = self.logits(encoding).float().cpu()
            scored.append(ScoredRecord(encoding, logits, response_from_logits(request, logits, encoding.num_tokens)))
            progress.advance(task, 1)
        return scored
