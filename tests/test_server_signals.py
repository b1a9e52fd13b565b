"""`clef-systemone` told to stop while its engine loads: every process it started ends with it, and it ends by the
signal it got. Before, the server process went at once and left its EngineCore (~620 MB) running for good."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest
from servers import ENGINE_FLAGS

from clef_quant.bench.processes import free_port, server_env, systemone_command

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = [pytest.mark.slow, pytest.mark.unit(order=150)]

LOADING_SECONDS = 2.0  # into the engine's own process, well before a tiny engine is ready (20-60 s here)


def engine_processes(server: psutil.Process) -> list[psutil.Process]:
    """What the server started for its engine (multiprocessing's resource tracker is not the engine's)."""
    found = []
    for child in server.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child)
    return found


def health(port: int) -> httpx.Response | None:
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_engine_loads_ends_every_process_the_server_started(
    tiny_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    port = free_port()
    log = tmp_path / "systemone.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            systemone_command(tiny_dir, port, *ENGINE_FLAGS),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(),
            start_new_session=True,
        )
        server = psutil.Process(process.pid)
        try:
            deadline = time.monotonic() + 300
            while not engine_processes(server):
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no engine process after 300 s"
                time.sleep(0.1)
            time.sleep(LOADING_SECONDS)
            answer = health(port)
            assert answer is None or answer.json() == {"status": "starting"}  # loading, not ready
            started = server.children(recursive=True)
            signalled = time.monotonic()
            process.send_signal(sig)
            assert process.wait(timeout=60) == -sig  # it still ends by the signal
            ended = time.monotonic() - signalled
            _, alive = psutil.wait_procs(started, timeout=10)
            assert not alive, [(p.pid, p.name()) for p in alive]
            assert ended < 15, f"the server took {ended:.1f} s to end"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
