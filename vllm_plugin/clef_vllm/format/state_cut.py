"""Tokenize a state only as far as the model can read it, with the ids a whole-state tokenization gives.

The release tokenizes the whole state and keeps its first `keep` ids. A 12 MB state would then cost seconds of
tokenization under the shared tokenizer and gigabytes of Python lists for ids the model never sees, and a 12 MB
run of spaces makes the Rust tokenizer's regex engine panic. Here the text is read in chunks of at most
`MAX_CALL_CHARS` characters, one tokenizer call each, only until enough ids are read. A chunk ends, where it can,
at a character position where the tokenizer's own pre-tokenizer always splits, so the ids of the chunks joined
are exactly the ids of the whole text.

A position is a safe cut for the Qwen pre-tokenizer (NFC, then the split regex below, then byte-level BPE per
piece) when the character before it is a digit (digits are single pieces), or a letter/mark followed by an ASCII
character that is not a letter (a letter run ends there whatever comes next). ASCII characters never compose
with their neighbour under NFC, and no split regex alternative looks past such a boundary. A cut inside an added
(special) token's text is skipped. Tokenizers with another normalizer or pre-tokenizer are tokenized whole.

A text with no safe cut in the second half of a chunk (one long word, a run of spaces, punctuation or CJK) is cut
by characters instead: the chunk's last `CHAR_CUT_MARGIN` ids, the ones the rest of the text could change, are
dropped and read again with the next chunk, which starts where the first of them starts. BPE only ever merges
neighbours, so ids that far from the cut are those of the whole text; tests/test_state_cut.py measures this
against whole tokenizations. A count of dropped ids read over a character cut is reported as not exact.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

import regex

# The split pattern of the Qwen3.5 tokenizer (and of the tiny checkpoints built from it).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SAFE_CUT = regex.compile(
    r"(?<=\p{N})(?=[\x00-\x7f])|(?<=[\p{L}\p{M}])(?=[\x00-\x40\x5b-\x60\x7b-\x7f])", flags=regex.REVERSE
)  # searched from the end of a chunk backwards: the first match is the latest cut
# Characters handed to one tokenizer call. The slowest texts measured (CJK, one long word) take about 0.13 s per
# 64 Ki characters on one 2 GHz core; Onig's retry limit is hit only by runs of about 10 M spaces.
MAX_CALL_CHARS = 65_536
# Ids dropped before a character cut and read again with the next chunk (see tests/test_state_cut.py).
CHAR_CUT_MARGIN = 32


@dataclass(frozen=True)
class StateCut:
    """The kept ids of a state and how much of it was dropped."""

    ids: list[int]
    dropped: int  # tokens after the kept ones; exact when `dropped_exact`, else estimated from characters
    dropped_exact: bool


def cut_state(tokenizer: Any, text: str, keep: int, *, count_beyond: int) -> StateCut:
    """The first `keep` ids of `text` (tokenized without special tokens) and the number of ids dropped.

    Dropped ids are counted exactly while the state has at most `count_beyond` ids past the kept ones; past
    that they are estimated from the characters left, so work stays bounded by `keep + count_beyond` ids.
    """
    added = _cuttable_added_tokens(tokenizer)
    if added is None:
        return _whole(tokenizer, text, keep)
    read = _read(tokenizer, text, added, keep + count_beyond)
    ids = read.ids
    if read.end >= len(text):
        return StateCut(ids[:keep], len(ids) - min(keep, len(ids)), read.exact)
    rest = len(text) - read.end
    estimate = len(ids) - keep + round(rest * len(ids) / max(read.end, 1))
    return StateCut(ids[:keep], estimate, False)


def token_ids(tokenizer: Any, text: str) -> list[int]:
    """All ids of `text` (without special tokens), read in calls of at most `MAX_CALL_CHARS` characters."""
    added = _cuttable_added_tokens(tokenizer)
    if added is None or len(text) <= MAX_CALL_CHARS:
        return _ids(tokenizer, text)
    return _read(tokenizer, text, added, None).ids


@dataclass(frozen=True)
class _Read:
    ids: list[int]
    end: int  # characters read
    exact: bool  # False when a chunk was cut by characters


def _read(tokenizer: Any, text: str, added: tuple[str, ...], wanted: int | None) -> _Read:
    """Ids of `text` chunk by chunk until more than `wanted` are read (None: all of it)."""
    ids: list[int] = []
    position = 0
    exact = True
    while position < len(text) and (wanted is None or len(ids) <= wanted):
        end = _chunk_end(text, position, added)
        if end is not None:
            ids += _ids(tokenizer, text[position:end])
            position = end
            continue
        exact = False
        chunk = text[position : position + MAX_CALL_CHARS]
        encoded = tokenizer([chunk], add_special_tokens=False, return_offsets_mapping=True)
        chunk_ids, offsets = list(encoded["input_ids"][0]), encoded["offset_mapping"][0]
        restart = _restart(offsets, len(chunk_ids) - CHAR_CUT_MARGIN)
        if restart is None:  # too few ids to drop a margin: the chunk is kept whole
            ids += chunk_ids
            position += len(chunk)
        else:
            ids += chunk_ids[:restart]
            position += offsets[restart][0]
    return _Read(ids, position, exact)


def _chunk_end(text: str, position: int, added: tuple[str, ...]) -> int | None:
    """Where the chunk from `position` ends: the text's end or the latest safe cut in the chunk's second half;
    None when the chunk must be cut by characters."""
    limit = position + MAX_CALL_CHARS
    if limit >= len(text):
        return len(text)
    for match in _SAFE_CUT.finditer(text, position + MAX_CALL_CHARS // 2, limit):
        if not _inside_added_token(text, match.start(), added):
            return match.start()
    return None


def _restart(offsets: list[tuple[int, int]], first: int) -> int | None:
    """The first id at or after `first` that starts a new character (a multi-byte character may span ids),
    past the chunk's first id."""
    for index in range(max(first, 1), len(offsets)):
        if offsets[index][0] >= offsets[index - 1][1] and offsets[index][0] > 0:
            return index
    return None


def _whole(tokenizer: Any, text: str, keep: int) -> StateCut:
    ids = _ids(tokenizer, text)
    return StateCut(ids[:keep], len(ids) - min(keep, len(ids)), True)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer([text], add_special_tokens=False)["input_ids"][0])


def _inside_added_token(text: str, position: int, added: tuple[str, ...]) -> bool:
    for token in added:
        start = text.find(token, max(0, position - len(token) + 1), position + len(token) - 1)
        if start != -1 and start < position < start + len(token):
            return True
    return False


_CUTTABLE: weakref.WeakKeyDictionary[Any, tuple[str, ...] | None] = weakref.WeakKeyDictionary()


def _cuttable_added_tokens(tokenizer: Any) -> tuple[str, ...] | None:
    """The added tokens' texts when this tokenizer can be cut safely, else None (tokenize whole)."""
    try:
        return _CUTTABLE[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weakly referable: inspect every time
        return _inspect(tokenizer)
    found = _CUTTABLE[tokenizer] = _inspect(tokenizer)
    return found


def _inspect(tokenizer: Any) -> tuple[str, ...] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        config = json.loads(backend.to_str())
    except Exception:  # an unknown tokenizer is simply tokenized whole
        return None
    normalizer = config.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    pre = config.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or split.get("pattern", {}).get("Regex") != QWEN_SPLIT
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex")
        or byte_level.get("add_prefix_space")
    ):
        return None
    if config.get("model", {}).get("type") != "BPE":
        return None
    return tuple(token["content"] for token in config.get("added_tokens", []))
