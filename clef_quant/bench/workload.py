"""A deterministic workload of varied SystemOne requests: every question type, short and long states, many
questions. Benchmarks and tests use it so that their numbers describe the same kind of traffic."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

WORDS = [
    "account",
    "card",
    "payment",
    "refund",
    "transfer",
    "balance",
    "limit",
    "fee",
    "travel",
    "abroad",
    "pin",
    "blocked",
    "cash",
    "machine",
    "delivery",
    "order",
    "delayed",
    "parcel",
    "address",
    "weather",
    "storm",
    "river",
    "mountain",
    "forest",
    "science",
    "energy",
    "atom",
    "history",
    "empire",
    "treaty",
    "music",
    "rhythm",
    "melody",
    "garden",
    "soil",
    "water",
    "light",
    "cell",
    "protein",
    "market",
    "price",
]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


# Words in a state, one drawn per request: from a few tokens to ~1,500.
STATE_WORDS = (3, 20, 80, 400, 900)


def varied_requests(count: int = 24, seed: int = 0, state_words: Sequence[int] = STATE_WORDS) -> list[dict[str, Any]]:
    """Deterministic requests: choice, noul and score questions, 1-12 questions, states of `state_words` words.

    The same seed with any five lengths draws the same questions and state kinds, only the states' lengths
    differ."""
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        words = rng.choice(list(state_words))
        state: Any = sentence(rng, words)
        if index % 4 == 1:
            state = {"ticket": index, "text": state, "tags": [rng.choice(WORDS) for _ in range(3)]}
        questions: dict[str, Any] = {}
        for q in range(rng.choice([1, 1, 2, 3, 5, 12])):
            kind = ("choice", "noul", "score")[(index + q) % 3]
            if kind == "choice":
                options = rng.sample(WORDS, rng.choice([2, 3, 4, 7]))
                criteria: Any = {name: sentence(rng, 4) for name in options}
            elif kind == "score":
                criteria = [sentence(rng, 2) for _ in range(rng.choice([3, 5]))]
            else:
                criteria = {"true": "Yes, it is.", "false": "No, it is not."} if q % 2 else None
            question: dict[str, Any] = {"type": kind, "instructions": sentence(rng, 6)}
            if criteria is not None:
                question["criteria"] = criteria
            questions[f"q{q}"] = question
        requests.append({"model": "clef", "id": f"r{index}", "state": state, "questions": questions})
    return requests


# Words in a serving benchmark's state: about 1,490 prompt tokens with three questions (clef-flash's tokenizer is
# the tiny checkpoint's in every size make-tiny builds).
SERVING_STATE_WORDS = 325


def serving_requests(count: int = 64, seed: int = 0, state_words: int = SERVING_STATE_WORDS) -> list[dict[str, Any]]:
    """Requests of one shape, as a serving benchmark wants them: a state of `state_words` words and three
    questions (a four-way choice, a noul and a five-level score); only the words differ between requests."""
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        options = rng.sample(WORDS, 4)
        questions = {
            "topic": {
                "type": "choice",
                "instructions": sentence(rng, 6),
                "criteria": {o: sentence(rng, 4) for o in options},
            },
            "urgent": {"type": "noul", "instructions": sentence(rng, 6)},
            "severity": {
                "type": "score",
                "instructions": sentence(rng, 6),
                "criteria": [sentence(rng, 2) for _ in range(5)],
            },
        }
        requests.append(
            {"model": "clef", "id": f"s{index}", "state": sentence(rng, state_words), "questions": questions}
        )
    return requests


# State lengths of the mixed-length probes, in words: from an almost empty state to one longer than any model
# allows (the state is cut to fit, so that prompt is exactly max_model_len tokens long).
MIXED_STATE_WORDS = (1, 5, 20, 60, 150, 600, 100_000)


def mixed_length_requests(seed: int = 1) -> list[dict[str, Any]]:
    """One request per `MIXED_STATE_WORDS` length, with the serving requests' three questions: prompts from the
    questions alone (about 500 tokens) to the longest the model allows, for checking answers inside batches of
    mixed lengths."""
    requests = []
    for index, words in enumerate(MIXED_STATE_WORDS):
        request = serving_requests(1, seed=seed + index, state_words=words)[0]
        requests.append({**request, "id": f"m{index}"})
    return requests


def generated_image(rng: random.Random, width: int, height: int) -> str:
    """A PNG (base64) of random colour blocks: different pixels for each seed, a few KiB."""
    import base64
    import io

    from PIL import Image

    block = 8
    image = Image.new("RGB", (width, height))
    for x in range(0, width, block):
        for y in range(0, height, block):
            colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
            image.paste(colour, (x, y, x + block, y + block))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


IMAGE_SIZES = [(64, 48), (96, 96), (128, 64), (48, 160)]


def image_requests(count: int = 16, seed: int = 0, images_per_request: int = 1) -> list[dict[str, Any]]:
    """`varied_requests` with generated images attached (sizes from 48 to 160 pixels a side)."""
    rng = random.Random(seed)
    requests = varied_requests(count, seed)
    for request in requests:
        request["images"] = [generated_image(rng, *rng.choice(IMAGE_SIZES)) for _ in range(images_per_request)]
    return requests
