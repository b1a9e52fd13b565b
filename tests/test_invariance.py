"""Offline engine and eval: the same probabilities, bit for bit, whatever the batch and across runs, on the FP8
and NVFP4 folders (the server's side is in test_server_load.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from plugins.engines import small_kv_cache, start_engine

from clef_quant.bench.workload import WORDS, sentence
from clef_quant.evaluation.config import EvalConfig
from clef_quant.evaluation.engines import FreshEngines
from clef_quant.evaluation.runner import run_eval
from clef_vllm.errors import SettingsError

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = [pytest.mark.slow, pytest.mark.unit(order=60)]

# vLLM's CPU FP8 path runs at tens of tokens per second on two cores: short prompts, cut at a short limit.
MAX_LEN = 320
EVAL_MAX_LEN = 512
FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"


def requests() -> list[dict[str, Any]]:
    """Short requests (every question type, text and JSON states) and two states cut at the limit."""
    rng = random.Random(5)

    def questions(count: int) -> dict[str, Any]:
        kinds = [
            {"type": "choice", "criteria": {w: "" for w in rng.sample(WORDS, 3)}},
            {"type": "noul", "instructions": "yes?"},
            {"type": "score", "criteria": ["low", "high"]},
        ]
        return {f"q{i}": kinds[(i + count) % 3] for i in range(count)}

    bodies: list[dict[str, Any]] = []
    for index in range(4):
        state: Any = sentence(rng, rng.choice([3, 10, 25]))
        if index % 3 == 1:
            state = {"ticket": index, "text": state, "tags": rng.sample(WORDS, 2)}
        bodies.append({"model": "m", "id": f"r{index}", "state": state, "questions": questions(1 + index % 2)})
    for index in range(2):
        bodies.append({"model": "m", "id": f"long{index}", "state": sentence(rng, 400), "questions": questions(2)})
    return bodies


def open_engine(folder: Path):
    with small_kv_cache() as kv_cache:
        return start_engine(folder, max_model_len=MAX_LEN, enforce_eager=True, **kv_cache)


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "nvfp4"])
def test_offline_engine_gives_the_same_bits_in_any_batch_and_any_run(quantized_dir: Any, scheme: str) -> None:
    folder = quantized_dir(scheme)
    engine = open_engine(folder)
    try:
        encodings = [engine.encode(body)[1] for body in requests()]
        assert max(e.num_tokens for e in encodings) == MAX_LEN
        first = engine.logits(encodings)  # one call: vLLM sees all of them at once
    finally:
        engine.close()
    engine = open_engine(folder)  # a second run, in a fresh engine, in another order and other batches
    try:
        order = list(range(len(encodings)))[::-1]
        second: dict[int, torch.Tensor] = {}
        for start, size in ((0, 1), (1, 2), (3, 3)):
            part = order[start : start + size]
            second.update(zip(part, engine.logits([encodings[i] for i in part]), strict=True))
    finally:
        engine.close()
    for index, logits in enumerate(first):
        assert torch.equal(logits, second[index]), f"request {index} differs between runs"


def test_batch_invariance_is_the_default_and_can_be_traded_for_throughput(tiny_dir: Path) -> None:
    from clef_vllm.engine.settings import engine_args

    invariant = engine_args(tiny_dir, max_model_len=MAX_LEN)
    assert invariant["max_num_seqs"] == 1 and invariant["max_num_batched_tokens"] == MAX_LEN
    batched = engine_args(tiny_dir, max_model_len=MAX_LEN, batch_invariant=False, max_num_seqs=64)
    assert batched["max_num_seqs"] == 64 and "max_num_batched_tokens" not in batched
    with pytest.raises(SettingsError, match="max_num_seqs=8 puts several prompts in one engine step"):
        engine_args(tiny_dir, max_model_len=MAX_LEN, max_num_seqs=8)
    with pytest.raises(SettingsError, match="max_num_batched_tokens=1024 is below max_model_len=4096"):
        engine_args(tiny_dir, max_model_len=4096, max_num_batched_tokens=1024)


class ReorderedEngines(FreshEngines):
    """Fresh engines whose records reach vLLM in reverse order and in small batches of varied size."""

    @contextmanager
    def open(self, folder: Path) -> Iterator[Any]:
        with super().open(folder) as engine:
            yield _Reordered(engine)


class _Reordered:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def encode(self, body: Any) -> Any:
        return self.engine.encode(body)

    def logits(self, encodings: list[Any]) -> list[torch.Tensor]:
        order = list(range(len(encodings)))[::-1]
        out: dict[int, torch.Tensor] = {}
        start, size = 0, 1
        while start < len(order):
            part = order[start : start + size]
            out.update(zip(part, self.engine.logits([encodings[i] for i in part]), strict=True))
            start, size = start + size, size + 2
        return [out[i] for i in range(len(encodings))]


def stored_probabilities(out: Path) -> dict[str, dict[str, Any]]:
    stored = {}
    for path in sorted((out / "probs").glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        stored[path.stem] = {line["key"]: line["probs"] for line in lines}
    return stored


def test_two_eval_runs_store_the_same_probabilities(tiny_dir: Path, quantized_dir: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from clef_quant.cli import app

    data = tmp_path / "data"
    source = ["--source", str(FIXTURES), "--task", "boolq", "--task", "arc_challenge"]  # short schemas: FP8 is slow
    built = CliRunner().invoke(
        app, ["build-data", "--out", str(data), *source, "--per-task", "1", "--calibration-count=0"]
    )
    assert built.exit_code == 0, built.output
    runs = []
    for name, engines in (("first", FreshEngines), ("second", ReorderedEngines)):
        config = EvalConfig(
            reference=str(tiny_dir),
            candidates=[str(quantized_dir("fp8-dynamic")), str(quantized_dir("nvfp4"))],
            data=data,
            out=tmp_path / name,
            max_model_len=EVAL_MAX_LEN,
        )
        with small_kv_cache() as kv_cache:
            run = run_eval(
                config, engines=engines.from_keywords(max_model_len=EVAL_MAX_LEN, enforce_eager=True, **kv_cache)
            )
        assert run.reused == 0
        runs.append(stored_probabilities(config.out))
    first, second = runs
    assert first.keys() == second.keys() and len(first) == 4  # reference, noise floor, FP8, NVFP4
    for side, records in first.items():
        assert records == second[side], f"{side}: probabilities differ between two runs"


def test_the_reference_scores_a_record_the_same_beside_any_others(tiny_dir: Path, tmp_path: Path) -> None:
    """eval rescores only the records whose stored line does not verify: each must get the bits it got among all
    (records of every task: lengths from about 200 to 3,600 tokens, one to three questions)."""
    from typer.testing import CliRunner

    from clef_quant.cli import app
    from clef_quant.evaluation.data import read_eval_data
    from clef_quant.reference import ReferenceScorer

    data = tmp_path / "data"
    built = CliRunner().invoke(
        app, ["build-data", "--out", str(data), "--source", str(FIXTURES), "--per-task", "2", "--calibration-count=0"]
    )
    assert built.exit_code == 0, built.output
    records = read_eval_data(data).records
    scorer = ReferenceScorer(tiny_dir, max_length=4096)
    together = [scored.logits for scored in scorer.score([record.request for record in records])]
    for record, logits in zip(records, together, strict=True):
        (alone,) = scorer.score([record.request])
        assert torch.equal(alone.logits, logits), f"{record.id} moved with the records beside it"


def test_the_server_refuses_batching_flags_without_turning_invariance_off(tiny_dir: Path, capsys) -> None:
    from clef_vllm.server.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--model", str(tiny_dir), "--max-num-seqs", "8"])
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: max_num_seqs=8 puts several prompts in one engine step")
    assert "--no-batch-invariant" in line
