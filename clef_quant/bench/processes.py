"""Start real server processes on loopback (benchmarks and tests), and stop them whatever happens."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings
    from clef_vllm.server.settings import ServeConfig

STARTUP_SECONDS = 300


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FLOOR = 20000
_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, for a server started soon after.

    Drawn below the kernel's ephemeral range: a port from that range (what binding port 0 gives) can be taken in the
    meantime by any outgoing connection or by an engine's own internal sockets, and the server then fails to bind.
    Random, so that processes drawing at once rarely meet; never the same one twice in one process.
    """
    low = _ephemeral_low()
    candidates = range(LISTEN_PORTS_FLOOR, low) if low - LISTEN_PORTS_FLOOR >= 1000 else range(0)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for port in rng.sample(candidates, min(200, len(candidates))):
        if port not in _handed_out and _can_listen(port):
            _handed_out.add(port)
            return port
    with socket.socket() as sock:  # no such range here: the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _can_listen(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))  # all addresses: a server on any of them makes this fail
        except OSError:
            return False
    return True


def server_env() -> dict[str, str]:
    from clef_vllm.engine.settings import IN_PROCESS_ENV

    env = dict(os.environ)
    env.pop(IN_PROCESS_ENV, None)  # servers run their engine core as vLLM ships it
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
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()


def _signal_group(pid: int, signum: int) -> None:
    # A server that exited by itself (and was reaped by poll()) leaves no group; why it exited is what matters then.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


class ServerExited(RuntimeError):
    """A server ended before it answered /health; the message is its status and its own last words, one line."""

    def __init__(self, command: list[str], status: int, log: Path) -> None:
        self.status = status
        self.log_tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
        name = "vllm serve" if "vllm.entrypoints.openai.api_server" in command else Path(command[0]).name
        super().__init__(f"{name} exited with status {status}: {exit_reason(self.log_tail)}")
        self.add_note(f"the end of its log ({log}):\n{self.log_tail}")  # in a traceback (a test's), not the line


def exit_reason(log_text: str) -> str:
    """The line a server gave as its reason: its last `error:` line (clef-systemone's refusals), else its last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    refusals = [line for line in lines if line.startswith("error: ")]
    if refusals:
        return refusals[-1].removeprefix("error: ")
    return lines[-1] if lines else "no output"


def wait_healthy(process: subprocess.Popen, port: int, log: Path) -> list[int]:
    seen: list[int] = []
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerExited([str(arg) for arg in process.args], process.returncode, log)
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


def systemone_start() -> list[str]:
    """`clef-systemone` from the running interpreter's environment (its module where the script is not installed,
    as with `pip install --target`)."""
    script = Path(sys.executable).parent / "clef-systemone"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "clef_vllm.server.cli"]


def serve_config(settings: EngineSettings, **server: Any) -> ServeConfig:
    """The `clef-systemone` settings that start its engine as `settings` do, with the server's own `server`
    fields (its port); a `ServeConfig`'s own server fields are not carried over."""
    from clef_vllm.engine.engine_settings import EngineSettings
    from clef_vllm.server.settings import ServeConfig

    engine = {f.name: getattr(settings, f.name) for f in dataclasses.fields(EngineSettings)}
    return ServeConfig(**engine, **server)


def server_command(settings: ServeConfig) -> list[str]:
    """The `clef-systemone` command that serves with `settings` (its flags written by the settings themselves)."""
    return [*systemone_start(), *settings.command_line()]


def systemone_command(model: Path | str, port: int, *flags: str) -> list[str]:
    """`clef-systemone` with flags as a user types them (the tests' servers start so)."""
    return [*systemone_start(), "--model", str(model), "--port", str(port), *flags]


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
