"""A small Qwen3.5-style tokenizer, trained here in a fraction of a second, for random-weight checkpoints.

The tokenizer class is the one transformers uses for Qwen3.5 (`Qwen3_5Tokenizer`): byte-level BPE behind
Qwen's pre-tokenizer split and NFC normalization, so any string encodes and unicode round-trips. That class
rebuilds its own pipeline from the vocabulary and merges when it loads, so the trainer below runs through the
very same normalizer and pre-tokenizer, taken from an empty instance of the class rather than restated here.

The training text is generated from a fixed seed (English, the Clef prompt scaffolding, compact JSON, digits,
punctuation and some non-ASCII), so the vocabulary, and every file written from it, is the same on every run.
The Qwen special tokens are appended after the learned vocabulary, as in the real tokenizer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

# Control tokens, in this order right after the learned vocabulary. `<think>`/`</think>` are plain added
# tokens (never split, but not "special": decoding with skip_special_tokens keeps them), as in Qwen.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
THINK_TOKENS = ("<think>", "</think>")
# Qwen3-Omni's audio placeholders, after the others, in Omni tokenizers only.
AUDIO_TOKENS = ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>")
# The names under which Qwen3-Omni's processor (transformers' processing_qwen3_omni_moe.py, Qwen3OmniMoeProcessor)
# looks its placeholders up on the tokenizer.
OMNI_TOKEN_NAMES = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Learned tokens (including the 256 byte symbols); the added tokens come on top.
LEARNED_VOCAB_SIZE = 2000
# What the real Qwen3.5 tokenizer declares.
MODEL_MAX_LENGTH = 262144
_CORPUS_SEED = 20261202
_CORPUS_LINES = 4000

CHAT_TEMPLATE = """\
{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif part['type'] == 'video' or 'video' in part -%}
<|vision_start|><|video_pad|><|vision_end|>
{%- elif 'text' in part -%}
{{ part['text'] }}
{%- endif -%}
{%- endfor -%}
{%- endif %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking -%}
<think>

</think>

{% else -%}
<think>
{% endif -%}
{%- endif -%}
"""

_ENGLISH = (
    "Read the complete state and schema. Decide every field jointly.",
    "Each answer must be exactly one of that field's allowed options.",
    "The proposition is true or the answer is yes.",
    "The proposition is false or the answer is no.",
    "The customer asked for a refund after the package arrived damaged.",
    "Please review the attached invoice and confirm the total amount.",
    "The weather in the mountains changed quickly, so the hikers turned back early.",
    "A short summary of the meeting was sent to everyone on the team.",
    "Is the message spam, a phishing attempt, or a legitimate request?",
    "Rate the answer from 0 (useless) to 4 (excellent), considering accuracy and tone.",
    "The model reads the whole record once and scores every option in a single pass.",
    "Images and videos are described by the vision tower before the text is read.",
    "This request was flagged because the account was created less than a day ago.",
    "She said: \"I don't think that's right\", and he replied: 'we'll see.'",
    "The server returned an error; retry the request later or contact support.",
    "Which category fits best: billing, shipping, account access, or something else?",
    "Quantized weights keep the answers close to the original model's decisions.",
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "Every user message should be answered politely, clearly and without delay.",
    "Temperature, humidity and wind speed were recorded every ten minutes.",
)
_SCAFFOLD = (
    "<|im_start|>system\n",
    "<|im_end|>\n<|im_start|>user\nSTATE:\n",
    "\n\nSCHEMA FIELDS:\n",
    "\nALLOWED OPTIONS:\n",
    "END FIELD\n",
    "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:",
)
# Vocabulary for the generated text, kept as plain text (split once below).
_WORD_TEXT = """
account action address age amount answer approved billing category city comment country created currency customer
date description email error event flag id items label language level message name note option order price priority
quantity reason region request review risk score status subject summary tags text title total type user value
verified weight
"""
_UNICODE_TEXT = (
    "café|naïve|Zürich|straße|façade|São Paulo|Ελληνικά|русский язык|日本語のテキスト|中文字符|한국어|العربية|हिन्दी"
    "|emoji 🙂 👍 🚀|≤ ≥ ≠ ± × ÷|— – … « » „ “ ”|€ £ ¥ ₹|Ωmega|piñata|Ångström|crème brûlée|Dvořák|Łódź|İstanbul"
)
_PUNCTUATION_TEXT = "() [] {} <> !? ... -- -> => :: ; / \\ | && || # @ % ^ * + = ~ ` $ _"
_WORDS = tuple(_WORD_TEXT.split())
_UNICODE = tuple(_UNICODE_TEXT.split("|"))
_PUNCTUATION = tuple(_PUNCTUATION_TEXT.split())


def _json_value(rng: random.Random, depth: int) -> object:
    kind = rng.randrange(8 if depth < 2 else 6)
    if kind == 0:
        return rng.randrange(-1000, 100000)
    if kind == 1:
        return round(rng.uniform(-100, 1000), rng.randrange(1, 4))
    if kind == 2:
        return rng.choice((True, False, None))
    if kind == 3:
        return " ".join(rng.choices(_WORDS, k=rng.randrange(1, 5)))
    if kind == 4:
        return rng.choice(_UNICODE)
    if kind == 5:
        return rng.choice(_ENGLISH)
    if kind == 6:
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(_WORDS): _json_value(rng, depth + 1) for _ in range(rng.randrange(1, 4))}


def _corpus_line(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:
        return " ".join(rng.choices(_ENGLISH, k=rng.randrange(1, 3)))
    if kind == 1:
        record = {rng.choice(_WORDS): _json_value(rng, 0) for _ in range(rng.randrange(1, 6))}
        # The release renders JSON compactly with sorted keys; pretty-printed text shows up in states too.
        if rng.random() < 0.7:
            return json.dumps(record, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        return json.dumps(record, ensure_ascii=False, indent=2)
    if kind == 2:
        number = rng.randrange(1, 40)
        option = json.dumps(
            {"description": rng.choice(_ENGLISH), "option_id": rng.choice(_WORDS)},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        return (
            f"\nFIELD {number}\nID: {rng.choice(_WORDS)}_{number}\nTYPE: {rng.choice(('noul', 'choice', 'score'))}"
            f"\nINSTRUCTION: {rng.choice(_ENGLISH)}{rng.choice(_SCAFFOLD)}OPTION {rng.randrange(1, 9)}: {option}\n"
        )
    if kind == 3:
        year, month, day = rng.randrange(1990, 2031), rng.randrange(1, 13), rng.randrange(1, 29)
        return (
            f"{year}-{month:02d}-{day:02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z "
            f"{rng.randrange(10**9)} {rng.uniform(0, 1):.4f} +{rng.randrange(1, 99)} "
            f"({rng.randrange(100, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
        )
    if kind == 4:
        return " ".join(rng.choices(_UNICODE, k=rng.randrange(1, 4))) + " " + rng.choice(_ENGLISH)
    if kind == 5:
        words = rng.choices(_WORDS, k=rng.randrange(2, 6))
        return "".join(w + rng.choice(_PUNCTUATION) for w in words)
    return rng.choice(_SCAFFOLD) + rng.choice(_ENGLISH)


def training_corpus() -> Iterator[str]:
    """The built-in training text: the same lines, in the same order, on every call."""
    rng = random.Random(_CORPUS_SEED)
    for _ in range(_CORPUS_LINES):
        yield _corpus_line(rng)


def build_tokenizer(learned_vocab_size: int = LEARNED_VOCAB_SIZE, audio: bool = False) -> Qwen3_5Tokenizer:
    """Train the BPE vocabulary and wrap it as transformers' Qwen3.5 tokenizer with the Qwen control tokens (and,
    with `audio`, Qwen3-Omni's audio placeholders and the token names its processor reads)."""
    # Take Qwen3.5's normalizer and pre-tokenizer from the class itself so training splits text exactly as the
    # loaded tokenizer will.
    pipeline = Qwen3_5Tokenizer().backend_tokenizer
    trainee = Tokenizer(models.BPE())
    trainee.normalizer = pipeline.normalizer
    trainee.pre_tokenizer = pipeline.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=learned_vocab_size,
        min_frequency=2,
        show_progress=False,
        # All 256 byte symbols, so that any string (any byte) has an encoding.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    trainee.train_from_iterator(training_corpus(), trainer=trainer)
    model = json.loads(trainee.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]

    # The class starts with `<|endoftext|>` as its unk/eos/pad token, which makes it the first added token;
    # the eos moves to `<|im_end|>` only after all control tokens have their ids, so they keep the listed order.
    named = {"model_specific_special_tokens": OMNI_TOKEN_NAMES} if audio else {}
    tokenizer = Qwen3_5Tokenizer(vocab=model["vocab"], merges=merges, model_max_length=MODEL_MAX_LENGTH, **named)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    if audio:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in AUDIO_TOKENS], special_tokens=True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tokenizer.eos_token = EOS_TOKEN
    tokenizer.pad_token = PAD_TOKEN
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def token_ids(tokenizer: Qwen3_5Tokenizer) -> dict[str, int]:
    """Ids of the control tokens, by token text."""
    added = tokenizer.get_added_vocab()
    return {t: added[t] for t in (*SPECIAL_TOKENS, *THINK_TOKENS, *AUDIO_TOKENS) if t in added}
