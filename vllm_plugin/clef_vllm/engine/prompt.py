"""What the engine runs for one encoded request."""

from __future__ import annotations

from typing import Any

from clef_vllm.format.encoding import Encoding


def engine_prompt(encoding: Encoding) -> Any:
    """What the engine runs: for media, the ids with unexpanded placeholders plus the decoded media and the processor
    settings of the model (`clef_vllm.format.media_encoding`), which vLLM's own processor expands into exactly
    `encoding.input_ids` (checked on every output)."""
    from vllm import TokensPrompt

    if not encoding.multi_modal_data:
        return TokensPrompt(prompt_token_ids=encoding.input_ids)
    prompt = TokensPrompt(prompt_token_ids=encoding.prompt_ids, multi_modal_data=encoding.multi_modal_data)
    if encoding.mm_processor_kwargs:
        prompt["mm_processor_kwargs"] = encoding.mm_processor_kwargs
    return prompt
