"""`clef-quant eval`: score a DATA folder with the bf16 reference and with every candidate through the plugin.

Sequence:
1. Read and validate every line of DATA (a bad line stops here with file:line, before any model loads).
2. Fingerprint each side's folder, check each plugin side's engine as vLLM would configure it (nothing loaded:
   a release without kernels here, an engine argument vLLM refuses) and encode every record with that side's
   tokenizer (a record too long for --max-model-len also stops here). Sides, in order: the reference
   (transformers, bf16: the release's own path), the noise floor (the same bf16 folder through the vLLM plugin)
   and each candidate (through the plugin).
3. For each side, look every record up in its probability store; score only the missing ones, one side at a time
   (one model in memory), task by task, appending to the store after every batch.
4. Compare each side with the reference per task and for All, with every metric of the registry; draw the
   intervals of the question means and of every pair of plugin sides' differences (paired t-intervals over records).
The noise floor row tells quantization damage from what the serving engine alone changes.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clef_quant.evaluation.comparison import compare, intervals
from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.data import EvalData, EvalRecord, read_eval_data, records_by_task
from clef_quant.evaluation.engines import EngineProvider, FreshEngines
from clef_quant.evaluation.errors import DataError
from clef_quant.evaluation.results import PROBS_DIR, ResultsFile, build_results
from clef_quant.evaluation.scoring import score_plugin, score_reference
from clef_quant.evaluation.sides import Side, encode_all, plan_sides
from clef_quant.evaluation.store import ProbabilityStore, StoredRecord
from clef_quant.progress import NoProgress, Progress
from clef_quant.release_folder.outputs import check_output_folder
from clef_vllm.errors import CheckpointError
from clef_vllm.format.encoder import Encoder
from clef_vllm.format.encoding import Encoding


@dataclass(frozen=True)
class EvalRun:
    results: ResultsFile
    sides: list[Side]

    @property
    def scored(self) -> int:
        return sum(side.scored for side in self.sides)

    @property
    def reused(self) -> int:
        return sum(side.reused for side in self.sides)

    @property
    def rejected(self) -> int:
        return sum(len(side.rejected) for side in self.sides)


def _score_side(
    side: Side,
    records: Sequence[EvalRecord],
    store: ProbabilityStore,
    score: Callable[[list[Encoding], Progress, str], list[tuple[list[list[float]], float]]],
    progress: Progress,
) -> None:
    """Score one side's missing records task by task; reused records complete their bar at once."""
    for task, indices in records_by_task(records).items():
        bar = f"{side.name} · {task}"
        progress.start(bar, len(indices))
        missing = [i for i in indices if store.get(side.keys[i], side.option_counts(i)) is None]
        side.reused += len(indices) - len(missing)
        progress.advance(bar, len(indices) - len(missing))
        if missing:
            scored = score([side.encodings[i] for i in missing], progress, bar)
            store.add(
                [
                    StoredRecord(side.keys[i], records[i].id, task, side.encodings[i].num_tokens, seconds, probs)
                    for i, (probs, seconds) in zip(missing, scored, strict=True)
                ]
            )
            side.scored += len(missing)
            side.seconds_scored += sum(seconds for _, seconds in scored)
        progress.finish(bar)
    side.rejected = list(store.rejected)


def run_eval(
    config: EvalConfig,
    *,
    engines: EngineProvider | None = None,
    progress: Progress | None = None,
    data: EvalData | None = None,
) -> EvalRun:
    """Score, compare and return the results (the caller writes them with `report.write_results`).

    `data` is `read_eval_data(config.data)` when the caller has already read (and so validated) it.
    """
    from clef_quant.reference import ReferenceScorer

    check_output_folder(Path(config.out))  # a file or /proc there fails now, not after the scoring
    progress = progress or NoProgress()
    data = data or read_eval_data(config.data)
    engines = engines or FreshEngines.from_keywords(max_model_len=config.max_model_len)
    try:
        sides = plan_sides(config, engines.settings, progress)
        for folder in dict.fromkeys(side.folder for side in sides[1:]):
            engines.check(folder)  # what its engine would refuse ends the run before the reference scores
    except CheckpointError as exc:
        raise DataError(str(exc)) from None

    scorer = ReferenceScorer(
        sides[0].folder, dtype=torch.bfloat16, device=config.device, max_length=config.max_model_len
    )  # loads the tokenizer now, the model on first use
    encode_all(sides[0], data.records, scorer.encode)
    encoders: dict[Path, Encoder] = {}
    for side in sides[1:]:
        if side.folder not in encoders:
            encoders[side.folder] = Encoder(side.folder, max_length=config.max_model_len)
        encode_all(side, data.records, encoders[side.folder].encode)

    probs_dir = Path(config.out) / PROBS_DIR
    stores = {side.key: ProbabilityStore(probs_dir / f"{side.key}.jsonl", side.producer()) for side in sides}
    _score_side(sides[0], data.records, stores[sides[0].key], _reference_scoring(scorer), progress)
    del scorer  # the backbone's memory goes back before any engine starts
    gc.collect()
    if torch.cuda.is_available():
        # vLLM's engine process checks the GPU's free memory at start: the cached blocks must go back too.
        torch.cuda.empty_cache()
    for side in sides[1:]:
        store = stores[side.key]
        if all(store.get(key, side.option_counts(i)) is not None for i, key in enumerate(side.keys)):
            _score_side(side, data.records, store, _never, progress)  # all reused: no engine starts
            continue
        with engines.open(side.folder) as engine:
            side.engine = engine_in_use(engine)
            _score_side(side, data.records, store, _plugin_scoring(engine), progress)
        gc.collect()

    values = compare(sides, data, stores)
    uncertainty = intervals(sides, data, stores)
    return EvalRun(results=build_results(config, data, sides, engines.settings, values, uncertainty), sides=sides)


def engine_in_use(engine: Any) -> dict[str, Any]:
    """What a started engine runs with, as opposed to what it was asked for: vLLM's CPU platform, for one, can put
    VLLM_CPU_KVCACHE_SPACE over the engine's own KV cache size. Empty for an engine that does not say."""
    size = getattr(engine, "kv_cache_memory_bytes", None)
    return {} if size is None else {"kv_cache_memory_bytes": size}


def _reference_scoring(scorer: Any) -> Callable[..., list[tuple[list[list[float]], float]]]:
    def score(encodings: list[Encoding], progress: Progress, bar: str) -> list[tuple[list[list[float]], float]]:
        return score_reference(scorer, encodings, progress, bar)

    return score


def _plugin_scoring(engine: Any) -> Callable[..., list[tuple[list[list[float]], float]]]:
    def score(encodings: list[Encoding], progress: Progress, bar: str) -> list[tuple[list[list[float]], float]]:
        return score_plugin(engine, encodings, progress=progress, task=bar)

    return score


def _never(encodings: list[Encoding], progress: Progress, bar: str) -> list[tuple[list[list[float]], float]]:
    raise AssertionError("nothing should be scored here")
