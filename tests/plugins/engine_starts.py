"""Engine starts, counted for the session summary.

Each start costs seconds in process and ~20 s as a server; the summary at the end of a run shows what started how
often, so that a duplicate start (a fixture that could have been shared) is seen. In-process engines are counted
where the suite starts them (`plugins.engines.start_engine`, which `clef_engine` uses). Servers are counted when this
process spawns one, seen through Python's audit hook for `subprocess.Popen` (PEP 578): that sees every server
whoever starts it, a test, a fixture or the tools a test runs (bench), without wrapping any of their code. Engines
that the tools start inside this process, and everything the README session starts, are not counted.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from plugins.work_units import send_to_controller, sent_by

ENGINE_STARTS: Counter[str] = Counter()


def count_in_process(model: str | Path, engine_kwargs: dict[str, Any]) -> None:
    folder = Path(str(model))
    settings = " ".join(f"{k}={v}" for k, v in sorted(engine_kwargs.items()))
    ENGINE_STARTS[f"in-process {folder.parent.name}/{folder.name} {settings}"] += 1


def server_name(command: list[str]) -> str | None:
    """`vllm serve` or `clef-systemone` for a command that serves on a port; None for any other process (a CLI run,
    or a server command that is refused before it would listen)."""
    if "--port" not in command:
        return None
    if "vllm.entrypoints.openai.api_server" in command:
        return "vllm serve"
    if Path(command[0]).name == "clef-systemone" or "clef_vllm.server.cli" in command:
        return "clef-systemone"
    return None


def count_server(command: list[str]) -> None:
    name = server_name(command)
    if name is None:
        return
    # The flags, without what changes from run to run (the model's folder, the port).
    flags = [a for i, a in enumerate(command) if i and command[i - 1] not in ("--model", "--port")]
    shown = " ".join(a for a in flags if a.startswith("-") or not Path(a).is_absolute())
    ENGINE_STARTS[f"server {name} {shown}"] += 1


def on_audit_event(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen":
        return
    try:
        _, command, _, _ = args
        parts = [command] if isinstance(command, (str, bytes, os.PathLike)) else list(command)
        count_server([os.fsdecode(part) for part in parts])
    except Exception:  # an error here would fail the test's Popen; a start left uncounted is only a summary line
        return


HOOKED: list[bool] = []  # audit hooks cannot be removed: one per process, however often pytest configures in it


def pytest_configure(config: pytest.Config) -> None:
    if not HOOKED:
        sys.addaudithook(on_audit_event)
        HOOKED.append(True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a worker: hand the counts to the controller, which prints the summary."""
    send_to_controller(session, "engine_starts", dict(ENGINE_STARTS))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    ENGINE_STARTS.update(sent_by(node, "engine_starts", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ENGINE_STARTS:
        return
    total = sum(ENGINE_STARTS.values())
    terminalreporter.write_sep("-", f"engine starts: {total} (README session's own not counted)")
    for what, count in sorted(ENGINE_STARTS.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count:3d}  {what}")
