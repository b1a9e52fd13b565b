"""`quantize` without loading the model: the streaming path against the oneshot path on the same source.

The streamed release must be the oneshot release: the same stored tensors bit for bit, the same config.json and
recipe.yaml, on a single-shard source and on one split into several shards (where a fused pair can sit in two
shards). Runs that measure memory or must not see vLLM run as their own process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.inspect import inspect_checkpoint
from clef_quant.quantize.run import QuantizeConfig, quantize
from clef_quant.release_folder.manifest import MANIFEST_FILE
from clef_quant.tiny import make_tiny

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=160)

INDEX = "model.safetensors.index.json"
DATA_FREE = ("fp8-dynamic", "fp8-block", "nvfp4a16")


def resharded(source: Path, dest: Path, shards: int) -> Path:
    """`source` with its backbone split round-robin over `shards` files (so fused partners land apart)."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("model.safetensors", INDEX))
    tensors = load_file(source / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[i::shards]}
        save_file(part, dest / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(t.nbytes for t in tensors.values())
    (dest / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return dest


def stored(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("model*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def assert_same_release(oneshot: Path, streamed: Path) -> None:
    a, b = stored(oneshot), stored(streamed)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        # Compare bytes: FP8 and packed FP4 have no torch.equal of their own, and NaN != NaN.
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    assert json.loads((oneshot / "config.json").read_text()) == json.loads((streamed / "config.json").read_text())
    assert (oneshot / "recipe.yaml").read_text() == (streamed / "recipe.yaml").read_text()


def path_of(folder: Path) -> str:
    return json.loads((folder / MANIFEST_FILE).read_text())["run"]["path"]


def run_cli(*args: str, env_code: str = "") -> subprocess.CompletedProcess:
    """clef-quant in its own process (its peak memory is its own); `env_code` runs first in that process."""
    code = f"{env_code}\nimport sys\nfrom clef_quant.cli import main\nsys.argv = ['clef-quant', *sys.argv[1:]]\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """`built(source, scheme, streaming) -> folder`, each built once per module."""
    root = tmp_path_factory.mktemp("streaming")
    done: dict[tuple[str, str, bool], Path] = {}

    def get(source: Path, scheme: str, streaming: bool) -> Path:
        key = (str(source), scheme, streaming)
        if key not in done:
            out = root / f"{source.name}-{scheme}-{'streamed' if streaming else 'oneshot'}"
            done[key] = quantize(QuantizeConfig(source=str(source), out=out, scheme=scheme, streaming=streaming)).out
        return done[key]

    return get


@pytest.fixture(scope="module")
def tiny_sharded(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resharded(tiny_dir, tmp_path_factory.mktemp("sharded") / "tiny-3", shards=3)


@pytest.fixture(scope="module")
def small_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small")
    return resharded(make_tiny(root / "small", size="small", seed=0), root / "small-4", shards=4)


# -- exactness ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", DATA_FREE)
def test_data_free_schemes_stream_by_default_and_equal_oneshot(tiny_dir: Path, quantized_dir, built, scheme) -> None:
    streamed = quantized_dir(scheme)  # the default path, as a user runs it
    assert path_of(streamed) == "streaming"
    oneshot = built(tiny_dir, scheme, False)
    assert path_of(oneshot) == "oneshot"
    assert_same_release(oneshot, streamed)
    report = inspect_checkpoint(streamed)
    assert report.ok, [str(v) for v in report.violations]


@pytest.mark.parametrize("scheme", DATA_FREE)
def test_sharded_source_streams_to_the_oneshot_release(tiny_sharded: Path, built, scheme: str) -> None:
    streamed, oneshot = built(tiny_sharded, scheme, True), built(tiny_sharded, scheme, False)
    assert_same_release(oneshot, streamed)
    index = json.loads((streamed / INDEX).read_text())["weight_map"]
    assert set(index) == set(stored(streamed))
    assert all((streamed / shard).is_file() for shard in index.values())
    assert inspect_checkpoint(streamed).ok


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8-block"])
def test_small_streams_bit_identical_to_oneshot(small_sharded: Path, built, scheme: str) -> None:
    assert_same_release(built(small_sharded, scheme, False), built(small_sharded, scheme, True))


def test_nvfp4a16_qkv_and_z_share_a_scale_across_shards(tiny_sharded: Path, built) -> None:
    folder = built(tiny_sharded, "nvfp4a16", True)
    index = json.loads((folder / INDEX).read_text())["weight_map"]
    source_index = json.loads((tiny_sharded / INDEX).read_text())["weight_map"]
    pairs = 0
    for layer in range(3):  # layers 0-2 are DeltaNet
        prefix = f"model.language_model.layers.{layer}.linear_attn"
        scales = []
        for member in ("in_proj_qkv", "in_proj_z"):
            name = f"{prefix}.{member}.weight_global_scale"
            with safe_open(str(folder / index[name]), framework="pt") as handle:
                scales.append(handle.get_tensor(name))
        assert torch.equal(scales[0], scales[1]), prefix
        pairs += source_index[f"{prefix}.in_proj_qkv.weight"] != source_index[f"{prefix}.in_proj_z.weight"]
    assert pairs > 0  # at least one pair really was split over two source shards


# -- choosing the path ----------------------------------------------------------------------------------------


def test_streaming_a_calibrating_scheme_is_refused_with_the_reason(tiny_dir: Path, tmp_path: Path) -> None:
    config = QuantizeConfig(source=str(tiny_dir), out=tmp_path / "out", scheme="nvfp4", streaming=True)
    with pytest.raises(QuantizeError, match=r"--streaming: .* the recipe calibrates on data"):
        quantize(config)
    assert list(tmp_path.iterdir()) == []


def test_cli_streaming_flag_and_no_vllm(tiny_dir: Path, tmp_path: Path) -> None:
    # Where vLLM is not installed (a GPU box with torch and llm-compressor only) the streaming path still runs.
    block_vllm = (
        "import sys, importlib.abc\n"
        "class B(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'vllm' or name.startswith('vllm.'): raise ImportError(name)\n"
        "sys.meta_path.insert(0, B())"
    )
    out = tmp_path / "out"
    args = ("quantize", str(tiny_dir), "--scheme", "fp8-dynamic", "--streaming", "--out", str(out))
    done = run_cli(
        *args,
        env_code=block_vllm + "\nimport atexit\n"
        "atexit.register(lambda: print('VLLM', any(m.startswith('vllm') for m in sys.modules)))",
    )
    assert done.returncode == 0, done.stderr
    assert "VLLM False" in done.stdout
    assert "streaming, shard by shard" in done.stdout
    refused = run_cli("quantize", str(tiny_dir), "--scheme", "w4a16", "--streaming", "--out", str(tmp_path / "w"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("error: --streaming:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# -- memory ---------------------------------------------------------------------------------------------------


def test_streaming_peak_memory_stays_far_below_loading_the_model(small_sharded: Path, tmp_path: Path) -> None:
    peaks = {}
    for flag in ("--streaming", "--no-streaming"):
        out = tmp_path / flag.strip("-")
        done = run_cli("quantize", str(small_sharded), "--scheme", "fp8-dynamic", flag, "--out", str(out))
        assert done.returncode == 0, done.stderr
        peaks[flag] = json.loads((out / MANIFEST_FILE).read_text())["run"]["peak_host_bytes"]
    bf16 = sum(p.stat().st_size for p in small_sharded.glob("model-*.safetensors"))
    # Both processes import the same libraries; loading the model adds at least its bf16 size on top, streaming
    # only the shards in flight (one read ahead, one being quantized, the quantized copy of the one before).
    assert peaks["--streaming"] + 0.5 * bf16 < peaks["--no-streaming"], (peaks, bf16)


def test_streamed_shards_are_hashed_as_written_and_are_safetensors_own_bytes(small_sharded: Path, built) -> None:
    import hashlib

    from safetensors.torch import save

    folder = built(small_sharded, "fp8-dynamic", True)
    files = json.loads((folder / MANIFEST_FILE).read_text())["files"]
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) == 4
    for shard in shards:
        data = shard.read_bytes()
        assert files[shard.name] == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        # The file is what safetensors itself serializes for these tensors, header and order included.
        with safe_open(shard, framework="pt") as handle:
            metadata = handle.metadata()
        assert save(load_file(shard), metadata=metadata) == data


def test_versions_of_an_uninstalled_source_tree_name_its_commit() -> None:
    import clef_quant

    tree = Path(clef_quant.__file__).resolve().parents[1]
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # -S: no site-packages, so neither package has distribution metadata, as when run from PYTHONPATH only.
    code = (
        "import json; from clef_quant.release_folder.versions import tool_versions; print(json.dumps(tool_versions()))"
    )
    env = {"PYTHONPATH": f"{tree}:{tree / 'vllm_plugin'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, check=True)
    versions = json.loads(done.stdout)
    for name in ("clef-quant", "clef-vllm"):
        assert versions[name] in (f"source tree {commit}", f"source tree {commit}+dirty"), versions
    assert versions["torch"] is None  # not importable without site-packages: still None, not made up

    # Installed, but imported from this checkout (editable or PYTHONPATH): the version and the checkout's commit.
    from importlib import metadata

    from clef_quant.release_folder.versions import tool_versions

    here = tool_versions(("clef-quant", "torch"), source_trees=True)
    assert here["clef-quant"].startswith(f"{metadata.version('clef-quant')} (source tree {commit}"), here
    assert here["torch"] == metadata.version("torch")  # an installed copy is not a source tree
