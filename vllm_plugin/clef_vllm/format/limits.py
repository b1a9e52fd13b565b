"""What a server accepts: the counts of a request (`Limits`) and the characters of its schema texts.

The request models name `Limits` fields in their bounds (`wire_checks.Bound`), so /openapi.json and validation
read the same numbers; a server builds its own `Limits` from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clef_vllm.format.media import DEFAULT_MEDIA_LIMITS, MediaLimits


@dataclass(frozen=True)
class Limits:
    """Server-side limits; defaults follow the documented limits of the fastest public Clef server."""

    max_questions: int = 64
    max_choice_options: int = 256
    max_score_levels: int = 256
    min_options: int = 1  # the release and the SystemOne schema accept a one-option choice and a one-level score
    max_id_length: int = 100
    max_images: int = 8  # per request, `images` and `assets` together; 0 switches images off
    max_videos: int = 2  # per request; 0 switches videos off
    media: MediaLimits = field(default_factory=lambda: DEFAULT_MEDIA_LIMITS)

    @property
    def media_enabled(self) -> bool:
        return self.max_images > 0 or self.max_videos > 0


DEFAULT_LIMITS = Limits()

# Schema texts are refused, before they are tokenized, past this many characters per token of the maximum
# length (English runs about 4): tokenizing 12 MB of instructions only to find they do not fit took 15 s.
SCHEMA_CHARS_PER_TOKEN = 32
# Below this the exact token count is cheap and decides alone (one tokenizer call, see state_cut).
MIN_SCHEMA_CHARS = 65_536


def schema_chars_limit(max_length: int) -> int:
    """Characters a schema text, and the schema in all, may have at `max_length` tokens."""
    return max(SCHEMA_CHARS_PER_TOKEN * max_length, MIN_SCHEMA_CHARS)
