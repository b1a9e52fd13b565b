"""The contract between a request and the head: question-type ids and where a record's questions and options sit.

The type ids index the head's `type_embedding`, so they are part of the release format; this is the one
place they are written. Everything else (the request parser, the encoding, the pooling contract, the head)
imports them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from itertools import chain
from typing import Literal


class QuestionType(IntEnum):
    """Type ids as the head's `type_embedding` indexes them; the lower-case names are the wire names."""

    NOUL = 0
    CHOICE = 1
    SCORE = 2


# The wire names as a type for request validation; a test holds them equal to QuestionType's names.
QuestionTypeName = Literal["noul", "choice", "score"]
NUM_QUESTION_TYPES = len(QuestionType)  # ids run from 0, so an id is valid when 0 <= id < this


def is_question_type(type_id: int) -> bool:
    return 0 <= type_id < NUM_QUESTION_TYPES


def _id_list() -> str:
    ids = [str(int(t)) for t in QuestionType]
    return ", ".join(ids[:-1]) + " or " + ids[-1]


@dataclass(frozen=True)
class RecordSchema:
    """Where a record's questions and options sit in its tokens (half-open positions within the record).

    `question_types` holds `QuestionType` ids; `option_spans[i]` are question i's options in model order.
    Validated on construction so a bad span fails here rather than as a NaN logit later.
    """

    question_types: tuple[int, ...]
    question_spans: tuple[tuple[int, int], ...]
    option_spans: tuple[tuple[tuple[int, int], ...], ...]

    def __post_init__(self) -> None:
        types = tuple(int(t) for t in self.question_types)
        questions = tuple((int(s), int(e)) for s, e in self.question_spans)
        options = tuple(tuple((int(s), int(e)) for s, e in spans) for spans in self.option_spans)
        object.__setattr__(self, "question_types", types)
        object.__setattr__(self, "question_spans", questions)
        object.__setattr__(self, "option_spans", options)
        if not questions:
            raise ValueError("a record needs at least one question")
        if not len(types) == len(questions) == len(options):
            raise ValueError(
                f"{len(types)} question types, {len(questions)} question spans and "
                f"{len(options)} option span lists must be equal in number"
            )
        if not all(is_question_type(t) for t in types):
            raise ValueError(f"question types must be {_id_list()}, got {types}")
        if any(not spans for spans in options):
            raise ValueError("every question needs at least one option")
        if any(not 0 <= s < e for s, e in chain(questions, chain.from_iterable(options))):
            raise ValueError("every span must be a non-empty [start, end) with start >= 0")

    @property
    def option_counts(self) -> tuple[int, ...]:
        return tuple(len(spans) for spans in self.option_spans)

    @property
    def num_options(self) -> int:
        return sum(self.option_counts)
