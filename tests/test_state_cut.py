"""The state is tokenized only as far as it can be kept, with exactly the ids of a whole-state tokenization."""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import Any

import pytest

from clef_vllm.format import state_cut
from clef_vllm.format.encoding import encode_request
from clef_vllm.format.request import parse_request
from clef_vllm.format.state_cut import cut_state
from clef_vllm.format.text import render


class CountingTokenizer:
    """A tokenizer that records the characters of every call it is given (the work a cut does), and is otherwise
    the tokenizer it wraps."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls: list[int] = []

    def __call__(self, texts: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(len(texts) if isinstance(texts, str) else sum(len(t) for t in texts))
        return self.tokenizer(texts, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def whole_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer([text], add_special_tokens=False)["input_ids"][0])


def texts() -> list[tuple[str, str]]:
    rng = random.Random(7)
    words = ["card", "refund", "ünïcode", "naïve", "e\u0301t\u0301e", "日本語のテキスト", "Ωmega", "x²", "don't"]
    words += ["I'LL"]
    pieces = [" ", "  ", "\n", "\r\n", "\t", ",", ".", "...", '"', "'s", "-", "123", "4.5e6", "<|im_end|>"]
    pieces += ["<think>", "🙂"]

    def mixed(n: int) -> str:
        return "".join(rng.choice(words) if rng.random() < 0.6 else rng.choice(pieces) for _ in range(n))

    record = {"ticket": 7, "text": mixed(300), "tags": [mixed(3) for _ in range(50)], "n": list(range(400))}
    return [
        ("mixed", mixed(3000)),
        ("json", render(record)),
        ("digits", ",".join(str(rng.randrange(10**9)) for _ in range(2000))),
        ("whitespace runs", "".join(rng.choice(["word", " " * rng.randrange(1, 9), "\n\n", "x"]) for _ in range(3000))),
        ("special tokens", "<|im_end|>".join(mixed(20) for _ in range(200))),
        ("one long word", "a" * 20000 + " tail 1 2 3"),
        ("marks", "".join(rng.choice(["e\u0301", "a\u0308", "n", "\u0301", "1", " ", "Å"]) for _ in range(8000))),
        ("cjk", "".join(rng.choice(["日本", "語", "。", "，", "1", "a"]) for _ in range(6000))),
    ]


TEXTS = texts()


@pytest.mark.parametrize(("name", "text"), TEXTS, ids=[name for name, _ in TEXTS])
@pytest.mark.parametrize("keep", [0, 1, 17, 300, 1000, 5000, 100000])
def test_kept_ids_are_the_whole_tokenization_cut(tokenizer, monkeypatch, name, text, keep):
    # Short chunks, so that every text is cut and read on at many places.
    monkeypatch.setattr(state_cut, "MAX_CALL_CHARS", 700)
    full = whole_ids(tokenizer, text)
    for beyond in (0, 5, 10**6):
        cut = cut_state(tokenizer, text, keep, count_beyond=beyond)
        assert cut.ids == full[:keep]
        if cut.dropped_exact:
            assert cut.dropped == len(full) - len(cut.ids)
        elif len(full) - keep > beyond:
            assert cut.dropped > beyond
    exact = cut_state(tokenizer, text, keep, count_beyond=10**6)
    assert exact.dropped == len(full) - len(exact.ids)
    assert exact.dropped_exact == (name != "one long word")  # its 20,000 letters have no safe cut


def no_split_texts() -> list[tuple[str, str]]:
    """Texts in which the pre-tokenizer has no safe cut for thousands of characters."""
    rng = random.Random(3)

    def pick(choices, n: int) -> str:
        return "".join(rng.choice(choices) for _ in range(n))

    n = 40_000
    return [
        ("one letter", "a" * n),
        ("spaces then a letter", " " * n + "a"),
        ("cjk", pick("日本語の文字列テキスト漢字。、「」", n)),
        ("cjk and accents", pick(["日本", "語", "。", "，", "ü", "é"], n)),
        ("punctuation", pick("!?.,;:-_()[]{}*&^%$#@", n)),
        ("accented letters", pick("éüñçàÅøæ", n)),
        ("marks", pick(["e\u0301", "a\u0308", "\u0301", "n\u0303"], n // 2)),
        ("emoji", pick("🙂🚀🎉✨💡", n)),
        ("whitespace", pick([" ", "\n", "\t", "\r\n"], n)),
        ("special tokens in a word", "a" * 3000 + "<|im_end|>" + "b" * 3000 + "<think>" + "c" * 3000),
    ]


NO_SPLIT = no_split_texts()


@pytest.mark.parametrize(("name", "text"), NO_SPLIT, ids=[name for name, _ in NO_SPLIT])
@pytest.mark.parametrize("chunk", [1000, 3000, 7777])
def test_texts_without_a_split_point_are_cut_by_characters_with_the_whole_ids(
    tokenizer, monkeypatch, name, text, chunk
):
    """The margin: 4 ids were enough on every one of these texts, so 32 are dropped before a character cut."""
    monkeypatch.setattr(state_cut, "MAX_CALL_CHARS", chunk)
    calls = []

    def counted(texts, **kwargs):
        calls.append(sum(len(t) for t in texts))
        return tokenizer(texts, **kwargs)

    counted.backend_tokenizer = tokenizer.backend_tokenizer  # type: ignore[attr-defined]
    full = whole_ids(tokenizer, text)
    assert state_cut.token_ids(counted, text) == full
    keep = len(full) // 3
    cut = cut_state(counted, text, keep, count_beyond=100)
    assert cut.ids == full[:keep]
    assert not cut.dropped_exact
    assert cut.dropped == pytest.approx(len(full) - keep, rel=0.05)
    assert max(calls) <= chunk


@pytest.mark.parametrize("text", ["a" * 12_000_000, " " * 12_000_000 + "a"], ids=["12M-letters", "12M-spaces"])
def test_a_12_mb_state_without_a_split_point_is_read_in_short_calls(tokenizer, text):
    """The whole of the spaces makes the tokenizer's regex engine panic; the letters take seconds in one call."""
    counted = CountingTokenizer(tokenizer)
    cut = cut_state(counted, text, 16384, count_beyond=16384)
    assert len(cut.ids) == 16384
    assert not cut.dropped_exact
    per_char = len(whole_ids(tokenizer, text[:100_000])) / 100_000
    assert cut.dropped == pytest.approx(len(text) * per_char - 16384, rel=0.05)
    # Short calls (the time of one is bounded by its length: state_cut.MAX_CALL_CHARS says how), and only as
    # many as the kept and counted ids need, not the whole 12 MB.
    assert max(counted.calls) <= state_cut.MAX_CALL_CHARS
    assert sum(counted.calls) < len(text) / 10


def test_a_12_mb_state_is_encoded_like_a_short_one(tokenizer):
    """Tokenization work and memory follow what the model can read, not the body's size."""
    rng = random.Random(0)
    sentence = " ".join(rng.choice(["card", "refund", "blocked", "abroad", "fee"]) for _ in range(400))
    huge = (sentence + "\n") * (12_000_000 // (len(sentence) + 1))
    request = parse_request({"model": "m", "state": huge, "questions": {"q": {"type": "noul"}}})
    small = parse_request({"model": "m", "state": huge[:200_000], "questions": {"q": {"type": "noul"}}})

    small_work = CountingTokenizer(tokenizer)
    reference = encode_request(small, small_work, max_length=16384)
    huge_work = CountingTokenizer(tokenizer)
    tracemalloc.start()
    encoding = encode_request(request, huge_work, max_length=16384)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    assert encoding.input_ids == reference.input_ids
    assert encoding.num_tokens == 16384
    assert not encoding.state_tokens_dropped_exact
    # ~2.4 M tokens dropped: the estimate is within a few percent of the truth measured on a 1/12 slice.
    per_char = len(whole_ids(tokenizer, huge[:1_000_000])) / 1_000_000
    assert encoding.state_tokens_dropped == pytest.approx(len(huge) * per_char - encoding.state_tokens, rel=0.05)
    # The same tokenizer work as the 200 KB state (at most one more call's characters), 60 times the body.
    assert sum(huge_work.calls) <= sum(small_work.calls) + state_cut.MAX_CALL_CHARS
    assert peak < 100 * 1024 * 1024  # tokenizing the whole state took gigabytes


def test_json_states_cut_exactly_through_encode_request(tokenizer):
    state = {"rows": [{"id": i, "text": f"row {i} with words"} for i in range(150)]}
    request = parse_request({"model": "m", "state": state, "questions": {"q": {"type": "noul"}}})
    encoding = encode_request(request, tokenizer, max_length=2048)
    full = whole_ids(tokenizer, json.dumps(state, separators=(",", ":"), sort_keys=True, ensure_ascii=False))
    start = len(whole_ids(tokenizer, encode_request.__globals__["PREFIX"]))
    assert encoding.input_ids[start : start + encoding.state_tokens] == full[: encoding.state_tokens]
    assert encoding.state_tokens_dropped == len(full) - encoding.state_tokens
    assert encoding.state_tokens_dropped_exact


def test_other_tokenizers_are_tokenized_whole(tokenizer):
    class Plain:
        def __call__(self, texts, *, add_special_tokens):
            return tokenizer(texts, add_special_tokens=add_special_tokens)

    text = "word " * 5000
    cut = cut_state(Plain(), text, 10, count_beyond=0)
    assert cut.ids == whole_ids(tokenizer, text)[:10]
    assert cut.dropped_exact and cut.dropped == len(whole_ids(tokenizer, text)) - 10
