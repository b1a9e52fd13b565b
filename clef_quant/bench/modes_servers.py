"""The servers of `bench modes`: `clef-systemone` in its default mode, or vLLM's own Clef class (`vllm serve`
without our plugin), sending the workload at 1, 8 and 64 clients and comparing answers with the one-client run's.

Only answered requests count (`clients.ClientTally`): requests/s and latencies are of answered requests, a run's
errors come with the first reason, and answers are compared only where both runs answered (a failed answer equals
nothing), so a server that fails every request (vLLM 0.32 has no native Clef class) reports its errors, not a speed
or an agreement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant.bench.clients import ClientTally, post_counted

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings

CLIENT_COUNTS = (1, 8, 64)
SYSTEMONE = "clef-systemone"
NATIVE = "vllm serve (native)"  # vLLM's own Clef class (0.33 and later), without our plugin


@dataclass
class ServerRun:
    release: str
    scheme: str
    mode: str
    clients: int
    requests_s: float  # answered requests per second (0 when none was answered)
    latency_ms: list[float]  # of answered requests
    errors: int
    identical_to_one_client: int | None = None  # of `compared`
    server: str = SYSTEMONE
    requests: int | None = None  # sent (None in reports written before failures were told apart)
    first_error: str | None = None
    compared: int | None = None  # requests both this run and the one-client run answered

    @property
    def answered(self) -> int | None:
        return None if self.requests is None else self.requests - self.errors


def identical_answers(first: list[Any], second: list[Any]) -> tuple[int, int]:
    """(identical, compared) over the requests both runs answered; a failed request (None) is compared with
    nothing, so two failures are not an agreement."""
    pairs = [(a, b) for a, b in zip(first, second, strict=True) if a is not None and b is not None]
    return sum(a == b for a, b in pairs), len(pairs)


def native_server_flags(enforce_eager: bool, gpu: bool) -> list[str]:
    """`vllm serve` flags (vLLM's own command line, not ours) for the native server: eager as ours when asked, and
    the GDN prefill backend our engines get on a GPU (vLLM's default there needs FlashInfer)."""
    from clef_vllm.engine.settings import gpu_defaults

    flags = ["--enforce-eager"] if enforce_eager else []
    for key, value in (gpu_defaults({}) if gpu else {}).items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def serve_at_client_counts(
    folder: Path,
    scheme: str,
    bodies: list[dict[str, Any]],
    max_model_len: int,
    settings: EngineSettings | list[str],
    server: str = SYSTEMONE,
) -> list[ServerRun]:
    """One server, `clef-systemone` in its default mode or native vLLM with its own defaults; the workload at each
    client count, answers compared with the one-client run's. `settings`: the engine settings `clef-systemone`
    serves with (the run's offline engines start from the same), or `vllm serve`'s flags (`native_server_flags`)."""
    import asyncio
    import tempfile

    from clef_quant.bench import processes

    port = processes.free_port()
    runs: list[ServerRun] = []
    if server == NATIVE:  # vLLM answers only for the model name it serves: the one the bodies ask for
        named = ("--served-model-name", str(bodies[0].get("model", "clef")))
        shared = ("--max-model-len", str(max_model_len), "--language-model-only", *settings)
        command, env = processes.native_vllm_command(folder, port, *shared, *named), processes.native_vllm_env()
    else:
        engine = replace(settings.for_model(folder), max_model_len=max_model_len, language_model_only=True)
        command, env = processes.server_command(processes.serve_config(engine, port=port)), None
    with tempfile.TemporaryDirectory() as logs, processes.running(command, port, Path(logs) / "server.log", env):
        url = f"http://127.0.0.1:{port}/v1/systemone"
        baseline: list[Any] | None = None
        for clients in CLIENT_COUNTS:
            rate, tally, answers = asyncio.run(timed_clients(url, bodies, clients))
            run = ServerRun(
                str(folder),
                scheme,
                "invariant" if server == SYSTEMONE else "vLLM's defaults",
                clients,
                rate,
                tally.latencies_ms,
                tally.errors,
                server=server,
                requests=len(bodies),
                first_error=tally.first_error,
            )
            if baseline is None:
                baseline = answers
            else:
                run.identical_to_one_client, run.compared = identical_answers(baseline, answers)
            runs.append(run)
    return runs


async def timed_clients(
    url: str, bodies: list[dict[str, Any]], clients: int
) -> tuple[float, ClientTally, list[Any | None]]:
    """`clients` concurrent clients send every body once: answered requests/s, what they saw, and the answers in
    body order (None where a request failed)."""
    import asyncio

    import httpx

    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(bodies)):
        queue.put_nowait(index)
    tally = ClientTally()
    answers: list[Any | None] = [None] * len(bodies)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            body = await post_counted(http, url, tally, json=bodies[index])
            answers[index] = None if body is None else body.get("answers")

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients)) as http:
        for body in bodies[:4]:  # warm-up
            await post_counted(http, url, None, json=body)
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        rate = tally.rate(time.perf_counter() - start)
    return rate, tally, answers
