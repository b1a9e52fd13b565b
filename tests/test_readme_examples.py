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

The session runs beside the rest of the suite (tests/plugins/readme_session.py, which reads the blocks and runs them;
its fixture `readme_session`): a serial run starts it with its first test, and on two workers it is the first unit of
work one worker takes while the other runs the rest. This test waits for it to end and checks what it printed.
"""

from __future__ import annotations

import re

import pytest
from plugins.readme_session import README, REPO, Session, flow_blocks, flow_documents, readme_blocks

# Handed out first on two workers: its session is the longest unit, and it runs on one worker while the other runs
# the rest of the suite.
pytestmark = pytest.mark.unit(order=10)


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
