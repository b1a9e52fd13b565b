"""The joint schema head: strict loading, and the batched forward held to the release's loop form."""

from __future__ import annotations

import json
import math
import re
from typing import get_args

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_quant.head_loop import loop_logits
from clef_vllm.errors import CheckpointError
from clef_vllm.format.schema import QuestionType, QuestionTypeName, RecordSchema
from clef_vllm.head.files import (
    HEAD_CONFIG,
    HEAD_SUBDIR,
    HEAD_WEIGHTS,
    HeadConfig,
    find_head_dir,
    head_prefix,
    load_head,
    save_head,
)
from clef_vllm.head.model import JointSchemaHead

CONFIG = HeadConfig(hidden_size=32, width=16, routing_layers=2, layers=2, heads=4, feedforward=24)
VOCAB = 64
TOLERANCE = 1e-5


def make_head(seed: int = 0, config: HeadConfig = CONFIG) -> JointSchemaHead:
    torch.manual_seed(seed)
    return JointSchemaHead(config).eval()


def make_record(
    seed: int,
    options: list[int],
    *,
    types: list[int] | None = None,
    max_span: int = 5,
    state: int = 7,
) -> tuple[torch.Tensor, torch.Tensor, RecordSchema]:
    """A random record: state tokens, then per question a span and its option spans, then a suffix."""
    generator = torch.Generator().manual_seed(seed)

    def draw() -> int:
        return int(torch.randint(1, max_span + 1, (1,), generator=generator))

    pos = state
    question_spans, option_spans = [], []
    for count in options:
        length = draw()
        question_spans.append((pos + 2, pos + 2 + length))
        pos += 3 + length
        spans = []
        for _ in range(count):
            length = draw()
            spans.append((pos + 1, pos + 1 + length))
            pos += 1 + length
        option_spans.append(tuple(spans))
    length = pos + 3
    schema = RecordSchema(
        question_types=tuple(types if types is not None else [i % 3 for i in range(len(options))]),
        question_spans=tuple(question_spans),
        option_spans=tuple(option_spans),
    )
    hidden = 2 * torch.randn(length, CONFIG.hidden_size, generator=generator)
    ids = torch.randint(0, VOCAB, (length,), generator=generator)
    return hidden, ids, schema


# --- config -----------------------------------------------------------------------------------------


def test_config_roundtrip() -> None:
    assert HeadConfig.from_dict(CONFIG.model_dump()) == CONFIG


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"depth": 3}, ["unknown keys: depth"]),
        ({"heads": None}, ["missing keys: heads"]),
        ({"heads": None, "width": None, "extra": 1}, ["missing keys: width, heads", "unknown keys: extra"]),
        ({"width": "16"}, ["width must be an integer"]),
        ({"heads": 5}, ["width 16 is not divisible by heads 5"]),
        ({"layers": True}, ["layers must be an integer"]),
    ],
)
def test_config_errors_name_every_key(change: dict, named: list[str]) -> None:
    data = {**CONFIG.model_dump(), **change}
    data = {key: value for key, value in data.items() if value is not None}
    with pytest.raises(CheckpointError) as info:
        HeadConfig.from_dict(data)
    for text in named:
        assert text in str(info.value)


def test_config_read_names_the_file(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        HeadConfig.read(tmp_path)
    (tmp_path / HEAD_CONFIG).write_text(json.dumps({**CONFIG.model_dump(), "dropout": 0.1}))
    with pytest.raises(CheckpointError, match=r"joint_head_config\.json.*unknown keys: dropout"):
        HeadConfig.read(tmp_path)
    (tmp_path / HEAD_CONFIG).write_text("{")
    with pytest.raises(CheckpointError, match=r"joint_head_config\.json is not valid JSON: Expecting property name"):
        HeadConfig.read(tmp_path / HEAD_CONFIG)


# --- parameter names, save and load -------------------------------------------------------------------


def test_parameter_names_follow_the_release(head: JointSchemaHead) -> None:
    names = set(head.state_dict())
    for name in [
        "memory_projection.weight",
        "option_lexical_projection.weight",
        "hidden_norm.bias",
        "type_embedding.weight",
        "evidence_layers.1.attention.in_proj_weight",
        "evidence_layers.1.attention.out_proj.bias",
        "evidence_layers.0.feedforward.0.weight",
        "evidence_layers.0.feedforward.3.bias",
        "evidence_layers.0.feedforward_norm.weight",
        "layers.1.multihead_attn.in_proj_bias",
        "layers.0.norm3.weight",
        "residual_scorer.0.weight",
        "residual_scorer.3.bias",
        "prior_logit_scale",
        "joint_logit_scale",
        "residual_gate",
    ]:
        assert name in names
    assert "memory_projection.bias" not in names
    assert head.residual_gate.shape == ()
    assert head.prior_logit_scale.item() == pytest.approx(math.log(10.0))


def test_init_is_deterministic() -> None:
    a, b = make_head(3).state_dict(), make_head(3).state_dict()
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert not torch.equal(a["memory_projection.weight"], make_head(4).state_dict()["memory_projection.weight"])


def test_save_load_roundtrip(tmp_path, head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    save_head(head, tmp_path / "a")
    save_head(head, tmp_path / "b")
    assert (tmp_path / "a" / HEAD_WEIGHTS).read_bytes() == (tmp_path / "b" / HEAD_WEIGHTS).read_bytes()
    config_text = (tmp_path / "a" / HEAD_CONFIG).read_text()
    assert config_text == json.dumps(CONFIG.model_dump(), sort_keys=True, indent=2) + "\n"

    loaded = load_head(tmp_path / "a")
    assert loaded.config == CONFIG and not loaded.training
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    hidden, ids, schema = make_record(1, [2, 3])
    assert torch.equal(loaded([hidden], [ids], [schema], embeddings)[0], head([hidden], [ids], [schema], embeddings)[0])

    as_bf16 = load_head(tmp_path / "a", dtype=torch.bfloat16)
    assert {t.dtype for t in as_bf16.state_dict().values()} == {torch.bfloat16}


def _rewrite_weights(folder, drop: tuple[str, ...] = (), add: dict | None = None) -> None:
    tensors = load_file(folder / HEAD_WEIGHTS)
    for key in drop:
        del tensors[key]
    tensors.update(add or {})
    save_file(tensors, folder / HEAD_WEIGHTS)


def test_missing_and_unexpected_keys_are_all_named(tmp_path, head: JointSchemaHead) -> None:
    save_head(head, tmp_path)
    _rewrite_weights(
        tmp_path,
        drop=("residual_gate", "layers.1.norm2.weight"),
        add={"extra_projection.weight": torch.zeros(2, 2)},
    )
    with pytest.raises(CheckpointError) as info:
        load_head(tmp_path)
    message = str(info.value)
    assert "missing keys: layers.1.norm2.weight, residual_gate" in message
    assert "unexpected keys: extra_projection.weight" in message


def test_unexpected_key_alone(tmp_path, head: JointSchemaHead) -> None:
    save_head(head, tmp_path)
    _rewrite_weights(tmp_path, add={"evidence_layers.2.query_norm.weight": torch.ones(CONFIG.width)})
    with pytest.raises(CheckpointError, match=r"unexpected keys: evidence_layers\.2\.query_norm\.weight"):
        load_head(tmp_path)


def test_wrong_shape_is_named(tmp_path, head: JointSchemaHead) -> None:
    save_head(head, tmp_path)
    _rewrite_weights(tmp_path, add={"type_embedding.weight": torch.zeros(4, CONFIG.width)})
    with pytest.raises(CheckpointError, match=r"wrong shapes: type_embedding\.weight \(4, 16\)"):
        load_head(tmp_path)


@pytest.mark.parametrize("missing", [HEAD_WEIGHTS, HEAD_CONFIG])
def test_missing_file_is_named(tmp_path, head: JointSchemaHead, missing: str) -> None:
    save_head(head, tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / missing))):
        load_head(tmp_path)


def test_find_head_dir(tmp_path, head: JointSchemaHead) -> None:
    with pytest.raises(CheckpointError, match="no joint schema head"):
        find_head_dir(tmp_path)
    (tmp_path / HEAD_SUBDIR).mkdir()
    (tmp_path / HEAD_SUBDIR / HEAD_CONFIG).write_text("{}")  # half a head is not a head
    with pytest.raises(CheckpointError, match="no joint schema head"):
        find_head_dir(tmp_path)
    save_head(head, tmp_path / HEAD_SUBDIR)  # an older quantized release
    assert find_head_dir(tmp_path) == tmp_path / HEAD_SUBDIR
    assert head_prefix(tmp_path) == f"{HEAD_SUBDIR}/"
    save_head(head, tmp_path)  # the root, where every engine looks, wins
    assert find_head_dir(tmp_path) == tmp_path
    assert head_prefix(tmp_path) == ""


# --- forward against the loop form -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "options", "max_span"),
    [
        (0, [2], 5),
        (1, [4, 2, 5], 5),
        (2, [3, 1, 2, 7, 2], 1),  # every span one token long, a one-option question
        (3, [2] * 24, 3),  # many questions
        (4, [30], 4),  # many options
    ],
)
def test_forward_matches_loop(
    head: JointSchemaHead, embeddings: torch.Tensor, seed: int, options: list[int], max_span: int
) -> None:
    hidden, ids, schema = make_record(seed, options, max_span=max_span)
    with torch.inference_mode():
        fast = head([hidden], [ids], [schema], embeddings)[0]
        slow = loop_logits(head, hidden, ids, schema, embeddings)
    assert fast.shape == (sum(options),)
    assert float((fast - slow).abs().max()) <= TOLERANCE
    assert float(fast.std()) > 0.1  # random weights still give logits that tell options apart


def test_batch_equals_records_alone(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    records = [
        make_record(10, [3, 2], state=40),
        make_record(11, [2, 5, 4, 2], state=3),
        make_record(12, [1], state=1, max_span=1),
        make_record(13, [2] * 9, state=12),
    ]
    hidden, ids, schemas = (list(part) for part in zip(*records, strict=True))
    assert len({h.shape[0] for h in hidden}) == len(records)
    with torch.inference_mode():
        batched = head(hidden, ids, schemas, embeddings)
        for i, record in enumerate(records):
            alone = head(*([part] for part in record), embeddings)[0]
            slow = loop_logits(head, *record, embeddings)
            assert batched[i].shape == (schemas[i].num_options,)
            assert float((batched[i] - alone).abs().max()) <= TOLERANCE
            assert float((batched[i] - slow).abs().max()) <= TOLERANCE


def test_the_comparison_can_fail(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    """A different question type, or one nudged weight, must move the logits far beyond the tolerance."""
    hidden, ids, schema = make_record(5, [3, 3])
    retyped = RecordSchema((2, 0), schema.question_spans, schema.option_spans)
    nudged = make_head()
    with torch.no_grad():
        nudged.layers[0].multihead_attn.in_proj_bias[-1] += 0.5  # a value bias of the last decoder head
    with torch.inference_mode():
        base = head([hidden], [ids], [schema], embeddings)[0]
        assert float((head([hidden], [ids], [retyped], embeddings)[0] - base).abs().max()) > 1e-3
        assert float((loop_logits(nudged, hidden, ids, schema, embeddings) - base).abs().max()) > 1e-3


def test_bfloat16_runs_close_to_float32(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    records = [make_record(20, [4, 2, 5]), make_record(21, [2, 2])]
    hidden, ids, schemas = (list(part) for part in zip(*records, strict=True))
    half = make_head().to(torch.bfloat16)
    with torch.inference_mode():
        exact = head(hidden, ids, schemas, embeddings)
        rounded = half([h.bfloat16() for h in hidden], ids, schemas, embeddings.bfloat16())
        looped = loop_logits(half, hidden[0], ids[0], schemas[0], embeddings.bfloat16())
    for a, b in zip(exact, rounded, strict=True):
        assert b.dtype == torch.bfloat16 and torch.isfinite(b).all()
        assert float((a - b.float()).abs().max()) < 0.5
    assert float((rounded[0].float() - looped.float()).abs().max()) < 0.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    hidden, ids, schema = make_record(30, [4, 2, 5])
    gpu = make_head().cuda()
    with torch.inference_mode():
        cpu_logits = head([hidden], [ids], [schema], embeddings)[0]
        gpu_logits = gpu([hidden.cuda()], [ids.cuda()], [schema], embeddings.cuda())[0]
    assert float((cpu_logits - gpu_logits.cpu()).abs().max()) <= 1e-3


# --- input checks ---------------------------------------------------------------------------------


def test_question_type_ids_are_the_rows_of_the_release_embedding() -> None:
    # Written out here on purpose: the ids index a released `type_embedding`, so they must never move.
    assert {t.name.lower(): int(t) for t in QuestionType} == {"noul": 0, "choice": 1, "score": 2}
    assert get_args(QuestionTypeName) == tuple(t.name.lower() for t in QuestionType)
    assert make_head().type_embedding.num_embeddings == len(QuestionType)


@pytest.mark.parametrize(
    ("types", "questions", "options", "error"),
    [
        ((), (), (), "at least one question"),
        ((0,), ((0, 1),), (), "equal in number"),
        ((3,), ((0, 1),), (((1, 2),),), "types must be 0, 1 or 2"),
        ((0,), ((0, 1),), ((),), "at least one option"),
        ((0,), ((1, 1),), (((1, 2),),), "non-empty"),
        ((0,), ((0, 1),), (((-1, 2),),), "non-empty"),
    ],
)
def test_schema_rejects_bad_spans(types, questions, options, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RecordSchema(types, questions, options)


def test_span_past_the_record_is_refused(head: JointSchemaHead, embeddings: torch.Tensor) -> None:
    hidden, ids, schema = make_record(7, [2])
    with pytest.raises(ValueError, match="span past its"):
        head([hidden[:-4]], [ids[:-4]], [schema], embeddings)
