"""The one way clef-quant writes a folder (`release_folder.staged_folder`), as make-tiny and build-data users meet
it: complete or absent after Ctrl-C or SIGTERM, never touching a `.partial` another live run writes, and readable
by other users whatever the umask. (quantize's runs through the same code are covered in test_quantize_integrity.)
"""

from __future__ import annotations

import json
import os
import shutil
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


# -- what a release folder may hold: regular files only, no code passing as a notice, manifests that parse -------


def run_cli(*args: object):
    from typer.testing import CliRunner

    from clef_quant.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """Files outside every release: what a planted symlink would make a reader (or an upload) read."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "x.py").write_text("import os\n")
    (folder / "LICENSE").write_text("someone else's secret\n")
    return folder


def test_quantize_follows_no_symlink_out_of_the_source_and_carries_no_code_as_a_notice(
    tiny_dir: Path, tmp_path: Path, elsewhere: Path
) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_dir, source)
    (source / "LICENSE").symlink_to(elsewhere / "LICENSE")
    (source / "lib").symlink_to(elsewhere, target_is_directory=True)
    (source / "NOTICE").write_text("#!/bin/sh\necho carried as a notice\n")
    (source / "COPYING").write_text("Plain licence text.\n")
    out = tmp_path / "out"

    # --include names the links: it carries a file on purpose, never whatever a link points at.
    result = run_cli(
        "quantize", source, "--scheme", "fp8-dynamic", "--out", out, "--include", "LICENSE", "--include", "lib/*"
    )

    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert any(f"LICENSE -> {elsewhere / 'LICENSE'}" in w and f"lib -> {elsewhere}" in w for w in warnings), warnings
    assert any("left out of the release" in w and "NOTICE" in w for w in warnings), warnings
    assert not any((out / name).exists() or (out / name).is_symlink() for name in ("LICENSE", "lib", "NOTICE")), sorted(
        p.name for p in out.iterdir()
    )
    assert (out / "COPYING").read_text() == "Plain licence text.\n"
    assert "someone else's secret" not in "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    inspected = run_cli("inspect", out)
    assert inspected.exit_code == 0, inspected.output  # the output passes its own inspect


@pytest.mark.parametrize("inside", [False, True], ids=["outside", "inside"])
def test_quantize_refuses_a_head_folder_behind_a_symlink_in_one_line(
    tiny_dir: Path, tmp_path: Path, inside: bool
) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_dir, source)
    heads = source / "heads" if inside else tmp_path / "heads"
    heads.mkdir()
    for name in ("joint_head.safetensors", "joint_head_config.json"):
        shutil.move(source / name, heads / name)
    (source / "clef_head").symlink_to(heads, target_is_directory=True)
    out = tmp_path / "out"

    result = run_cli("quantize", source, "--scheme", "fp8-dynamic", "--out", out)

    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.stderr.splitlines() == [
        f"error: {source / 'clef_head'} is a symlink to {heads}; quantize follows no symlink to a folder: copy the "
        f"head's files into {source} (at its root)"
    ]
    assert not out.exists()


def plant_code_link(folder: Path, elsewhere: Path) -> tuple[str, str]:
    (folder / "evil.py").symlink_to(elsewhere / "x.py")
    return "evil.py", f"a symlink (to {elsewhere / 'x.py'})"


def plant_folder_link(folder: Path, elsewhere: Path) -> tuple[str, str]:
    (folder / "lib").symlink_to(elsewhere, target_is_directory=True)
    return "lib", f"a symlink (to {elsewhere})"


def swap_listed_file_for_a_link(folder: Path, elsewhere: Path) -> tuple[str, str]:
    """The same bytes, behind a link: every hash would match, but what is read is not the release's file."""
    shutil.move(folder / "tokenizer.json", elsewhere / "tokenizer.json")
    (folder / "tokenizer.json").symlink_to(elsewhere / "tokenizer.json")
    return "tokenizer.json", f"a symlink (to {elsewhere / 'tokenizer.json'})"


def plant_code_pipe(folder: Path, elsewhere: Path) -> tuple[str, str]:
    """A reader that opens it blocks, or reads whatever a writer at the other end sends."""
    os.mkfifo(folder / "evil.py")
    return "evil.py", "a named pipe (FIFO)"


def plant_socket(folder: Path, elsewhere: Path) -> tuple[str, str]:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "s.py"))
    sock.close()
    return "s.py", "a socket"


@pytest.mark.parametrize(
    "plant", [plant_code_link, plant_folder_link, swap_listed_file_for_a_link, plant_code_pipe, plant_socket]
)
def test_inspect_and_upload_fail_on_anything_but_regular_files(
    quantized_dir, tmp_path: Path, elsewhere: Path, plant
) -> None:
    folder = tmp_path / "release"
    shutil.copytree(quantized_dir("fp8-dynamic"), folder)
    name, what = plant(folder, elsewhere)

    inspected = run_cli("inspect", folder, "--json")
    assert inspected.exit_code == 1, inspected.output
    report = json.loads(inspected.stdout)
    found = [v for v in report["violations"] if v["subject"] == name]
    assert [v["message"] for v in found] == [f"{what}; a release holds regular files only"]
    assert {c["name"]: c["status"] for c in report["checks"]}["manifest hashes"] == "fail"

    uploaded = run_cli("upload", folder, "--repo-id", "someone/clef-tiny", "--dry-run")
    assert uploaded.exit_code == 2 and "Traceback" not in uploaded.output
    assert f"refused: {name}: {what}" in uploaded.stderr
    assert "would commit" not in uploaded.stdout


def test_a_deeply_nested_manifest_is_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "release"
    shutil.copytree(tiny_dir, folder)
    (folder / "clef_quant.json").write_text("[" * 5000 + "]" * 5000)

    uploaded = run_cli("upload", folder, "--repo-id", "someone/clef-tiny", "--dry-run")
    assert uploaded.exit_code == 2 and "Traceback" not in uploaded.output, uploaded.output
    expected = "is not valid JSON: JSON nested more than 64 levels deep (line 1 column 65)"
    assert uploaded.stderr.splitlines() == [f"error: {folder / 'clef_quant.json'} {expected}"]
    inspected = run_cli("inspect", folder, "--json")
    assert inspected.exit_code == 1, inspected.output
    (violation,) = [v for v in json.loads(inspected.stdout)["violations"] if v["subject"] == "clef_quant.json"]
    assert "nested more than 64 levels deep" in violation["message"]
