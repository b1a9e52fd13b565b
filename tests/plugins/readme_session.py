"""The README's and the docs pages' examples, run in one bash session beside the suite.

Which blocks run, and how, is what tests/test_readme_examples.py's docstring says and its tests check; this plugin
reads the blocks, runs them (`start_session`) and gives the session to the test that checks its output
(`readme_session`). The session runs minutes of its own processes while the suite's torch work runs on one thread: a
serial run starts it with its first test, so that it uses the machine's other core while the suite goes on; on
workers, the README module is the first unit handed out and the session runs when its test does, on one worker,
while the other worker runs the rest. The summary says how long it took.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.work_units import in_worker, send_to_controller, sent_by

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MKDOCS = REPO / "mkdocs.yml"
README_PORTS = ("8000", "8001")
NOT_RUN = re.compile(r"^<!-- not run: (?P<why>.+) -->$")
RUNS_IN = re.compile(r"^<!-- runs in (?P<page>docs/[\w/.-]+\.md) -->$")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
RUN_LANGS = ("bash", "python")
TIMEOUT_S = 1500  # far above a normal run (printed with -s), so only a hung block ends it
BLOCK_TIMEOUT_S = 300  # six times the slowest block's usual time: a block waiting on a server that died ends here


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # where the block's fence is in its document
    not_run: str | None  # the document's reason for leaving it out
    source: str = "README.md"  # the document, relative to the repository
    runs_in: str | None = None  # the page whose blocks run this block's lines (the README's tour)

    @property
    def runs(self) -> bool:
        return self.not_run is None and self.runs_in is None

    @property
    def where(self) -> str:
        return f"{self.source} line {self.line}"


def readme_blocks(text: str, source: str = "README.md") -> list[Block]:
    """The ```bash and ```python blocks of a markdown text, in order, each with its marker (if any)."""
    blocks = []
    for match in FENCE.finditer(text):
        if match["lang"] not in RUN_LANGS:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        not_run, runs_in = NOT_RUN.match(before), RUNS_IN.match(before)
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(
            Block(
                match["lang"], match["code"], line, not_run["why"] if not_run else None, source,
                runs_in["page"] if runs_in else None,
            )
        )  # fmt: skip
    return blocks


def nav_pages(nav: list[Any]) -> list[str]:
    """The pages of a mkdocs nav, in order (sections flattened)."""
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def flow_documents() -> list[str]:
    """The documents whose blocks run, in the order they run: README.md, then docs/ in the nav's order."""
    config = yaml.safe_load(MKDOCS.read_text(encoding="utf-8"))
    return ["README.md", *(f"{config.get('docs_dir', 'docs')}/{page}" for page in nav_pages(config["nav"]))]


def flow_blocks() -> list[Block]:
    """Every block of the flow's documents, in the order they run."""
    return [
        block
        for document in flow_documents()
        for block in readme_blocks((REPO / document).read_text(encoding="utf-8"), document)
    ]


def session_script(blocks: list[Block], scratch: Path, ports: dict[str, str]) -> str:
    """One bash script that runs every block in order and brackets each with start/end lines (with the time)."""
    lines = ["set -e -o pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for number, block in enumerate(blocks):
        code = re.sub(rf"\b({'|'.join(ports)})\b", lambda m: ports[m[1]], block.code)
        lines.append(f'printf "\\n::start {number} %s\\n" "$EPOCHREALTIME"')
        if block.lang == "python":
            path = scratch / f"{Path(block.source).stem}_block_{block.line}.py"
            path.write_text(code, encoding="utf-8")
            lines.append(f"python {path.name}")
        else:
            lines.append(code.rstrip("\n"))
        lines.append(f'printf "\\n::end {number} %s\\n" "$EPOCHREALTIME"')
    return "\n".join(lines) + "\n"


def session_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VLLM_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # Offline: a block that reached for the Hub without saying so would fail here instead of downloading.
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost")
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # the default reserves most of the machine's memory for the tiny model
    return env


@dataclass
class Session:
    """The flow's blocks (README.md's, then the pages') running in one bash session in `scratch`."""

    blocks: list[Block]
    process: subprocess.Popen[bytes]
    log: Path
    began: float
    code: int | None = None
    elapsed: float | None = None

    def finish(self) -> None:
        """Wait for the session to end (at most TIMEOUT_S from its start, BLOCK_TIMEOUT_S for one block), then stop
        whatever it left running."""
        if self.elapsed is not None:
            return
        try:
            while self.code is None and time.monotonic() - self.began < TIMEOUT_S and not self.block_overran():
                with suppress(subprocess.TimeoutExpired):
                    self.code = self.process.wait(timeout=5)
        finally:
            with_group_gone(self.process)
            self.elapsed = time.monotonic() - self.began

    def block_overran(self) -> bool:
        """Whether the block running now started more than BLOCK_TIMEOUT_S ago (the log stamps each start)."""
        starts = re.findall(r"^::start \d+ ([\d.]+)$", self.log.read_text(encoding="utf-8", errors="replace"), re.M)
        return bool(starts) and time.time() - float(starts[-1]) > BLOCK_TIMEOUT_S


def start_session(scratch: Path) -> Session:
    """Every block of the flow that runs, in one bash session in `scratch`, started now in the background."""
    from clef_quant.bench.processes import free_port

    blocks = [b for b in flow_blocks() if b.runs]
    shutil.copytree(REPO / "examples", scratch / "examples")
    script = scratch / "readme.sh"
    ports = {port: str(free_port()) for port in README_PORTS}
    script.write_text(session_script(blocks, scratch, ports), encoding="utf-8")
    log = scratch / "readme.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", script.name], cwd=scratch, env=session_env(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Session(blocks, process, log, time.monotonic())


def with_group_gone(process: subprocess.Popen[bytes]) -> None:
    """Stop whatever the session left running (servers it started in the background), then reap the shell."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(2)
    process.wait()


# -- the session beside the suite --------------------------------------------------------------------------------

README_TEST = "test_readme_examples.py::test_readme_examples_run_as_written"
README_ELAPSED: list[float] = []


@contextmanager
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """The README session, started now; stopped (if its test did not wait for it) and timed on the way out."""
    session = start_session(tmp_path_factory.mktemp("readme"))
    try:
        yield session
    finally:
        session.finish()
        README_ELAPSED.append(session.elapsed)


@pytest.fixture(scope="session", autouse=True)
def readme_beside(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session | None]:
    """In a serial run that selects the README test: its session, started with the suite's first test (else None)."""
    if in_worker() or not any(README_TEST in item.nodeid for item in request.session.items):
        yield None
        return
    with readme_run(tmp_path_factory) as session:
        yield session


@pytest.fixture(scope="session")
def readme_session(readme_beside: Session | None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """The README session of test_readme_examples_run_as_written: the one started beside the suite, or one started
    now (on a worker, when that test runs)."""
    if readme_beside is not None:
        yield readme_beside
        return
    with readme_run(tmp_path_factory) as session:
        yield session


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a worker: hand the README time to the controller, which prints it."""
    send_to_controller(session, "readme_elapsed", list(README_ELAPSED))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    README_ELAPSED.extend(sent_by(node, "readme_elapsed", []))


@pytest.hookimpl(tryfirst=True)  # the first of the suite's summary lines, before the engine starts
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for elapsed in README_ELAPSED:
        terminalreporter.write_sep("-", f"README session: {elapsed:.0f} s")
