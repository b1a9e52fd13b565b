"""Serving benchmark: the HTTP server against the offline engine, and the plugin against the reference.

All sides score the same requests in one run, one after another (two cores cannot host two engines at once
without each slowing the other):
1. the offline engine (`ClefEngine.score`) with the default settings (one whole prompt per engine step, answers
   independent of load) -> records/s;
2. `clef-systemone` as a real process on loopback with the same settings, `clients` concurrent clients sending
   the same requests -> requests/s;
3. both again with batch invariance off (vLLM batches prompts, `max_num_batched_tokens` per step);
4. the transformers reference in bf16 (batches of 8) -> records/s.
The ratios are server / offline (the cost of HTTP, JSON and per-request scheduling), invariant / batched (the
cost of answers that do not move with load) and plugin / reference.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant.bench.clients import ClientTally, post_counted
from clef_quant.bench.processes import free_port, running, serve_config, server_command
from clef_quant.bench.workload import varied_requests
from clef_quant.formatting import facts_table, markdown_table, utc_minute
from clef_quant.progress import Progress, Stages
from clef_vllm.engine.settings import CPU_KV_CACHE_ENV, apply_cpu_defaults

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings


@dataclass
class ServeBenchResult:
    model: str
    records: int
    tokens: int
    clients: int
    offline_records_s: float = 0.0
    server_requests_s: float = 0.0
    offline_batched_records_s: float = 0.0
    server_batched_requests_s: float = 0.0
    reference_records_s: float = 0.0
    server_errors: int = 0  # failed requests of both server runs; their rates count answered requests only
    server_first_error: str | None = None
    compress_above: int | None = None
    compressed_requests: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def server_over_offline(self) -> float:
        return _ratio(self.server_requests_s, self.offline_records_s)

    @property
    def invariant_over_batched_server(self) -> float:
        return _ratio(self.server_requests_s, self.server_batched_requests_s)

    @property
    def invariant_over_batched_offline(self) -> float:
        return _ratio(self.offline_records_s, self.offline_batched_records_s)

    @property
    def plugin_over_reference(self) -> float:
        return _ratio(self.offline_records_s, self.reference_records_s)


def _ratio(numerator: float, denominator: float) -> float:
    """NaN where a side answered nothing: a server whose requests all failed has no speed to compare."""
    return numerator / denominator if numerator > 0 and denominator > 0 else math.nan


def _offline(settings: EngineSettings, bodies: list[dict[str, Any]]) -> float:
    from clef_vllm.engine import ClefEngine

    engine = ClefEngine.from_settings(settings)
    engine.score(bodies[:4])  # warm-up
    start = time.perf_counter()
    engine.score(bodies)
    elapsed = time.perf_counter() - start
    engine.close()
    del engine
    gc.collect()
    return len(bodies) / elapsed


def _request(body: dict[str, Any], compress_above: int | None) -> tuple[bytes, dict[str, str]]:
    """The bytes a client sends: zstd above `compress_above` bytes, as SystemOne clients do."""
    import zstandard

    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if compress_above is not None and len(raw) > compress_above:
        return zstandard.ZstdCompressor().compress(raw), {**headers, "Content-Encoding": "zstd"}
    return raw, headers


async def _clients(
    url: str, bodies: list[dict[str, Any]], clients: int, compress_above: int | None = None
) -> tuple[float, ClientTally]:
    """Answered requests/s (a failed request adds errors, not speed) and what the clients saw."""
    import httpx

    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    tally = ClientTally()

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            content, headers = _request(queue.get_nowait(), compress_above)
            await post_counted(http, f"{url}/v1/systemone", tally, content=content, headers=headers)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(limits=limits) as http:
        await post_counted(http, f"{url}/v1/systemone", None, json=bodies[0])  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return tally.rate(time.perf_counter() - start), tally


def _server(
    settings: EngineSettings, bodies: list[dict[str, Any]], clients: int, compress_above: int | None
) -> tuple[float, ClientTally]:
    port = free_port()
    command = server_command(serve_config(settings, port=port))
    with (
        tempfile.TemporaryDirectory() as logs,
        running(command, port, Path(logs) / "systemone.log"),
    ):
        return asyncio.run(_clients(f"http://127.0.0.1:{port}", bodies, clients, compress_above))


def _reference(model: Path, bodies: list[dict[str, Any]], dtype: str, device: str) -> float:
    from clef_quant.reference import DTYPES, ReferenceScorer
    from clef_vllm.format.request import parse_request

    scorer = ReferenceScorer(model, dtype=DTYPES[dtype], device=device)
    requests = [parse_request(body) for body in bodies]
    scorer.score(requests[:4])  # warm-up, and the model load stays out of the timing
    start = time.perf_counter()
    scorer.score(requests)
    return len(requests) / (time.perf_counter() - start)


def run_serve_bench(
    settings: EngineSettings,
    *,
    records: int = 128,
    clients: int = 32,
    max_num_batched_tokens: int = 8192,
    device: str = "cpu",
    compress_above: int | None = 1024,
    progress: Progress | None = None,
) -> ServeBenchResult:
    """Score the same `records` requests offline, through the server, and with the reference.

    Server clients send bodies larger than `compress_above` bytes zstd-compressed (None: never). `settings`: the
    release and the engine settings every engine and server starts with (the batched runs change the scheduling)."""
    from clef_vllm.format.encoder import Encoder
    from clef_vllm.format.request import parse_request

    model = Path(settings.model)
    bodies = varied_requests(records, seed=11)
    encoder = Encoder(model, max_length=settings.max_model_len)
    tokens = sum(encoder.encode(parse_request(b)).num_tokens for b in bodies)
    result = ServeBenchResult(
        model=str(model), records=records, tokens=tokens, clients=clients, compress_above=compress_above
    )
    if compress_above is not None:
        result.compressed_requests = sum(len(json.dumps(b).encode()) > compress_above for b in bodies)
    if device == "cpu":
        settings = replace(settings, enforce_eager=True)
        own_size = settings.engine_overrides().get("kv_cache_memory_bytes")
        apply_cpu_defaults(own_size)  # the server process inherits it
        # An engine's own size wins over the variable (`clef_vllm.engine.settings.own_kv_cache`): say the one in use.
        kv_cache = (
            f"kv_cache_memory_bytes={own_size}"
            if own_size
            else f"{CPU_KV_CACHE_ENV}={os.environ[CPU_KV_CACHE_ENV]} GiB"
        )
        result.notes.append(f"KV cache {kv_cache}, enforce_eager")
    batched = replace(settings, batch_invariant=False, max_num_batched_tokens=max_num_batched_tokens)
    result.notes.append(
        f"batched: vLLM's default max_num_seqs, max_num_batched_tokens={max_num_batched_tokens}; "
        "invariant (the default): one whole prompt per engine step"
    )
    stage = Stages(progress)
    stage("offline engine")
    result.offline_records_s = _offline(settings, bodies)
    stage(f"clef-systemone, {clients} clients")
    result.server_requests_s, tally = _server(settings, bodies, clients, compress_above)
    stage("offline engine, batched")
    result.offline_batched_records_s = _offline(batched, bodies)
    stage(f"clef-systemone, batched, {clients} clients")
    result.server_batched_requests_s, batched_tally = _server(batched, bodies, clients, compress_above)
    result.server_errors = tally.errors + batched_tally.errors
    result.server_first_error = tally.first_error or batched_tally.first_error
    stage("transformers reference")
    result.reference_records_s = _reference(model, bodies, "bfloat16", device)
    stage.done()
    return result


def render_markdown(result: ServeBenchResult, command: str, machine: str) -> str:
    import torch
    import transformers
    import vllm

    facts = {
        "machine": machine,
        "date": utc_minute(),
        "versions": f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}",
        "command": f"`{command}`",
        "model": f"`{result.model}`",
        "workload": f"{result.records} varied requests (`clef_quant.bench.workload`), {result.tokens} prompt tokens",
    }
    lines = [
        *facts_table(
            "Serving: clef-systemone vs the offline engine, and the plugin vs the transformers reference", facts
        ),
        "",
    ]
    rates = (
        ("offline engine (`ClefEngine.score`)", result.offline_records_s),
        (f"clef-systemone, {result.clients} concurrent clients", result.server_requests_s),
        ("offline engine, `batch_invariant=False`", result.offline_batched_records_s),
        (f"clef-systemone `--no-batch-invariant`, {result.clients} clients", result.server_batched_requests_s),
        ("transformers reference, bf16, batch 8", result.reference_records_s),
    )
    rows = [
        [name, f"{rate:.2f}", f"{rate * result.tokens / result.records:.0f}"] if rate else [name, "—", "—"]
        for name, rate in rates
    ]
    ratios = [
        ["server / offline", _shown(result.server_over_offline, ".3f"), ">= 0.95"],
        ["invariant / batched, server", _shown(result.invariant_over_batched_server, ".3f"), "(cost of invariance)"],
        ["invariant / batched, offline", _shown(result.invariant_over_batched_offline, ".3f"), "(cost of invariance)"],
        ["plugin / reference", _shown(result.plugin_over_reference, ".2f"), ">= 3"],
    ]
    lines += [
        markdown_table(["side", "records/s", "tokens/s"], rows),
        "",
        markdown_table(["ratio", "value", "goal"], ratios),
        "",
        f"Server errors: {result.server_errors} of {2 * result.records} requests"
        + (f", the first: `{result.server_first_error}`" if result.server_first_error else "")
        + ". Server rates count answered requests only.",
    ]
    if result.compress_above is not None:
        lines.append(
            f"- server clients send bodies above {result.compress_above} bytes with `Content-Encoding: zstd` "
            f"({result.compressed_requests} of {result.records} requests), compressing inside the timed loop"
        )
    lines += [f"- {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def _shown(value: float, fmt: str) -> str:
    return "—" if math.isnan(value) else format(value, fmt)


def result_json(result: ServeBenchResult) -> str:
    data = {**result.__dict__, "server_over_offline": result.server_over_offline}
    data["invariant_over_batched_server"] = result.invariant_over_batched_server
    data["invariant_over_batched_offline"] = result.invariant_over_batched_offline
    data["plugin_over_reference"] = result.plugin_over_reference
    return json.dumps({k: None if isinstance(v, float) and math.isnan(v) else v for k, v in data.items()}, indent=2)
