"""`quantize` on a broken source, or onto a full disk: one `error:` line naming the file (and the tensor where one is
involved), exit 2, and neither OUT nor OUT.partial left, on the streaming path, the loaded one (`--no-streaming`)
and a calibrating scheme's; `scan`, which loads the same backbone, refuses the same sources.

Each case breaks a copy of the tiny release. The shards' headers and the index are checked before the output is
claimed, so those runs end within the CLI's imports; a shard cut after the checks is caught where it is read.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.run import QuantizeConfig, quantize
from clef_quant.release_folder.writer import partial_of
from clef_vllm.head.files import HEAD_WEIGHTS

SHARD = "model.safetensors"
INDEX = "model.safetensors.index.json"
SECOND = "model-00002-of-00002.safetensors"
LINEAR = "model.language_model.layers.0.mlp.down_proj.weight"

PATHS = {
    "streaming": ("--scheme", "fp8-dynamic"),
    "loaded": ("--scheme", "fp8-dynamic", "--no-streaming"),
    "calibrating": ("--scheme", "nvfp4", "--calibration-records", "2"),
}


def header(path: Path) -> tuple[int, dict]:
    """The header's length and its tensor entries."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        entries = json.loads(handle.read(length))
    entries.pop("__metadata__", None)
    return length, entries


def remap(source: Path, tensor: str, shard: str) -> None:
    index = json.loads((source / INDEX).read_text())
    assert tensor in index["weight_map"]
    index["weight_map"][tensor] = shard
    (source / INDEX).write_text(json.dumps(index))


# Each breaks the copy `source` and returns what the error line must name.


def truncated(source: Path, file: str = SHARD) -> list[str]:
    path = source / file
    length, entries = header(path)
    data = path.read_bytes()
    cut = (len(data) - 8 - length) // 2  # inside the data region, so the header itself still parses
    (name,) = [n for n, e in entries.items() if e["data_offsets"][0] < cut <= e["data_offsets"][1]]
    path.write_bytes(data[: 8 + length + cut])
    return [str(path), name]


def random_bytes(source: Path) -> list[str]:
    path = source / SHARD
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))
    return [str(path)]


def huge_header_length(source: Path) -> list[str]:
    path = source / SHARD
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 10**12) + data[8:])
    return [str(path)]


def index_names_a_shard_without_the_tensor(source: Path) -> list[str]:
    # A real second shard, holding something else: the index's claim is what is wrong.
    save_file({"unrelated.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}, source / SECOND, metadata={"format": "pt"})
    remap(source, LINEAR, SECOND)
    return [str(source / INDEX), LINEAR, SECOND]


def index_names_a_missing_shard(source: Path) -> list[str]:
    remap(source, LINEAR, SECOND)
    return [str(source / INDEX), SECOND]


def truncated_head(source: Path) -> list[str]:
    # Copied byte for byte and never loaded by quantize, so only the check would stop a cut head shipping.
    return truncated(source, HEAD_WEIGHTS)


BREAKS: dict[str, Callable[[Path], list[str]]] = {
    "truncated": truncated,
    "random-bytes": random_bytes,
    "header-length-1e12": huge_header_length,
    "index-wrong-shard": index_names_a_shard_without_the_tensor,
    "index-missing-shard": index_names_a_missing_shard,
    "head-truncated": truncated_head,
}


def clef_quant(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})


def assert_one_error_line(result, out: Path, names: list[str]) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.rstrip().splitlines()[-1] == errors[0], result.stderr
    for name in names:
        assert name in errors[0], (name, errors[0])
    assert not out.exists() and not partial_of(out).exists()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", BREAKS)
def test_a_broken_source_is_one_line_naming_the_file(tiny_dir: Path, tmp_path: Path, case: str, path: str) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_dir, source)
    names = BREAKS[case](source)
    out = tmp_path / "out"
    result = clef_quant("quantize", str(source), *PATHS[path], "--out", str(out))
    assert_one_error_line(result, out, names)


@pytest.mark.parametrize("case", [case for case in BREAKS if case != "head-truncated"])
def test_scan_refuses_a_broken_source_in_one_line_too(tiny_dir: Path, tmp_path: Path, case: str) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_dir, source)
    names = BREAKS[case](source)
    out = tmp_path / "scan"
    result = clef_quant("scan", str(source), "--out", str(out), "--calibration-records", "2", "--heldout", "1")
    assert_one_error_line(result, out, names)


@pytest.mark.parametrize("case", BREAKS)
def test_a_broken_source_is_refused_before_the_output_is_claimed(tiny_dir: Path, tmp_path: Path, case: str) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_dir, source)
    BREAKS[case](source)
    stages: list[str] = []
    with pytest.raises(QuantizeError):
        quantize(QuantizeConfig(source=str(source), out=tmp_path / "out", scheme="fp8-dynamic"), on_stage=stages.append)
    assert stages == []  # not even "checked": nothing was claimed, loaded or planned


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "loaded"])
def test_a_shard_cut_after_the_checks_is_one_error_naming_it(tiny_dir: Path, tmp_path: Path, streaming: bool) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_dir, source)
    out = tmp_path / "out"

    def cut_once_claimed(stage: str) -> None:
        if stage == "claimed":  # the checks passed; nothing has read the shard's data yet
            names.extend(truncated(source))

    names: list[str] = []
    config = QuantizeConfig(source=str(source), out=out, scheme="fp8-dynamic", streaming=streaming)
    with pytest.raises(QuantizeError) as refused:
        quantize(config, on_stage=cut_once_claimed)
    assert names and "\n" not in str(refused.value)
    for name in names:
        assert name in str(refused.value)
    assert not out.exists() and not partial_of(out).exists()


# -- a full disk ------------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """`small_disk(bytes) -> folder` on a tmpfs of that size (needs root; skipped where mounting is refused)."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        where = tmp_path / f"disk-{len(mounted)}"
        where.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
            )
        except FileNotFoundError:
            pytest.skip("no mount command here")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("path", ["streaming", "loaded"])
@pytest.mark.parametrize("full_at", ["backbone", "release-files"])
def test_a_full_disk_is_one_line_and_leaves_nothing(
    quantized_dir, tiny_dir: Path, small_disk, full_at: str, path: str
) -> None:
    backbone = (quantized_dir("fp8-dynamic") / SHARD).stat().st_size
    # Half the quantized shard fails while it is written; the shard and 64 KiB more hold the backbone's small files
    # but not the head's weights (106 KB) or the tokenizer, so the copy after it fails.
    size = backbone // 2 if full_at == "backbone" else backbone + 64 * 1024
    out = small_disk(size) / "out"
    result = clef_quant("quantize", str(tiny_dir), *PATHS[path], "--out", str(out))
    assert_one_error_line(result, out, [str(out)])
