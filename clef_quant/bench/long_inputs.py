"""Small requests behind long inputs: how long the shared tokenizer keeps everyone else waiting.

One `clef-systemone` process on loopback. For each long input (12 MB states with no split point, 12 MB of
instructions) one client sends it while `clients` others send a small request in a loop until its answer is
back; the worst and the median latency of those small requests are the wait. Beside them: the small request
on an idle server, and behind a full-length state that is small as a body (the control: what the engine step
of a full-length prompt costs anyway). Each input is also encoded in this process with the release tokenizer,
timing every tokenizer call: the longest is what a small request can wait for the shared tokenizer. The
report is a section of `bench/results/serve-cpu.md`.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from clef_quant.bench.environment import load_average
from clef_quant.bench.modes import percentile
from clef_quant.bench.processes import free_port, running, serve_config, server_command
from clef_quant.formatting import facts_table, markdown_table, utc_minute
from clef_quant.progress import Progress, Stages

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings

HEADING = "Small requests behind long inputs"
SMALL = {"state": "My card was charged twice for one order.", "questions": {"billing": {"type": "noul"}}}
MEGABYTES = 12_000_000


def _state(text: str) -> dict[str, Any]:
    return {"state": text, "questions": {"q": {"type": "noul"}}}


def _instructions(text: str) -> dict[str, Any]:
    return {"state": "short", "questions": {"q": {"type": "noul", "instructions": text}}}


PROSE = "The refund for order 1182 was blocked abroad, so the card was charged twice and the fee stayed. "
# A state that fills any model length but is small as a body: the engine's own time for a full-length prompt,
# which small requests wait for in any case (one whole prompt per engine step).
CONTROL = "state: 200 K characters of prose (control)"

# name -> body; CJK is 3 bytes a character in UTF-8, so 4 M characters make the 12 MB.
LONG_INPUTS: dict[str, Callable[[], dict[str, Any]]] = {
    CONTROL: lambda: _state(PROSE * (200_000 // len(PROSE))),
    "state: 12 M letters `a`": lambda: _state("a" * MEGABYTES),
    "state: 12 M spaces, then `a`": lambda: _state(" " * MEGABYTES + "a"),
    "state: 4 M CJK characters": lambda: _state("日本語の文字列。" * (MEGABYTES // 3 // 8)),
    "state: 12 M punctuation": lambda: _state("!?.,;:-_" * (MEGABYTES // 8)),
    "instructions: 12 M spaces, then `a`": lambda: _instructions(" " * MEGABYTES + "a"),
    "instructions: 12 M letters `a`": lambda: _instructions("a" * MEGABYTES),
}


# Two long states in flight at once, each over any model length: a small request queued behind both waits for
# the engine's steps, not the reading (one whole prompt per step on a CPU).
TWO_STATES = "two states of 11 MB prose at once"
# How long the small clients run alone: the row every long input is compared with (what the machine itself gives).
ALONE_SECONDS = 10.0
ALONE = f"none: the small clients alone for {ALONE_SECONDS:.0f} s"
TWO_STATES_BYTES = 11_000_000


def encode_body(body: dict[str, Any]) -> bytes:
    """Bytes as a client sends them: UTF-8 as it is (escaped CJK would triple the body)."""
    return json.dumps(body, ensure_ascii=False).encode()


# How long the long input and each small request may take before the row counts it as failed.
LONG_TIMEOUT_S = 600.0
SMALL_TIMEOUT_S = 120.0


@dataclass
class Behind:
    """One long input and the small requests answered while it was in flight."""

    name: str
    body_bytes: int
    status: int
    seconds: float
    headers: dict[str, str]
    error_code: str | None = None
    tokenizer_calls: list[float] = field(default_factory=list)  # seconds of each call, encoded in this process
    small_seconds: list[float] = field(default_factory=list)
    small_errors: int = 0

    @property
    def worst(self) -> float:
        return max(self.small_seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.small_seconds)

    @property
    def p95(self) -> float:
        """The wait 95% of the small requests stayed within: unlike the worst, it holds when the machine itself
        stalls every process for a moment (a virtual machine whose host takes its cores back does)."""
        return percentile(self.small_seconds, 0.95)


def small_latencies(url: str, count: int) -> list[float]:
    """The small request's latency, one at a time, `count` times."""
    seconds = []
    with httpx.Client(timeout=120) as http:
        for _ in range(count):
            started = time.perf_counter()
            http.post(f"{url}/v1/systemone", json=SMALL).raise_for_status()
            seconds.append(time.perf_counter() - started)
    return seconds


def behind(
    url: str,
    name: str,
    body: bytes,
    *,
    clients: int = 4,
    request_id: str | None = None,
    copies: int = 1,
    timeouts: tuple[float, float] = (LONG_TIMEOUT_S, SMALL_TIMEOUT_S),
) -> Behind:
    """Send `body` (`copies` times at once; an empty body: nothing, for ALONE_SECONDS) while `clients` threads send
    the small request until every answer is back; the row keeps the first copy's status and headers and the
    slowest copy's time. A request with no answer within its timeout (long, small) or whose connection fails is a
    failed request in the row (status 0 for the long one), not the end of the run."""
    done = threading.Event()
    lock = threading.Lock()
    result = Behind(name, len(body), 0, 0.0, {})
    long_timeout, small_timeout = timeouts

    def small() -> None:
        with httpx.Client(timeout=small_timeout) as http:
            while not done.is_set():
                started = time.perf_counter()
                try:
                    failed = http.post(f"{url}/v1/systemone", json=SMALL).status_code != 200
                except httpx.TransportError:
                    failed = True
                elapsed = time.perf_counter() - started
                with lock:
                    result.small_seconds.append(elapsed)
                    result.small_errors += failed

    def long(_: int) -> httpx.Response | str:
        try:
            return httpx.post(f"{url}/v1/systemone", content=body, headers=headers, timeout=long_timeout)
        except httpx.TimeoutException:
            return f"no answer in {long_timeout:g} s"
        except httpx.TransportError as exc:
            return f"connection failed ({type(exc).__name__})"

    threads = [threading.Thread(target=small) for _ in range(clients)]
    for thread in threads:
        thread.start()
    if not body:  # the small clients alone: what the machine gives them without any long input
        time.sleep(ALONE_SECONDS)
        done.set()
        for thread in threads:
            thread.join()
        return result
    time.sleep(0.2)  # the small clients are under way when the long input arrives
    headers = {"Content-Type": "application/json", **({"X-Request-Id": request_id} if request_id else {})}
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(copies) as pool:
            response, *_ = pool.map(long, range(copies))  # every copy answered: the slowest sets the time
        result.seconds = time.perf_counter() - started
        if isinstance(response, str):
            result.error_code = response
        else:
            result.status = response.status_code
            result.headers = dict(response.headers)
            if response.status_code != 200:
                result.error_code = _error_code(response)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    return result


def tokenizer_calls(tokenizer: Any, body: dict[str, Any], max_model_len: int) -> list[float]:
    """Seconds of every tokenizer call that encoding `body` makes (none when it is refused before)."""
    from clef_vllm.errors import RequestError
    from clef_vllm.format.encoding import encode_request
    from clef_vllm.format.request import parse_request

    seconds: list[float] = []

    def timed(texts: list[str], **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return tokenizer(texts, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)

    timed.backend_tokenizer = tokenizer.backend_tokenizer  # type: ignore[attr-defined]  # the cut reads its config
    with contextlib.suppress(RequestError):
        encode_request(parse_request(body), timed, max_length=max_model_len)
    return seconds


@dataclass
class LongInputsResult:
    model: str
    max_model_len: int
    clients: int
    idle_small: list[float]
    rows: list[Behind]
    load: str = ""


def run_long_inputs_bench(
    settings: EngineSettings, *, clients: int = 4, progress: Progress | None = None
) -> LongInputsResult:
    """`clef-systemone` serving `settings` (eager, whole long inputs in one step), the wait of small requests
    behind each long input."""
    from clef_vllm.format.encoder import load_tokenizer

    stage = Stages(progress)
    model, max_model_len = settings.model, settings.max_model_len
    tokenizer = load_tokenizer(model)
    port = free_port()
    # Whole long inputs in one step, unless the settings cut them into pieces (--prompt-chunk).
    step = {} if settings.prompt_chunk else {"max_num_batched_tokens": 65536}
    config = serve_config(replace(settings, enforce_eager=True, **step), port=port)
    load = load_average()
    with (
        tempfile.TemporaryDirectory() as logs,
        running(server_command(config), port, Path(logs) / "systemone.log"),
    ):
        url = f"http://127.0.0.1:{port}"
        small_latencies(url, 5)  # warm-up
        stage("small requests on an idle server")
        idle = small_latencies(url, 20)
        stage(ALONE)
        rows = [behind(url, ALONE, b"", clients=clients)]
        for name, make in LONG_INPUTS.items():
            stage(name)
            body = make()
            row = behind(url, name, encode_body(body), clients=clients)
            row.tokenizer_calls = tokenizer_calls(tokenizer, body, max_model_len)
            rows.append(row)
        stage(TWO_STATES)
        state = _state(PROSE * (TWO_STATES_BYTES // len(PROSE)))
        row = behind(url, TWO_STATES, encode_body(state), clients=clients, copies=2)
        row.tokenizer_calls = tokenizer_calls(tokenizer, state, max_model_len)
        rows.append(row)
    stage.done()
    return LongInputsResult(model, max_model_len, clients, idle, rows, load)


def render_section(result: LongInputsResult, command: str, machine: str) -> str:
    import tokenizers
    import torch
    import transformers
    import vllm

    versions = (
        f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}"
    )
    facts = {
        "machine": machine,
        "date": utc_minute(),
        "versions": versions,
        "command": f"`{command}`",
        "model": f"`{result.model}`, `--max-model-len {result.max_model_len}`",
        "workload": f"each long input once, {result.clients} clients sending a small noul request meanwhile",
        "load average": result.load,
    }
    title, *table = facts_table(HEADING, facts)
    idle = statistics.median(result.idle_small)
    lines = [
        "#" + title,
        *table,
        "",
        f"The small request alone, on an idle server: median {idle * 1000:.0f} ms, worst "
        f"{max(result.idle_small) * 1000:.0f} ms ({len(result.idle_small)} requests).",
        "",
    ]
    header = [
        "long input", "body MB", "status", "long request s", "dropped (exact)", "tokenizer calls", "longest call s",
        "small requests", "small worst s", "small p95 s", "small median s",
    ]  # fmt: skip
    rows = []
    for row in result.rows:
        if row.name == ALONE:
            small = [len(row.small_seconds), f"{row.worst:.2f}", f"{row.p95:.2f}", f"{row.median:.2f}"]
            rows.append([row.name, "", "", "", "", "", "", *small])
            continue
        dropped = row.headers.get("x-clef-state-tokens-dropped")
        exact = row.headers.get("x-clef-state-tokens-dropped-exact")
        rows.append(
            [
                row.name,
                f"{row.body_bytes / 1e6:.1f}",
                row.status,
                f"{row.seconds:.2f}",
                f"{dropped} ({exact})" if dropped is not None else f"`{row.error_code}`",
                len(row.tokenizer_calls),
                f"{max(row.tokenizer_calls, default=0.0):.3f}",
                len(row.small_seconds),
                f"{row.worst:.2f}",
                f"{row.p95:.2f}",
                f"{row.median:.2f}",
            ]
        )
    lines.append(markdown_table(header, rows, "lrrrlrrrrrr"))
    errors = sum(row.small_errors for row in result.rows)
    lines += ["", f"Small requests that failed: {errors}."]
    return "\n".join(lines) + "\n"


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (KeyError, ValueError, TypeError):
        return response.headers.get("content-type", "no body")


def split_section(text: str) -> tuple[str, str | None]:
    """A report and its long-inputs section (always the last one), if it has one."""
    head, found, section = text.partition(f"\n## {HEADING}\n")
    return head, (f"## {HEADING}\n" + section if found else None)


def join_section(report: str, section: str | None) -> str:
    return report if section is None else report.rstrip("\n") + "\n\n" + section


def read_report(out: Path) -> tuple[str, str | None]:
    """The report already at `out` (empty when there is none) and its long-inputs section: `bench serve` and
    `bench serve --long-inputs` each rewrite their own part of one report and keep the other's."""
    return split_section(out.read_text(encoding="utf-8") if out.is_file() else "")


def with_section(report: str, section: str) -> str:
    """`report` with `section` as its long-inputs section; the section alone where there is no report yet."""
    return join_section(report, section) if report.strip() else section
