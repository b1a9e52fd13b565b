"""`--engine-arg KEY=VALUE`: any vLLM engine argument, passed through by every command that starts an engine.

KEY is a field of vLLM's `EngineArgs` (`gpu_memory_utilization`, `kv_cache_memory_bytes`, `gdn_prefill_backend`,
`compilation_config`, ...); VALUE is read as JSON when it parses (numbers, `true`, objects) and as text otherwise.
The arguments that make an engine a Clef engine are the plugin's, and those a command has its own flag for are
refused with that flag's name, so each setting has one way in. A few no Clef engine takes at all (`REFUSED`) are
refused with the reason, and `quantization` only where it names the folder's own method.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clef_vllm.errors import CheckpointError, SettingsError
from clef_vllm.format.release_config import read_release_config

FLAG = "--engine-arg"
HELP = (
    "a vLLM engine argument, KEY=VALUE, repeatable (e.g. gpu_memory_utilization=0.5, gdn_prefill_backend=triton, "
    "compilation_config='{\"max_cudagraph_capture_size\": 2048}'); VALUE is read as JSON when it parses"
)

# What the plugin sets to run the joint schema head; changing any of them breaks the engine or its answers.
PLUGIN_OWNED = ("model", "runner", "pooler_config", "hf_overrides", "enable_prefix_caching", "dtype", "convert")

# Engine arguments no Clef engine takes, whatever their value, and why.
REFUSED = {
    "trust_remote_code": "a Clef release never needs code of its own (clef-quant inspect fails a folder holding "
    "any), and with it vLLM would run the .py files of the release folder",
    "pipeline_parallel_size": "a Clef engine runs no pipeline parallelism (the joint schema head reads the last "
    "hidden states of the whole model in one rank); use tensor or data parallelism",
}

# Engine arguments that most commands expose as flags of their own (clef-systemone's are its settings' fields,
# `EngineSettings.own_flags`).
COMMON_FLAGS = {"max_model_len": "--max-model-len", "enforce_eager": "--enforce-eager"}


def engine_arg_names() -> frozenset[str]:
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(field.name for field in dataclasses.fields(EngineArgs))


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, value); VALUE as JSON when it parses, else the text itself."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise SettingsError(f"{FLAG} takes KEY=VALUE, not {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def engine_overrides(items: Sequence[str], flags: Mapping[str, str] = COMMON_FLAGS) -> dict[str, Any]:
    """The engine arguments `items` ask for, checked against vLLM's `EngineArgs`; `flags` maps the keys the command
    has its own flag for to that flag."""
    overrides: dict[str, Any] = {}
    known: frozenset[str] | None = None
    for text in items:
        key, value = parse_engine_arg(text)
        if key in PLUGIN_OWNED:
            raise SettingsError(f"{FLAG} {key}=... is set by clef-vllm to run the joint schema head")
        if key in REFUSED:
            raise SettingsError(f"{FLAG} {key}=... is refused: {REFUSED[key]}")
        if key in flags:
            raise SettingsError(f"{FLAG} {key}=...: use {flags[key]}")
        known = known or engine_arg_names()
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SettingsError(f"{FLAG}: vLLM has no engine argument {key!r}{hint}")
        if key in overrides:
            raise SettingsError(f"{FLAG} {key} is given twice")
        overrides[key] = value
    return overrides


def refuse_engine_keys(keys: Iterable[str]) -> None:
    """`SettingsError` for an engine argument no Clef engine takes (`ClefEngine`'s keywords meet this too)."""
    for key in keys:
        if key in REFUSED:
            raise SettingsError(f"engine argument {key} is refused: {REFUSED[key]}")


def check_quantization(model: str | Path, quantization: Any) -> None:
    """Refuse an engine's `quantization` that is not the release folder's own method: on a bf16 folder vLLM would
    quantize the weights as it loads them (online quantization), which is no Clef release and none the project has
    evaluated; on a quantized folder vLLM reads the method from its config.json."""
    if quantization is None:
        return
    try:
        stored = read_release_config(model).quantization_config
    except CheckpointError:
        return  # a Hub id, or a folder vLLM will report itself
    method = stored.quant_method if stored is not None else None
    given = f"quantization={json.dumps(quantization)}"
    if not method:
        raise SettingsError(
            f"{given}: {model} is a bf16 release, and vLLM would quantize it as it loads (online quantization), "
            "which is not a Clef release; make a quantized release with clef-quant quantize and serve that folder"
        )
    if str(quantization).replace("_", "-") != str(method).replace("_", "-"):
        raise SettingsError(
            f"{given}: {model} is quantized with {method} (its config.json's quantization_config); leave "
            "quantization out, vLLM reads the method from the folder"
        )
