"""Release integrity through the CLI as a user runs it: only what belongs in a release is carried, `inspect` never
passes a folder that is unfinished, holds unvetted code or has a broken manifest, and two runs on one output never
harm each other, in every order a test can force (`tests/quantize_driver.py` holds a real run at a stage).
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
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.release_folder.manifest import MANIFEST_FILE, sha256_file
from clef_quant.release_folder.writer import OWNER_FILE, Writer, process_start_ticks

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=100)

DRIVER = Path(__file__).with_name("quantize_driver.py")
PLANTED = ("sitecustomize.py", "__init__.py", "clef_vllm.py", "modeling_evil.py")
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json", "processor_config.json")
REACH_LIMIT_S = 180.0


def clef_quant(*args: str) -> SimpleNamespace:
    """The CLI as a user runs it (in this process, so the slow imports are paid once; wide, so rich wraps nothing
    a test reads). Runs that must be held, signalled or killed run in their own process (`Held`)."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def quantize_args(source: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", str(source), "--scheme", "fp8-dynamic", "--out", str(out), *extra]


def plant(source: Path) -> None:
    """What an adversarial release folder might hold: code Python imports on its own, and auto_map entries."""
    for name in PLANTED:
        (source / name).write_text("import os\nos.system('touch /tmp/clef-planted-ran')\n")
    for name in AUTO_MAP_FILES:
        data = json.loads((source / name).read_text())
        data["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
        (source / name).write_text(json.dumps(data, indent=2))


@pytest.fixture
def planted(tiny_dir: Path, tmp_path: Path) -> Path:
    source = tmp_path / "planted"
    shutil.copytree(tiny_dir, source)
    plant(source)
    (source / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Clef tiny\n")
    (source / "LICENSE").write_text("Apache License 2.0\n")
    (source / "NOTICE").write_text("Copyright\n")
    (source / "joint_schema_model.py").write_text("raise SystemExit('executed joint_schema_model.py')\n")
    return source


def release_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


class Held:
    """A quantize run held at chosen stages by the driver."""

    def __init__(self, control: Path, stages: str, args: list[str]) -> None:
        self.control = control
        control.mkdir(exist_ok=True)
        command = [sys.executable, str(DRIVER), str(control), stages, "--", *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_at(self, stage: str) -> None:
        deadline = time.monotonic() + REACH_LIMIT_S
        while not (self.control / f"{stage}.reached").exists():
            assert self.process.poll() is None, self.process.communicate()
            assert time.monotonic() < deadline, f"the run never reached {stage}"
            time.sleep(0.05)

    def go(self, stage: str) -> None:
        (self.control / f"{stage}.go").touch()

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, err

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def held_runs():
    runs: list[Held] = []

    def start(control: Path, stages: str, args: list[str]) -> Held:
        runs.append(Held(control, stages, args))
        return runs[-1]

    yield start
    for run in runs:
        run.stop()


# -- only what belongs in a release ---------------------------------------------------------------------------


def test_planted_code_and_auto_map_are_left_out_with_one_warning(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = clef_quant(*quantize_args(planted, out))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    for name in (*PLANTED, *(f"{f}:auto_map" for f in AUTO_MAP_FILES)):
        assert name in warnings[0]
    assert "--include PATTERN" in warnings[0]

    files = release_files(out)
    assert not files & set(PLANTED)
    assert not [f for f in files if f.endswith(".py") and f != "joint_schema_model.py"]
    for name in AUTO_MAP_FILES:
        assert "auto_map" not in json.loads((out / name).read_text()), name
    # Licence, notice, the source card (renamed: `card` writes README.md) and the release code are carried.
    assert (out / "LICENSE").read_text() == "Apache License 2.0\n" and (out / "NOTICE").is_file()
    assert (out / "source_card.md").read_text() == (planted / "README.md").read_text()
    assert not (out / "README.md").exists()
    assert sha256_file(out / "joint_schema_model.py") == sha256_file(planted / "joint_schema_model.py")
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert [entry["path"] for entry in manifest["included"]] == ["joint_schema_model.py"]
    assert set(manifest["files"]) == files - {MANIFEST_FILE}
    assert not Path("/tmp/clef-planted-ran").exists()

    inspected = clef_quant("inspect", str(out))
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    assert "all checks passed" in inspected.stdout


def test_include_carries_a_file_and_an_auto_map_on_purpose(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    includes = ["--include", "modeling_*.py", "--include", "config.json:auto_map", "--include", "nothing*"]
    result = clef_quant(*quantize_args(planted, out, *includes))
    assert result.returncode == 0, result.stderr
    warning, unused = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert unused == "warning: --include matched nothing in the source: nothing*"
    assert "modeling_evil.py" not in warning and "config.json:auto_map" not in warning.replace("_config.json", "")
    assert "sitecustomize.py" in warning and "tokenizer_config.json:auto_map" in warning
    assert (out / "modeling_evil.py").is_file()
    assert "auto_map" in json.loads((out / "config.json").read_text())
    assert "auto_map" not in json.loads((out / "tokenizer_config.json").read_text())
    included = {e["path"]: e["why"] for e in json.loads((out / MANIFEST_FILE).read_text())["included"]}
    assert included["modeling_evil.py"] == "--include modeling_*.py"
    assert included["config.json:auto_map"] == "--include config.json:auto_map"
    assert clef_quant("inspect", str(out)).returncode == 0


def test_inspect_fails_code_and_auto_map_the_manifest_does_not_include(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert clef_quant(*quantize_args(planted, out)).returncode == 0
    # Planted after the fact, with the manifest re-hashed so only the code check can notice.
    plant(out)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    for name in release_files(out) - {MANIFEST_FILE}:
        manifest["files"][name] = {"sha256": sha256_file(out / name), "size": (out / name).stat().st_size}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    result = clef_quant("inspect", str(out))
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if line.startswith("violation")]
    named = {line.split(") ", 1)[1].split(": ", 1)[0] for line in lines}
    assert named == {*PLANTED, *(f"{f}:auto_map" for f in AUTO_MAP_FILES)}
    assert all("does not list it as included on purpose" in line for line in lines)


def test_release_files_are_0644(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert clef_quant(*quantize_args(tiny_dir, out)).returncode == 0
    modes = {name: stat.S_IMODE((out / name).stat().st_mode) for name in release_files(out)}
    assert modes["model.safetensors"] == 0o644
    assert set(modes.values()) == {0o644}, modes
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


# -- inspect: one line each, never a traceback ------------------------------------------------------------------


def test_inspect_fails_a_partial_with_one_line(tiny_dir: Path, tmp_path: Path, held_runs) -> None:
    """A run killed between the head copy and the manifest leaves a .partial: inspect must not pass it."""
    out = tmp_path / "out"
    run = held_runs(tmp_path / "control", "copied", quantize_args(tiny_dir, out))
    run.wait_at("copied")
    partial = tmp_path / "out.partial"
    assert (partial / "joint_head.safetensors").is_file() and not (partial / MANIFEST_FILE).exists()
    os.kill(run.pid, signal.SIGKILL)
    run.finish()
    result = clef_quant("inspect", str(partial))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {partial}: an unfinished quantize output (.partial): its run is still writing or was killed; "
        "inspect the folder the run finishes, or quantize again",
        f"error: {partial / OWNER_FILE}: a quantize run's writer marker: the run did not finish its last step; "
        "quantize again",
    ]


def test_inspect_fails_a_quantized_folder_without_manifest(quantized_dir, tmp_path: Path) -> None:
    folder = shutil.copytree(quantized_dir("fp8-dynamic"), tmp_path / "no-manifest")
    (folder / MANIFEST_FILE).unlink()
    result = clef_quant("inspect", str(folder))
    assert result.returncode == 1
    assert f"{MANIFEST_FILE}: missing: a quantized folder without a manifest" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


BAD_MANIFESTS = {
    "files as a list": (lambda m: {**m, "files": list(m["files"])}, "files: Input should be a valid dictionary"),
    "a string entry": (
        lambda m: {**m, "files": {**m["files"], "config.json": "abc"}},
        "files.config.json: Input should be a valid dictionary",
    ),
    "a JSON list": (lambda m: [m], "is not a manifest: a JSON list, not an object"),
    "a path outside": (
        lambda m: {**m, "files": {**m["files"], "../x": {"sha256": "0" * 64, "size": 1}}},
        "is not a path inside the folder",
    ),
    "a short hash": (
        lambda m: {**m, "files": {**m["files"], "config.json": {"sha256": "abc", "size": 1}}},
        "files.config.json.sha256: String should match pattern",
    ),
}


@pytest.mark.parametrize("case", [*BAD_MANIFESTS, "bad JSON"])
def test_inspect_of_a_malformed_manifest_is_one_line(quantized_dir, tmp_path: Path, case: str) -> None:
    folder = shutil.copytree(quantized_dir("fp8-dynamic"), tmp_path / "bad")
    if case == "bad JSON":
        (folder / MANIFEST_FILE).write_text('{"format": ')
        expected = "is not valid JSON"
    else:
        change, expected = BAD_MANIFESTS[case]
        (folder / MANIFEST_FILE).write_text(json.dumps(change(json.loads((folder / MANIFEST_FILE).read_text()))))
    result = clef_quant("inspect", str(folder))
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("violation")]
    assert len(lines) == 1 and MANIFEST_FILE in lines[0] and expected in lines[0], result.stdout


def test_inspect_reads_a_bf16_source_as_a_source(planted: Path) -> None:
    result = clef_quant("inspect", str(planted))
    assert result.returncode == 0, result.stdout
    assert f"{planted}: a bf16 source release (not quantized), inspected as a source" in result.stdout
    assert "code that quantize leaves out of a release" in result.stdout.replace("\n", " ")
    as_json = json.loads(clef_quant("inspect", "--json", str(planted)).stdout)
    assert as_json["kind"] == "source" and as_json["ok"]


# -- the writer marker: killed runs, reused PIDs ----------------------------------------------------------------


@pytest.mark.parametrize(("stage", "sig"), [("loaded", signal.SIGTERM), ("saved", signal.SIGINT)])
def test_signal_mid_run_leaves_no_folder(
    tiny_dir: Path, tmp_path: Path, held_runs, stage: str, sig: signal.Signals
) -> None:
    out = tmp_path / "out"
    run = held_runs(tmp_path / "control", stage, quantize_args(tiny_dir, out))
    run.wait_at(stage)
    partial = tmp_path / "out.partial"
    assert (partial / OWNER_FILE).is_file()
    if stage == "saved":
        assert (partial / "model.safetensors").is_file()  # there really was something to clean up
    run.process.send_signal(sig)
    code, _, stderr = run.finish(timeout=60)
    assert code == 128 + sig, stderr
    assert f"interrupted by {sig.name}" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control"]


def test_calibrating_run_interrupted_leaves_no_folder(tiny_dir: Path, tmp_path: Path, held_runs) -> None:
    out = tmp_path / "out"
    args = ["quantize", str(tiny_dir), "--scheme", "nvfp4", "--calibration-records", "2", "--out", str(out)]
    run = held_runs(tmp_path / "control", "calibrating", args)
    run.wait_at("calibrating")
    run.process.send_signal(signal.SIGINT)
    code, _, stderr = run.finish(timeout=60)
    assert code == 128 + signal.SIGINT, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control"]


def test_a_sigkilled_run_is_reclaimed_by_the_next(tiny_dir: Path, tmp_path: Path, held_runs) -> None:
    out = tmp_path / "out"
    run = held_runs(tmp_path / "control", "saved", quantize_args(tiny_dir, out))
    run.wait_at("saved")
    os.kill(run.pid, signal.SIGKILL)
    run.finish()
    partial = tmp_path / "out.partial"
    assert Writer.parse((partial / OWNER_FILE).read_text()).pid == run.pid
    result = clef_quant(*quantize_args(tiny_dir, out))
    assert result.returncode == 0, result.stderr
    assert not partial.exists() and clef_quant("inspect", str(out)).returncode == 0


def plant_partial(out: Path, writer: Writer | None, extra: bool = True) -> Path:
    partial = out.with_name(out.name + ".partial")
    partial.mkdir()
    if writer is not None:
        (partial / OWNER_FILE).write_text(writer.to_json())
    if extra:
        (partial / "model.safetensors").write_bytes(b"half")
    return partial


def test_a_live_writer_is_never_reclaimed(tiny_dir: Path, tmp_path: Path, live_process) -> None:
    out = tmp_path / "out"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    partial = plant_partial(
        out, Writer(live_process.pid, process_start_ticks(live_process.pid), boot, socket.gethostname())
    )
    result = clef_quant(*quantize_args(tiny_dir, out))
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"error: {partial} is being written by process {live_process.pid}; wait for it or stop it"
    )
    assert (partial / "model.safetensors").read_bytes() == b"half"


def test_a_reused_pid_is_reclaimed(tiny_dir: Path, tmp_path: Path, live_process) -> None:
    """The recorded PID now belongs to another process (it started at another time): the writer is gone."""
    out = tmp_path / "out"
    started = process_start_ticks(live_process.pid)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    partial = plant_partial(out, Writer(live_process.pid, started - 1, boot, socket.gethostname()))
    result = clef_quant(*quantize_args(tiny_dir, out))
    assert result.returncode == 0, result.stderr
    assert not partial.exists() and clef_quant("inspect", str(out)).returncode == 0


@pytest.mark.parametrize(
    ("case", "message"),
    [("no marker", "exists and names no writer; remove it by hand"), ("another host", "on elsewhere.example")],
)
def test_an_unprovable_writer_is_refused(tiny_dir: Path, tmp_path: Path, case: str, message: str) -> None:
    out = tmp_path / "out"
    writer = None if case == "no marker" else Writer(1, 1, "x", "elsewhere.example")
    partial = plant_partial(out, writer)
    result = clef_quant(*quantize_args(tiny_dir, out))
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert partial.is_dir()


def test_an_empty_partial_is_reclaimed(tiny_dir: Path, tmp_path: Path) -> None:
    """A run killed between creating the folder and its marker left nothing to lose."""
    out = tmp_path / "out"
    plant_partial(out, None, extra=False)
    assert clef_quant(*quantize_args(tiny_dir, out)).returncode == 0


# -- two runs, one output: every order ----------------------------------------------------------------------------

IN_PROGRESS = ("claimed", "loaded", "saved", "copied", "hashed")


def test_a_second_run_is_refused_at_every_stage_of_the_first(tiny_dir: Path, tmp_path: Path, held_runs) -> None:
    out = tmp_path / "out"
    first = held_runs(tmp_path / "control", ",".join(IN_PROGRESS), quantize_args(tiny_dir, out))
    for stage in IN_PROGRESS:
        first.wait_at(stage)
        second = clef_quant(*quantize_args(tiny_dir, out, "--overwrite"))
        assert second.returncode == 2, (stage, second.stderr)
        assert f"is being written by process {first.pid}" in second.stderr, stage
        first.go(stage)
    code, _, stderr = first.finish()
    assert code == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control", "out"]
    assert clef_quant("inspect", str(out)).returncode == 0


def test_a_run_that_checked_before_the_other_finished_is_refused(tiny_dir: Path, tmp_path: Path, held_runs) -> None:
    """The second run found no output when it checked its inputs; the first publishes; the second must not
    replace it: it is refused when it claims, and leaves nothing behind."""
    out = tmp_path / "out"
    late = held_runs(tmp_path / "late", "checked", quantize_args(tiny_dir, out))
    late.wait_at("checked")
    first = clef_quant(*quantize_args(tiny_dir, out))
    assert first.returncode == 0, first.stderr
    manifest = (out / MANIFEST_FILE).read_bytes()
    late.go("checked")
    code, _, stderr = late.finish()
    assert code == 2 and f"{out} already exists; pass --overwrite" in stderr
    assert (out / MANIFEST_FILE).read_bytes() == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late", "out"]


def test_both_held_before_claiming_one_wins(tiny_dir: Path, tmp_path: Path, held_runs) -> None:
    out = tmp_path / "out"
    a = held_runs(tmp_path / "a", "checked,claimed", quantize_args(tiny_dir, out))
    b = held_runs(tmp_path / "b", "checked", quantize_args(tiny_dir, out))
    a.wait_at("checked")
    b.wait_at("checked")
    a.go("checked")
    a.wait_at("claimed")
    b.go("checked")
    code_b, _, stderr_b = b.finish()
    assert code_b == 2 and f"is being written by process {a.pid}" in stderr_b
    a.go("claimed")
    code_a, _, stderr_a = a.finish()
    assert code_a == 0, stderr_a
    assert clef_quant("inspect", str(out)).returncode == 0
