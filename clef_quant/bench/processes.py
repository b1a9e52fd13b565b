"""Start real server processes on loopback (benchmarks and tests), and stop them whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

STARTUP_SECONDS = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # servers run their engine core as vLLM ships it
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


@contextlib.contextmanager
def running(command: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> Iterator[list[int]]:
    """Run `command` until the block ends; yields the /health status codes seen until it answered 200."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env or server_env(), start_new_session=True
        )
        try:
            yield wait_healthy(process, port, log)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def wait_healthy(process: subprocess.Popen, port: int, log: Path) -> list[int]:
    seen: list[int] = []
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
        except httpx.TransportError:
            time.sleep(0.5)
            continue
        seen.append(status)
        if status == 200:
            return seen
        time.sleep(0.5)
    raise RuntimeError(f"server not healthy after {STARTUP_SECONDS} s:\n{log.read_text()[-4000:]}")


def systemone_command(model: Path | str, port: int, *flags: str) -> list[str]:
    """`clef-systemone` from the running interpreter's environment (its module where the script is not installed,
    as with `pip install --target`)."""
    script = Path(sys.executable).parent / "clef-systemone"
    start = [str(script)] if script.is_file() else [sys.executable, "-m", "clef_vllm.server.cli"]
    return [*start, "--model", str(model), "--port", str(port), *flags]


def native_vllm_command(model: Path | str, port: int, *flags: str) -> list[str]:
    """`vllm serve` as a vLLM that serves Clef natively (0.33 and later) runs it: its own model class and
    /v1/systemone, its own defaults. Start it with `native_vllm_env()` so our plugin stays out of it."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--runner", "pooling", "--port", str(port), *flags,
    ]  # fmt: skip


def native_vllm_env() -> dict[str, str]:
    env = server_env()
    env["VLLM_PLUGINS"] = ""  # vLLM loads only the plugins named here: none
    return env
