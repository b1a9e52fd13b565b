"""Every ```bash and ```python block of README.md and of the docs pages runs as written, on the tiny checkpoint.

The documents run in the order of the flow: README.md, then the pages of docs/ in the order of mkdocs.yml's nav,
each page's blocks in order. The blocks run in one bash session in a scratch folder holding a copy of the checkout's
`examples/`, as a reader pasting them into one terminal would: artifacts that one block writes (`artifacts/tiny`,
...) are read by the blocks after it, on the same page or a later one, variables and background servers carry over,
and each Python block runs as `python FILE` from that session. The venv's scripts come first on PATH.

Two markers, on the line right before a block, leave it out of the session:
- `<!-- not run: REASON -->`: the block needs the Hub, a GPU or the whole suite.
- `<!-- runs in docs/PAGE.md -->`: the README's tour repeats commands of a page; every line of such a block is a line
  of a block of that page that runs, so it runs there, once.

Ports 8000 and 8001, which the servers of the examples use, may be taken on a shared machine: each is replaced in
every block by a free port of its own. Everything else runs verbatim.

The session runs beside the rest of the suite (conftest.py's `readme_session`): a serial run starts it with its
first test, and on two workers it is the first unit of work one worker takes while the other runs the rest. This
test waits for it to end and checks what it printed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from clef_quant.bench.processes import free_port

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MKDOCS = REPO / "mkdocs.yml"
README_PORTS = ("8000", "8001")
NOT_RUN = re.compile(r"^<!-- not run: (?P<why>.+) -->$")
RUNS_IN = re.compile(r"^<!-- runs in (?P<page>docs/[\w/.-]+\.md) -->$")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
RUN_LANGS = ("bash", "python")
TIMEOUT_S = 1500  # far above a normal run (printed with -s), so only a hung block ends it


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


def nav_pages(nav: list) -> list[str]:
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


def test_the_documents_mark_only_hub_gpu_or_suite_blocks_as_not_run() -> None:
    blocks = flow_blocks()
    reasons = [f"{b.where}: {b.not_run}" for b in blocks if b.not_run]
    assert sum(b.runs for b in blocks) >= 12  # the examples themselves are run, not marked away
    assert all(re.search(r"Hub|GPU|suite", why) for why in reasons), reasons
    assert len(reasons) <= 8, reasons


def test_every_page_of_docs_is_in_the_flow() -> None:
    documents = flow_documents()
    assert len(documents) == len(set(documents))
    assert sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")) == sorted(documents[1:])


def test_the_readme_tour_runs_in_the_pages_it_names() -> None:
    """A README block marked `runs in docs/PAGE.md` is made of lines that PAGE's run blocks hold, so it runs there."""
    tour = [b for b in flow_blocks() if b.runs_in]
    assert tour and {b.source for b in tour} == {"README.md"}
    for block in tour:
        page = (REPO / block.runs_in).read_text(encoding="utf-8")
        ran = {line.rstrip() for b in readme_blocks(page, block.runs_in) if b.runs for line in b.code.splitlines()}
        missing = [line for line in block.code.splitlines() if line.strip() and line.rstrip() not in ran]
        assert missing == [], f"{block.where}: not in a block of {block.runs_in} that runs"


def test_the_readme_links_to_every_page() -> None:
    readme = README.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]*)?\)", readme))
    assert linked == set(flow_documents()[1:])


@dataclass
class Session:
    """The flow's blocks (README.md's, then the pages') running in one bash session in `scratch`."""

    blocks: list[Block]
    process: subprocess.Popen
    log: Path
    began: float
    code: int | None = None
    elapsed: float | None = None

    def finish(self) -> None:
        """Wait for the session to end (at most TIMEOUT_S from its start), then stop whatever it left running."""
        if self.elapsed is not None:
            return
        try:
            self.code = self.process.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - self.began)))
        except subprocess.TimeoutExpired:
            self.code = None
        finally:
            with_group_gone(self.process)
            self.elapsed = time.monotonic() - self.began


def start_session(scratch: Path) -> Session:
    """Every block of the flow that runs, in one bash session in `scratch`, started now in the background."""
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


@pytest.mark.slow
def test_readme_examples_run_as_written(readme_session: Session) -> None:
    session = readme_session
    session.finish()
    blocks, code = session.blocks, session.code
    output = session.log.read_text(encoding="utf-8", errors="replace")
    started = {int(n): float(t) for n, t in re.findall(r"^::start (\d+) ([\d.]+)$", output, re.MULTILINE)}
    ended = {int(n): float(t) for n, t in re.findall(r"^::end (\d+) ([\d.]+)$", output, re.MULTILINE)}
    timings = ", ".join(f"{blocks[n].where}: {ended[n] - started[n]:.0f} s" for n in sorted(ended))
    print(f"README and docs examples: {len(blocks)} blocks in {session.elapsed:.0f} s ({timings})")
    failed = next((n for n in sorted(started) if n not in ended), None)
    if failed is not None or code != 0:
        where = f"{blocks[failed].where} ({blocks[failed].lang})" if failed is not None else "?"
        tail = output.split(f"::start {failed} ")[-1][-4000:] if failed is not None else output[-4000:]
        pytest.fail(f"exit {code} in the block at {where}:\n{tail}")
    assert sorted(ended) == list(range(len(blocks)))
    # A failing command already ended the session; this catches an error body a server answered with. (No check for
    # tracebacks: vLLM's server logs one of its own when `kill %python` stops it.)
    assert '{"error"' not in output, output[-4000:]


def with_group_gone(process: subprocess.Popen) -> None:
    """Stop whatever the session left running (servers it started in the background), then reap the shell."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(2)
    process.wait()
