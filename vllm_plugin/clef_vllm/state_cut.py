"""Tokenize a state only as far as the model can read it, with exactly the ids a whole-state tokenization gives.

The release tokenizes the whole state and keeps its first `keep` ids. A 12 MB state would then cost seconds of
tokenization and gigabytes of Python lists for ids the model never sees. Here the text is cut first, at a
character position where the tokenizer's own pre-tokenizer always splits, so the ids of the cut text are a
prefix of the ids of the whole text; the cut moves further out (geometrically) until it yields enough ids.

A position is a safe cut for the Qwen pre-tokenizer (NFC, then the split regex below, then byte-level BPE per
piece) when the character before it is a digit (digits are single pieces), or a letter/mark followed by an ASCII
character that is not a letter (a letter run ends there whatever comes next). ASCII characters never compose
with their neighbour under NFC, and no split regex alternative looks past such a boundary. A cut inside an added
(special) token's text is skipped. Tokenizers with another normalizer or pre-tokenizer are tokenized whole.
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
_SAFE_CUT = regex.compile(r"(?<=\p{N})(?=[\x00-\x7f])|(?<=[\p{L}\p{M}])(?=[\x00-\x40\x5b-\x60\x7b-\x7f])")
# A first guess of characters per token; the cut grows by FACTOR until it holds enough tokens.
CHARS_PER_TOKEN_GUESS = 4
MIN_CUT_CHARS = 4096
GROWTH = 4


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
    wanted = keep + count_beyond
    added = _cuttable_added_tokens(tokenizer)
    if added is None:
        return _whole(tokenizer, text, keep)
    chars = max(MIN_CUT_CHARS, wanted * CHARS_PER_TOKEN_GUESS)
    while True:
        cut = _safe_cut(text, chars, added)
        ids = _ids(tokenizer, text[:cut])
        if cut >= len(text):
            return StateCut(ids[:keep], len(ids) - min(keep, len(ids)), True)
        if len(ids) > wanted:
            rest = len(text) - cut
            estimate = len(ids) - keep + round(rest * len(ids) / max(cut, 1))
            return StateCut(ids[:keep], estimate, False)
        chars = max(cut + 1, int(cut * GROWTH))


def _whole(tokenizer: Any, text: str, keep: int) -> StateCut:
    ids = _ids(tokenizer, text)
    return StateCut(ids[:keep], len(ids) - min(keep, len(ids)), True)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer([text], add_special_tokens=False)["input_ids"][0])


def _safe_cut(text: str, chars: int, added: tuple[str, ...]) -> int:
    """The first safe cut at or after `chars` (the end of the text if there is none)."""
    if chars >= len(text):
        return len(text)
    for match in _SAFE_CUT.finditer(text, pos=chars):
        position = match.start()
        if not _inside_added_token(text, position, added):
            return position
    return len(text)


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
