"""The one progress protocol (`clef_quant.progress`): the library reports its long work through it, and the CLI's
stderr bars show each task's steps, its bytes, or only its time."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from clef_quant.cli._stderr import RichProgress
from clef_quant.progress import BYTES, Stages


class Recorded:
    """Every call, in order, as (method, task, numbers...)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, task: str, total: int | None = None, unit: str = "") -> None:
        self.calls.append(("start", task, total, unit))

    def advance(self, task: str, amount: int = 1) -> None:
        self.calls.append(("advance", task, amount))

    def finish(self, task: str) -> None:
        self.calls.append(("finish", task))


def test_make_tiny_reports_every_piece_of_work_and_finishes_it(tmp_path: Path) -> None:
    from clef_quant.tiny import make_tiny

    progress = Recorded()
    folder = make_tiny(tmp_path / "tiny", progress=progress)
    started = [call[1] for call in progress.calls if call[0] == "start"]
    assert started == ["tokenizer + processor", "backbone (cpu)", "joint schema head"]
    assert [call[1] for call in progress.calls if call[0] == "finish"] == started
    (backbone,) = [call for call in progress.calls if call[:2] == ("start", "backbone (cpu)")]
    assert backbone[3] == BYTES
    written = sum(call[2] for call in progress.calls if call[:2] == ("advance", "backbone (cpu)"))
    assert written == backbone[2]
    shards = sum(p.stat().st_size for p in folder.glob("model*.safetensors"))
    assert 0.9 * shards < written <= shards  # the tensors' bytes: the files add only their headers


def test_stages_finish_each_piece_before_the_next_starts() -> None:
    progress = Recorded()
    stage = Stages(progress)
    stage("loading")
    stage("timed")
    stage.done()
    stage.done()  # nothing left to finish
    assert progress.calls == [
        ("start", "loading", None, ""),
        ("finish", "loading"),
        ("start", "timed", None, ""),
        ("finish", "timed"),
    ]


def test_the_stderr_bars_show_steps_bytes_or_only_the_time() -> None:
    out = io.StringIO()
    with RichProgress(Console(file=out, width=100)) as progress:
        progress.start("backbone (cpu)", 9_000_000, unit=BYTES)
        progress.advance("backbone (cpu)", 4_500_000)
        progress.start("records", 4)
        progress.advance("records", 3)
        stage = Stages(progress)
        stage("warm-up")
        stage.done()
    lines = out.getvalue().splitlines()

    def line(task: str) -> str:
        (found,) = [text for text in lines if f" {task} " in text]
        return found

    assert "4.5 MB / 9.0 MB" in line("backbone (cpu)")
    assert "3/4" in line("records")
    assert "/" not in line("warm-up") and "0:00:0" in line("warm-up")


def test_a_run_refused_before_any_work_draws_nothing() -> None:
    out = io.StringIO()
    with RichProgress(Console(file=out, width=100)):
        pass
    assert out.getvalue() == ""


def test_the_stage_line_names_the_running_task_and_leaves_no_output_behind(capsys) -> None:
    """Benchmarks and build-data show one line that follows their stages; their output stays their results."""
    from clef_quant.cli._stderr import stage_line

    with stage_line("benchmarking") as progress:
        stage = Stages(progress)
        stage("warm-up")
        assert progress._status.status == "warm-up"
        stage.done()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
