"""`quantize`: a Clef release folder in, a quantized release folder out, complete or not at all.

The sequence: resolve the source and check everything that can be checked without the model (scheme, recipe,
output folder, head, calibration file); encode the calibration requests (NVFP4 family); load the backbone;
resolve the recipe against its Linear modules and refuse a plan that touches the keep-list or splits a fused
group; run llm-compressor's `oneshot` with the qkv/z pair added to its fused-scale groups; save the compressed backbone
into `DIR.partial`; copy what the allowlist of `contents` names (head into `clef_head/`, tokenizer, processor,
chat template, generation config, licences, the source card, `joint_schema_model.py`) and nothing else, without
`auto_map` keys; set every file to 0644; write the manifest last; rename `DIR.partial` to `DIR`.

Any failure, Ctrl-C or SIGTERM removes `DIR.partial`, so an interrupted run leaves neither folder. (SIGKILL
cannot be caught: its leftover `DIR.partial` is removed by the next run, once its writer is provably gone; see
`writer`.)

`on_stage` is told each stage as the run reaches it (`STAGES`), in the process and thread of the run; a caller
can log, measure, or hold the run there.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clef_quant.quantize import progress as tasks
from clef_quant.quantize import writer
from clef_quant.quantize.auto import AUTO_SCHEME, load_auto_recipe
from clef_quant.quantize.calibration import (
    DEFAULT_MAX_SEQ_LEN,
    CalibrationSummary,
    as_dataloader,
    build_calibration,
    read_request_bodies,
)
from clef_quant.quantize.contents import (
    BACKBONE_OUTPUTS,
    ReleaseContents,
    normalize_modes,
    plan_contents,
    strip_remote_code_keys,
)
from clef_quant.quantize.cpu_compat import no_pinned_memory_without_accelerator, one_rank_is_not_distributed
from clef_quant.quantize.errors import Interrupted, QuantizeError
from clef_quant.quantize.fused_scales import fused_global_scales
from clef_quant.quantize.manifest import build_manifest, folder_files, write_manifest
from clef_quant.quantize.plan import QuantPlan, parse_recipe, plan_quantization, recipe_needs_calibration
from clef_quant.quantize.progress import NoProgress, Progress
from clef_quant.quantize.recipes import Recipe, load_recipe
from clef_quant.quantize.writer import OWNER_FILE, PARTIAL_SUFFIX
from clef_quant.release import resolve_release
from clef_vllm.head_files import HEAD_SUBDIR, HEAD_WEIGHTS, find_head_dir

# What `on_stage` is told, in order ("calibrating" only for schemes that calibrate).
STAGES = ("checked", "claimed", "loaded", "calibrating", "saved", "copied", "hashed", "published")
StageHook = Callable[[str], None]
GENERATION_CONFIG = "generation_config.json"  # save_pretrained writes one; the source's replaces it when there


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
    manifest: dict[str, Any]
    timings: dict[str, float]  # seconds per stage, and "total"
    peak_host_bytes: int
    peak_gpu_bytes: int | None
    source_bytes: int  # backbone weights of the source
    out_bytes: int  # backbone weights written
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
    source_config: dict[str, Any]
    recipe: Recipe
    head_dir: Path
    contents: ReleaseContents
    out: Path
    partial: Path
    progress: Progress
    started: float
    on_stage: StageHook
    timings: dict[str, float] = field(default_factory=dict)


def quantize(
    config: QuantizeConfig, progress: Progress | None = None, on_stage: StageHook | None = None
) -> QuantizeResult:
    """Run one quantization; raises QuantizeError/CheckpointError for input to fix, Interrupted on a signal."""
    started = time.perf_counter()
    source_dir, source_config, recipe, head_dir = _check_inputs(config)
    out = Path(config.out).expanduser().absolute()
    job = _Job(
        config=config,
        source_dir=source_dir,
        source_config=source_config,
        recipe=recipe,
        head_dir=head_dir,
        contents=plan_contents(source_dir, head_dir, config.include),
        out=out,
        partial=out.with_name(out.name + PARTIAL_SUFFIX),
        progress=progress or NoProgress(),
        started=started,
        on_stage=on_stage or (lambda _stage: None),
    )
    with _signals_raise():
        job.on_stage("checked")
        # Claimed outside the cleanup: a DIR.partial that another live run owns must never be removed here.
        writer.claim(out, config.overwrite)
        with _cleanup_on_failure(job.partial):
            job.on_stage("claimed")
            return _run(job)


def _run(job: _Job) -> QuantizeResult:
    config, progress, timings, partial = job.config, job.progress, job.timings, job.partial
    source_dir, recipe = job.source_dir, job.recipe
    with _timed(timings, "setup"):  # mostly importing torch, transformers and llm-compressor
        device = _check_device(config.device)
        if device.startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats()
        recipe_obj = parse_recipe(recipe.text)  # a bad modifier fails here, before the model loads
        needs_calibration = recipe_needs_calibration(recipe_obj)
        tokenizer = _load_tokenizer(source_dir)

    calibration = CalibrationSummary.unused(config.max_seq_len)
    dataloader = None
    notes: list[str] = []
    if needs_calibration:
        # Encoded before the model loads: bad or unusable records fail in seconds, not after a 20 GB load.
        with _timed(timings, "encode_calibration"):
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

    with _timed(timings, "load"):
        progress.start(tasks.LOADING)
        model = _load_model(source_dir, job.source_config, device)
        progress.finish(tasks.LOADING)
    job.on_stage("loaded")

    plan = plan_quantization(model, recipe_obj)

    with _timed(timings, "quantize"):
        _oneshot(model, recipe_obj, dataloader, tokenizer, progress, job.on_stage)

    with _timed(timings, "save"):
        progress.start(tasks.SAVING)
        model.save_pretrained(str(partial), save_compressed=True)
        if recipe.scheme == AUTO_SCHEME:  # keep the per-layer comments saying why each unit got its scheme
            (partial / "recipe.yaml").write_text(recipe.text, encoding="utf-8")
        progress.finish(tasks.SAVING)
    del model
    job.on_stage("saved")

    with _timed(timings, "copy"):
        _copy_release_files(source_dir, job.contents, partial)
    job.on_stage("copied")

    with _timed(timings, "manifest"):
        names = [name for name in folder_files(partial) if name != OWNER_FILE]
        progress.start(tasks.COPYING, len(names))
        timings["total"] = time.perf_counter() - job.started  # the manifest holds the time up to hashing
        manifest = build_manifest(
            partial,
            source=_source_entry(config, source_dir),
            scheme=recipe.scheme,
            recipe=_recipe_entry(recipe),
            calibration=calibration.to_dict(),
            run=_run_entry(config, device, timings),
            included=[entry.to_dict() for entry in job.contents.included],
            exclude=(OWNER_FILE,),
            on_hashed=lambda _name: progress.advance(tasks.COPYING),
        )
        write_manifest(partial, manifest)
        progress.finish(tasks.COPYING)
    job.on_stage("hashed")

    writer.publish(partial, job.out, config.overwrite)
    job.on_stage("published")

    timings["total"] = time.perf_counter() - job.started
    return QuantizeResult(
        out=job.out,
        scheme=recipe.scheme,
        plan=plan,
        calibration=calibration,
        manifest=manifest,
        timings=timings,
        peak_host_bytes=peak_host_bytes(),
        peak_gpu_bytes=_peak_gpu_bytes(device),
        source_bytes=backbone_bytes(source_dir),
        out_bytes=backbone_bytes(job.out),
        notes=notes,
        warnings=job.contents.warnings(),
    )


# -- inputs ---------------------------------------------------------------------------------------------------


def _check_inputs(config: QuantizeConfig) -> tuple[Path, dict[str, Any], Recipe, Path]:
    """Everything that can be wrong before the model loads, checked in one go (cheapest first)."""
    out = Path(config.out).expanduser().absolute()
    if out.exists() and not config.overwrite:
        raise QuantizeError(f"{out} already exists; pass --overwrite to replace it")
    if out.exists() and not out.is_dir():
        raise QuantizeError(f"{out} exists and is not a folder")
    source_dir = resolve_release(config.source, config.revision).absolute()
    if out.resolve() == source_dir.resolve() or out.resolve() in source_dir.resolve().parents:
        raise QuantizeError(f"--out {out} would replace the source {source_dir}")
    try:
        source_config = json.loads((source_dir / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise QuantizeError(f"{source_dir / 'config.json'} is not valid JSON: {exc.msg}") from None
    if source_config.get("quantization_config"):
        raise QuantizeError(f"{source_dir} is already quantized; quantize the bf16 release")
    if config.scheme == AUTO_SCHEME:
        if config.scan_file is None:
            raise QuantizeError("--scheme auto needs --scan SCAN.json (from clef-quant scan)")
        recipe = load_auto_recipe(
            config.scan_file, source_dir, source_config, max_kl=config.max_kl, max_size_gb=config.max_size_gb
        )
    else:
        recipe = load_recipe(config.scheme, config.recipe_file, source_config)
    head_dir = find_head_dir(source_dir)
    if config.calibration_file is not None:
        read_request_bodies(Path(config.calibration_file))  # a broken file fails now, not after loading
    if config.calibration_records is not None and config.calibration_records < 1:
        raise QuantizeError("--calibration-records must be at least 1")
    if config.max_seq_len < 1:
        raise QuantizeError("--max-seq-len must be at least 1")
    return source_dir, source_config, recipe, head_dir


def _check_device(device: str) -> str:
    if device == "cpu":
        return device
    if device == "cuda" or device.startswith("cuda:"):
        import torch

        if not torch.cuda.is_available():
            raise QuantizeError("--device cuda but no CUDA GPU is available")
        return device
    raise QuantizeError(f"--device must be cpu or cuda, not {device}")


# -- the model ------------------------------------------------------------------------------------------------


def _load_tokenizer(source_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source_dir)


def _load_model(source_dir: Path, source_config: dict[str, Any], device: str) -> Any:
    import torch
    import transformers

    architectures = source_config.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        raise QuantizeError(f"config.json names no transformers architecture ({architectures or 'none'})")
    # The release is bf16 and serving runs bf16; the GPU path loads straight onto the device, as plain
    # llm-compressor does, so FP8_DYNAMIC computes its scales there.
    model = model_class.from_pretrained(
        source_dir, dtype=torch.bfloat16, device_map=device if device != "cpu" else None
    )
    model.eval()
    return model


def _decoder_layers(model: Any) -> Any:
    for path in ("model.language_model.layers", "model.layers"):
        try:
            return model.get_submodule(path)
        except AttributeError:
            continue
    return None


def _first_linear(layer: Any) -> Any:
    import torch

    return next((m for m in layer.modules() if isinstance(m, torch.nn.Linear)), None)


def _oneshot(
    model: Any, recipe_obj: Any, dataloader: Any, tokenizer: Any, progress: Progress, on_stage: StageHook
) -> None:
    from llmcompressor import oneshot

    layers = _decoder_layers(model)
    total = len(layers) if layers is not None else None
    progress.start(tasks.CALIBRATING, total)
    handles = []
    if layers is not None and dataloader is not None:
        reached = [0]

        # Sequential calibration runs the decoder layers one after another over all records; the first call
        # into layer i means the layers before it are done. The hook sits on a Linear inside each layer
        # because llm-compressor traces through the layers themselves, while Linear modules stay leaf calls.
        def on_layer(index: int) -> Any:
            def hook(_module: Any, _args: Any) -> None:
                if index == 0 and reached[0] == 0:
                    on_stage("calibrating")
                if index > reached[0]:
                    progress.advance(tasks.CALIBRATING, index - reached[0])
                    reached[0] = index

            return hook

        handles = [
            _first_linear(layer).register_forward_pre_hook(on_layer(i))
            for i, layer in enumerate(layers)
            if _first_linear(layer) is not None
        ]
    kwargs: dict[str, Any] = {}
    if layers is not None and len(layers) > 0:
        kwargs["sequential_targets"] = [type(layers[0]).__name__]
    if dataloader is not None:
        # A DataLoader of token ids skips llm-compressor's tokenization; it still wants the processor.
        kwargs.update(dataset=dataloader, processor=tokenizer)
    try:
        with fused_global_scales(), no_pinned_memory_without_accelerator(), one_rank_is_not_distributed():
            oneshot(model=model, recipe=recipe_obj, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    progress.finish(tasks.CALIBRATING)


# -- files ----------------------------------------------------------------------------------------------------


def _copy_release_files(source_dir: Path, contents: ReleaseContents, partial: Path) -> None:
    """Keep only the backbone save_pretrained wrote (llm-compressor also copies the source's *.py files), copy the
    allowlisted files byte for byte, drop remote-code keys, and give every file the same mode."""
    for path in list(partial.iterdir()):
        if path.name in (OWNER_FILE, GENERATION_CONFIG) or BACKBONE_OUTPUTS.match(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (partial / HEAD_SUBDIR).mkdir(exist_ok=True)
    for source_name, release_name in contents.copies.items():
        target = partial / release_name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_dir / source_name, target)
    for path in sorted(partial.rglob("*.json")):
        name = path.relative_to(partial).as_posix()
        keep = [entry.split(":", 1)[1] for entry in contents.keep_keys if entry.split(":", 1)[0] == name]
        strip_remote_code_keys(path, keep)
    normalize_modes(partial)


def backbone_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors") if p.name != HEAD_WEIGHTS)


def _source_entry(config: QuantizeConfig, source_dir: Path) -> dict[str, Any]:
    local = Path(config.source).expanduser().exists()
    revision = config.revision
    if not local and revision is None:
        revision = source_dir.name  # a Hub snapshot folder is named after its commit
    return {"id": config.source if not local else str(Path(config.source)), "revision": revision, "local": local}


def _recipe_entry(recipe: Recipe) -> dict[str, Any]:
    return {"file": str(recipe.path), "text": recipe.text, "variables": recipe.variables}


def _run_entry(config: QuantizeConfig, device: str, timings: dict[str, float]) -> dict[str, Any]:
    return {
        "device": device,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": {k: round(v, 3) for k, v in timings.items()},
        "peak_host_bytes": peak_host_bytes(),
        "peak_gpu_bytes": _peak_gpu_bytes(device),
    }


# -- process safety -------------------------------------------------------------------------------------------


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted in the main thread, so cleanup runs; restored afterwards."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


@contextmanager
def _cleanup_on_failure(partial: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        # A second Ctrl-C must not cut the cleanup short.
        with _signals_ignored():
            writer.remove_partial(partial)
        raise


@contextmanager
def _signals_ignored() -> Iterator[None]:
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


# -- measurements ---------------------------------------------------------------------------------------------


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = time.perf_counter() - start


def peak_host_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_gpu_bytes(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return int(torch.cuda.max_memory_allocated())
