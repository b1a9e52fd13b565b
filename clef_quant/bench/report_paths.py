"""Where a benchmark writes its report, checked before anything is measured: a run of minutes or hours must not
end on a report it cannot write.

A report is a markdown file and, for most benchmarks, its JSON beside it (same stem, `.json`). `--out` names the
markdown; an `--out` ending in `.json` would have the JSON written over the markdown, so it is refused. Without
`--out` a report goes to bench/results/, named by the benchmark and the kind of device (`default_report`), and
`write_report` writes the two files.
"""

from __future__ import annotations

from pathlib import Path

from clef_quant.bench.errors import BenchError
from clef_quant.release_folder.outputs import check_place

JSON_SUFFIX = ".json"


def default_report(bench: str, device: str, suffix: str = ".md") -> Path:
    """bench/results/BENCH-KIND.md: a report names the kind of device it ran on (cpu, cuda), not which GPU, so its
    name holds no `:`."""
    return Path(f"bench/results/{bench}-{device.partition(':')[0]}{suffix}")


def write_report(out: Path, markdown: str, json_text: str | None = None) -> list[Path]:
    """The markdown report at `out` and, when given, its JSON beside it (same stem); the paths written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown, encoding="utf-8")
    if json_text is None:
        return [out]
    json_beside(out).write_text(json_text, encoding="utf-8")
    return [out, json_beside(out)]


def json_beside(out: Path) -> Path:
    """Where the JSON of the markdown report at `out` goes."""
    return out.with_suffix(JSON_SUFFIX)


def check_report_out(out: Path, *, with_json: bool = True) -> None:
    """Refuse, in one line, an `--out` whose report (and, `with_json`, its JSON beside it) cannot be written."""
    if with_json and out.suffix.lower() == JSON_SUFFIX:
        raise BenchError(
            f"--out {out} names the markdown report and its JSON goes beside it, so both would be one file; "
            f"give {out.with_suffix('.md')}"
        )
    for path in (out, json_beside(out)) if with_json else (out,):
        check_writable_file(path)


def check_writable_file(path: Path) -> None:
    """`path` is a regular file this process may write, or can be created as one.

    A device (/dev/full takes the open and fails every write) or a folder is refused by what it is; an existing
    file is opened for appending, which changes nothing in it; a new one needs a place where files can be made."""
    where = path.absolute()
    if where.is_dir():
        raise BenchError(f"cannot write {where}: it is a folder")
    if where.exists():
        if not where.is_file():
            raise BenchError(f"cannot write {where}: it is not a regular file")
        try:
            with where.open("ab"):
                pass
        except OSError as exc:
            raise BenchError(f"cannot write {where}: {exc.strerror}") from None
        return
    if where.is_symlink():  # dangling: writing would create a file wherever it points
        raise BenchError(f"cannot write {where}: it is a symlink to nothing")
    check_place(where)
