"""The one reader of a release's `config.json` (`clef_vllm.format.release_config`): the tiny releases' real files
read as typed configs, broken ones refused in one line naming the file, and each reader keeping its own answer
for a folder whose config cannot be read (some refuse, some fall back on purpose)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import ReleaseConfig, read_release_config, release_config


def raw(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def with_config(tmp_path: Path, text: str | bytes, name: str = "release") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return folder


# -- the tiny releases' own files -------------------------------------------------------------------------------


def test_a_bf16_release_reads_as_its_file_says(tiny_dir: Path) -> None:
    config, data = read_release_config(tiny_dir), raw(tiny_dir)
    assert config.architectures == data["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config.model_type == data["model_type"] == "qwen3_5"
    text = data["text_config"]
    assert config.text.num_hidden_layers == text["num_hidden_layers"] and config.text.hidden_size == text["hidden_size"]
    assert config.text.layer_types == text["layer_types"]
    assert config.quantization_config is None and not config.stores_fp4_weights and not config.has_routed_experts
    assert config.document() == data
    config.document()["architectures"].append("Changed")  # a copy: the shared config is not changed
    assert read_release_config(tiny_dir).architectures == data["architectures"]


def test_omni_reads_its_text_model_from_the_thinker(family_dir) -> None:
    folder = family_dir("omni-tiny")
    config, data = read_release_config(folder), raw(folder)
    thinker_text = data["thinker_config"]["text_config"]
    assert config.architectures == ["Qwen3OmniMoeForConditionalGeneration"]
    assert config.text.num_hidden_layers == thinker_text["num_hidden_layers"]
    assert config.text.num_experts == thinker_text["num_experts"] > 0 and config.has_routed_experts


@pytest.mark.parametrize(("scheme", "fp4", "weight_only"), [("nvfp4", True, False), ("nvfp4a16", True, True)])
def test_a_quantized_release_reads_as_compressed_tensors_wrote_it(
    quantized_dir: Any, scheme: str, fp4: bool, weight_only: bool
) -> None:
    folder = quantized_dir(scheme)
    quantization, data = read_release_config(folder).quantization_config, raw(folder)["quantization_config"]
    assert quantization is not None and quantization.is_compressed_tensors
    assert quantization.format == data["format"] and quantization.ignore == data["ignore"]
    assert list(quantization.config_groups) == list(data["config_groups"])
    for name, group in quantization.config_groups.items():
        written = data["config_groups"][name]
        assert group.targets == written["targets"]
        assert group.written_args() == (written["weights"], written["input_activations"])
        assert group.stores_fp4_weights is fp4 and group.weight_only is weight_only
    assert read_release_config(folder).stores_fp4_weights is fp4


# -- one shape for every reader ---------------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [None, {}])
def test_an_empty_quantization_config_is_a_bf16_release(empty: Any) -> None:
    config = release_config({"architectures": ["X"], "quantization_config": empty})
    assert config.quantization_config is None


def test_null_lists_and_empty_arguments_read_as_none() -> None:
    group = {"targets": None, "weights": {"num_bits": 8, "type": "float"}, "input_activations": {}}
    quantization = {"quant_method": "compressed-tensors", "config_groups": {"g": group}, "ignore": None}
    config = release_config({"architectures": None, "quantization_config": quantization})
    assert config.architectures == [] and config.quantization_config is not None
    (read,) = config.quantization_config.groups
    assert read.targets == [] and read.weight_only and config.quantization_config.ignore == []


def test_keys_no_tool_reads_are_kept() -> None:
    data = {"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    config = release_config(data)
    assert config.document() == data and config.quantization_config is not None
    assert not config.quantization_config.is_compressed_tensors and config.quantization_config.groups == []


def test_a_text_only_config_is_its_own_text_model() -> None:
    config = release_config({"num_hidden_layers": 3, "hidden_size": 64})
    assert config.text is config and config.text.num_hidden_layers == 3


def test_a_config_that_is_already_typed_is_taken_as_it_is(tiny_dir: Path) -> None:
    config = read_release_config(tiny_dir)
    assert release_config(config) is config and isinstance(config, ReleaseConfig)


# -- broken files: one line naming the file ---------------------------------------------------------------------

BROKEN = {
    "not JSON": ('{"architectures": ', r"config\.json is not valid JSON: Expecting value \(line 1 column 19\)"),
    "not UTF-8": (b'{"model_type": "\xff"}', r"config\.json is not valid UTF-8 at byte 16"),
    "a list": ("[1, 2]", r"config\.json is not a model config: a JSON list, not an object"),
    "too deep": ("[" * 100 + "]" * 100, r"config\.json is not valid JSON: JSON nested more than 64 levels deep"),
    "architectures a string": ('{"architectures": "Qwen"}', r"config\.json: architectures: Input should be"),
    "bits as a string": (
        json.dumps({"quantization_config": {"config_groups": {"group_0": {"weights": {"num_bits": "4"}}}}}),
        r"config\.json: quantization_config\.config_groups\.group_0\.weights\.num_bits: Input should be a valid "
        "integer",
    ),
    "layers as a float": (
        '{"text_config": {"num_hidden_layers": 4.0}}',
        r"config\.json: text_config\.num_hidden_layers: Input should be a valid integer",
    ),
    "ignore a string": ('{"quantization_config": {"ignore": "lm_head"}}', r"quantization_config\.ignore: Input should"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_config_is_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    text, message = BROKEN[case]
    folder = with_config(tmp_path, text)
    with pytest.raises(CheckpointError, match=message) as caught:
        read_release_config(folder)
    assert str(caught.value).startswith(str(folder / "config.json")) and "\n" not in str(caught.value)


def test_a_folder_without_config_is_no_release(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"is not a release folder: it has no config\.json"):
        read_release_config(tmp_path)
    (tmp_path / "config.json").mkdir()
    with pytest.raises(CheckpointError, match=r"it has no config\.json"):
        read_release_config(tmp_path)


def test_an_unreadable_config_names_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = with_config(tmp_path, "{}")

    def denied(path: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(CheckpointError, match=r"^cannot read .*config\.json: Permission denied$"):
        read_release_config(folder)


# -- read once per version of the file --------------------------------------------------------------------------


def test_a_settled_file_is_parsed_once_and_a_rewrite_is_read_again(tmp_path: Path) -> None:
    folder = with_config(tmp_path, '{"architectures": ["Aaaa"]}')
    fresh = read_release_config(folder)
    assert read_release_config(folder) is not fresh  # written within the last second: never kept
    time.sleep(1.1)
    settled = read_release_config(folder)
    assert read_release_config(folder) is settled
    (folder / "config.json").write_text('{"architectures": ["Bbbb"]}')  # the same size
    assert read_release_config(folder).architectures == ["Bbbb"]


# -- the readers: who refuses, who falls back -------------------------------------------------------------------


def test_readers_that_fall_back_on_purpose_still_do(tmp_path: Path) -> None:
    from clef_quant.engines_compat import config_architectures as detected_architectures
    from clef_quant.families import family_of_folder
    from clef_quant.reference import quantization_config
    from clef_vllm.engine.architecture import config_architectures
    from clef_vllm.engine.cpu.experts import check_cpu_experts
    from clef_vllm.engine.invariance import stores_fp4_weights
    from clef_vllm.engine.options import check_quantization
    from clef_vllm.engine.release_kernels import check_cpu_dense

    for case, (text, _) in BROKEN.items():
        folder = with_config(tmp_path, text, name=case.replace(" ", "-"))
        assert detected_architectures(folder) == [] and config_architectures(folder) == [], case
        assert family_of_folder(folder) is None and quantization_config(folder) is None, case
        assert stores_fp4_weights(folder) is False, case
        check_quantization(folder, "fp8")  # vLLM reports the folder itself
        check_cpu_experts(folder)
        check_cpu_dense(folder)


def test_readers_that_refuse_name_the_file(tiny_dir: Path, tmp_path: Path) -> None:
    from clef_quant.quantize.engines_loading import read_layout
    from clef_quant.quantize.errors import QuantizeError
    from clef_quant.quantize.inputs import bf16_source_config
    from clef_quant.quantize.inspect import inspect_checkpoint

    folder = shutil.copytree(tiny_dir, tmp_path / "broken")
    (folder / "config.json").write_text('{"architectures": ')
    expected = f"{folder / 'config.json'} is not valid JSON: Expecting value (line 1 column 19)"
    for read in (inspect_checkpoint, read_layout):
        with pytest.raises(CheckpointError) as caught:
            read(folder)
        assert str(caught.value) == expected
    with pytest.raises(QuantizeError) as refused:
        bf16_source_config(folder, "quantize")
    assert str(refused.value) == expected
