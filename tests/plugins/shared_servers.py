"""The servers the session shares (`shared_systemone`, `vllm_serve`), started beside the suite.

A server takes ~20 s to start, almost all of it in its own processes: started with the first test (from a thread),
it is up by the time a test asks for it, while the suite went on. On two workers the modules that use them are one
unit of work (`pytest.mark.unit("shared-servers")`), so one worker starts each server once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from plugins.work_units import in_worker


class Starting:
    """A server's context manager, entered in a thread of its own; `result()` waits for what it yields."""

    def __init__(self, manager: AbstractContextManager[Any]) -> None:
        self.manager = manager
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._enter, daemon=True)
        self.thread.start()

    def _enter(self) -> None:
        try:
            self.value = self.manager.__enter__()
        except BaseException as exc:  # raised again to the test that asks for the server
            self.error = exc

    def result(self) -> Any:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value

    def stop(self) -> None:
        self.thread.join()
        if self.error is None:
            self.manager.__exit__(None, None, None)


def selected_tests_use(session: pytest.Session, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in session.items)


@pytest.fixture(scope="session", autouse=True)
def session_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str, Path], Starting]]:
    """`start(name, tiny) -> Starting` for `shared_systemone` and `vllm_serve`. A serial run starts each one that a
    selected test uses with its first test; a worker starts one when a test first asks for it (the modules that
    use them are one unit of work, so one worker does)."""
    from servers import SHARED_FLAGS, observed_systemone, vllm_serve

    from clef_quant.bench.processes import server_env

    env = server_env()  # made here: tests change this process's environment while the servers start
    starting: dict[str, Starting] = {}

    def start(name: str, tiny: Path) -> Starting:
        if name not in starting:
            log = tmp_path_factory.mktemp("logs") / f"shared-{name}.log"
            if name == "shared_systemone":
                server = observed_systemone(tiny, log, *SHARED_FLAGS, env=env)
            else:
                server = vllm_serve(tiny, log, env=env)
            starting[name] = Starting(server)
        return starting[name]

    if not in_worker():
        for name in ("shared_systemone", "vllm_serve"):
            if selected_tests_use(request.session, name):
                start(name, request.getfixturevalue("tiny_dir"))
    try:
        yield start
    finally:
        for server in starting.values():
            server.stop()


@pytest.fixture(scope="session")
def shared_systemone(session_servers: Callable[[str, Path], Starting], tiny_dir: Path) -> Any:
    """One `clef-systemone` on the tiny checkpoint (`servers.SHARED_FLAGS`: an API key, small media limits, the test
    engine flags),
    shared by the modules that need nothing else of it (a `servers.StartedServer`). Tests must leave it serving."""
    return session_servers("shared_systemone", tiny_dir).result()


@pytest.fixture(scope="session")
def vllm_serve(session_servers: Callable[[str, Path], Starting], tiny_dir: Path) -> str:
    """One `vllm serve` on the tiny checkpoint with our architecture (media on), shared like `shared_systemone`."""
    return session_servers("vllm_serve", tiny_dir).result()
