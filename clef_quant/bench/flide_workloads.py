"""Five SystemOne requests shaped like the workloads whose one-request-at-a-time latency the Flide documentation
publishes for the 27B (Cloudflare/clef) on one H200, with Flide's and the SGLang nightly's medians beside them.

The shapes (what a request holds, not its words) follow the public data sets the workloads are named after:
- decision-index: a short support-ticket state and three fields (yes/no, a four-way choice, a five-level score);
- race: one reading passage (about 450 tokens) and one question with four lettered answers;
- multirc: one passage (about 400 tokens) and 49 true/false questions about it, all answered in one pass;
- quality: a long article, about 6,000-8,000 tokens of state, and one four-way question;
- gqa: one photograph-sized image (512 x 384) and one choice question about it.

Token counts are the model's own (its tokenizer and processor, through our encoder), so the same bodies report
their length beside every latency. The texts are drawn from a fixed seed: the same folder gives the same bodies.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_quant.bench.workload import WORDS, generated_image, sentence
from clef_vllm.format.text import render

# Median latency of one request at a time, ms (Flide documentation, clef 27B on one H200).
FLIDE_MS = {"decision-index": 71.6, "race": 50.8, "multirc": 609.1, "quality": 348.2, "gqa": 147.9}
SGLANG_MS = {"decision-index": 92.7, "race": 91.3, "multirc": 624.3, "quality": 349.6, "gqa": 151.1}
WORKLOADS = tuple(FLIDE_MS)

# State lengths in tokens: RACE passages average about 350 words, MultiRC paragraphs about 300, QuALITY articles
# 2,000-8,000 words (the long split is what Flide times: 6-8k tokens of state).
DECISION_MESSAGE_TOKENS = 60
RACE_STATE_TOKENS = 450
MULTIRC_STATE_TOKENS = 400
MULTIRC_QUESTIONS = 49
QUALITY_STATE_TOKENS = (6000, 8000)
GQA_IMAGE = (512, 384)


CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class FlideWorkload:
    """One request body and its length as the model reads it."""

    name: str
    body: dict[str, Any]
    input_tokens: int  # prompt tokens after media expansion (the SystemOne response's usage.input_tokens)
    state_tokens: int  # of which the state (the rest is the fixed prompt, the media and the schema)
    flide_ms: float
    sglang_ms: float


def _text(rng: random.Random, tokens: int, count_tokens: CountTokens) -> str:
    """A passage of about `tokens` tokens (within 10%) as the model's tokenizer counts them: words per token differ
    between tokenizers, so the length is set in tokens."""
    words = tokens
    text = _passage(rng, words)
    for _ in range(8):
        counted = count_tokens(text)
        if abs(counted - tokens) <= tokens // 10:
            break
        words = max(1, round(words * tokens / counted))
        text = _passage(rng, words)
    return text


def _passage(rng: random.Random, words: int) -> str:
    sentences = []
    while words > 0:
        length = min(words, rng.randint(8, 20))
        sentences.append(sentence(rng, length))
        words -= length
    return " ".join(sentences)


def _choice(rng: random.Random, letters: str = "ABCD") -> dict[str, Any]:
    return {
        "type": "choice",
        "instructions": sentence(rng, 10).rstrip(".") + "?",
        "criteria": {letter: sentence(rng, rng.randint(4, 9)) for letter in letters},
    }


def _decision_index(rng: random.Random, count_tokens: CountTokens) -> dict[str, Any]:
    state = {
        "ticket": rng.randint(10_000, 99_999),
        "channel": "email",
        "customer": {"plan": "business", "tenure_months": rng.randint(1, 60)},
        "message": _text(rng, DECISION_MESSAGE_TOKENS, count_tokens),
    }
    questions = {
        "escalate": {"type": "noul", "instructions": "Does this ticket need a human agent today?"},
        "topic": {
            "type": "choice",
            "instructions": "What is the ticket mainly about?",
            "criteria": {
                "billing": "Charges, invoices or refunds.",
                "access": "Logging in, passwords or blocked accounts.",
                "delivery": "Orders, parcels or shipping delays.",
                "other": "Anything else.",
            },
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is the ticket?",
            "criteria": ["Not urgent.", "Low.", "Moderate.", "High.", "Critical."],
        },
    }
    return {"state": state, "questions": questions}


def _race(rng: random.Random, count_tokens: CountTokens) -> dict[str, Any]:
    return {"state": _text(rng, RACE_STATE_TOKENS, count_tokens), "questions": {"answer": _choice(rng)}}


def _multirc(rng: random.Random, count_tokens: CountTokens) -> dict[str, Any]:
    questions = {
        f"q{i:02d}": {"type": "noul", "instructions": sentence(rng, rng.randint(10, 18))}
        for i in range(1, MULTIRC_QUESTIONS + 1)
    }
    return {"state": _text(rng, MULTIRC_STATE_TOKENS, count_tokens), "questions": questions}


def _quality(rng: random.Random, count_tokens: CountTokens) -> dict[str, Any]:
    low, high = QUALITY_STATE_TOKENS
    return {"state": _text(rng, (low + high) // 2, count_tokens), "questions": {"answer": _choice(rng)}}


def _gqa(rng: random.Random, count_tokens: CountTokens) -> dict[str, Any]:
    objects = rng.sample(WORDS, 5)
    return {
        "state": "",
        "images": [generated_image(rng, *GQA_IMAGE)],
        "questions": {
            "answer": {
                "type": "choice",
                "instructions": f"Which object is to the left of the {objects[0]}?",
                "criteria": {name: f"The {name}." for name in objects[1:]},
            }
        },
    }


def flide_workloads(model: str | Path, seed: int = 0, names: tuple[str, ...] = WORKLOADS) -> list[FlideWorkload]:
    """The request bodies of `names` for the release folder `model`, with their token counts."""
    from clef_vllm.format.encoder import Encoder
    from clef_vllm.format.request import DEFAULT_LIMITS

    unknown = [name for name in names if name not in FLIDE_MS]
    if unknown:
        raise ValueError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    encoder = Encoder(model, max_length=16384, media="gqa" in names or None)

    def count_tokens(text: str) -> int:
        return len(encoder.tokenizer(text, add_special_tokens=False)["input_ids"])

    makers = {"decision-index": _decision_index, "race": _race, "multirc": _multirc, "quality": _quality, "gqa": _gqa}
    workloads = []
    for name in names:
        rng = random.Random(f"{seed}/{name}")
        body = {"model": "clef", "id": name, **makers[name](rng, count_tokens)}
        _, encoding = encoder.prepare(body, DEFAULT_LIMITS)
        state = render(body["state"])
        workloads.append(
            FlideWorkload(
                name=name,
                body=body,
                input_tokens=encoding.num_tokens,
                state_tokens=count_tokens(state),
                flide_ms=FLIDE_MS[name],
                sglang_ms=SGLANG_MS[name],
            )
        )
    return workloads


def write_jsonl(workloads: list[FlideWorkload], out: Path) -> None:
    """One line per workload: its body and token counts beside Flide's and SGLang's medians (keys sorted, text
    unescaped, so two runs' files compare line by line)."""
    lines = [
        json.dumps(
            {
                "workload": w.name,
                "input_tokens": w.input_tokens,
                "state_tokens": w.state_tokens,
                "flide_ms": w.flide_ms,
                "sglang_ms": w.sglang_ms,
                "body": w.body,
            },
            ensure_ascii=False,
            sort_keys=True,
        )
        for w in workloads
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
