"""The head benchmark's workload: clef-flash's head sizes and random records shaped like encoded requests.

Only the structure matters to the timings (memory attention per option, per-question reductions), so weights,
hidden states and token ids are random.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clef_vllm.format.schema import RecordSchema
from clef_vllm.head.files import HeadConfig

FLASH_HEAD = HeadConfig(hidden_size=4096, width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096)
RECORD_TOKENS = 3000
VOCAB_ROWS = 16384  # only rows of option tokens are read, so the full 248,320 rows would change nothing
STEP_RECORDS = 8  # records in the mimicked pooler step
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class BenchShape:
    """A record's schema: one type id and one option count per question."""

    name: str
    types: tuple[int, ...]
    options: tuple[int, ...]


SHAPES = (
    BenchShape("1 choice x 77 options", (1,), (77,)),
    BenchShape("3 mixed (choice 4, noul, score 5)", (1, 0, 2), (4, 2, 5)),
    BenchShape("49 noul x 2 options", (0,) * 49, (2,) * 49),
)


def bench_record(
    shape: BenchShape, tokens: int, hidden_size: int, vocab: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, RecordSchema]:
    """A random record laid out like an encoded request: state first, then the schema fields at the end."""

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=generator))

    question_spans, option_spans = [], []
    pos = 0
    for count in shape.options:
        pos += 10  # "\nFIELD i\nID: ...\nTYPE: ...\nINSTRUCTION: "
        length = draw(3, 11)
        question_spans.append((pos, pos + length))
        pos += length + 5  # "\nALLOWED OPTIONS:\n"
        spans = []
        for _ in range(count):
            pos += 4  # "OPTION j: "
            length = draw(4, 17)
            spans.append((pos, pos + length))
            pos += length + 1
        option_spans.append(tuple(spans))
        pos += 3  # "END FIELD\n"
    schema_start = tokens - pos - 20  # room for the suffix
    if schema_start < 100:
        raise ValueError(f"{shape.name} needs about {pos + 120} tokens; the record has {tokens}")
    schema = RecordSchema(
        question_types=shape.types,
        question_spans=tuple((s + schema_start, e + schema_start) for s, e in question_spans),
        option_spans=tuple(tuple((s + schema_start, e + schema_start) for s, e in q) for q in option_spans),
    )
    hidden = torch.randn(tokens, hidden_size, generator=generator)
    ids = torch.randint(0, vocab, (tokens,), generator=generator)
    return hidden, ids, schema
