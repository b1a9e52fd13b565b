"""The one way clef-quant writes a folder (`release_folder.staged_folder`), as make-tiny and build-data users meet
it: complete or absent after Ctrl-C or SIGTERM, never touching a `.partial` another live run writes, and readable
by other users whatever the umask. (quantize's runs through the same code are covered in test_quantize_integrity.)
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clef_quant.release_folder.errors import Interrupted
from clef_quant.release_folder.staged import staged_folder
from clef_quant.release_folder.writer import OWNER_FILE, Writer, boot_id, process_start_ticks

DRIVER = Path(__file__).with_name("hold_driver.py")
FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
REACH_LIMIT_S = 180.0
# Each run is held inside its staged folder, after some files are written: the head (make-tiny) comes after the
# backbone, the summary (build-data) after every JSONL file.
COMMANDS = {
    "make-tiny": ("clef_quant.tiny.build:write_head", lambda out: ["make-tiny", str(out)]),
    "build-data": (
        "clef_quant.evaluation.build:write_json_atomic",
        lambda out: ["build-data", "--out", str(out), "--source", str(FIXTURES), "--per-task", "2", "--task", "boolq"],
    ),
}


def start_held(control: Path, command: str, out: Path) -> subprocess.Popen:
    target, args = COMMANDS[command]
    control.mkdir()
    run = [sys.executable, str(DRIVER), str(control), target, "--", *args(out)]
    process = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + REACH_LIMIT_S
    while not (control / "reached").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run never reached the held call"
        time.sleep(0.05)
    return process


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_run_leaves_no_folder(tmp_path: Path, command: str, sig: signal.Signals) -> None:
    out = tmp_path / "out"
    process = start_held(tmp_path / "control", command, out)
    try:
        partial = tmp_path / "out.partial"
        assert len(list(partial.rglob("*"))) > 1  # something to clean up
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + sig, stderr
    assert f"interrupted by {sig.name}" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control"]


def test_make_tiny_never_removes_a_partial_a_live_run_writes(tmp_path: Path, live_process) -> None:
    from typer.testing import CliRunner

    from clef_quant.cli import app

    partial = tmp_path / "tiny.partial"
    partial.mkdir()
    writer = Writer(live_process.pid, process_start_ticks(live_process.pid), boot_id(), socket.gethostname())
    (partial / OWNER_FILE).write_text(writer.to_json())
    (partial / "model.safetensors").write_bytes(b"half")
    result = CliRunner().invoke(app, ["make-tiny", str(tmp_path / "tiny")], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert f"{partial} is being written by process {live_process.pid}; wait for it or stop it" in result.stderr
    assert (partial / "model.safetensors").read_bytes() == b"half" and not (tmp_path / "tiny").exists()


def test_files_are_0644_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        with staged_folder(tmp_path / "out", command="test") as partial:
            (partial / "sub").mkdir()
            (partial / "sub" / "a.jsonl").write_text("{}\n")
            (partial / "b.json").write_text("{}\n")
    finally:
        os.umask(previous)
    out = tmp_path / "out"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["b.json", "sub", "sub/a.jsonl"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()} == {0o644}
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE((out / "sub").stat().st_mode) == 0o755


def test_signal_handlers_are_restored_after_the_block(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted), staged_folder(tmp_path / "out", command="test") as partial:
        (partial / "a").write_text("x")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at once; never reached
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before
