"""Which engines take a release folder for a Clef model, and which questions of a request they would refuse.

The rules are data, one row per engine, as each engine's code applies them: vLLM >= 0.33 (`clef_flash.py`) and
SGLang >= 0.5.23 (`joint_schema_head.py`) switch a `Qwen3_5ForConditionalGeneration` checkpoint to Clef when
`joint_head_config.json` and `joint_head.safetensors` sit at the folder's root; llama.cpp's converter and NeMo
AutoModel's `load_joint_head` look for the same files. clef-vllm also reads the `clef_head/` of older quantized
releases. Each serving engine checks a request's questions against its own limits (vLLM 0.32's `/v1/systemone`
parser, which `vllm serve` with our plugin goes through, labels choice options A-Z and score levels 0-9).
`clef-quant inspect --engines` reports both; the engine compatibility tests hold our releases to the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from clef_vllm.engine.architecture import ARCHITECTURE
from clef_vllm.errors import CheckpointError
from clef_vllm.format.limits import DEFAULT_LIMITS, Limits
from clef_vllm.format.release_config import read_release_config
from clef_vllm.format.request import ClefRequest, parse_request
from clef_vllm.head.files import HEAD_FILES, HEAD_SUBDIR

QWEN3_5 = "Qwen3_5ForConditionalGeneration"
ROOT = ""  # the release's top level, as a head location


@dataclass(frozen=True)
class Range:
    """How many options (or levels) a question may have; None: no bound of that side."""

    low: int | None = None
    high: int | None = None

    def refuses(self, count: int) -> bool:
        return (self.low is not None and count < self.low) or (self.high is not None and count > self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low}-{self.high}"
        if self.high is not None:
            return f"<= {self.high}"
        return f">= {self.low}" if self.low is not None else "any"


@dataclass(frozen=True)
class Engine:
    name: str
    how: str  # how a user runs it on a release folder
    architectures: tuple[str, ...]  # config.json's `architectures` must name one of these
    head_dirs: tuple[str, ...]  # folders (relative; ROOT is the top level) where the head's two files may sit
    serves: bool = True  # False: reads the folder (a converter, a loader) but answers no requests
    max_questions: int | None = None
    choice: Range = Range()
    score: Range = Range()


ENGINES: tuple[Engine, ...] = (
    Engine(
        "clef-vllm",
        "clef-systemone, ClefEngine, clef-quant eval",
        (QWEN3_5,),
        (ROOT, HEAD_SUBDIR),
        max_questions=DEFAULT_LIMITS.max_questions,
        choice=Range(DEFAULT_LIMITS.min_options, DEFAULT_LIMITS.max_choice_options),
        score=Range(DEFAULT_LIMITS.min_options, DEFAULT_LIMITS.max_score_levels),
    ),
    Engine(
        "vllm serve + clef-vllm",
        f"vllm serve DIR --runner pooling --hf-overrides '{json.dumps({'architectures': [ARCHITECTURE]})}'",
        (QWEN3_5,),
        (ROOT, HEAD_SUBDIR),
        max_questions=DEFAULT_LIMITS.max_questions,
        choice=Range(1, 26),
        score=Range(1, 10),
    ),
    Engine("vLLM >= 0.33", "vllm serve DIR", (QWEN3_5,), (ROOT,), choice=Range(None, 26), score=Range(2, 10)),
    Engine(
        "SGLang >= 0.5.23",
        "python -m sglang.launch_server --model-path DIR",
        (QWEN3_5,),
        (ROOT,),
        choice=Range(None, 255),
        score=Range(None, 10),
    ),
    Engine("llama.cpp", "convert_hf_to_gguf.py DIR", (QWEN3_5,), (ROOT,), serves=False),
    Engine("NeMo AutoModel", "load_joint_head(DIR)", (QWEN3_5,), (ROOT,), serves=False),
)


@dataclass(frozen=True)
class Detection:
    engine: Engine
    missing: tuple[str, ...]  # what the engine looks for and does not find; empty: it detects a Clef model

    @property
    def detected(self) -> bool:
        return not self.missing


def config_architectures(folder: Path) -> list[str]:
    """config.json's `architectures` ([] when the file, or the key, is missing or unreadable)."""
    try:
        return list(read_release_config(folder).architectures)
    except CheckpointError:  # detection reports what is missing, not why the file is broken
        return []


def _head_at(folder: Path, head_dir: str) -> bool:
    return all((folder / head_dir / name).is_file() for name in HEAD_FILES)


def detect(folder: Path, engine: Engine) -> Detection:
    """Whether `engine` sees a Clef model in `folder`, and if not, what it misses."""
    folder = Path(folder)
    missing = []
    if not set(config_architectures(folder)) & set(engine.architectures):
        missing.append(f"config.json architectures naming {' or '.join(engine.architectures)}")
    if not any(_head_at(folder, head_dir) for head_dir in engine.head_dirs):
        places = " or ".join("the root" if d == ROOT else f"{d}/" for d in engine.head_dirs)
        missing.append(f"{' and '.join(HEAD_FILES)} at {places}")
    return Detection(engine, tuple(missing))


def detect_all(folder: Path) -> list[Detection]:
    return [detect(folder, engine) for engine in ENGINES]


def read_request(body: object) -> ClefRequest:
    """A request parsed by the release's checks, with no cap on question, option or level counts: those are each
    engine's limits, reported per engine by `over_limits`."""
    uncapped: Limits = replace(DEFAULT_LIMITS, max_questions=10**9, max_choice_options=10**9, max_score_levels=10**9)
    return parse_request(body, uncapped)


def over_limits(request: ClefRequest, engine: Engine) -> list[str]:
    """What of `request` `engine` refuses, one line per question (and one for the question count)."""
    if not engine.serves:
        return []
    problems = []
    if engine.max_questions is not None and len(request.questions) > engine.max_questions:
        problems.append(f"{len(request.questions)} questions (at most {engine.max_questions})")
    for question in request.questions:
        kind = question.type_name
        allowed = {"choice": engine.choice, "score": engine.score}.get(kind)
        count = len(question.options)
        if allowed is not None and allowed.refuses(count):
            noun = "options" if kind == "choice" else "levels"
            problems.append(f'question "{question.id}": {kind} with {count} {noun} (allowed {allowed})')
    return problems
