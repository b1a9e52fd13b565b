"""`make-tiny`: a random-weight release that loads like a real one, byte-identical for a seed."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from clef_quant.tiny import SIZES, TinyBuildError, make_tiny
from clef_quant.tiny import build as build_module
from clef_quant.tiny.tokenizer import SPECIAL_TOKENS, THINK_TOKENS

RELEASE_FILES = {
    "README.md",
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "joint_head.safetensors",
    "joint_head_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
IMAGE_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\nWhat is shown?<|im_end|>\n"
# Qwen's processor scales images up to at least 65536 pixels in 32-pixel steps; a 2x2 merge makes one token.
PLACEHOLDERS = [((32, 32), (16, 16)), ((64, 48), (14, 20)), ((200, 300), (20, 14))]  # (w, h) -> grid (h, w)


def digests(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_folder_holds_the_release_files(tiny_dir: Path) -> None:
    assert {f.name for f in tiny_dir.iterdir()} == RELEASE_FILES
    assert not tiny_dir.with_name(tiny_dir.name + ".partial").exists()


def test_same_seed_gives_identical_bytes(tiny_dir: Path, tmp_path: Path) -> None:
    again = make_tiny(tmp_path / "again", seed=0)
    assert digests(again) == digests(tiny_dir)


def test_other_seed_changes_only_the_weights(tiny_dir: Path, tmp_path: Path) -> None:
    first, other = digests(tiny_dir), digests(make_tiny(tmp_path / "other", seed=1))
    changed = {name for name in first if first[name] != other[name]}
    assert changed == {"model.safetensors", "joint_head.safetensors", "README.md"}  # the card names the seed


def test_backbone_loads_strictly_and_gives_finite_states(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    model, info = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_dir, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    assert model.dtype == torch.bfloat16
    assert any(name.startswith("model.visual.") for name, _ in model.named_parameters())
    assert model.config.text_config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    batch = tokenizer(['{"ticket":"Grüße aus Köln!","priority":2}'], return_tensors="pt")
    with torch.no_grad():
        hidden = model.model(**batch).last_hidden_state
    assert hidden.shape == (1, batch["input_ids"].shape[1], 128)
    assert torch.isfinite(hidden).all()
    assert 0.5 < hidden.float().std().item() < 2.0  # final RMSNorm at its identity init


def test_weight_index_names_only_backbone_files(tiny_dir: Path) -> None:
    # vLLM loads every *.safetensors of a folder that has no index, the head's file included.
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model.safetensors"}
    assert all(name.startswith(("model.language_model.", "model.visual.", "lm_head.")) for name in index["weight_map"])


def test_tokenizer_matches_config(tiny_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    config = AutoConfig.from_pretrained(tiny_dir)
    assert type(tokenizer).__name__ == "Qwen3_5Tokenizer"
    assert len(tokenizer) <= config.text_config.vocab_size
    ids = tokenizer.convert_tokens_to_ids
    assert config.image_token_id == ids("<|image_pad|>")
    assert config.video_token_id == ids("<|video_pad|>")
    assert config.vision_start_token_id == ids("<|vision_start|>")
    assert config.vision_end_token_id == ids("<|vision_end|>")
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    for token in (*SPECIAL_TOKENS, *THINK_TOKENS):  # each control token is one id, never split
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [ids(token)]
    # The think tags are plain added tokens, as in Qwen: decoding without special tokens keeps them.
    think = tokenizer("<think>\n\n</think>\n\n<|im_end|>", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(think, skip_special_tokens=True) == "<think>\n\n</think>\n\n"


@pytest.mark.parametrize(
    "text",
    [
        "plain ASCII, digits 0123456789 and punctuation !?;:()[]{}",
        "Grüße aus Köln, naïve café, Ελληνικά, русский, 日本語, 中文, 한국어, العربية",
        "emoji 🙂🚀👍🏽 and symbols € ≤ ≠ — …",
        "control \x00\x07\t\r\n and rare \U0010fffd planes",
        '{"description":"The proposition is true or the answer is yes.","option_id":"true"}',
    ],
)
def test_tokenizer_roundtrips_any_text(tiny_dir: Path, text: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(("image_size", "grid"), PLACEHOLDERS)
def test_processor_expands_image_placeholder(tiny_dir: Path, image_size: tuple[int, int], grid) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_dir)
    assert type(processor).__name__ == "Qwen3VLProcessor"
    batch = processor(text=[IMAGE_PROMPT], images=[Image.new("RGB", image_size, (200, 40, 40))], return_tensors="pt")
    assert batch["image_grid_thw"].tolist() == [[1, *grid]]
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((batch["input_ids"][0] == image_id).sum()) == grid[0] * grid[1] // 4


def test_image_forward_is_finite(tiny_dir: Path) -> None:
    from transformers import AutoProcessor, Qwen3_5ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(tiny_dir)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_dir)
    batch = processor(text=[IMAGE_PROMPT], images=[Image.new("RGB", (32, 32), (10, 200, 10))], return_tensors="pt")
    with torch.no_grad():
        hidden = model.model(**batch).last_hidden_state
    assert hidden.shape[1] == batch["input_ids"].shape[1]
    assert torch.isfinite(hidden).all()


def test_head_loads_with_the_size_shapes(tiny_dir: Path) -> None:
    from clef_vllm.head.files import load_head

    head = load_head(tiny_dir)
    shape = SIZES["tiny"].head
    assert head.config.hidden_size == SIZES["tiny"].text.hidden_size
    assert (head.config.width, head.config.routing_layers, head.config.layers) == (
        shape.width,
        shape.routing_layers,
        shape.layers,
    )
    assert head.dtype == torch.bfloat16
    assert all(torch.isfinite(p).all() for p in head.parameters())


def test_existing_folder_is_refused(tiny_dir: Path) -> None:
    before = digests(tiny_dir)
    with pytest.raises(TinyBuildError, match="already exists; pass --overwrite"):
        make_tiny(tiny_dir)
    assert digests(tiny_dir) == before


def test_overwrite_refuses_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(TinyBuildError, match="not a folder make-tiny wrote"):
        make_tiny(tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("card", ["none", "release", "broken"])
def test_overwrite_refuses_any_model_folder_make_tiny_did_not_write(tiny_dir: Path, tmp_path: Path, card: str) -> None:
    """A real checkpoint or a quantized release has a config.json too; random weights must never replace it."""
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    if card == "none":
        (model / "README.md").unlink()
    elif card == "release":
        (model / "README.md").write_text("---\nlicense: apache-2.0\ntags: [clef]\n---\n# A quantized release\n")
        (model / "clef_quant.json").write_text("{}")
    else:
        (model / "README.md").write_text("---\n: [\n---\n")
    before = digests(model)
    with pytest.raises(
        TinyBuildError, match=r"is not a folder make-tiny wrote \(its README\.md has no make-tiny mark\)"
    ):
        make_tiny(model, overwrite=True)
    assert digests(model) == before


def test_overwrite_replaces_a_checkpoint(tmp_path: Path) -> None:
    target = make_tiny(tmp_path / "tiny", seed=1)
    make_tiny(target, seed=2, overwrite=True)
    assert {f.name for f in target.iterdir()} == RELEASE_FILES


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": "huge"}, "unknown size 'huge'"),
        ({"device": "tpu"}, "device must be cpu or cuda"),
        ({"seed": -1}, "seed must be between"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(TinyBuildError, match=message):
        make_tiny(tmp_path / "tiny", **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch, error: BaseException) -> None:
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(build_module, "write_head", fail)
    with pytest.raises(type(error)):
        make_tiny(tmp_path / "tiny")
    assert list(tmp_path.iterdir()) == []


def test_flash_size_has_clef_flash_shapes() -> None:
    from clef_quant.tiny import parameter_count

    # clef-flash: 9.41 B backbone parameters (0.456 B of them the vision tower) + a 121.8 M head.
    assert 9.52e9 < parameter_count("flash") < 9.54e9
    assert 20e6 < parameter_count("small") < 100e6


def test_cli_builds_and_refuses_an_existing_folder(tmp_path: Path, monkeypatch) -> None:
    from clef_quant.cli import app

    monkeypatch.delenv("CLEF_QUANT_DEBUG", raising=False)
    runner = CliRunner()
    result = runner.invoke(app, ["make-tiny", str(tmp_path / "tiny"), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "tiny, 2.18 M parameters" in result.stdout
    again = runner.invoke(app, ["make-tiny", str(tmp_path / "tiny")])
    assert again.exit_code == 2
    assert "already exists" in again.stderr and "Traceback" not in again.output
