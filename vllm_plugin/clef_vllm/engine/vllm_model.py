"""Clef-Flash on vLLM: the Qwen3.5 model with the joint schema head as a `token_classify` pooler.

Request sequence: the front end encodes a request (`clef_vllm.format.encoding`) and sends its token ids with the
schema in `PoolingParams.extra_kwargs["joint_schema"]` (`clef_vllm.engine.pooling_contract`). The engine runs the
prompt, possibly in several chunks; each step the pooler keeps the chunk's final hidden states, and once a
prompt is complete it runs the head on it and returns each option's logit (or, by default, its probability
within its question).

The head's lexical features read rows of the output embedding (`lm_head`). We keep that table on the host,
captured from the checkpoint while the weights stream by, and copy to the device only the rows the option
tokens of a step use: under tensor parallelism `lm_head` is split across ranks, and a host table gives
every rank the full rows without a collective in the pooler and without a second full copy on the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from pathlib import Path

import torch
from vllm.config import VllmConfig
from vllm.model_executor.layers.pooler import Pooler, PoolingParamsUpdate
from vllm.model_executor.layers.pooler.tokwise.methods import AllPool
from vllm.model_executor.models.config import VerifyAndUpdateConfig
from vllm.model_executor.models.interfaces_base import default_pooling_type
from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration
from vllm.tasks import PoolingTask
from vllm.v1.outputs import PoolerOutput
from vllm.v1.pool.metadata import PoolingMetadata

from clef_vllm.engine.gdn_graphs import install_prompt_graphs
from clef_vllm.engine.invariance import (
    accept_gdn_layers,
    invariant_kernels_on,
    keep_cublas_for_bf16_linears,
    split_free_kernels_on,
    use_split_free_kernels,
)
from clef_vllm.engine.pooling_contract import POOLER_RANGE, parse_pooling_schema
from clef_vllm.errors import CheckpointError, SettingsError
from clef_vllm.format.answers import flat_probabilities
from clef_vllm.format.release_source import fetch_release
from clef_vllm.format.schema import RecordSchema
from clef_vllm.head.files import HEAD_CONFIG, HEAD_SUBDIR, HEAD_WEIGHTS, HeadConfig, find_head_dir, load_head
from clef_vllm.head.graphs import GraphedHead
from clef_vllm.head.model import JointSchemaHead

HEAD_PREFIX = "pooler.head."
LEXICAL_TABLE_NAMES = ("lm_head.weight", "model.language_model.embed_tokens.weight")


class ClefFlashConfig(VerifyAndUpdateConfig):
    """Settings the Clef model needs whoever starts the engine (`vllm serve` included).

    Prefix caching would hand the pooler a prompt without the hidden states of its cached prefix. With vLLM's
    batch-invariant or split-free kernels on (`clef_vllm.engine.invariance`), a prompt must also run whole in one step
    (`clef_vllm.engine.invariance`), so chunked prefill is turned off when the step holds the longest prompt and refused
    otherwise. On a GPU without FlashInfer, Gated DeltaNet's prefill runs vLLM's Triton kernels."""

    @staticmethod
    def verify_and_update_config(vllm_config: VllmConfig) -> None:
        vllm_config.cache_config.enable_prefix_caching = False
        if invariant_kernels_on() or split_free_kernels_on():
            _whole_prompts_per_step(vllm_config)
        if torch.cuda.is_available() and isinstance(vllm_config.additional_config, dict):
            from clef_vllm.engine.settings import gpu_defaults

            vllm_config.additional_config.update(gpu_defaults(vllm_config.additional_config))


def _whole_prompts_per_step(vllm_config: VllmConfig) -> None:
    scheduler = vllm_config.scheduler_config
    longest = vllm_config.model_config.max_model_len
    if scheduler.enable_chunked_prefill and scheduler.max_num_batched_tokens < longest:
        raise SettingsError(
            f"answers that do not move with load need whole prompts in a step: max_num_batched_tokens "
            f"{scheduler.max_num_batched_tokens} is below max_model_len {longest} "
            "(pass --no-enable-chunked-prefill --max-num-batched-tokens N with N >= max_model_len)"
        )
    scheduler.enable_chunked_prefill = False


def local_release_dir(model: str, revision: str | None) -> Path:
    """The folder vLLM loads from, for a local path or a Hub id (only the head files are fetched)."""
    path = Path(model)
    if path.is_dir():
        return path
    patterns = [HEAD_CONFIG, HEAD_WEIGHTS, f"{HEAD_SUBDIR}/{HEAD_CONFIG}", f"{HEAD_SUBDIR}/{HEAD_WEIGHTS}"]
    return fetch_release(model, revision, allow_patterns=patterns)


class JointSchemaPooler(Pooler):
    """Accumulates each prompt's hidden states across chunks and runs the head on finished prompts.

    `token_classify` answers with the head; `token_embed` returns the hidden states themselves, which lets
    tests compare the head against vLLM's own per-token states under the same schedule.
    """

    def __init__(self, head: JointSchemaHead) -> None:
        super().__init__()
        self.head = head
        self.graphed_head = GraphedHead(head)  # CUDA graph replays on a GPU, the batched forward elsewhere
        self.accumulate = AllPool()
        self.lexical_table: torch.Tensor | None = None  # [vocab, hidden] on the host

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"token_classify", "token_embed"}

    def get_pooling_updates(self, task: PoolingTask) -> PoolingParamsUpdate:
        return PoolingParamsUpdate(requires_token_ids=task == "token_classify")

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        with torch.profiler.record_function(POOLER_RANGE):  # names the pooler's share in a profile
            return self._forward(hidden_states, pooling_metadata)

    def _forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> PoolerOutput:
        pooled = self.accumulate(hidden_states, pooling_metadata)
        params = pooling_metadata.pooling_params
        outputs: list[torch.Tensor | None] = list(pooled)
        ready: list[tuple[int, RecordSchema]] = []
        for index, (hidden, param) in enumerate(zip(pooled, params, strict=True)):
            if hidden is None or param.task == "token_embed":
                continue
            schema = parse_pooling_schema(param.extra_kwargs, hidden.shape[0])
            if schema is None:
                # A finished request given None would wait forever; an empty answer ends it.
                outputs[index] = hidden.new_empty(0, dtype=torch.float32)
                continue
            ready.append((index, schema))
        if ready:
            token_ids = pooling_metadata.get_prompt_token_ids_cpu()
            for index, schema in ready:
                # One prompt per head call: in bf16 a padded batch would make an answer depend on which
                # other prompts happened to finish in the same step.
                record_logits = self._logits(pooled[index], token_ids[index], schema)
                if params[index].use_activation is not False:
                    record_logits = flat_probabilities(record_logits, schema.option_counts)
                outputs[index] = record_logits
        return outputs

    def _logits(self, hidden: torch.Tensor, token_ids: torch.Tensor, schema: RecordSchema) -> torch.Tensor:
        if self.lexical_table is None:
            raise RuntimeError("the lexical table was not captured while loading weights")
        # Only the option tokens' rows are needed: map their ids into a compact table for this prompt.
        positions = _option_positions(schema)
        unique_ids, compact = torch.unique(token_ids[positions], return_inverse=True)
        rows = self.lexical_table[unique_ids].to(device=hidden.device, dtype=hidden.dtype, non_blocking=True)
        local_ids = torch.zeros(token_ids.shape[0], dtype=torch.long)
        local_ids[positions] = compact
        logits = self.graphed_head(hidden, local_ids.to(hidden.device, non_blocking=True), schema, rows)
        return logits.float()


def _option_positions(schema: RecordSchema) -> torch.Tensor:
    spans = torch.tensor([span for spans in schema.option_spans for span in spans], dtype=torch.long)
    lengths = spans[:, 1] - spans[:, 0]
    offsets = torch.arange(int(lengths.sum())) - torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
    return torch.repeat_interleave(spans[:, 0], lengths) + offsets


@default_pooling_type(tok_pooling_type="ALL")
class ClefFlashForJointSchema(Qwen3_5ForConditionalGeneration):
    """Qwen3.5 backbone plus the Clef joint schema head, read from the release's root (or `clef_head/`)."""

    is_pooling_model = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "model") -> None:
        if invariant_kernels_on():
            accept_gdn_layers()  # before the layers pick their attention backends
            keep_cublas_for_bf16_linears()
        elif split_free_kernels_on():
            use_split_free_kernels()
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.prompt_graphs = install_prompt_graphs(self, vllm_config)  # GPU engines with CUDA graphs only
        model_config = vllm_config.model_config
        self.head_dir = find_head_dir(local_release_dir(model_config.model, model_config.revision))
        head = JointSchemaHead(HeadConfig.read(self.head_dir / HEAD_CONFIG))
        hidden = model_config.hf_text_config.hidden_size
        if head.config.hidden_size != hidden:
            raise CheckpointError(
                f"{self.head_dir / HEAD_CONFIG}: head hidden_size {head.config.hidden_size} "
                f"does not match the backbone's {hidden}"
            )
        self.pooler = JointSchemaPooler(head)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        captured: dict[str, torch.Tensor] = {}
        head_keys = set(self.pooler.head.state_dict())
        loaded = super().load_weights(self._capture_lexical_table(weights, captured, head_keys))
        table = next((captured[name] for name in LEXICAL_TABLE_NAMES if name in captured), None)
        if table is None:
            raise CheckpointError("the checkpoint has neither lm_head.weight nor the input embeddings")
        if torch.cuda.is_available() and table.device.type == "cpu":
            table = table.pin_memory()
        self.pooler.lexical_table = table
        return loaded | self._load_head()

    @staticmethod
    def _capture_lexical_table(
        weights: Iterable[tuple[str, torch.Tensor]], captured: dict[str, torch.Tensor], head_keys: set[str]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if name in head_keys:
                # Without a weights index vLLM reads every *.safetensors in the folder, the root's
                # joint_head.safetensors included (our releases list only backbone shards in theirs); the
                # head is loaded from its own file below, strictly.
                continue
            if name in LEXICAL_TABLE_NAMES:
                captured[name] = tensor.detach().to("cpu", copy=True)
            yield name, tensor

    def _load_head(self) -> set[str]:
        reference = next(self.parameters())
        loaded = load_head(self.head_dir, dtype=reference.dtype, device=reference.device)
        self.pooler.head.load_state_dict(loaded.state_dict(), strict=True)
        return {HEAD_PREFIX + name for name, _ in self.pooler.head.named_parameters()}
