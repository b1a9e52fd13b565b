"""Starting the servers the slow tests talk to: `clef-systemone` and `vllm serve` on the tiny checkpoint."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from clef_quant.bench.processes import free_port, running, systemone_command

# A short model length and eager mode keep the tiny model's start to seconds; one whole prompt fits a step.
ENGINE_FLAGS = ["--max-model-len", "4096", "--enforce-eager", "--max-num-batched-tokens", "65536"]


@contextmanager
def vllm_serve(model: Path, log: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`vllm serve` (the OpenAI server) with our architecture and the `clef` model name; yields its base URL.
    `env`: the server's environment (default: `server_env()` when it starts)."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--runner", "pooling",
        "--hf-overrides", '{"architectures": ["ClefFlashForJointSchema"]}',
        *flags,
        "--served-model-name", "clef",
        "--port", str(port),
        *ENGINE_FLAGS,
    ]  # fmt: skip
    with running(command, port, log, env):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def systemone(model: Path, log: Path, *flags: str) -> Iterator[tuple[str, list[int]]]:
    """`clef-systemone` with `flags`; yields its base URL and the /health codes it answered while starting."""
    port = free_port()
    with running(systemone_command(model, port, *flags), port, log) as statuses:
        yield f"http://127.0.0.1:{port}", statuses


# The server most modules share (`shared_systemone`, tests/plugins/shared_servers.py): one start for the session
# instead of one per module. Modules whose tests need other flags, or that end the server, start their own.
SHARED_API_KEY = "test-key"
SHARED_AUTH = {"Authorization": f"Bearer {SHARED_API_KEY}"}
# Media limits small enough that the tests of refusals reach them with small files.
MEDIA_FLAGS = ["--limit-images", "3", "--limit-videos", "1", "--max-video-frames", "8"]
SHARED_FLAGS = ["--api-key", SHARED_API_KEY, *MEDIA_FLAGS, *ENGINE_FLAGS]
# What a client sends while the engine loads; the answers are kept for the tests of that phase.
PROBE = {
    "state": {"ticket": "I was charged twice for one order. " * 40},
    "questions": {
        "billing": {"type": "noul", "instructions": "Is this about billing?"},
        "team": {"type": "choice", "criteria": {"billing": "money", "technical": "bugs", "sales": "deals"}},
        "urgency": {"type": "score", "criteria": ["low", "medium", "high"]},
    },
}


@dataclass(frozen=True)
class StartedServer:
    url: str
    log: Path
    health_while_starting: list[int]  # the /health codes answered until the first 200
    answers_while_loading: list[httpx.Response]  # the non-200 answers to PROBE posted before the engine was ready
    metrics_while_loading: list[str]  # /metrics as a scraper read it while /health still answered 503


@contextmanager
def observed_systemone(
    model: Path, log: Path, *flags: str, env: dict[str, str] | None = None
) -> Iterator[StartedServer]:
    """`clef-systemone` with `flags`, and what a client saw while it started: /health codes and PROBE's answers.
    `env`: the server's environment (default: `server_env()` when it starts)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    answers: list[httpx.Response] = []
    stop = threading.Event()

    metrics: list[str] = []

    def post_while_loading() -> None:
        while not stop.is_set() and (len(answers) < 3 or not metrics):
            with contextlib.suppress(httpx.TransportError):
                if len(answers) < 3:
                    response = httpx.post(f"{url}/v1/systemone", json=PROBE, headers=SHARED_AUTH, timeout=5)
                    if response.status_code != 200:
                        answers.append(response)
                if not metrics:
                    scraped = httpx.get(f"{url}/metrics", timeout=5)
                    if scraped.status_code == 200 and httpx.get(f"{url}/health", timeout=5).status_code == 503:
                        metrics.append(scraped.text)
            time.sleep(0.3)

    poller = threading.Thread(target=post_while_loading, daemon=True)
    poller.start()
    try:
        with running(systemone_command(model, port, *flags), port, log, env) as statuses:
            stop.set()
            poller.join()
            yield StartedServer(url, log, statuses, answers, metrics)
    finally:
        stop.set()


def listening_process(url: str) -> psutil.Process:
    """The process that accepts connections at `url` (a server's own process, where its memory is measured)."""
    port = int(url.rsplit(":", 1)[1])
    (pid,) = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    return psutil.Process(pid)
