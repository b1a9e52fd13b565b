"""`clef-systemone --dp N` and `--tp N` on a CPU: data parallel engines answer exactly as one engine does, every
rank gets cores of its own, what vLLM cannot run ends the command with one `error:` line, and one engine's death
ends the server within seconds.

`--tp 2` is not started here: it starts (55-80 s on two shared cores, about twice a one-engine server) and its
answers differ from one engine's by up to 0.012, stable across runs (docs/serve.md, "Several engines"); what is ours in
it, the cores each rank is bound to, is checked below without an engine."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import ENGINE_FLAGS, SHARED_AUTH
from workloads import short_requests

from clef_quant.bench.processes import free_port, server_env, systemone_command, wait_healthy
from clef_vllm.engine.cpu.threads import BIND_ENV, LogicalCpu, omp_binding
from clef_vllm.errors import SettingsError
from clef_vllm.server.cli import EXIT_ENGINE_DIED

# One unit of work with the other modules on the session's shared servers (tests/plugins/shared_servers.py),
# handed out right after the README's.
pytestmark = pytest.mark.unit("shared-servers", order=20)


def cpus(count: int, siblings: int = 1, nodes: int = 1) -> list[LogicalCpu]:
    """`count` logical CPUs numbered as Linux does: the second thread of core c is CPU c + count / siblings."""
    cores = count // siblings
    return [LogicalCpu(cpu, cpu % cores, (cpu % cores) * nodes // cores) for cpu in range(count)]


def test_ranks_get_cores_of_their_own_where_numa_nodes_are_too_few() -> None:
    assert omp_binding(2, cpus(2), [0], None) == "0|1"  # this machine: no core left over
    assert omp_binding(2, cpus(8), [0], "auto") == "0,1,2|3,4,5"  # one core left to the server
    assert omp_binding(2, cpus(8, siblings=2), [0], None) == "4|5"  # one thread per physical core


def test_vllm_binds_threads_itself_where_it_can() -> None:
    assert omp_binding(1, cpus(2), [0], None) is None
    assert omp_binding(2, cpus(16, nodes=2), [0, 1], None) is None  # a NUMA node per rank
    assert omp_binding(2, cpus(2), [0], "0|1") is None
    assert omp_binding(2, cpus(2), [0], "nobind") is None


def test_ranks_without_cores_of_their_own_are_refused() -> None:
    with pytest.raises(SettingsError) as refused:
        omp_binding(4, cpus(2), [0], None)
    assert str(refused.value) == (
        "4 engine ranks (tensor x data parallel size) need a CPU core each and this machine allows 2: vLLM's CPU "
        f"backend runs every rank's threads on cores of its own (or set {BIND_ENV})"
    )
    with pytest.raises(SettingsError, match=r"^VLLM_CPU_OMP_THREADS_BIND='0\|1' gives 2 CPU list\(s\) and 4 "):
        omp_binding(4, cpus(8), [0], "0|1")
    with pytest.raises(SettingsError, match=r"need a NUMA node each .* allows 2: set VLLM_CPU_OMP_THREADS_BIND"):
        omp_binding(4, cpus(16, nodes=2), [0, 1], None)


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from clef_vllm.server.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert "Traceback" not in "\n".join(lines)
    (line,) = [line for line in lines if line.startswith("error: ")]
    return line


def test_clef_systemone_refuses_what_vllm_cannot_run_in_one_line(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In a full run, vLLM's log handlers can still hold an earlier test's captured (closed) stderr; the logging
    # module would print its own "Logging error" traceback for them here, which no user of the command sees.
    monkeypatch.setattr(logging, "raiseExceptions", False)
    monkeypatch.setenv(BIND_ENV, "0|1")
    line = refusal(["--model", str(tiny_dir), "--tp", "2", "--dp", "2"], capsys)
    assert line.startswith(f"error: {BIND_ENV}='0|1' gives 2 CPU list(s) and 4 engine ranks")
    # Three ranks on two cores would be slow, but vLLM refuses the split itself: the tiny model has 4 heads.
    monkeypatch.setenv(BIND_ENV, "0|1|0")
    line = refusal(["--model", str(tiny_dir), "--tp", "3", *ENGINE_FLAGS], capsys)
    assert line == (
        "error: vLLM refuses the engine settings: Total number of attention heads (4) must be divisible by tensor "
        "parallel size (3)."
    )


def engine_requests(url: str) -> dict[str, float]:
    """Requests each engine finished, by vLLM's `engine` label."""
    done: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total" and sample.labels["finished_reason"] == "stop":
                done[sample.labels["engine"]] = sample.value
    return done


def engine_state(metrics: str) -> dict[str, float]:
    """`clef_engine_state` by state, read with prometheus_client's parser."""
    return {
        sample.labels["state"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "clef_engine_state"
    }


def post_all(url: str, bodies: list[dict], headers: dict[str, str] | None = None) -> list[dict]:
    """The bodies sent at once (vLLM spreads a burst over its engines); the answers in order."""

    def post(body: dict) -> dict:
        response = httpx.post(
            f"{url}/v1/systemone",
            content=json.dumps(body),
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=300,
        )
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


@pytest.mark.slow
def test_data_parallel_engines_answer_as_one_engine_and_end_together(
    tiny_dir: Path, shared_systemone, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each engine is a whole copy running the same kernels with as many threads (one core each here; vLLM's own
    binding gives a lone engine one core of two too), so an answer does not depend on the engine it lands on.

    Then one of the two engines is killed under load: /metrics shows the engine dead, requests get a 503 until the
    server is gone, which exits with status 3 so that a supervisor restarts it, and no engine process is left
    behind. Who notices first varies: the
    server's own watcher (every 0.5 s, which ends the orphaned rank at once), or vLLM (whose process manager first
    waits out a 5-second grace on that rank). The exit time is only reported, since two loaded cores stretch it."""
    # vLLM logs the binding at INFO; a `clef-quant eval` run in this process earlier left its quiet level here.
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    bodies = short_requests(6, seed=5)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "dp2.log"
    with log.open("wb") as out:
        command = systemone_command(tiny_dir, port, "--dp", "2", *ENGINE_FLAGS)
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True
        )
        try:
            wait_healthy(process, port, log)
            started = psutil.Process(process.pid).children(recursive=True)
            cores = [p for p in started if "EngineCore" in " ".join(p.cmdline())]
            assert len(cores) == 2, [p.cmdline() for p in started]
            answers = post_all(url, bodies)
            served = engine_requests(url)
            bound = re.findall(r"core ids=\[([0-9, ]*)\]", log.read_text(errors="replace"))
            assert len(bound) == 2 and not set(bound[0].split(", ")) & set(bound[1].split(", ")), bound
            # Both engines answered: the warm-up's request each, and the burst split between them.
            assert (
                sorted(served) == ["0", "1"] and min(served.values()) >= 2 and sum(served.values()) == 2 + len(bodies)
            )
            assert answers == post_all(shared_systemone.url, bodies, SHARED_AUTH)

            # Clients keep posting through the kill until the server is gone: a whole batch can end in one engine
            # step here, so requests sent once could all be answered before the engine dies.
            in_flight: list[httpx.Response | Exception] = []
            gone = threading.Event()

            def keep_posting(body: dict) -> None:
                while not gone.is_set():
                    try:
                        in_flight.append(httpx.post(f"{url}/v1/systemone", json=body, timeout=60))
                    except httpx.TransportError as exc:
                        in_flight.append(exc)
                        return

            threads = [threading.Thread(target=keep_posting, args=(body,)) for body in short_requests(8, seed=3)]
            for thread in threads:
                thread.start()
            while not in_flight:
                time.sleep(0.005)
            killed = time.monotonic()
            cores[0].kill()
            # A scraper sees the engine dead while the server still answers (it exits a grace period later).
            states: list[dict[str, float]] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (not states or states[-1]["dead"] != 1.0):
                states.append(engine_state(httpx.get(f"{url}/metrics", timeout=30).text))
                time.sleep(0.05)
            status = process.wait(timeout=60)
            ended = time.monotonic() - killed
            gone.set()
            for thread in threads:
                thread.join()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert status == EXIT_ENGINE_DIED, f"status {status}, {ended:.1f} s after the kill"
    assert states[-1] == {"starting": 0.0, "ready": 0.0, "dead": 1.0}, states
    assert "the engine has stopped" in log.read_text(errors="replace")
    # Answers until the server closed its socket: 200 before the engine's death, 503 after it.
    answered = [a for a in in_flight if isinstance(a, httpx.Response)]
    codes = [a.status_code for a in answered]
    assert set(codes) <= {200, 503} and 503 in codes, codes
    assert {a.json()["error"]["type"] for a in answered if a.status_code == 503} == {"service_unavailable"}
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, [(p.pid, p.name()) for p in alive]
