"""Which steps replay the Gated DeltaNet graphs of one prompt, and the metadata they are captured with.

The replays run on a GPU only (bench modes checks their bits there: alone against inside batches); what decides
them is host logic, checked here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

from clef_vllm.engine.gdn_graphs import (
    FRESH_PROMPT_ATTR,
    GDN_GRAPHS_ENV,
    MAX_TOKENS,
    MIN_TOKENS,
    PromptGraphs,
    fresh_prompt_tokens,
    gdn_graphs_on,
    install_prompt_graphs,
    keeping_mark,
    single_prompt_metadata,
)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        # num_reqs, max_query_len, max_seq_len, prefills, decodes, spec decodes
        ((1, 553, 553, 1, 0, 0), 553),  # one request from its first token
        ((1, 553, 1106, 1, 0, 0), None),  # the second piece of a prompt: the state before it matters
        ((2, 553, 553, 2, 0, 0), None),  # two prompts in the step
        ((2, 553, 553, 1, 1, 0), None),  # a prompt beside a decode
        ((1, 1, 1, 0, 1, 0), None),  # a decode
        ((1, 4, 4, 0, 0, 1), None),  # a speculative decode
    ],
)
def test_only_a_step_of_one_whole_prompt_qualifies(step: tuple[int, ...], expected: int | None) -> None:
    assert fresh_prompt_tokens(*step) == expected


def test_the_captured_metadata_is_one_sequence_of_the_step_size_from_a_zero_state() -> None:
    tokens = 130
    metadata = single_prompt_metadata(tokens, "cpu")
    assert metadata.num_prefills == 1 and metadata.num_decodes == 0 and metadata.num_spec_decodes == 0
    assert metadata.num_actual_tokens == metadata.num_prefill_tokens == tokens
    for starts in (metadata.non_spec_query_start_loc, metadata.prefill_query_start_loc):
        assert starts.tolist() == [0, tokens]
    assert not metadata.has_initial_state.any() and not metadata.prefill_has_initial_state.any()
    # Not slot 0: vLLM's null block, whose sequences the convolution skips (its output would be left unwritten).
    assert NULL_BLOCK_ID == 0
    assert metadata.prefill_state_indices.tolist() == [1] == metadata.non_spec_state_indices_tensor.tolist()
    # The chunked delta rule's grid: three 64-token chunks of sequence 0; the convolution's: 17 blocks of 8 tokens.
    assert metadata.chunk_indices.tolist() == [[0, 0], [0, 1], [0, 2]]
    assert metadata.chunk_offsets.tolist() == [0, 3]
    assert metadata.nums_dict[8]["tot"] == 17
    assert metadata.batch_ptr[:17].tolist() == [0] * 17


class _Layer:
    prefix = "model.layers.0.linear_attn"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def _forward_core(self, mixed_qkv, b, a, core_attn_out):
        self.calls.append(int(mixed_qkv.shape[0]))


def test_steps_outside_the_captured_sizes_run_the_layers_own_method() -> None:
    layer = _Layer()
    graphs = PromptGraphs([layer], [1, 8, 32, 64, 512, 2048, 4096])
    assert graphs.sizes == {64, 512, 2048}  # one-token warm-ups and long steps keep vLLM's path
    assert MIN_TOKENS == 64 and MAX_TOKENS == 2048
    graphs.install()
    x = torch.zeros(4096, 8)
    layer._forward_core(mixed_qkv=x, b=x[:, :2], a=x[:, :2], core_attn_out=x)
    assert layer.calls == [4096] and graphs.captured_sizes == []
    graphs.uninstall()
    layer._forward_core(mixed_qkv=x[:8], b=x[:8, :2], a=x[:8, :2], core_attn_out=x[:8])
    assert layer.calls == [4096, 8]


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("off", False), ("false", False)])
def test_the_switch(monkeypatch: pytest.MonkeyPatch, value: str | None, on: bool) -> None:
    if value is None:
        monkeypatch.delenv(GDN_GRAPHS_ENV, raising=False)
    else:
        monkeypatch.setenv(GDN_GRAPHS_ENV, value)
    assert gdn_graphs_on() is on


def _model_with_one_gdn_layer() -> torch.nn.Module:
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    layer = QwenGatedDeltaNetAttention.__new__(QwenGatedDeltaNetAttention)  # only its type and method are read
    torch.nn.Module.__init__(layer)
    layer._forward_core = lambda **kwargs: None
    model = torch.nn.Module()
    model.linear_attn = layer
    return model


def _engine_config(*, chunked_prefill: bool) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=False),
        compilation_config=SimpleNamespace(cudagraph_mode="PIECEWISE", cudagraph_capture_sizes=[512]),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked_prefill),
    )


def test_nothing_is_installed_without_a_gpu_or_with_the_switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _engine_config(chunked_prefill=False)
    assert install_prompt_graphs(_model_with_one_gdn_layer(), config) is None  # this machine has no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(GDN_GRAPHS_ENV, "0")
    assert install_prompt_graphs(_model_with_one_gdn_layer(), config) is None


def test_graphs_are_installed_only_where_prompts_are_never_split(monkeypatch: pytest.MonkeyPatch) -> None:
    # A first piece of a longer prompt looks like a whole one-prompt step; its state must reach the cache, which the
    # graphs do not write, so engines with chunked prefill (pieces, the batched mode) keep vLLM's path.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(GDN_GRAPHS_ENV, raising=False)
    assert install_prompt_graphs(_model_with_one_gdn_layer(), _engine_config(chunked_prefill=True)) is None
    installed = install_prompt_graphs(_model_with_one_gdn_layer(), _engine_config(chunked_prefill=False))
    assert installed is not None and installed.sizes == {512}
    installed.uninstall()


def test_each_group_of_gdn_layers_gets_the_mark_of_the_step() -> None:
    # vLLM's GPU model runner builds a step's GDN metadata once and gives each further KV-cache group of GDN layers
    # a `dataclasses.replace` copy with that group's block table; every group must still see the one prompt.
    from dataclasses import replace

    def vllms_update(builder: object, metadata: object, block_table: torch.Tensor, slot_mapping: torch.Tensor):
        return replace(metadata, non_spec_state_indices_tensor=block_table[:, 0])

    built = single_prompt_metadata(96, "cpu")
    setattr(built, FRESH_PROMPT_ATTR, 96)
    table = torch.tensor([[7]], dtype=torch.int32)

    assert getattr(vllms_update(None, built, table, table), FRESH_PROMPT_ATTR, None) is None  # what vLLM alone does
    copy = keeping_mark(vllms_update)(None, built, table, table)
    assert getattr(copy, FRESH_PROMPT_ATTR) == 96
    assert copy.non_spec_state_indices_tensor.tolist() == [7]
