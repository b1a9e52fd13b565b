"""Throughput benchmark: records/s and tokens/s of the transformers reference and of the plugin, same records.

Sides run one after another in one process (a shared CPU cannot host two models without each slowing the
other): the bf16 reference through transformers (one record per forward pass, as `clef-quant eval` scores it),
then each folder through the vLLM plugin (bf16, then the quantized folders as given; all records in one call,
vLLM forms the batches). Every side first scores `warm_up` records untimed (lazy initialisation, first-call
kernels), then all records timed. The time is model time: records are encoded before the clock starts, as
`clef-quant eval` does.

`run_throughput` returns the numbers; `throughput_report.write_report` writes them as markdown and JSON;
`clef-quant bench throughput` does both.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from clef_quant.bench.engine_record import recorded_engine
from clef_quant.bench.environment import load_average, machine_name
from clef_quant.evaluation.engines import FreshEngines
from clef_quant.evaluation.scoring import score_plugin, score_reference
from clef_quant.evaluation.store import tool_versions
from clef_quant.formatting import utc_minute
from clef_quant.progress import Progress, Stages
from clef_quant.release_folder.fingerprints import folder_fingerprint
from clef_quant.throughput_report import ThroughputResult, ThroughputRow
from clef_vllm.errors import ClefError
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.encoding import Encoding
from clef_vllm.format.request import ClefRequest, parse_request

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings


def load_requests(source: Path, records: int) -> list[ClefRequest]:
    """`records` requests from a DATA folder (taking tasks in turn, so every task is represented) or a JSONL file
    of requests (plain or wrapped as {"request": ...}, like calibration files)."""
    from clef_quant.evaluation.data import read_eval_data

    if source.is_dir():
        data = read_eval_data(source)
        by_task: dict[str, list[ClefRequest]] = {}
        for record in data.records:
            by_task.setdefault(record.task, []).append(record.request)
        ordered = [
            group[i] for i in range(max(map(len, by_task.values()))) for group in by_task.values() if i < len(group)
        ]
        requests = ordered[:records]
    else:
        from clef_quant.quantize.calibration import read_request_bodies

        requests = [parse_request(body) for body in read_request_bodies(source)[:records]]
    if not requests:
        raise ClefError(f"no requests in {source}")
    return requests


def plugin_side_name(folder: Path) -> str:
    """A quantized folder's row: the labels its scheme stores (`FP8_DYNAMIC`, `FP8_DYNAMIC + NVFP4`), the scheme
    its manifest records when it is not a registry scheme (`auto`, `custom`), else the folder's name."""
    from clef_quant.quantize.registry import schemes
    from clef_quant.release_folder.manifest import read_manifest

    manifest = read_manifest(folder)
    scheme = manifest.scheme if manifest is not None else None
    if scheme in schemes().names:
        return " + ".join(schemes().scheme(scheme).labels)
    return scheme or folder.name


def plugin_sides(reference: Path, quantized: Sequence[Path]) -> list[tuple[str, Path]]:
    """The plugin's rows: the bf16 reference folder, then each quantized folder named by its scheme."""
    return [("plugin bf16", reference), *((f"plugin {plugin_side_name(folder)}", folder) for folder in quantized)]


def image_workload(count: int) -> list[ClefRequest]:
    """`count` generated records with one image each (seed 0: every run times the same ones)."""
    from clef_quant.bench.workload import image_requests

    return [parse_request(body) for body in image_requests(count, seed=0)]


def run_throughput(
    reference: Path,
    plugin: Sequence[tuple[str, Path]],
    requests: Sequence[ClefRequest],
    settings: EngineSettings,
    *,
    source: str = "",
    warm_up: int = 8,
    device: str = "cpu",
    progress: Progress | None = None,
    image_requests: Sequence[ClefRequest] = (),
) -> ThroughputResult:
    """Time the reference and every `(name, folder)` of `plugin` on the same requests; `image_requests` (one
    image each) get their own row per side, timed the same way. Each plugin side's engine is `settings` for its
    folder, and both sides cut prompts at its `max_model_len`."""
    from clef_quant.reference import ReferenceScorer

    stage = Stages(progress)
    load = load_average()
    max_model_len = settings.max_model_len
    rows = []

    stage("transformers reference: loading")
    began = time.perf_counter()
    scorer = ReferenceScorer(reference, dtype=torch.bfloat16, device=device, max_length=max_model_len)
    encodings = [scorer.encode(r) for r in requests]
    _ = scorer.model  # load now, so the load is not timed as scoring
    loaded = time.perf_counter() - began
    stage("transformers reference: warm-up")
    score_reference(scorer, encodings[:warm_up])
    stage("transformers reference: timed")
    timed = score_reference(scorer, encodings)
    rows.append(_row("bf16 reference", "transformers", reference, encodings, timed, loaded))
    if image_requests:
        stage("transformers reference: image records")
        with_images = [scorer.encode(r) for r in image_requests]
        score_reference(scorer, with_images[:1])
        timed = score_reference(scorer, with_images)
        rows.append(_row("bf16 reference, 1 image", "transformers", reference, with_images, timed, loaded))
    del scorer
    gc.collect()

    engines = FreshEngines(settings)
    for name, folder in plugin:
        stage(f"plugin {name}: starting the engine")
        encoder = Encoder(folder, max_length=max_model_len)
        encodings = [encoder.encode(r) for r in requests]
        with_images = [encoder.encode(r) for r in image_requests]
        began = time.perf_counter()
        with engines.open(folder) as engine:
            started = time.perf_counter() - began
            stage(f"plugin {name}: warm-up")
            score_plugin(engine, encodings[:warm_up])
            stage(f"plugin {name}: timed")
            timed = score_plugin(engine, encodings, chunk=len(encodings))
            if with_images:
                stage(f"plugin {name}: image records")
                score_plugin(engine, with_images[:warm_up])
                image_timed = score_plugin(engine, with_images, chunk=len(with_images))
        rows.append(_row(name, "vLLM plugin", folder, encodings, timed, started))
        if with_images:
            rows.append(_row(f"{name}, 1 image", "vLLM plugin", folder, with_images, image_timed, started))
        gc.collect()

    stage.done()
    return ThroughputResult(
        machine=machine_name(torch.device(device)),
        date=utc_minute(),
        load=load,
        versions=tool_versions(),
        source=source,
        records=len(requests),
        tokens=sum(e.num_tokens for e in encodings),
        max_model_len=max_model_len,
        device=device,
        engine=recorded_engine(settings),
        rows=tuple(rows),
    )


def _row(
    side: str, runner: str, folder: Path, encodings: Sequence[Encoding], timed: Sequence[tuple[Any, float]], load: float
) -> ThroughputRow:
    return ThroughputRow(
        side=side,
        runner=runner,
        folder=str(folder),
        records=len(encodings),
        tokens=sum(e.num_tokens for e in encodings),
        seconds=sum(seconds for _, seconds in timed),
        load_seconds=load,
        sha256=_fingerprint(str(folder)),
    )


@functools.cache
def _fingerprint(folder: str) -> str | None:
    """The model fingerprint a card matches the row against; None for a Hub id (nothing local to hash)."""
    return folder_fingerprint(Path(folder)).sha256 if Path(folder).is_dir() else None
