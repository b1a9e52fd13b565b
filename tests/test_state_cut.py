"""The state is tokenized only as far as it can be kept, with exactly the ids of a whole-state tokenization."""

from __future__ import annotations

import json
import random
import time
import tracemalloc

import pytest

from clef_vllm import state_cut
from clef_vllm.encoding import encode_request, render
from clef_vllm.request import parse_request
from clef_vllm.state_cut import cut_state


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
    # Start with tiny cuts so that every text is cut, regrown and cut again at many places.
    monkeypatch.setattr(state_cut, "MIN_CUT_CHARS", 1)
    monkeypatch.setattr(state_cut, "CHARS_PER_TOKEN_GUESS", 1)
    monkeypatch.setattr(state_cut, "GROWTH", 1.3)
    full = whole_ids(tokenizer, text)
    for beyond in (0, 5, 10**6):
        cut = cut_state(tokenizer, text, keep, count_beyond=beyond)
        assert cut.ids == full[:keep]
        if cut.dropped_exact:
            assert cut.dropped == len(full) - len(cut.ids)
        else:
            assert len(full) - keep > beyond
            assert cut.dropped > beyond
    assert cut_state(tokenizer, text, keep, count_beyond=10**6).dropped_exact


def test_a_12_mb_state_is_encoded_like_a_short_one(tokenizer):
    """Tokenization work and memory follow what the model can read, not the body's size."""
    rng = random.Random(0)
    sentence = " ".join(rng.choice(["card", "refund", "blocked", "abroad", "fee"]) for _ in range(400))
    huge = (sentence + "\n") * (12_000_000 // (len(sentence) + 1))
    request = parse_request({"model": "m", "state": huge, "questions": {"q": {"type": "noul"}}})
    small = parse_request({"model": "m", "state": huge[:200_000], "questions": {"q": {"type": "noul"}}})

    encode_request(small, tokenizer, max_length=16384)  # warm caches
    start = time.perf_counter()
    reference = encode_request(small, tokenizer, max_length=16384)
    small_seconds = time.perf_counter() - start
    tracemalloc.start()
    start = time.perf_counter()
    encoding = encode_request(request, tokenizer, max_length=16384)
    huge_seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    assert encoding.input_ids == reference.input_ids
    assert encoding.num_tokens == 16384
    assert not encoding.state_tokens_dropped_exact
    # ~2.4 M tokens dropped: the estimate is within a few percent of the truth measured on a 1/12 slice.
    per_char = len(whole_ids(tokenizer, huge[:1_000_000])) / 1_000_000
    assert encoding.state_tokens_dropped == pytest.approx(len(huge) * per_char - encoding.state_tokens, rel=0.05)
    assert huge_seconds < 3 * small_seconds + 0.5
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
