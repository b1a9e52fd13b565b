"""What `clef-quant bench modes` is given, read before any engine starts: each `--release` with the modes it runs
in, and the saved report `--append` adds to."""

from __future__ import annotations

from pathlib import Path

from clef_quant.bench.errors import BenchError
from clef_quant.bench.modes import MODES, Mode, ModesResult, read_result

# What a run added to a saved report must share with it: the same workload on the same machine.
SAME_WORKLOAD = ("machine", "records", "tokens", "questions", "max_model_len")


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
