"""Everything `clef-systemone` is started with, declared once.

Each field of `ServeConfig` that carries a `Setting` is one command-line flag: the flag's name, type, default,
help and bounds all come from the field, and `clef-systemone`'s parser is generated from these fields
(`server/cli.py`). Adding a setting is adding a field here. The bounds hold for a config built in Python too:
a value out of bounds raises `SettingsError` naming the flag, whoever built the config.

Defaults that belong to another object (the request limits, the connection limits, the maximum length) are read
from that object, so each default has one home.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

from clef_vllm.engine.options import FLAG as ENGINE_ARG_FLAG
from clef_vllm.engine.options import HELP as ENGINE_ARG_HELP
from clef_vllm.errors import SettingsError
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.format.request import DEFAULT_LIMITS, Limits
from clef_vllm.server.connections import ConnectionLimits

API_KEY_ENV = "CLEF_SYSTEMONE_API_KEY"
MEDIA_GROUP = "images and videos"
KIB = 1024
MIB = 1024 * KIB
_CONNECTIONS = ConnectionLimits()
_SETTING = "clef_setting"


@dataclass(frozen=True)
class Setting:
    """How one field is given on the command line, and the values it may take."""

    help: str
    flag: str | None = None  # default --field-name, or --no-field-name for a switch that is on by default
    group: str | None = None  # a titled section of --help
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    env: str | None = None  # read when the flag is not given
    show_default: bool = True  # False where the help says what the default is


def setting(default: Any = dataclasses.MISSING, /, help: str = "", **how: Any) -> Any:
    """A `ServeConfig` field that is also a flag; without a default the flag is required."""
    return field(default=default, metadata={_SETTING: Setting(help, **how)})


def setting_of(config_field: dataclasses.Field[Any]) -> Setting | None:
    return config_field.metadata.get(_SETTING)


def flag_of(config_field: dataclasses.Field[Any]) -> str:
    """The flag that sets `config_field`."""
    how = setting_of(config_field)
    if how is not None and how.flag:
        return how.flag
    name = config_field.name.replace("_", "-")
    return f"--no-{name}" if config_field.default is True else f"--{name}"


def out_of_bounds(config_field: dataclasses.Field[Any], value: Any) -> str | None:
    """Why `value` is refused for `config_field` (one line naming the flag), or None when it is within bounds."""
    how = setting_of(config_field)
    if how is None or value is None or isinstance(value, bool):
        return None
    flag = flag_of(config_field)
    if how.at_least is not None and value < how.at_least:
        return f"{flag} must be >= {how.at_least:g}, not {value}"
    if how.above is not None and value <= how.above:
        return f"{flag} must be > {how.above:g}, not {value}"
    if how.at_most is not None and value > how.at_most:
        return f"{flag} must be at most {how.at_most:g}, not {value}"
    return None


@dataclass(frozen=True)
class ServeConfig:
    """Everything `clef-systemone` is started with: the flags (fields with a `Setting`), and the request limits
    that have no flag."""

    model: str = setting(help="release folder, or a Hub id (ORG/NAME) when the Hub is reachable")
    served_model_name: str | None = setting(
        None,
        help="name reported by /v1/models and echoed when a request has no model (default: the model card's "
        "name, else the folder's name, else the Hub id)",
    )
    host: str = setting("127.0.0.1", help="address to bind (127.0.0.1: loopback only)", show_default=False)
    port: int = setting(8000, help="port to listen on", at_least=0, at_most=65535)
    api_key: str | None = setting(
        None, help=f"require 'Authorization: Bearer KEY' (or set {API_KEY_ENV})", env=API_KEY_ENV
    )
    # A cap under 1 KiB would refuse every request: the smallest useful body is about 60 bytes, a real one more.
    max_body_mb: float = setting(
        13.0, help="larger bodies get 413; counted after decompression; at least 1 KiB", at_least=KIB / MIB
    )
    header_timeout: float = setting(
        _CONNECTIONS.header_timeout, help="seconds for a request's headers to arrive, else 408 and close", above=0
    )
    body_timeout: float = setting(
        _CONNECTIONS.body_timeout, help="seconds for a request's whole body to arrive, else 408 and close", above=0
    )
    idle_timeout: float = setting(5.0, help="seconds an idle keep-alive connection stays open", at_least=0)
    max_connections: int = setting(
        _CONNECTIONS.max_connections, help="open connections beyond this get 503 and are closed", at_least=1
    )
    max_model_len: int = setting(
        DEFAULT_MAX_LENGTH, help="longest prompt in tokens, media tokens included; the state is cut to fit", at_least=1
    )
    tensor_parallel_size: int = setting(
        1,
        help="tensor parallel ranks per engine; answers then move by about 0.01 from one rank's (the ranks' bf16 "
        "partial sums are added), and on a CPU each rank needs a core of its own",
        flag="--tp",
        at_least=1,
    )
    data_parallel_size: int = setting(
        1,
        help="whole engines behind one port (one per GPU; on a CPU, cores of their own), each giving one engine's "
        "answers",
        flag="--dp",
        at_least=1,
    )
    # One whole prompt per engine step: the same request gets the same bits whatever else is in flight.
    # Answers that do not move with load (clef_vllm.engine.invariance: batch-invariant kernels on a GPU, one prompt per
    # step on a CPU).
    batch_invariant: bool = setting(
        True,
        help="let vLLM batch and split prompts freely (--max-num-seqs, --max-num-batched-tokens): probabilities then "
        "move in the third decimal with what else is in flight. By default answers never depend on load: on a GPU "
        "vLLM batches whole prompts with its batch-invariant kernels, on a CPU each step runs one whole prompt",
    )
    max_num_seqs: int | None = setting(
        None,
        help="prompts per engine step (default: vLLM's on a GPU, 1 on a CPU, where more need --no-batch-invariant)",
    )
    max_num_batched_tokens: int | None = setting(
        None,
        help="tokens per engine step (default: the larger of 16384 and --max-model-len on a GPU, --max-model-len on "
        "a CPU; lower values need --no-batch-invariant)",
    )
    enforce_eager: bool = setting(
        False, help="skip graph capture and compilation (on a GPU both are on by default; a CPU starts faster without)"
    )
    engine_arg: tuple[str, ...] = setting((), help=ENGINE_ARG_HELP, flag=ENGINE_ARG_FLAG, show_default=False)
    limit_images: int = setting(
        DEFAULT_LIMITS.max_images,
        help="images per request, assets included; 0 refuses images",
        group=MEDIA_GROUP,
        at_least=0,
    )
    limit_videos: int = setting(
        DEFAULT_LIMITS.max_videos, help="videos per request; 0 refuses videos", group=MEDIA_GROUP, at_least=0
    )
    max_image_pixels: int = setting(
        DEFAULT_LIMITS.media.max_image_pixels,
        help="pixels per image or video frame, checked before decoding",
        group=MEDIA_GROUP,
        at_least=1,
    )
    max_video_frames: int = setting(
        DEFAULT_LIMITS.media.max_video_frames, help="frames per video after sampling", group=MEDIA_GROUP, at_least=1
    )
    language_model_only: bool = setting(
        False, help="text only: refuse images and videos and do not load the vision tower", group=MEDIA_GROUP
    )
    # The request limits no flag sets (questions, options, ids, per-video sizes); the media flags override theirs.
    request_limits: Limits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        for config_field in dataclasses.fields(self):
            problem = out_of_bounds(config_field, getattr(self, config_field.name))
            if problem is not None:
                raise SettingsError(problem)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * MIB)

    @property
    def limits(self) -> Limits:
        """What a request may hold: `request_limits` with the media flags applied."""
        media = replace(
            self.request_limits.media, max_image_pixels=self.max_image_pixels, max_video_frames=self.max_video_frames
        )
        if self.language_model_only:
            return replace(self.request_limits, max_images=0, max_videos=0, media=media)
        return replace(self.request_limits, max_images=self.limit_images, max_videos=self.limit_videos, media=media)

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(self.header_timeout, self.body_timeout, self.max_connections)

    def _schedule(self) -> dict[str, Any]:
        return {
            "max_model_len": self.max_model_len,
            "batch_invariant": self.batch_invariant,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }

    def _parallel(self) -> dict[str, int]:
        return {"tensor_parallel_size": self.tensor_parallel_size, "data_parallel_size": self.data_parallel_size}

    def engine_overrides(self) -> dict[str, Any]:
        """The `--engine-arg` settings; the engine arguments this server has a flag for are refused there."""
        from clef_vllm.engine.options import server_engine_overrides

        return server_engine_overrides(self.engine_arg)

    def check(self) -> None:
        """Raise `SettingsError` for contradicting settings, before anything is loaded."""
        from clef_vllm.engine.invariance import invariance_method, uses_gpu
        from clef_vllm.engine.settings import schedule_args

        schedule_args(**self._schedule(), method=invariance_method(uses_gpu(), self.model))
        self.check_ranks()

    def check_ranks(self) -> None:
        """Raise `SettingsError` where a CPU cannot give every rank (`--tp` x `--dp`) cores of its own."""
        from clef_vllm.engine.cpu.threads import machine_binding, parallel_ranks
        from clef_vllm.engine.invariance import uses_gpu

        ranks = parallel_ranks({**self._parallel(), **self.engine_overrides()})
        if ranks > 1 and not uses_gpu():
            machine_binding(ranks)

    def engine_kwargs(self) -> dict[str, Any]:
        from clef_vllm.engine.settings import engine_args

        return engine_args(
            self.model,
            limits=self.limits,
            **self._parallel(),
            served_model_name=self.served_model_name,
            **self._schedule(),
            **({"enforce_eager": True} if self.enforce_eager else {}),
            **self.engine_overrides(),
        )
