"""`EngineSettings`: everything a Clef engine starts with, as one typed object.

Each field is one flag (`clef_vllm.engine.flags`): `clef-systemone`'s parser and `--help` are generated from these
fields (with the server's own in `ServeConfig`, which extends this class), `vllm_kwargs()` gives vLLM's keyword
arguments, and `command_line()` the flags that start a server with these settings. Every command that starts an
engine or a server builds one, so no flag is spelled out anywhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clef_vllm.engine.flags import check_bounds, command_line, flag_of, setting, setting_of
from clef_vllm.engine.options import FLAG as ENGINE_ARG_FLAG
from clef_vllm.engine.options import HELP as ENGINE_ARG_HELP
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH
from clef_vllm.format.limits import DEFAULT_LIMITS, Limits

MEDIA_GROUP = "images and videos"
# vLLM engine arguments that the media flags set together.
MEDIA_ENGINE_ARGS = {"limit_mm_per_prompt": ("limit_images", "limit_videos")}


@dataclass(frozen=True)
class EngineSettings:
    """One engine's settings: the release, the scheduling that keeps answers independent of load, parallelism,
    `--engine-arg` pass-through and the media a request may hold."""

    model: str = setting(help="release folder, or a Hub id (ORG/NAME) when the Hub is reachable")
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
    # Answers that do not move with load (clef_vllm.engine.invariance): whole prompts per step on a GPU with
    # kernels whose reductions do not follow the step's size, one prompt per step on a CPU.
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
    prompt_chunk: int | None = setting(
        None,
        help="where each step runs one prompt (a CPU): run prompts longer than N tokens in pieces of N, one piece a "
        "step, requests in flight taking turns, so that a short request waits for a piece instead of a whole long "
        "prompt. Answers still never depend on load; those of prompts over N tokens differ slightly from the whole "
        "prompt's. Text only (with --language-model-only). --max-num-seqs is then how many requests are in flight "
        "(default 8, or what the KV cache holds)",
        at_least=16,
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
    # Engine arguments given in Python (`ClefEngine`'s keywords), passed to vLLM as they are, after everything
    # else; `--engine-arg` is the command line's way in.
    python_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_bounds(self)

    @classmethod
    def from_keywords(cls, model: str | Path, *, limits: Limits = DEFAULT_LIMITS, **keywords: Any) -> EngineSettings:
        """Settings from `ClefEngine`'s keywords: those that are fields here set them, `limits` sets the request
        and media limits, the rest are engine arguments passed as they are."""
        names = {f.name for f in dataclasses.fields(cls) if setting_of(f) is not None} - {"model", "engine_arg"}
        fields = {key: keywords.pop(key) for key in list(keywords) if key in names}
        media = {
            "limit_images": limits.max_images,
            "limit_videos": limits.max_videos,
            "max_image_pixels": limits.media.max_image_pixels,
            "max_video_frames": limits.media.max_video_frames,
        }
        return cls(model=str(model), request_limits=limits, **{**media, **fields}, python_args=keywords)

    @classmethod
    def from_engine_args(cls, model: str | Path, engine_arg: Sequence[str] = (), **fields: Any) -> EngineSettings:
        """Settings for a command with fewer flags than `clef-systemone` (eval, score, the benchmarks): its
        `--engine-arg` values for keys that are fields here (`max_num_seqs=4`) go to those fields, the rest stay
        engine arguments; keys the command has a flag for (`fields`' names) are refused with that flag."""
        from clef_vllm.engine.options import COMMON_FLAGS, engine_overrides, parse_engine_arg

        engine_overrides(engine_arg, {**COMMON_FLAGS, **{name: cls.flag(name) for name in fields}})
        names = {f.name for f in dataclasses.fields(cls) if setting_of(f) is not None}
        moved: dict[str, Any] = {}
        kept: list[str] = []
        for text in engine_arg:
            key, value = parse_engine_arg(text)
            if key in names:
                moved[key] = value
            else:
                kept.append(text)
        return cls(model=str(model), engine_arg=tuple(kept), **fields, **moved)

    @classmethod
    def flag(cls, name: str) -> str:
        """The flag of the field `name`."""
        return flag_of(next(f for f in dataclasses.fields(cls) if f.name == name))

    @classmethod
    def own_flags(cls) -> dict[str, str]:
        """The vLLM engine arguments these settings have a flag for, each with its flag: given as `--engine-arg`
        they are refused, naming the flag."""
        flags = {f.name: flag_of(f) for f in dataclasses.fields(cls) if setting_of(f) is not None}
        flags.pop("engine_arg")
        flags.pop("model")
        for key, names in MEDIA_ENGINE_ARGS.items():
            flags[key] = " and ".join(flags[name] for name in names)
        return flags

    def for_model(self, model: str | Path) -> EngineSettings:
        """The same settings for another release (eval and the benchmarks start one engine per release)."""
        return replace(self, model=str(model))

    @property
    def limits(self) -> Limits:
        """What a request may hold: `request_limits` with the media flags applied."""
        media = replace(
            self.request_limits.media, max_image_pixels=self.max_image_pixels, max_video_frames=self.max_video_frames
        )
        if self.language_model_only:
            return replace(self.request_limits, max_images=0, max_videos=0, media=media)
        return replace(self.request_limits, max_images=self.limit_images, max_videos=self.limit_videos, media=media)

    def schedule(self) -> dict[str, Any]:
        return {
            "max_model_len": self.max_model_len,
            "batch_invariant": self.batch_invariant,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "prompt_chunk": self.prompt_chunk,
        }

    def parallel(self) -> dict[str, int]:
        return {"tensor_parallel_size": self.tensor_parallel_size, "data_parallel_size": self.data_parallel_size}

    def engine_overrides(self) -> dict[str, Any]:
        """The `--engine-arg` settings; the engine arguments that have a flag here are refused there."""
        from clef_vllm.engine.options import engine_overrides

        return engine_overrides(self.engine_arg, self.own_flags())

    def check(self) -> None:
        """Raise `SettingsError` for contradicting settings, before anything is loaded."""
        from clef_vllm.engine.invariance import invariance_method, uses_gpu
        from clef_vllm.engine.settings import check_text_pieces, schedule_args

        schedule_args(**self.schedule(), method=invariance_method(uses_gpu(), self.model))
        check_text_pieces(self.prompt_chunk, self.limits)
        self.check_ranks()

    def check_ranks(self) -> None:
        """Raise `SettingsError` where a CPU cannot give every rank (`--tp` x `--dp`) cores of its own."""
        from clef_vllm.engine.cpu.threads import machine_binding, parallel_ranks
        from clef_vllm.engine.invariance import uses_gpu

        ranks = parallel_ranks({**self.parallel(), **self.engine_overrides()})
        if ranks > 1 and not uses_gpu():
            machine_binding(ranks)

    def vllm_kwargs(self) -> dict[str, Any]:
        """vLLM's keyword arguments for an engine with these settings."""
        from clef_vllm.engine.settings import engine_args

        return engine_args(
            self.model,
            limits=self.limits,
            **self.parallel(),
            **self.schedule(),
            **({"enforce_eager": True} if self.enforce_eager else {}),
            **self.engine_overrides(),
            **self.python_args,
        )

    def offline_kwargs(self) -> dict[str, Any]:
        """`ClefEngine`'s keywords for these settings: the fields away from their defaults, then the engine
        arguments (so an engine's recorded settings name only what was asked for)."""
        given = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "prompt_chunk": self.prompt_chunk,
            "tensor_parallel_size": self.tensor_parallel_size if self.tensor_parallel_size != 1 else None,
            "data_parallel_size": self.data_parallel_size if self.data_parallel_size != 1 else None,
            "enforce_eager": True if self.enforce_eager else None,
        }
        return {
            "max_model_len": self.max_model_len,
            "limits": self.limits,
            "batch_invariant": self.batch_invariant,
            **{key: value for key, value in given.items() if value is not None},
            **self.engine_overrides(),
            **self.python_args,
        }

    def command_line(self) -> list[str]:
        """The flags that start `clef-systemone` (or a command with the same flags) with these settings."""
        return command_line(self)
