"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

# One torch thread per process, for this process and every process it starts (CLI runs, servers, the README
# session). The tiny model's ops are far too small to split, and a second OpenMP thread spin-waits at every op's
# barrier: with any other busy process on two cores (the suite's own servers, a neighbour's job) a forward pass of
# the tiny model took 3.9 s instead of 0.12 s, and `clef-quant scan` 73 s of CPU instead of 11 s. vLLM does the same
# for its engine steps (`set_torch_threads_for_runtime`). Set before torch is imported; an explicit value wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny Clef release (seed 0), built once per test session (~3 s). Treat it as read-only."""
    from clef_quant.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("release") / "tiny", size="tiny", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path):
    """The tiny release's tokenizer, loaded once. Treat it as read-only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def processor(tiny_dir: Path):
    """The tiny release's processor (images and videos), loaded once. Treat it as read-only."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_dir)


# -- quantized tiny releases (clef-quant quantize); shared by the quantize, vLLM plugin and eval tests ----------

QUANTIZE_TEST_RECORDS = 4  # drawn from the shipped eval/calibration/default.jsonl (NVFP4 family only)


@pytest.fixture(scope="session")
def quantized_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """`quantized_dir(scheme) -> Path`: `tiny_dir` quantized by clef-quant with `scheme` (fp8-dynamic, nvfp4,
    nvfp4-hybrid, nvfp4a16), built on first use and then shared by the whole session. Treat it as read-only."""
    from clef_quant.quantize.run import QuantizeConfig, quantize

    root = tmp_path_factory.mktemp("quantized")
    built: dict[str, Path] = {}

    def get(scheme: str) -> Path:
        if scheme not in built:
            config = QuantizeConfig(
                source=str(tiny_dir), out=root / scheme, scheme=scheme, calibration_records=QUANTIZE_TEST_RECORDS
            )
            built[scheme] = quantize(config).out
        return built[scheme]

    return get


# -- the other Clef models: clef-tiny (the 27B's architecture) and omni-tiny (Clef-Omni's) ----------------------


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory: pytest.TempPathFactory):
    """`family_dir(size) -> Path`: a random-weight release of a make-tiny size (seed 0), built on first use and
    shared by the session. Treat it as read-only."""
    from clef_quant.tiny import make_tiny

    root = tmp_path_factory.mktemp("family")
    built: dict[str, Path] = {}

    def get(size: str) -> Path:
        if size not in built:
            built[size] = make_tiny(root / size, size=size, seed=0)
        return built[size]

    return get


@pytest.fixture(scope="session")
def family_quantized(family_dir, tmp_path_factory: pytest.TempPathFactory):
    """`family_quantized(size, scheme) -> Path`: `family_dir(size)` quantized with `scheme`, built on first use."""
    from clef_quant.quantize.run import QuantizeConfig, quantize

    root = tmp_path_factory.mktemp("family-quantized")
    built: dict[tuple[str, str], Path] = {}

    def get(size: str, scheme: str) -> Path:
        if (size, scheme) not in built:
            config = QuantizeConfig(
                source=str(family_dir(size)),
                out=root / f"{size}-{scheme}",
                scheme=scheme,
                calibration_records=QUANTIZE_TEST_RECORDS,
            )
            built[size, scheme] = quantize(config).out
        return built[size, scheme]

    return get


# vLLM engines run in the test process: start in seconds instead of ~20 s, and schedule an offline
# batch deterministically. Server tests start their own processes with their own environment.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ENGINE_MAX_MODEL_LEN = 4096


# The tests' in-process engines get a small KV cache of their own (the tiny model's one 4,096-token prompt needs a
# few MiB; 64 MiB holds about 80,000 tokens) instead of the process's whole GiB (VLLM_CPU_KVCACHE_SPACE, kept for
# the engines that eval and the CLI start here), so that each engine the suite asks for again stays open: about
# twenty different ones, most asked for by several modules, each ~0.1 GB in process (~1 GB for Omni's, whose core
# runs in its own process), and no test uses more than two at once.
ENGINE_KV_CACHE_BYTES = 64 * 2**20
ENGINES_KEPT = 16


@contextmanager
def small_kv_cache() -> Iterator[dict[str, int]]:
    """The engine argument for an ENGINE_KV_CACHE_BYTES cache, for the engines started inside: the process's
    VLLM_CPU_KVCACHE_SPACE, which vLLM's CPU platform would put over it, is out of the way until the end."""
    space = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:
        yield {"kv_cache_memory_bytes": ENGINE_KV_CACHE_BYTES}
    finally:
        if space is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = space


@pytest.fixture(scope="session")
def clef_engine():
    """Factory for `ClefEngine`s, shared by every test that asks for the same one; the least recently asked-for
    engine is closed once more than ENGINES_KEPT are open, and every one at the end of the session."""
    from clef_vllm.engine import ClefEngine

    count_engine_starts()  # the module is imported now: its first engine is counted too
    engines: OrderedDict[tuple[str, str], ClefEngine] = OrderedDict()

    def get(model: Path, **engine_kwargs) -> ClefEngine:
        key = (str(model), repr(sorted(engine_kwargs.items())))
        if key in engines:
            engines.move_to_end(key)
            return engines[key]
        while len(engines) >= ENGINES_KEPT:
            engines.popitem(last=False)[1].close()
        with small_kv_cache() as kv_cache:
            engines[key] = ClefEngine(
                model, max_model_len=ENGINE_MAX_MODEL_LEN, enforce_eager=True, **kv_cache, **engine_kwargs
            )
        return engines[key]

    yield get
    # Closed here, not in the interpreter's teardown: an engine core in its own process (Omni's) is stopped while
    # logging still works, and the last in-process engine frees vLLM's process-wide state.
    while engines:
        engines.popitem()[1].close()


# -- the servers the session shares, started beside the suite --------------------------------------------------
# A server takes ~20 s to start, almost all of it in its own processes: started with the first test (from a
# thread), it is up by the time a test asks for it, while the suite went on.


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
def session_servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """`shared_systemone` and `vllm_serve`, each started with the suite's first test when a selected test uses it."""
    from servers import ENGINE_FLAGS, SHARED_API_KEY, observed_systemone, vllm_serve

    from clef_quant.bench.processes import server_env

    wanted = [name for name in ("shared_systemone", "vllm_serve") if selected_tests_use(request.session, name)]
    starting: dict[str, Starting] = {}
    if not wanted:
        yield starting
        return
    tiny = request.getfixturevalue("tiny_dir")
    logs = tmp_path_factory.mktemp("logs")
    env = server_env()  # made here: tests change this process's environment while the servers start
    if "shared_systemone" in wanted:
        flags = ("--api-key", SHARED_API_KEY, *ENGINE_FLAGS)
        log = logs / "shared-systemone.log"
        starting["shared_systemone"] = Starting(observed_systemone(tiny, log, *flags, env=env))
    if "vllm_serve" in wanted:
        starting["vllm_serve"] = Starting(vllm_serve(tiny, logs / "shared-vllm-serve.log", env=env))
    try:
        yield starting
    finally:
        for server in starting.values():
            server.stop()


@pytest.fixture(scope="session")
def shared_systemone(session_servers: dict[str, Starting]):
    """One `clef-systemone` on the tiny checkpoint (`--api-key servers.SHARED_API_KEY`, the test engine flags),
    shared by the modules that need nothing else of it. Tests must leave it serving."""
    return session_servers["shared_systemone"].result()


@pytest.fixture(scope="session")
def vllm_serve(session_servers: dict[str, Starting]) -> str:
    """One `vllm serve` on the tiny checkpoint with our architecture (media on), shared like `shared_systemone`."""
    return session_servers["vllm_serve"].result()


# -- the README's examples, beside the suite -------------------------------------------------------------------
# Their bash session (tests/test_readme_examples.py) runs minutes of its own processes; the suite's torch work runs
# on one thread. Started with the first test, the session uses the machine's other core while the suite goes on.

README_TEST = "test_readme_examples.py::test_readme_examples_run_as_written"
README_SESSIONS: list = []


@pytest.fixture(scope="session", autouse=True)
def readme_session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The README session of test_readme_examples_run_as_written, started with the suite's first test when that
    test is selected (None otherwise); stopped at the end of the suite if that test did not wait for it."""
    if not any(item.nodeid.endswith(README_TEST) for item in request.session.items):
        yield None
        return
    from test_readme_examples import start_session

    session = start_session(tmp_path_factory.mktemp("readme"))
    README_SESSIONS.append(session)
    try:
        yield session
    finally:
        session.finish()


@pytest.fixture(scope="module")
def head():
    """A random head at the small test config (test_head.CONFIG), the same weights in every module."""
    from test_head import make_head

    return make_head()


@pytest.fixture(scope="module")
def embeddings():
    """Output-embedding rows for the head tests' vocabulary."""
    import torch
    from test_head import CONFIG, VOCAB

    return torch.randn(VOCAB, CONFIG.hidden_size, generator=torch.Generator().manual_seed(99))


@pytest.fixture
def live_process():
    """A process that is alive for the test (a writer that has not finished), killed afterwards."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


# -- engine starts, counted for the session summary --------------------------------------------------------------
# Each start costs seconds in process and ~20 s as a server; the summary at the end of a run shows what started how
# often, so a duplicate start (a fixture that could have been shared) is seen.

ENGINE_STARTS: Counter[str] = Counter()


def count_engine_starts() -> None:
    """Count every `ClefEngine` made in this process, once its module is imported (idempotent)."""
    module = sys.modules.get("clef_vllm.engine")
    if module is None or getattr(module.ClefEngine.__init__, "counted", False):
        return
    started = module.ClefEngine.__init__

    def init(self, model, *args, **kwargs) -> None:
        folder = Path(str(model))
        settings = " ".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
        ENGINE_STARTS[f"in-process {folder.parent.name}/{folder.name} {settings}"] += 1
        started(self, model, *args, **kwargs)

    init.counted = True
    module.ClefEngine.__init__ = init


def pytest_configure(config: pytest.Config) -> None:
    from clef_quant.bench import processes

    waited = processes.wait_healthy

    def wait_healthy(process: subprocess.Popen, port: int, log: Path) -> list[int]:
        command = [str(a) for a in process.args]
        name = "vllm serve" if "vllm.entrypoints.openai.api_server" in command else Path(command[0]).name
        flags = [a for i, a in enumerate(command) if i and command[i - 1] not in ("--model", "--port")]
        shown = " ".join(a for a in flags if a.startswith("-") or not Path(a).is_absolute())
        ENGINE_STARTS[f"server {name} {shown}"] += 1
        return waited(process, port, log)

    processes.wait_healthy = wait_healthy


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    count_engine_starts()


def pytest_terminal_summary(terminalreporter) -> None:
    for session in README_SESSIONS:
        if session.elapsed is not None:
            terminalreporter.write_sep("-", f"README session: {session.elapsed:.0f} s, beside the suite")
    if not ENGINE_STARTS:
        return
    total = sum(ENGINE_STARTS.values())
    terminalreporter.write_sep("-", f"engine starts: {total} (README session's own not counted)")
    for what, count in sorted(ENGINE_STARTS.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count:3d}  {what}")
