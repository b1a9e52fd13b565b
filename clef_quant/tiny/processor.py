"""The tokenizer and processor files of a random-weight release: what `AutoProcessor` loads to expand image and
video placeholders, plus the tokenizer files and `chat_template.jinja`."""

from __future__ import annotations

from pathlib import Path

from clef_quant.tiny.tokenizer import build_tokenizer, token_ids

# Qwen's image and video processor settings (Qwen3-VL and Qwen3.5 releases ship these).
IMAGE_PROCESSOR = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
VIDEO_PROCESSOR = {
    "size": {"shortest_edge": 4096, "longest_edge": 25165824},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def write_tokenizer_and_processor(folder: Path, audio: bool = False) -> dict[str, int]:
    """Tokenizer files, `chat_template.jinja` and `processor_config.json`; returns the control-token ids.

    With `audio` (Clef-Omni) the processor is Qwen3-Omni's, which adds a Whisper feature extractor for audio."""
    # Imported here: the image processor needs torchvision, which counting parameters does not.
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3OmniMoeProcessor,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
        WhisperFeatureExtractor,
    )

    tokenizer = build_tokenizer(audio=audio)
    images = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, **IMAGE_PROCESSOR)
    videos = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, **VIDEO_PROCESSOR)
    if audio:
        processor = Qwen3OmniMoeProcessor(
            image_processor=images,
            video_processor=videos,
            # 128 mel bins, as the Omni audio tower's num_mel_bins.
            feature_extractor=WhisperFeatureExtractor(feature_size=128),
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
        )
    else:
        processor = Qwen3VLProcessor(
            image_processor=images, video_processor=videos, tokenizer=tokenizer, chat_template=tokenizer.chat_template
        )
    processor.save_pretrained(folder)
    return token_ids(tokenizer)
