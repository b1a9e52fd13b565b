"""Who writes `DIR.partial`: one run per output folder, and no run ever removes another's live work.

A run (quantize, make-tiny, build-data, card's staging folder) claims its `.partial` by creating it with a writer
marker inside (`.clef_quant_writer`: PID, the process' start time in clock ticks since boot, the boot id and the
host name). The marker stays until the finished folder is renamed to `DIR`, so a `.partial` always names its
writer. A later run removes a leftover `.partial` only when that writer is provably gone: no process has its PID,
or the process with that PID started at another time (the PID was reused), or the machine has rebooted since.
Anything it cannot prove (a marker from another host, a non-empty `.partial` without a marker) is refused with the
command to remove it by hand.

Claiming, reclaiming and the final rename each run under an exclusive `flock` on the output's parent folder, so
two runs never both see a folder as free: the kernel drops the lock when its holder dies, and the lock is held for
milliseconds, never across the slow part.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clef_quant.release_folder.errors import ReleaseFolderError
from clef_quant.release_folder.outputs import check_replaceable

PARTIAL_SUFFIX = ".partial"
OWNER_FILE = ".clef_quant_writer"


@dataclass(frozen=True)
class Writer:
    pid: int
    start_ticks: int | None  # /proc/<pid>/stat field 22; None where /proc is not there
    boot_id: str | None
    host: str

    def to_json(self) -> str:
        return json.dumps(
            {"pid": self.pid, "start_ticks": self.start_ticks, "boot_id": self.boot_id, "host": self.host}
        )

    @classmethod
    def parse(cls, text: str) -> Writer | None:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError):  # a marker nested too deep is no marker
            return None
        if isinstance(data, int) and data > 0:  # a bare PID
            return cls(data, None, None, socket.gethostname())
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int) or data["pid"] <= 0:
            return None
        start = data.get("start_ticks")
        boot = data.get("boot_id")
        host = data.get("host")
        return cls(
            data["pid"],
            start if isinstance(start, int) else None,
            boot if isinstance(boot, str) else None,
            host if isinstance(host, str) else socket.gethostname(),
        )

    def describe(self) -> str:
        return f"process {self.pid}" + (f" on {self.host}" if self.host != socket.gethostname() else "")


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot; None when it does not exist (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count fields after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def this_writer() -> Writer:
    pid = os.getpid()
    return Writer(pid, process_start_ticks(pid), boot_id(), socket.gethostname())


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_gone(writer: Writer) -> bool:
    """True only when `writer` provably no longer runs."""
    if writer.host != socket.gethostname():
        return False
    current_boot = boot_id()
    if writer.boot_id is not None and current_boot is not None and writer.boot_id != current_boot:
        return True
    if not _pid_exists(writer.pid):
        return True
    if writer.start_ticks is None:
        return False  # a live process has that PID, and nothing says it is another one
    start = process_start_ticks(writer.pid)
    if start is None:
        return not _pid_exists(writer.pid)  # it may have ended since the first look
    return start != writer.start_ticks  # the PID now belongs to a process that started at another time


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` itself (no lock file left behind), released on exit or death."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def partial_of(out: Path) -> Path:
    return out.with_name(out.name + PARTIAL_SUFFIX)


def read_writer(partial: Path) -> Writer | None:
    try:
        return Writer.parse((partial / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def claim(partial: Path, *, command: str, out: Path | None = None, overwrite: bool = False) -> None:
    """Create `partial` with this process' marker; reclaim one whose writer is provably gone; else refuse.

    `out`, when given, is the folder `partial` will become: it must not exist unless `overwrite`. `command` names
    the kind of run in messages ("quantize", "make-tiny", ...)."""
    try:
        partial.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(partial.parent):
            if out is not None:
                check_replaceable(out, command, overwrite)
            if partial.exists() or partial.is_symlink():
                _reclaim(partial, command)
            partial.mkdir()
            marker = partial / OWNER_FILE
            tmp = partial / f"{OWNER_FILE}.tmp"
            tmp.write_text(this_writer().to_json(), encoding="utf-8")
            os.replace(tmp, marker)  # the marker is whole or absent, never half written
    except OSError as exc:  # a parent that is a regular file, a read-only disk, /proc
        raise ReleaseFolderError(f"cannot create {partial}: {exc.strerror or exc}") from None


def _reclaim(partial: Path, command: str) -> None:
    by_hand = f"remove it by hand (rm -r {partial}) if no {command} is writing it"
    if partial.is_symlink() or not partial.is_dir():
        raise ReleaseFolderError(f"{partial} is in the way and is not a folder a {command} run made; {by_hand}")
    writer = read_writer(partial)
    if writer is None:
        leftovers = [p.name for p in partial.iterdir() if p.name != f"{OWNER_FILE}.tmp"]
        if leftovers:
            raise ReleaseFolderError(f"{partial} exists and names no writer; {by_hand}")
    elif writer.pid == os.getpid() or not writer_gone(writer):
        raise ReleaseFolderError(f"{partial} is being written by {writer.describe()}; wait for it or stop it")
    remove_partial(partial)


def remove_partial(partial: Path) -> None:
    """Remove a `.partial`, its marker last, so a run killed half-way still leaves a marker naming a dead writer."""
    if not partial.is_dir():
        return
    for child in partial.iterdir():
        if child.name == OWNER_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    (partial / OWNER_FILE).unlink(missing_ok=True)
    try:
        partial.rmdir()
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)


def publish(partial: Path, out: Path, overwrite: bool) -> Path | None:
    """Rename the finished `partial` to `out` (an old `out` moved aside first when overwriting); drop the marker.
    Returns the moved-aside old folder for the caller to remove once `out` is in place."""
    old: Path | None = None
    with folder_lock(out.parent):
        if out.exists():
            if not overwrite:
                raise ReleaseFolderError(f"{out} appeared while this run was writing; pass --overwrite to replace it")
            old = out.with_name(f"{out.name}.old-{os.getpid()}")
            out.rename(old)
        partial.rename(out)
        (out / OWNER_FILE).unlink(missing_ok=True)
    return old
