"""`quantize`: a Clef release folder in, a quantized release folder out, complete or not at all.

The sequence: resolve the source and check everything that can be checked without the model (scheme, recipe, output
folder, head, the backbone shards' headers and index, calibration file: `inputs`); plan the run on the model's
definition, built on the meta device (`run_plan`: the path, and a refusal of a plan that touches the keep-list or
splits a fused group); claim the output; encode the calibration requests (NVFP4 family); load the backbone; run
llm-compressor's `oneshot` with the qkv/z pair added to its fused-scale groups; save the compressed backbone into
`DIR.partial` with a weights index naming only its shards; write `recipe.yaml`; copy what the allowlist of
`contents` names (head at the root, tokenizer, processor, chat template, generation config, licences, the source
card, `joint_schema_model.py`) and nothing else, without `auto_map` keys; write the manifest last; then every file
is set to 0644 and `DIR.partial` renamed to `DIR`.

Data-free schemes (`streaming: true` in their recipe's front matter, or any data-free recipe with
`streaming=True`) take the streaming path instead of loading, calibrating and saving: the backbone quantized
shard by shard (`streaming`), each shard hashed once written. Everything after the backbone (`recipe.yaml`, copy,
manifest, publish) is the same for both paths.

The output is written through `release_folder.staged_folder`: any failure, Ctrl-C or SIGTERM removes
`DIR.partial`, so an interrupted run leaves neither folder, and a `.partial` another live run writes is never
touched. (SIGKILL cannot be caught: its leftover `DIR.partial` is removed by the next run, once its writer is
provably gone; see `release_folder.writer`.) A write that fails (a full disk) is one line naming the file
(`output_errors`).

`on_stage` is told each stage as the run reaches it (`STAGES`), in the process and thread of the run; a caller
can log, measure, or hold the run there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.formatting import utc_timestamp
from clef_quant.progress import NoProgress, Progress
from clef_quant.quantize import task_names as tasks
from clef_quant.quantize.calibration import DEFAULT_MAX_SEQ_LEN, CalibrationSummary, as_dataloader, build_calibration
from clef_quant.quantize.compress import load_model, run_oneshot, save_compressed
from clef_quant.quantize.contents import ReleaseContents, plan_contents
from clef_quant.quantize.inputs import check_inputs
from clef_quant.quantize.measure import device_memory_errors, peak_gpu_bytes, peak_host_bytes, timed
from clef_quant.quantize.output_errors import output_write_errors
from clef_quant.quantize.plan import QuantPlan, recipe_needs_calibration
from clef_quant.quantize.recipes import Recipe
from clef_quant.quantize.release_files import RECIPE_FILE, backbone_bytes, copy_release_files, write_recipe_file
from clef_quant.quantize.run_plan import RunPlan, plan_run
from clef_quant.quantize.streaming import stream_quantize
from clef_quant.release_folder.manifest import Manifest, build_manifest, folder_files, write_manifest
from clef_quant.release_folder.staged import staged_folder
from clef_quant.release_folder.writer import OWNER_FILE
from clef_vllm.format.encoder import load_tokenizer
from clef_vllm.format.release_config import ReleaseConfig

# What `on_stage` is told, in order ("calibrating" only for schemes that calibrate; on the streaming path
# "loaded" means the shards are about to be read and "saved" that every shard is written). The plan is made
# before "checked": a run refused by it tells nothing.
STAGES = ("checked", "claimed", "loaded", "calibrating", "saved", "copied", "hashed", "published")
StageHook = Callable[[str], None]


@dataclass(frozen=True)
class QuantizeConfig:
    """Everything one quantize run needs; the CLI builds it from flags."""

    source: str
    out: Path
    scheme: str | None = None
    recipe_file: Path | None = None
    calibration_file: Path | None = None
    calibration_records: int | None = None
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    device: str = "cpu"
    overwrite: bool = False
    revision: str | None = None
    include: tuple[str, ...] = ()  # fnmatch patterns of source files (or FILE:auto_map) to carry on purpose
    # shard by shard without loading the model: None = for the data-free schemes where it is exact
    streaming: bool | None = None
    # --scheme auto: the scan to choose from and exactly one target (see quantize/auto.py)
    scan_file: Path | None = None
    max_kl: float | None = None
    max_size_gb: float | None = None


@dataclass
class QuantizeResult:
    out: Path
    scheme: str
    plan: QuantPlan
    calibration: CalibrationSummary
    manifest: Manifest
    timings: dict[str, float]  # seconds per stage, and "total"
    peak_host_bytes: int
    peak_gpu_bytes: int | None
    source_bytes: int  # backbone weights of the source
    out_bytes: int  # backbone weights written
    path: str = "oneshot"  # how the backbone was quantized: "oneshot" (model loaded) or "streaming"
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def kept_bf16(self) -> list[str]:
        return self.plan.kept_bf16


@dataclass
class _Job:
    """One run's resolved inputs and running measurements."""

    config: QuantizeConfig
    source_dir: Path
    source_config: ReleaseConfig
    recipe: Recipe
    run_plan: RunPlan
    contents: ReleaseContents
    out: Path
    progress: Progress
    started: float
    on_stage: StageHook
    timings: dict[str, float]


def quantize(
    config: QuantizeConfig, progress: Progress | None = None, on_stage: StageHook | None = None
) -> QuantizeResult:
    """Run one quantization; raises QuantizeError/CheckpointError for input to fix, ReleaseFolderError for an
    output or `.partial` in the way, Interrupted on a signal."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    inputs = check_inputs(config)
    run_plan = plan_run(inputs, config.streaming, timings)  # every refusal of the plan comes before anything loads
    out = Path(config.out).expanduser().absolute()
    job = _Job(
        config=config,
        source_dir=inputs.source_dir,
        source_config=inputs.source_config,
        recipe=inputs.recipe,
        run_plan=run_plan,
        contents=plan_contents(inputs.source_dir, inputs.head_dir, config.include),
        out=out,
        progress=progress or NoProgress(),
        started=started,
        on_stage=on_stage or (lambda _stage: None),
        timings=timings,
    )
    job.on_stage("checked")
    with output_write_errors(out), staged_folder(out, command="quantize", overwrite=config.overwrite) as partial:
        job.on_stage("claimed")
        model_bytes = backbone_bytes(inputs.source_dir)
        with device_memory_errors(config.device, model_bytes, streaming=run_plan.streaming is not None):
            result = _run(job, partial)
    job.on_stage("published")
    result.timings["total"] = time.perf_counter() - job.started
    return result


def _run(job: _Job, partial: Path) -> QuantizeResult:
    """Everything written into `partial`, the manifest last; publishing it is `staged_folder`'s."""
    config, progress, timings = job.config, job.progress, job.timings
    source_dir, recipe, plan, streaming = job.source_dir, job.recipe, job.run_plan.plan, job.run_plan.streaming
    device = config.device
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()

    calibration = CalibrationSummary.unused(config.max_seq_len)
    notes = list(job.run_plan.notes)
    hashed: dict[str, dict[str, Any]] = {}
    if streaming is not None:
        if config.calibration_file is not None or config.calibration_records is not None:
            notes.append("this scheme needs no calibration data; --calibration/--calibration-records unused")
        left = len(streaming.left_out)
        if left:
            notes.append(f"{left} checkpoint tensor(s) the model does not define left out, as loading it would")
        job.on_stage("loaded")
        with timed(timings, "quantize"):
            hashed = stream_quantize(streaming, source_dir, partial, device, progress)
        write_recipe_file(partial, recipe)
    else:
        setup = timings["setup"] + timings.pop("plan")  # as before the plan came first: it counts as setup here
        with timed(timings, "setup"):  # only oneshot needs the tokenizer (streaming copies its files as they are)
            tokenizer = load_tokenizer(source_dir)
        timings["setup"] += setup
        calibration = _oneshot(job, partial, tokenizer, notes)
        # What llm-compressor's own save appended the recipe to: a recipe.yaml of the source it loaded.
        appended_to = source_dir / RECIPE_FILE
        write_recipe_file(partial, recipe, appended_to if appended_to.is_file() else None)
    job.on_stage("saved")

    with timed(timings, "copy"):
        copy_release_files(source_dir, job.contents, partial)
    job.on_stage("copied")

    with timed(timings, "manifest"):
        names = [name for name in folder_files(partial) if name != OWNER_FILE]
        progress.start(tasks.COPYING, len(names))
        timings["total"] = time.perf_counter() - job.started  # the manifest holds the time up to hashing
        manifest = build_manifest(
            partial,
            source=_source_entry(config, source_dir),
            scheme=recipe.scheme,
            recipe=_recipe_entry(recipe),
            calibration=calibration.to_dict(),
            run=_run_entry(config, device, timings, job.run_plan.path),
            included=[entry.to_dict() for entry in job.contents.included],
            exclude=(OWNER_FILE,),
            on_hashed=lambda _name: progress.advance(tasks.COPYING),
            hashed=hashed,
        )
        write_manifest(partial, manifest)
        progress.finish(tasks.COPYING)
    job.on_stage("hashed")

    return QuantizeResult(
        out=job.out,
        scheme=recipe.scheme,
        plan=plan,
        calibration=calibration,
        manifest=manifest,
        timings=timings,
        peak_host_bytes=peak_host_bytes(),
        peak_gpu_bytes=peak_gpu_bytes(device),
        source_bytes=backbone_bytes(source_dir),
        out_bytes=backbone_bytes(partial),
        path=job.run_plan.path,
        notes=notes,
        warnings=job.contents.warnings(),
    )


def _oneshot(job: _Job, partial: Path, tokenizer: Any, notes: list[str]) -> CalibrationSummary:
    """Load the backbone, quantize it with `oneshot` (calibrating when the recipe needs it) and save it."""
    config, progress, timings = job.config, job.progress, job.timings
    modifiers = job.recipe.compressor_recipe
    dataloader = None
    calibration = CalibrationSummary.unused(config.max_seq_len)
    if recipe_needs_calibration(modifiers):
        # Encoded before the model loads: bad or unusable records fail in seconds, not after a 20 GB load.
        with timed(timings, "encode_calibration"):
            calibration_set = build_calibration(
                tokenizer,
                file=config.calibration_file,
                records=config.calibration_records,
                max_seq_len=config.max_seq_len,
                progress=progress,
            )
        calibration = calibration_set.summary
        dataloader = as_dataloader(calibration_set)
    elif config.calibration_file is not None or config.calibration_records is not None:
        notes.append("this scheme needs no calibration data; --calibration/--calibration-records unused")

    with timed(timings, "load"):
        progress.start(tasks.LOADING)
        model = load_model(job.source_dir, job.source_config, config.device)
        progress.finish(tasks.LOADING)
    job.on_stage("loaded")

    with timed(timings, "quantize"):
        run_oneshot(model, modifiers, dataloader, tokenizer, progress, job.on_stage)

    with timed(timings, "save"):
        progress.start(tasks.SAVING)
        save_compressed(model, partial)
        progress.finish(tasks.SAVING)
    del model
    return calibration


# -- manifest entries ------------------------------------------------------------------------------------------


def _source_entry(config: QuantizeConfig, source_dir: Path) -> dict[str, Any]:
    local = Path(config.source).expanduser().exists()
    revision = config.revision
    if not local and revision is None:
        revision = source_dir.name  # a Hub snapshot folder is named after its commit
    return {"id": config.source if not local else str(Path(config.source)), "revision": revision, "local": local}


def _recipe_entry(recipe: Recipe) -> dict[str, Any]:
    return {"file": str(recipe.path), "text": recipe.text, "variables": recipe.variables, "shipped": recipe.shipped}


def _run_entry(config: QuantizeConfig, device: str, timings: dict[str, float], path: str) -> dict[str, Any]:
    return {
        "device": device,
        "path": path,
        "created": utc_timestamp(),
        "seconds": {k: round(v, 3) for k, v in timings.items()},
        "peak_host_bytes": peak_host_bytes(),
        "peak_gpu_bytes": peak_gpu_bytes(device),
    }
