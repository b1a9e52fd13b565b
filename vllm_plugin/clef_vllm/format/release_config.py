"""A release's `config.json`, typed: the parts the tools read of it, and its `quantization_config` as
compressed-tensors writes it (config groups with targets and quantization arguments, an ignore list, a KV-cache
scheme).

Every reader of `config.json` in clef-quant and clef-vllm goes through `read_release_config`, so the file is read
once per change and a broken one is refused in one line naming it, in the same words everywhere. A config holds
many keys no tool here reads: every section keeps them (`extra="allow"`), and `document()` gives the file as
parsed. The fields named here are checked strictly (a JSON string is no integer), as the manifest's are.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from clef_vllm.errors import CheckpointError, RequestError, first_validation_error, not_valid_json
from clef_vllm.format.release_source import BACKBONE_CONFIG
from clef_vllm.format.strict_json import check_depth

COMPRESSED_TENSORS = "compressed-tensors"

# Frozen: one parsed config is shared by every reader of the same file (the cache below).
_SECTION = ConfigDict(extra="allow", frozen=True)


def _empty_as_none(value: Any) -> Any:
    # compressed-tensors writes null for arguments a scheme does not have; `{}` has meant the same to every reader.
    return None if value == {} else value


class QuantizationArgs(BaseModel):
    """compressed-tensors' `QuantizationArgs` of weights, input or output activations, or the KV cache."""

    model_config = _SECTION

    num_bits: StrictInt | None = None
    type: StrictStr | None = None  # "int" or "float"
    strategy: StrictStr | None = None  # "tensor", "channel", "group", "tensor_group", "block", "token"
    group_size: StrictInt | None = None
    block_structure: list[StrictInt] | None = None
    symmetric: StrictBool | None = None
    dynamic: StrictBool | StrictStr | None = None  # True, False or "local" (per-group scales of a global one)

    @property
    def is_fp4(self) -> bool:
        """4-bit floats (NVFP4's E2M1)."""
        return self.type == "float" and self.num_bits == 4

    def as_dict(self) -> dict[str, Any]:
        """The arguments as the file writes them (only its keys, others included), for code that reads them by key
        like compressed-tensors' own dumps (`quantize.schemes.scheme_label`)."""
        return self.model_dump(exclude_unset=True)


class QuantizationGroup(BaseModel):
    """One of `config_groups`: the modules it targets and how their weights and activations are stored."""

    model_config = _SECTION

    targets: list[StrictStr] = []
    weights: QuantizationArgs | None = None
    input_activations: QuantizationArgs | None = None
    output_activations: QuantizationArgs | None = None
    format: StrictStr | None = None  # the group's compressor; None: the config's `format`

    _none_is_empty = field_validator("targets", mode="before")(lambda value: [] if value is None else value)
    _no_args = field_validator("weights", "input_activations", "output_activations", mode="before")(_empty_as_none)

    @property
    def stores_fp4_weights(self) -> bool:
        return self.weights is not None and self.weights.is_fp4

    @property
    def weight_only(self) -> bool:
        """Activations stay bf16 (NVFP4A16, W4A16)."""
        return self.input_activations is None

    def written_args(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(weights, input activations) as the file writes them, None where the group has none."""
        weights, inputs = self.weights, self.input_activations
        return (weights.as_dict() if weights else None, inputs.as_dict() if inputs else None)


class QuantizationConfig(BaseModel):
    """`quantization_config`; its groups, ignore list and KV-cache scheme are compressed-tensors' (another method's
    keys are kept unread)."""

    model_config = _SECTION

    quant_method: StrictStr | None = None
    format: StrictStr | None = None
    config_groups: dict[str, QuantizationGroup] = {}
    ignore: list[StrictStr] = []  # names and `re:` patterns of modules left bf16
    kv_cache_scheme: QuantizationArgs | None = None

    _no_groups = field_validator("config_groups", mode="before")(lambda value: {} if value is None else value)
    _no_ignore = field_validator("ignore", mode="before")(lambda value: [] if value is None else value)
    _no_args = field_validator("kv_cache_scheme", mode="before")(_empty_as_none)

    @property
    def is_compressed_tensors(self) -> bool:
        return self.quant_method == COMPRESSED_TENSORS

    @property
    def groups(self) -> list[QuantizationGroup]:
        return list(self.config_groups.values())

    @property
    def stores_fp4_weights(self) -> bool:
        """Whether any group stores 4-bit float weights (NVFP4, NVFP4A16)."""
        return any(group.stores_fp4_weights for group in self.config_groups.values())


class TextConfig(BaseModel):
    """What is read of the text model's config (also the top level of a text-only model's config)."""

    model_config = _SECTION

    hidden_size: StrictInt | None = None
    num_hidden_layers: StrictInt | None = None
    layer_types: list[StrictStr] | None = None  # Qwen3.5: "linear_attention" (Gated DeltaNet) or "full_attention"
    num_experts: StrictInt | None = None  # routed experts of a MoE text model


class ThinkerConfig(BaseModel):
    """Qwen3-Omni's `thinker_config`: the part that understands (text, audio, vision), which Clef-Omni keeps."""

    model_config = _SECTION

    text_config: TextConfig | None = None


class ReleaseConfig(TextConfig):
    """A release's `config.json`."""

    architectures: list[StrictStr] = []  # the transformers classes; the first is the one loaded
    model_type: StrictStr | None = None
    text_config: TextConfig | None = None  # a vision-language model's (Qwen3.5)
    thinker_config: ThinkerConfig | None = None  # Qwen3-Omni's
    # None for a bf16 release: no key, null, or `{}` (how some tools write "not quantized").
    quantization_config: QuantizationConfig | None = None

    _document: dict[str, Any] = PrivateAttr(default_factory=dict)
    _none_is_empty = field_validator("architectures", mode="before")(lambda value: [] if value is None else value)
    _not_quantized = field_validator("quantization_config", mode="before")(_empty_as_none)

    @property
    def text(self) -> TextConfig:
        """The text model's part: `thinker_config.text_config` (Omni), `text_config` (Qwen3.5) or the config itself
        (a text-only model)."""
        if self.thinker_config is not None and self.thinker_config.text_config is not None:
            return self.thinker_config.text_config
        return self.text_config if self.text_config is not None else self

    @property
    def stores_fp4_weights(self) -> bool:
        return self.quantization_config is not None and self.quantization_config.stores_fp4_weights

    @property
    def has_routed_experts(self) -> bool:
        """Whether any (nested) model config has routed experts: Omni keeps them in `thinker_config.text_config`,
        and other models elsewhere, so every nested object is looked at, not only the text config."""
        return _has_experts(self._document)

    def document(self) -> dict[str, Any]:
        """The whole file as parsed (a copy: the parsed config is shared), for code that copies it on."""
        return copy.deepcopy(self._document)


def _has_experts(config: Mapping[str, Any]) -> bool:
    count = config.get("num_experts")
    if isinstance(count, (int, float)) and not isinstance(count, bool) and count > 0:
        return True
    return any(isinstance(value, Mapping) and _has_experts(value) for value in config.values())


def release_config(data: ReleaseConfig | Mapping[str, Any], where: str = BACKBONE_CONFIG) -> ReleaseConfig:
    """`data` typed: a `ReleaseConfig` as it is, a mapping (a `config.json` already parsed, a transformers config's
    `to_dict()`) validated; `CheckpointError` naming `where` for one of another shape."""
    if isinstance(data, ReleaseConfig):
        return data
    if not isinstance(data, Mapping):
        raise CheckpointError(f"{where} is not a model config: a JSON {type(data).__name__}, not an object")
    try:
        config = ReleaseConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise CheckpointError(f"{where}: {first_validation_error(exc)}") from None
    config._document = copy.deepcopy(dict(data))  # the caller keeps its own
    return config


# One parse per file version: starting an engine asks five questions of one config.json, inspect four. A version is
# the file's stat taken after reading it; a file changed within the second before is not kept, so a rewrite that
# leaves its size and times as they were (timestamps move in ticks of a few milliseconds) is never answered from here.
_CACHE: dict[Path, tuple[tuple[int, ...], ReleaseConfig]] = {}
_CACHE_SIZE = 64
_SETTLED_NS = 1_000_000_000


def read_release_config(folder: str | Path) -> ReleaseConfig:
    """The `config.json` of a release folder, typed. `CheckpointError`, one line naming the file, for a folder
    without one, a file that cannot be read, is not JSON or not the shape of a model config."""
    path = Path(folder) / BACKBONE_CONFIG
    if not path.is_file():
        raise CheckpointError(f"{folder} is not a release folder: it has no {BACKBONE_CONFIG}")
    key = path.absolute()
    cached = _CACHE.get(key)
    try:
        if cached is not None and cached[0] == _version(path):
            return cached[1]
        raw = path.read_bytes()
        version = _version(path)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    config = release_config(_parse(raw, path), where=str(path))
    if time.time_ns() - max(version[2], version[3]) > _SETTLED_NS:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (version, config)
    return config


def _version(path: Path) -> tuple[int, ...]:
    stat = path.stat()
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _parse(raw: bytes, path: Path) -> Any:
    # In the words of every other file the tools read (`clef_quant.documents.parse_json`), nesting limited first:
    # Python's parser recurses, and a file nested thousands deep would end in a RecursionError.
    try:
        check_depth(raw)
    except RequestError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc.message.rsplit(': ', 1)[-1]}") from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(not_valid_json(str(path), exc)) from None
