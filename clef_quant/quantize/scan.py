"""`clef-quant scan`: what each decoder layer's Linear groups cost the head when quantized alone.

A unit is one Linear group of one decoder layer: `deltanet` (in_proj_qkv, in_proj_z, out_proj; the gates
in_proj_a/b stay bf16), `attention` (q/k/v/o_proj) or `mlp` (gate/up/down_proj). Groups never split a set of
modules vLLM fuses, so every unit is something a recipe can give its own scheme.

For each candidate scheme the sequence is: load the bf16 backbone; run llm-compressor's `oneshot` with that
scheme's recipe from `recipes/` on the calibration records, exactly as `clef-quant quantize` does (same recipe,
same records, same qkv/z global-scale group); keep the weights it produced; then switch quantization off in every
module and, one unit at a time, back on in that unit's modules only, and score the held-out records.

Why the fake-quantized unit equals what the scheme stores: the modules keep the scales and global scales
`oneshot` computed (the very tensors `save_pretrained` compresses with), and compressed-tensors' forward applies
`dequantize(quantize(w))` with them, which is bit for bit what loading the stored folder decompresses to;
activations are quantized by the same forward with the same (static or dynamic) arguments. The test suite
compares a scanned unit's weights with the dequantized weights of a `clef-quant quantize` folder.

Numbers per unit: mean KL(bf16 || unit quantized) over every question of the held-out records (the last
`heldout` requests of the calibration file, never used to calibrate) with its 95% interval over those records
(`sensitivity.py`), each record's KL (so two units can be compared on the same records), top-1 flips, and bytes
saved (bf16 weight bytes minus what the scheme stores: packed values plus scale tensors). Results go to
`scan.json` after every unit (atomic rename), so an interrupted scan resumes where it stopped; `scan.csv`,
`scan.md` and `scan.png` are written at the end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from clef_quant.bootstrap import Bootstrap
from clef_quant.progress import NoProgress, Progress
from clef_quant.quantize import registry
from clef_quant.quantize.calibration import (
    DEFAULT_CALIBRATION_FILE,
    DEFAULT_MAX_SEQ_LEN,
    check_calibration_settings,
    draw,
    read_calibration_file,
)
from clef_quant.quantize.compress import decoder_layers_path, load_model, run_oneshot
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.inputs import bf16_source_config, check_device
from clef_quant.quantize.recipes import load_recipe, num_decoder_layers
from clef_quant.quantize.scan_file import (
    DEFAULT_CALIBRATION_RECORDS,
    DEFAULT_HELDOUT,
    GROUPS,
    SCAN_FORMAT,
    SCAN_JSON,
    ScanFile,
    ScanSettings,
    UnitResult,
    config_sha256,
    read_scan,
    write_scan,
)
from clef_quant.quantize.scan_report import write_reports
from clef_quant.quantize.sensitivity import bootstrap_settings, kl_interval
from clef_quant.quantize.source_shards import sharded_source
from clef_quant.release import resolve_release
from clef_quant.release_folder.outputs import check_output_folder
from clef_vllm.format.release_config import ReleaseConfig

TASK_CALIBRATE = "calibrating"
TASK_UNITS = "scanning units"


@dataclass(frozen=True)
class ScanConfig:
    source: str
    out: Path
    # The candidates are the schemes whose front matter has `scan:` (registry.py): those whose modifiers change
    # nothing but Linear weights and their quantization parameters, so a unit can be switched on alone (AWQ also
    # rescales norms, and the hybrid is already a mix). Without --scheme, the `scan: {default: true}` ones, what auto
    # needs.
    schemes: tuple[str, ...] = field(default_factory=lambda: registry.schemes().default_scan())
    calibration_file: Path | None = None
    calibration_records: int = DEFAULT_CALIBRATION_RECORDS
    heldout: int = DEFAULT_HELDOUT
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    device: str = "cpu"
    overwrite: bool = False
    revision: str | None = None


@dataclass
class ScanOutcome:
    scan: ScanFile
    files: list[Path]
    resumed: int  # units taken from an earlier run
    notes: list[str] = field(default_factory=list)


def unit_modules(layer_prefix: str, layer: int, group: str) -> list[str]:
    return [f"{layer_prefix}.{layer}.{leaf}" for leaf in GROUPS[group]]


# -- the run --------------------------------------------------------------------------------------------------


def scan(config: ScanConfig, progress: Progress | None = None) -> ScanOutcome:
    """Scan every (layer, group) unit under every candidate scheme; resumes from `out/scan.json`."""
    progress = progress or NoProgress()
    started = time.perf_counter()
    source_dir, source_config, bodies_heldout, bodies_calibration, settings = _check(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    layer_types = list(source_config.text.layer_types or [])
    num_layers = num_decoder_layers(source_config)
    existing = _existing(out / SCAN_JSON, config, source_dir, settings)
    resumed = len(existing.units) if existing else 0
    scan_file = existing or ScanFile(
        format=SCAN_FORMAT,
        source=str(config.source),
        config_sha256=config_sha256(source_dir),
        num_layers=num_layers,
        layer_types=layer_types,
        settings=settings,
        device=config.device,
    )
    units = [
        (layer, group)
        for layer in range(num_layers)
        for group in GROUPS
        if group != ("attention" if _is_linear(layer_types, layer) else "deltanet")
    ]
    todo = {s: [u for u in units if scan_file.unit(u[0], u[1], s) is None] for s in config.schemes}
    total = sum(len(v) for v in todo.values())
    if total:
        _run_units(
            config, source_dir, source_config, bodies_calibration, bodies_heldout, todo, scan_file, out, progress
        )
    scan_file.seconds["last_run"] = round(time.perf_counter() - started, 3)
    write_scan(out / SCAN_JSON, scan_file)
    files = [out / SCAN_JSON, *write_reports(scan_file, out)]
    return ScanOutcome(scan=scan_file, files=files, resumed=resumed)


def _is_linear(layer_types: list[str], layer: int) -> bool:
    return layer < len(layer_types) and layer_types[layer] == "linear_attention"


def _check(config: ScanConfig) -> tuple[Path, dict[str, Any], list[dict], list[dict], ScanSettings]:
    check_output_folder(Path(config.out))
    registry.schemes().check_scannable(config.schemes)
    if not config.schemes:
        raise QuantizeError("give at least one --scheme to scan")
    if config.heldout < 1:
        raise QuantizeError("--heldout must be at least 1")
    check_calibration_settings(config.calibration_records, config.max_seq_len)
    check_device(config.device)
    source_dir = resolve_release(config.source, config.revision).absolute()
    source_config = bf16_source_config(source_dir, "scan")
    sharded_source(source_dir)  # a cut or mis-indexed shard fails now, not inside transformers' loading
    for scheme in config.schemes:
        load_recipe(scheme, None, source_config)
    path: Path | Traversable = (
        Path(config.calibration_file) if config.calibration_file is not None else DEFAULT_CALIBRATION_FILE
    )
    every, file_sha256 = read_calibration_file(path)
    bodies = [b for b in every if not (b.get("images") or b.get("videos"))]
    if len(bodies) <= config.heldout:
        raise QuantizeError(
            f"{path} has {len(bodies)} text request(s); --heldout {config.heldout} leaves none to calibrate on"
        )
    heldout = bodies[-config.heldout :]
    pool = bodies[: -config.heldout]
    calibration = [pool[i] for i in draw(len(pool), config.calibration_records)]
    settings = ScanSettings(
        schemes=list(config.schemes),
        calibration_sha256=file_sha256,
        calibration_records=len(calibration),
        heldout=len(heldout),
        max_seq_len=config.max_seq_len,
    )
    return source_dir, source_config, heldout, calibration, settings


def _existing(path: Path, config: ScanConfig, source_dir: Path, settings: ScanSettings) -> ScanFile | None:
    if not path.is_file():
        return None
    if config.overwrite:
        path.unlink()
        return None
    scan_file = read_scan(path)
    old = scan_file.settings.model_dump(exclude={"schemes"})
    if scan_file.config_sha256 != config_sha256(source_dir) or old != settings.model_dump(exclude={"schemes"}):
        raise QuantizeError(
            f"{path} holds a scan of another checkpoint or with other settings; pass --overwrite or another --out"
        )
    scan_file.settings.schemes = sorted(set(scan_file.settings.schemes) | set(settings.schemes))
    return scan_file


def _run_units(
    config: ScanConfig,
    source_dir: Path,
    source_config: ReleaseConfig,
    calibration_bodies: list[dict],
    heldout_bodies: list[dict],
    todo: dict[str, list[tuple[int, str]]],
    scan_file: ScanFile,
    out: Path,
    progress: Progress,
) -> None:
    import torch

    from clef_quant.quantize.calibration import CalibrationSet, CalibrationSummary, as_dataloader
    from clef_vllm.format.encoder import Encoder
    from clef_vllm.format.request import parse_request
    from clef_vllm.head.files import find_head_dir, load_head

    encoder = Encoder(source_dir, max_length=config.max_seq_len, media=False)

    def encode(bodies: list[dict]) -> list[Any]:
        return [encoder.encode(parse_request(b)) for b in bodies]

    calibration = encode(calibration_bodies)
    heldout = encode(heldout_bodies)
    questions = [len(e.option_spans) for e in heldout]
    bootstrap = Bootstrap()
    scan_file.record_questions = questions
    scan_file.intervals = bootstrap_settings(bootstrap)
    summary = CalibrationSummary.unused(config.max_seq_len)
    calibration_set = CalibrationSet([e.input_ids for e in calibration], summary)
    head = load_head(find_head_dir(source_dir), dtype=torch.bfloat16, device=config.device)

    reference: list[list[Any]] | None = None
    progress.start(TASK_UNITS, sum(len(v) for v in todo.values()))
    for scheme, units in todo.items():
        if not units:
            continue
        started = time.perf_counter()
        model = load_model(source_dir, source_config, config.device)
        prefix = _layer_prefix(model)
        if reference is None:
            reference = heldout_probabilities(model, head, heldout, config.device)
        wanted = {name for layer, group in units for name in unit_modules(prefix, layer, group)}
        originals = {n: m.weight.detach().clone() for n, m in model.named_modules() if n in wanted}
        progress.start(f"{TASK_CALIBRATE} {scheme}")
        calibrate_in_memory(model, source_config, scheme, as_dataloader(calibration_set), encoder.tokenizer)
        progress.finish(f"{TASK_CALIBRATE} {scheme}")
        modules = dict(model.named_modules())
        produced = {n: modules[n].weight.detach().clone() for n in originals}
        for module in modules.values():
            if hasattr(module, "quantization_scheme"):
                module.quantization_enabled = False
        for name, weight in originals.items():
            modules[name].weight.data.copy_(weight)
        scan_file.seconds[f"calibrate {scheme}"] = round(time.perf_counter() - started, 3)
        for layer, group in units:
            unit_started = time.perf_counter()
            names = [n for n in unit_modules(prefix, layer, group) if n in modules]
            stored = sum(stored_bytes(modules[n]) for n in names if hasattr(modules[n], "quantization_scheme"))
            for name in names:
                modules[name].weight.data.copy_(produced[name])
                modules[name].quantization_enabled = True
            candidate = heldout_probabilities(model, head, heldout, config.device)
            for name in names:
                modules[name].weight.data.copy_(originals[name])
                modules[name].quantization_enabled = False
            kls, flips, record_kl = _compare(reference, candidate)
            low, high = kl_interval(record_kl, questions, bootstrap)
            params = sum(modules[n].weight.numel() for n in names)
            bf16 = sum(modules[n].weight.numel() * 2 for n in names)
            scan_file.units.append(
                UnitResult(
                    layer=layer,
                    group=group,
                    scheme=scheme,
                    modules=names,
                    params=params,
                    bf16_bytes=bf16,
                    stored_bytes=stored,
                    bytes_saved=bf16 - stored,
                    kl_mean=float(sum(kls) / len(kls)),
                    kl_max=float(max(kls)),
                    flips=flips,
                    questions=len(kls),
                    seconds=round(time.perf_counter() - unit_started, 3),
                    kl_low=low,
                    kl_high=high,
                    record_kl=record_kl,
                )
            )
            write_scan(out / SCAN_JSON, scan_file)  # after every unit: an interrupted scan resumes here
            progress.advance(TASK_UNITS)
        del model
    progress.finish(TASK_UNITS)


def _layer_prefix(model: Any) -> str:
    path = decoder_layers_path(model)
    if path is None:
        raise QuantizeError("the model has no decoder layers under model.language_model.layers")
    return path


def calibrate_in_memory(model: Any, source_config: ReleaseConfig, scheme: str, dataloader: Any, tokenizer: Any) -> None:
    """The same oneshot `clef-quant quantize --scheme SCHEME` runs, on the in-memory model."""
    from clef_quant.quantize.plan import parse_recipe, plan_quantization, recipe_needs_calibration

    recipe = parse_recipe(load_recipe(scheme, None, source_config).text)
    plan_quantization(model, recipe)  # the same refusals as quantize: keep-list, split fused groups
    calibration = dataloader if recipe_needs_calibration(recipe) else None
    run_oneshot(model, recipe, calibration, tokenizer, NoProgress(), lambda _stage: None)


def stored_bytes(module: Any) -> int:
    """Bytes a quantized Linear takes in a compressed-tensors folder: packed values plus its scale tensors."""
    weights = module.quantization_scheme.weights
    if weights is None:
        return module.weight.numel() * module.weight.element_size()
    import torch

    total = math.ceil(module.weight.numel() * weights.num_bits / 8)
    for name in ("weight_scale", "weight_global_scale", "input_global_scale", "input_scale"):
        tensor = getattr(module, name, None)
        if tensor is None:
            continue
        size = tensor.element_size()
        if name == "weight_scale" and weights.scale_dtype is not None:
            # held in a wider dtype while calibrating; compressed to scale_dtype (FP8 for NVFP4) when saved
            size = torch.empty(0, dtype=weights.scale_dtype).element_size()
        total += tensor.numel() * size
    zero = getattr(module, "weight_zero_point", None)
    if zero is not None and not weights.symmetric:
        total += zero.numel() * zero.element_size()
    return total


def heldout_probabilities(model: Any, head: Any, encodings: list[Any], device: str) -> list[list[Any]]:
    """Per record, per question: the head's probabilities (float32, model order), each record scored alone
    through the reference's path (`reference.record_logits`): padded batches moved bf16 logits by up to 0.03, more
    than many units' own effect."""
    from clef_quant.reference import record_logits
    from clef_vllm.format.answers import split_logits

    results: list[list[Any]] = []
    for encoding in encodings:
        logits = record_logits(model, head, encoding, device).float().cpu()
        counts = [len(spans) for spans in encoding.option_spans]
        results.append([p.numpy() for p in split_logits(logits, counts)])
    return results


def _compare(reference: list[list[Any]], candidate: list[list[Any]]) -> tuple[list[float], int, list[float]]:
    """Every question's KL, the top-1 flips, and per record the sum of its questions' KL."""
    from clef_quant.divergences import kl_divergence

    kls: list[float] = []
    record_kl: list[float] = []
    flips = 0
    for ref_record, cand_record in zip(reference, candidate, strict=True):
        own = [kl_divergence(p, q) for p, q in zip(ref_record, cand_record, strict=True)]
        flips += sum(int(p.argmax() != q.argmax()) for p, q in zip(ref_record, cand_record, strict=True))
        kls += own
        record_kl.append(float(sum(own)))
    return kls, flips, record_kl
