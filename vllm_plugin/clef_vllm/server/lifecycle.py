"""The engine's processes over the server's life: started in a thread the event loop does not wait for, watched
for a death directly, and ended whenever the server stops, while the engine loads too.

vLLM marks an engine dead only once its process manager has stopped every other rank of it, which gives each a
5-second grace after SIGTERM; a data-parallel rank whose peer died sits in a collective that never returns and
uses all of it. Watching the processes' sentinels sees the death at once, and the ranks left are of no use.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import connection
from types import FrameType
from typing import Any

import psutil

# How long a process told to stop (SIGTERM) gets before it is killed.
STOP_GRACE_SECONDS = 3.0
# How long a server told to stop waits for an engine still loading to give up once its processes are gone.
LOADING_STOP_SECONDS = 20.0


class EngineStart:
    """`start` (the engine's construction) in a daemon thread, awaited by the event loop.

    `asyncio.to_thread` would put it in the loop's default executor, which the loop joins when it closes: a server
    stopped while the engine loads would wait for the whole load, and leave the engine it made behind."""

    def __init__(self, start: Callable[[], None]) -> None:
        self._start = start
        self.thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():  # the awaiting task was cancelled: the server is stopping
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def target() -> None:
            error: BaseException | None = None
            try:
                self._start()
            except BaseException as exc:  # handed to the awaiting task, which reports it
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, error)

        self.thread = threading.Thread(target=target, name="clef-engine-start", daemon=True)
        self.thread.start()
        await done


def engine_processes(engine: Any) -> list[Any]:
    """The processes vLLM runs `engine` (an AsyncLLM) in: one core per data-parallel rank, and their coordinator
    (their own workers are their children). Empty while it loads or when the core runs in this process."""
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    processes = list(getattr(getattr(resources, "engine_manager", None), "processes", None) or ())
    coordinator = getattr(getattr(resources, "coordinator", None), "proc", None)
    return processes + ([coordinator] if coordinator is not None else [])


def exited(processes: list[Any]) -> list[Any]:
    """Those of `processes` (multiprocessing processes) that have ended, seen without reaping them."""
    if not processes:
        return []
    ready = set(connection.wait([p.sentinel for p in processes], timeout=0))
    return [p for p in processes if p.sentinel in ready]


def end_engine_processes(engine: Any, grace: float = STOP_GRACE_SECONDS) -> None:
    """End every process of `engine` still running (`end_processes`)."""
    roots = []
    for process in engine_processes(engine):
        if process.pid is None:  # never started (psutil.Process(None) would be this process)
            continue
        with contextlib.suppress(psutil.Error):  # gone already
            roots.append(psutil.Process(process.pid))
    end_processes(roots, grace)


def end_processes(roots: list[psutil.Process], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM to `roots` (each shuts its own workers down), SIGKILL to them and every descendant still alive after
    `grace` seconds. Descendants are listed before anything is signalled: a process killed first would leave its
    children to init, out of reach."""
    everyone: dict[int, psutil.Process] = {}
    for root in roots:
        with contextlib.suppress(psutil.Error):
            for process in [root, *root.children(recursive=True)]:
                everyone[process.pid] = process
    for root in roots:
        with contextlib.suppress(psutil.Error):
            root.terminate()
    _, alive = psutil.wait_procs(list(everyone.values()), timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=grace)


def server_children() -> list[psutil.Process]:
    """The processes this one started, but multiprocessing's resource tracker (it ends by itself with this process
    and cleans up after the others)."""
    return [
        child
        for child in psutil.Process().children()
        if "multiprocessing.resource_tracker" not in " ".join(_cmdline(child))
    ]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def end_all_children(start: EngineStart | None, deadline_seconds: float = LOADING_STOP_SECONDS) -> None:
    """End every process this server started, and any an engine still loading starts until it gives up (it does
    once its core is gone), or until `deadline_seconds` have passed."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        end_processes(server_children())
        if start is None or not start.running or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    end_processes(server_children())


class StopSignals:
    """SIGTERM and SIGINT, recorded while uvicorn serves (it hands a signal it caught to the handler it found when
    it ends) and raised again once the engine's processes are gone, so the process still ends by the signal."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, on_signal: Callable[[], None]) -> None:
        self.on_signal = on_signal  # for a signal that comes before uvicorn listens for its own
        self.received: list[int] = []

    def install(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, self._record)

    def _record(self, sig: int, frame: FrameType | None) -> None:
        self.received.append(sig)
        self.on_signal()

    def raise_again(self) -> None:
        """End the process by the first signal received (nothing when none was)."""
        if not self.received:
            return
        sig = self.received[0]
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)
