"""One prompt's Gated DeltaNet prefill as a CUDA graph replay per layer, on a GPU.

vLLM runs each Gated DeltaNet layer outside its CUDA graphs: the prefill kernels take their grids from the step's
sequence lengths, so the layer is an eager call between graph pieces. On a short prompt that call is host time, not
GPU time. Profiled on an H100 (bench/results/latency-h100-27b-profile.md), the 27B FP8 at 553 tokens spent about
53 ms in kernels of a 92 ms request: each layer's ~10 Triton launches and the Python around them take longer than
its kernels run, 48 layers in a row.

A step that prefills exactly one prompt from its start, and nothing else, is the common case of one request at a
time. For it the layer's work has fixed shapes once the sequence is taken to be the whole padded step: vLLM already
pads the step to a captured size N, so one graph per (layer, N) holds the conv, the gating and the chunked delta
rule for a single sequence of N tokens, captured from vLLM's own `_forward_core` on a metadata of that one sequence.

The padding cannot reach a real token: every kernel of the prefill is causal within its sequence. The convolution
reads the three tokens before a row, the per-row prep (gates, L2 norms) reads its row, and the chunked delta rule
masks each chunk's intra-chunk products to earlier rows with `tl.where` before they touch the values, so a row's
output reads only rows at or before it; a row after the prompt's end only changes the final state, which a Clef
prompt never reads (no decode, no prefix caching). The padding rows are zeros (a step's padding rows may hold
anything, NaN included, and 0 * NaN is not 0), so they stay finite. Only the prompt's own rows are copied out, the
others left as vLLM's path leaves them. The state writes go to a scratch slot instead of the request's.

Whether a step qualifies is decided from host integers only (no device sync): `mark_fresh_single_prompts` wraps
vLLM's GDN metadata builder so that a step's metadata carries its prompt length when the step is one request with
nothing computed before it. Any other step (a batch, a prompt in pieces, a size without a vLLM graph) runs vLLM's
path unchanged. `CLEF_GDN_GRAPHS=0` turns the replays off.

Measured on an H100, side by side in one lease (bench/results/serve-h100-fp8-gdn-graphs.md): flash FP8, one
1.5k-token request 41.4 ms p50 against 54.9 without the replays, and every request the same bits alone (replayed)
as inside the batch and inside mixed batches (vLLM's path), 8/8 and 35/35. That run replayed a third of the layers
(see `keeping_mark`); with all of them, one flash FP8 request of 553 tokens took 30.2 ms p50 on an H100
(bench/results/latency-h100-flash-gdn-groups.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and vLLM load in the engine's processes only, not with the CLI
    import torch

logger = logging.getLogger("clef_vllm.engine")

GDN_GRAPHS_ENV = "CLEF_GDN_GRAPHS"
# Above this the prefill's kernels run long enough to hide their launches (multirc's 6,445 tokens on the 27B: 18 ms of
# GPU idle time in 434 ms), and the graphs' intermediates grow with N (the chunk states are fp32).
MAX_TOKENS = 2048
# Below this a step is vLLM's warm-up of one-token sequences, not a Clef prompt (its fixed part alone is ~60 tokens).
MIN_TOKENS = 64
FRESH_PROMPT_ATTR = "clef_fresh_prompt_tokens"
# The state slot the graphs write to, in a scratch cache of two slots: slot 0 is vLLM's null block
# (`NULL_BLOCK_ID`), whose sequences the convolution kernel skips without writing their output.
SCRATCH_SLOT = 1


def gdn_graphs_on() -> bool:
    """Whether GPU engines replay Gated DeltaNet graphs for one-prompt steps (`CLEF_GDN_GRAPHS`, default on)."""
    return os.environ.get(GDN_GRAPHS_ENV, "1").strip().lower() not in {"0", "false", "off", "no"}


def fresh_prompt_tokens(
    num_reqs: int, max_query_len: int, max_seq_len: int, num_prefills: int, num_decodes: int, num_spec_decodes: int
) -> int | None:
    """The prompt's length when a step prefills one request from its first token and nothing else, else None."""
    single = num_reqs == 1 and num_prefills == 1 and num_decodes == 0 and num_spec_decodes == 0
    return max_query_len if single and max_seq_len == max_query_len else None


_MARKED = False


def mark_fresh_single_prompts() -> None:
    """Make vLLM's GDN metadata carry `FRESH_PROMPT_ATTR` (see `fresh_prompt_tokens`); idempotent."""
    global _MARKED
    if _MARKED:
        return
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    build = GDNAttentionMetadataBuilder.build

    def build_and_mark(self: Any, common_prefix_len: int, common_attn_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        metadata = build(self, common_prefix_len, common_attn_metadata, *args, **kwargs)
        m = common_attn_metadata
        tokens = fresh_prompt_tokens(
            m.num_reqs,
            m.max_query_len,
            m.max_seq_len,
            metadata.num_prefills,
            metadata.num_decodes,
            metadata.num_spec_decodes,
        )
        setattr(metadata, FRESH_PROMPT_ATTR, tokens)
        return metadata

    GDNAttentionMetadataBuilder.build = build_and_mark  # type: ignore[method-assign]
    GDNAttentionMetadataBuilder.update_block_table = keeping_mark(  # type: ignore[method-assign]
        GDNAttentionMetadataBuilder.update_block_table
    )
    _MARKED = True


def keeping_mark(update_block_table: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's `update_block_table`, with the mark carried over. vLLM's GPU model runner builds one GDN metadata per
    step and hands each further group of GDN layers a copy with its own block table (a hybrid model's layers are
    split into KV-cache groups, a third of the GDN layers each on Qwen3.5); the copy is `dataclasses.replace`,
    which keeps the fields only, so without this only the first group's layers replayed their graphs."""

    def update_and_keep_mark(self: Any, metadata: Any, *args: Any, **kwargs: Any) -> Any:
        updated = update_block_table(self, metadata, *args, **kwargs)
        setattr(updated, FRESH_PROMPT_ATTR, getattr(metadata, FRESH_PROMPT_ATTR, None))
        return updated

    return update_and_keep_mark


def single_prompt_metadata(tokens: int, device: torch.device | str) -> Any:
    """vLLM's GDN metadata of one step holding one prompt of `tokens` tokens with no state before it, its states
    in `SCRATCH_SLOT`: what the metadata builder would give that step, built from host integers."""
    import torch
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets
    from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
    from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

    starts_cpu = torch.tensor([0, tokens], dtype=torch.int32)
    starts = starts_cpu.to(device)
    slot = torch.full((1,), SCRATCH_SLOT, dtype=torch.int32, device=device)
    fresh = torch.zeros(1, dtype=torch.bool, device=device)
    nums_dict, batch_ptr, token_chunk_offset_ptr = compute_causal_conv1d_metadata(
        starts_cpu, device=torch.device(device)
    )
    return GDNAttentionMetadata(
        num_prefills=1,
        num_prefill_tokens=tokens,
        num_decodes=0,
        num_decode_tokens=0,
        num_spec_decodes=0,
        num_spec_decode_tokens=0,
        num_actual_tokens=tokens,
        has_initial_state=fresh,
        non_spec_query_start_loc=starts,
        non_spec_state_indices_tensor=slot,
        chunk_indices=prepare_chunk_indices(starts_cpu, FLA_CHUNK_SIZE).to(device),
        chunk_offsets=prepare_chunk_offsets(starts_cpu, FLA_CHUNK_SIZE).to(device),
        prefill_query_start_loc=starts,
        prefill_state_indices=slot,
        prefill_has_initial_state=fresh,
        nums_dict=nums_dict,
        batch_ptr=batch_ptr,
        token_chunk_offset_ptr=token_chunk_offset_ptr,
    )


@dataclass
class _Inputs:
    """Static buffers every graph reads and writes (views of the first N rows), shared by layers and sizes."""

    qkv: torch.Tensor  # laid out like vLLM's view of the fused projection (same row stride)
    b: torch.Tensor
    a: torch.Tensor
    out: torch.Tensor
    filled: int = 0  # rows at and after this are zero


class PromptGraphs:
    """The Gated DeltaNet layers of one model: per captured step size, one graph per layer, replayed in order.

    Installed over each layer's `_forward_core` (the body of vLLM's `qwen_gdn_attention_core` op); steps that do
    not qualify go to the layer's own method. Captures happen lazily, all layers of a size at once, on a side stream.
    """

    def __init__(self, layers: list[Any], sizes: Iterable[int]) -> None:
        self.layers = layers
        self.sizes = frozenset(size for size in sizes if MIN_TOKENS <= size <= MAX_TOKENS)
        self._originals = [layer._forward_core for layer in layers]
        # Per size: the layers' graphs and the metadata tensors they read (kept alive as long as the graphs).
        # Sizes are vLLM's capture sizes within the bounds (73 with the whole-prompt sizes), so every one is kept.
        self._graphs: dict[int, tuple[list[torch.cuda.CUDAGraph], Any]] = {}
        self._inputs: _Inputs | None = None
        self._scratch: tuple[torch.Tensor, ...] | None = None
        self._pool: Any = None

    def install(self) -> None:
        for index, layer in enumerate(self.layers):
            layer._forward_core = _LayerCall(self, index)

    def uninstall(self) -> None:
        for layer, original in zip(self.layers, self._originals, strict=True):
            layer._forward_core = original

    @property
    def captured_sizes(self) -> list[int]:
        """Step sizes with graphs, in the order they were first run."""
        return list(self._graphs)

    def forward(
        self, index: int, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor
    ) -> None:
        tokens, size = self._qualifies(index, mixed_qkv)
        if tokens is None:
            self._originals[index](mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
            return
        captured = self._graphs.get(size)
        if captured is None:
            try:
                captured = self._capture(size, mixed_qkv, b, a, core_attn_out)
            except Exception as error:  # a capture this vLLM or driver refuses: its own path for every step after
                logger.warning("Gated DeltaNet graphs off (capturing %d tokens failed: %s)", size, error)
                self.uninstall()
                self._originals[index](mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
                return
        inputs = self._inputs
        assert inputs is not None
        inputs.qkv[:tokens].copy_(mixed_qkv[:tokens])
        inputs.b[:tokens].copy_(b[:tokens])
        inputs.a[:tokens].copy_(a[:tokens])
        if inputs.filled > tokens:
            inputs.qkv[tokens : inputs.filled].zero_()
            inputs.b[tokens : inputs.filled].zero_()
            inputs.a[tokens : inputs.filled].zero_()
        inputs.filled = tokens
        captured[0][index].replay()
        core_attn_out[:tokens].copy_(inputs.out[:tokens])

    def _qualifies(self, index: int, mixed_qkv: torch.Tensor) -> tuple[int | None, int]:
        import torch
        from vllm.forward_context import get_forward_context

        size = int(mixed_qkv.shape[0])
        if size not in self.sizes or torch.cuda.is_current_stream_capturing():
            return None, size
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict):
            return None, size
        tokens = getattr(metadata.get(self.layers[index].prefix), FRESH_PROMPT_ATTR, None)
        return (tokens if tokens is not None and tokens <= size else None), size

    def _static_inputs(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, out: torch.Tensor) -> _Inputs:
        import torch

        rows = max(self.sizes)
        if self._inputs is None:
            device = mixed_qkv.device
            row_stride = mixed_qkv.stride(0)
            fused = torch.zeros(rows, row_stride, dtype=mixed_qkv.dtype, device=device)
            self._inputs = _Inputs(
                qkv=fused[:, : mixed_qkv.shape[1]],
                b=torch.zeros(rows, *b.shape[1:], dtype=b.dtype, device=device),
                a=torch.zeros(rows, *a.shape[1:], dtype=a.dtype, device=device),
                out=torch.zeros(rows, *out.shape[1:], dtype=out.dtype, device=device),
            )
        return self._inputs

    def _capture(
        self, size: int, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, out: torch.Tensor
    ) -> tuple[list[torch.cuda.CUDAGraph], Any]:
        import torch
        from vllm.forward_context import get_forward_context

        inputs = self._static_inputs(mixed_qkv, b, a, out)
        if self._scratch is None:
            # Slots shaped like the cache's: the graphs' final states land in `SCRATCH_SLOT`, never read.
            self._scratch = tuple(state[: SCRATCH_SLOT + 1].clone() for state in self.layers[0].kv_cache)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        metadata = single_prompt_metadata(size, mixed_qkv.device)
        context = get_forward_context()
        saved_metadata = context.attn_metadata
        args = {
            "mixed_qkv": inputs.qkv[:size],
            "b": inputs.b[:size],
            "a": inputs.a[:size],
            "core_attn_out": inputs.out[:size],
        }
        graphs: list[torch.cuda.CUDAGraph] = []
        current = torch.cuda.current_stream()
        stream = torch.cuda.Stream(device=mixed_qkv.device)
        stream.wait_stream(current)
        try:
            with torch.cuda.stream(stream):
                for index, (layer, original) in enumerate(zip(self.layers, self._originals, strict=True)):
                    context.attn_metadata = {layer.prefix: replace(metadata)}
                    saved_cache, layer.kv_cache = layer.kv_cache, self._scratch
                    try:
                        if index == 0:  # off the capture first: Triton specializations for this size, autotuning
                            original(**args)
                        graph = torch.cuda.CUDAGraph()
                        graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                        try:
                            original(**args)
                        finally:
                            graph.capture_end()
                    finally:
                        layer.kv_cache = saved_cache
                    graphs.append(graph)
        finally:
            context.attn_metadata = saved_metadata
            current.wait_stream(stream)
        self._graphs[size] = (graphs, metadata)
        return graphs, metadata


class _LayerCall:
    """What a layer's `_forward_core` becomes: same keywords as vLLM's method."""

    def __init__(self, graphs: PromptGraphs, index: int) -> None:
        self.graphs = graphs
        self.index = index

    def __call__(self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor) -> None:
        self.graphs.forward(self.index, mixed_qkv, b, a, core_attn_out)


def install_prompt_graphs(model: torch.nn.Module, vllm_config: Any) -> PromptGraphs | None:
    """Put `PromptGraphs` over the model's Gated DeltaNet layers when the engine runs CUDA graphs on a GPU with
    whole prompts per step (chunked prefill off, the invariant mode) and `CLEF_GDN_GRAPHS` is not off; returns it,
    or None where nothing was installed."""
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    compilation = vllm_config.compilation_config
    if (
        not torch.cuda.is_available()
        or not gdn_graphs_on()
        or vllm_config.model_config.enforce_eager
        # With chunked prefill a step of one prompt from its first token can be the first piece of a longer one
        # (pieces of `prompt_chunk`, the batched mode's step budget, a piece ended before an image): its final
        # state must reach the cache for the next piece, and the graphs write theirs to a scratch slot.
        or vllm_config.scheduler_config.enable_chunked_prefill
        or compilation.cudagraph_mode in (None, CUDAGraphMode.NONE)
        or not compilation.cudagraph_capture_sizes
    ):
        return None
    layers = [module for module in model.modules() if isinstance(module, QwenGatedDeltaNetAttention)]
    if not layers:
        return None
    graphs = PromptGraphs(layers, compilation.cudagraph_capture_sizes)
    if not graphs.sizes:
        return None
    mark_fresh_single_prompts()
    graphs.install()
    logger.info("Gated DeltaNet graphs for one-prompt steps of %d-%d tokens", min(graphs.sizes), max(graphs.sizes))
    return graphs
