"""What `quantize` checks before any model loads: the source (its config and its shards' headers), the scheme or
recipe, the output folder, the head, the calibration file and the device, so input to fix fails in seconds rather
than after a 20 GB load. The scheme is checked here only when the command line's parser has not (`SchemeName`);
the recipe is read and parsed here, once, into the `Recipe` the whole run uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clef_quant.devices import device_problem
from clef_quant.quantize.auto import check_auto_options, load_auto_recipe
from clef_quant.quantize.calibration import check_calibration_settings, read_request_bodies
from clef_quant.quantize.contents import head_prefix_of
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.recipes import AUTO_SCHEME, Recipe, check_recipe_choice, recipe_of
from clef_quant.quantize.source_shards import ShardedSource, shard_header, sharded_source
from clef_quant.release import resolve_release
from clef_quant.release_folder.outputs import check_output
from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_config import ReleaseConfig, read_release_config
from clef_vllm.head.files import HEAD_WEIGHTS, find_head_dir

if TYPE_CHECKING:  # run.py imports this module; the config class is only needed for annotations
    from clef_quant.quantize.run import QuantizeConfig


@dataclass(frozen=True)
class CheckedInputs:
    source_dir: Path
    source_config: ReleaseConfig
    recipe: Recipe
    head_dir: Path
    shards: ShardedSource  # every header checked against its file, every indexed name found in its shard


def bf16_source_config(source_dir: Path, verb: str) -> ReleaseConfig:
    """The source release's config.json; a quantized source is refused (`verb` says what needs the bf16 one)."""
    try:
        source_config = read_release_config(source_dir)
    except CheckpointError as exc:
        raise QuantizeError(str(exc)) from None
    if source_config.quantization_config is not None:
        raise QuantizeError(f"{source_dir} is already quantized; {verb} the bf16 release")
    return source_config


def _refuse_replacing(out: Path, source_dir: Path) -> None:
    if out.resolve() == source_dir.resolve() or out.resolve() in source_dir.resolve().parents:
        raise QuantizeError(f"--out {out} would replace the source {source_dir}")


def check_inputs(config: QuantizeConfig) -> CheckedInputs:
    """Everything about the input that can be wrong, checked in one go (cheapest first); what the recipe does to
    the model is `run_plan`'s, next."""
    scheme = check_recipe_choice(config.scheme, config.recipe_file)  # where the library is entered
    check_auto_options(scheme, config.scan_file, config.max_kl, config.max_size_gb)
    out = Path(config.out).expanduser().absolute()
    local_source = Path(config.source).expanduser()
    if local_source.exists():  # before the output's own checks, whose refusal would say less
        _refuse_replacing(out, local_source.absolute())
    check_output(out, "quantize", config.overwrite)
    source_dir = resolve_release(config.source, config.revision).absolute()
    _refuse_replacing(out, source_dir)
    source_config = bf16_source_config(source_dir, "quantize")
    if scheme == AUTO_SCHEME and config.scan_file is not None:  # checked above: auto has its scan
        recipe = load_auto_recipe(
            config.scan_file, source_dir, source_config, max_kl=config.max_kl, max_size_gb=config.max_size_gb
        )
    else:
        recipe = recipe_of(scheme, config.recipe_file, source_config)
    head_dir = find_head_dir(source_dir)
    head_prefix_of(source_dir, head_dir)
    shards = sharded_source(source_dir)  # headers only: a cut or mis-indexed shard fails here, on either path
    shard_header(head_dir / HEAD_WEIGHTS)  # copied byte for byte, never loaded: a cut head would ship as it is
    if config.calibration_file is not None:
        read_request_bodies(Path(config.calibration_file))  # a broken file fails now, not after loading
    check_calibration_settings(config.calibration_records, config.max_seq_len)
    check_device(config.device)  # imports torch only for a CUDA device
    return CheckedInputs(source_dir, source_config, recipe, head_dir, shards)


def check_device(device: str) -> str:
    """`device` if this machine can run it; torch is imported only for a CUDA device."""
    problem = device_problem(device)
    if problem is not None:
        raise QuantizeError(problem)
    return device
