"""What `clef-quant bench modes` is given, read before any engine starts: each `--release` with the modes it runs
in, what `--profile`, `--serve` and `--serve-native` name, the workload and the result it starts from, and the saved
report `--append` adds to."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant.bench.errors import BenchError
from clef_quant.bench.modes import MODES, Mode, ModesResult, read_result
from clef_quant.bench.releases import check_release, row_name

if TYPE_CHECKING:
    import torch

DEFAULT_MODES = ("invariant", "batched")
# What a run added to a saved report must share with it: the same workload on the same machine.
SAME_WORKLOAD = ("machine", "records", "tokens", "questions", "max_model_len")
Release = tuple[str, Path, list[Mode]]  # row name, folder, the modes it runs in


def release_and_modes(given: str, default: list[Mode]) -> tuple[Path, list[Mode]]:
    """`FOLDER` or `FOLDER@MODE,MODE` -> the folder and the modes it runs in.

    A path that exists is a folder whatever it holds (`/tmp/a@b/flash`); otherwise only a trailing `@` followed by
    mode names splits. A trailing `@` part that names no mode is a typo when what comes before it is a folder."""
    if Path(given).exists():
        return Path(given), default
    folder, sep, names = given.rpartition("@")
    if not sep or not folder:
        return Path(given), default
    asked = names.split(",")
    unknown = [name for name in asked if name not in MODES]
    if not unknown:
        return Path(folder), [MODES[name] for name in asked]
    if Path(folder).is_dir():
        raise BenchError(f"--release {given}: unknown mode {unknown[0]!r}; choose from {', '.join(MODES)}")
    return Path(given), default


def read_releases(given: list[str], modes: list[str] | None) -> list[Release]:
    """Each `--release` checked and named by its row; `modes` (the `--mode`s) are what a release without `@MODE`
    runs in. Rows are what --profile and --serve name, so two releases with one row name are refused."""
    default = [MODES[name] for name in (modes or DEFAULT_MODES)]
    releases = []
    for text in given:
        folder, modes_of = release_and_modes(text, default)
        check_release(folder)
        releases.append((row_name(folder), folder, modes_of))
    names = [name for name, _, _ in releases]
    if len(set(names)) != len(names):
        raise BenchError(f"two releases have the same row name ({', '.join(names)}); give each scheme once")
    return releases


def profiled_pairs(profile: list[str], releases: list[Release]) -> set[tuple[str, str]]:
    """The (row, mode) pairs `--profile RELEASE:MODE` names, each a release of this run in a mode it runs in."""
    names = [name for name, _, _ in releases]
    profiled = set()
    for given in profile:
        scheme, _, mode_name = given.rpartition(":")
        if not any(name == scheme and mode_name in [m.name for m in modes] for name, _, modes in releases):
            raise BenchError(f"--profile {given}: name one of the releases ({', '.join(names)}) and one of its modes")
        profiled.add((scheme, mode_name))
    return profiled


def check_served(flag: str, served: list[str], releases: list[Release]) -> None:
    """`--serve` and `--serve-native` name rows of this run's releases."""
    names = [name for name, _, _ in releases]
    for name in served:
        if name not in names:
            raise BenchError(f"{flag} {name}: not one of the releases ({', '.join(names)})")


def starting_result(
    folder: Path, *, records: int, state_words: int, max_model_len: int, command: str, device: torch.device
) -> tuple[list[dict[str, Any]], ModesResult]:
    """The workload's request bodies and the empty result they fill, its tokens counted by the encoder of `folder`
    (the first release: every release reads the same requests)."""
    import torch
    import transformers
    import vllm

    from clef_quant.bench.environment import machine_name
    from clef_quant.bench.workload import serving_requests
    from clef_quant.formatting import utc_minute
    from clef_vllm.format.encoder import Encoder
    from clef_vllm.format.request import parse_request

    bodies = serving_requests(records, seed=0, state_words=state_words)
    encoder = Encoder(folder, max_length=max_model_len)
    result = ModesResult(
        machine=machine_name(device),
        versions=f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}",
        command=command,
        records=records,
        tokens=sum(encoder.encode(parse_request(body)).num_tokens for body in bodies),
        questions=3,
        max_model_len=max_model_len,
        date=utc_minute(),
    )
    return bodies, result


def appended(saved: Path, new: ModesResult) -> ModesResult:
    """The report saved at `saved` with `new`'s command added; refused when it is not a report of bench modes or
    measured another workload or machine."""
    if not saved.is_file():
        raise BenchError(f"--append: {saved} does not exist; run once without --append")
    old = read_result(saved)
    differing = [name for name in SAME_WORKLOAD if getattr(old, name) != getattr(new, name)]
    if differing:
        raise BenchError(f"--append: {saved} measured another {' and '.join(differing)}")
    old.command = f"{old.command}` then `{new.command}"
    return old
