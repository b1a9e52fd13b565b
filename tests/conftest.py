"""Fixtures shared by the whole suite."""

from __future__ import annotations

import functools
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
from filelock import FileLock

# One torch thread per process, for this process and every process it starts (CLI runs, servers, the README
# session). The tiny model's ops are far too small to split, and a second OpenMP thread spin-waits at every op's
# barrier: with any other busy process on two cores (the suite's own servers, a neighbour's job) a forward pass of
# the tiny model took 3.9 s instead of 0.12 s, and `clef-quant scan` 73 s of CPU instead of 11 s. vLLM does the same
# for its engine steps (`set_torch_threads_for_runtime`). Set before torch is imported; an explicit value wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# -- running on two workers (`make test` runs `pytest -n 2`, pytest-xdist) -------------------------------------
# The suite is bound by CPU work in processes it starts (servers, CLI runs, engines), and one worker leaves a core
# idle between them. Each test module is one unit of work, handed out in the order of WORK_ORDER (the longest
# first, so both workers end together); the modules that share the session's servers are one unit.

SHARED_SERVER_MODULES = (
    "test_clients.py", "test_server.py", "test_server_front_door.py", "test_server_media.py",
    "test_server_parallel.py", "test_server_protocol.py",
)  # fmt: skip
WORK_ORDER = (
    "test_readme_examples.py", "shared-servers", "test_family.py", "test_quality.py", "test_bench_entries.py",
    "test_invariance.py", "test_score_quantized.py", "test_omni_media.py", "test_release.py",
    "test_quantize_integrity.py", "test_server_hostile.py", "test_server_load.py", "test_wheel.py",
    "test_server_metrics.py", "test_server_signals.py", "test_quantize_streaming.py", "test_engine_loading.py",
    "test_settings_refusals.py", "test_release_audit.py",
)  # fmt: skip


def in_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def work_unit(nodeid: str) -> str:
    module = Path(nodeid.split("::", 1)[0]).name
    return "shared-servers" if module in SHARED_SERVER_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with our units of work as the scopes."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: the units in WORK_ORDER first (ties keep their order), the order the scheduler hands them out
    in (with `--no-loadscope-reorder`)."""
    if in_worker():
        rank = {unit: n for n, unit in enumerate(WORK_ORDER)}
        items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(WORK_ORDER)))


def build_root(factory: pytest.TempPathFactory, name: str) -> Path:
    """The folder a session fixture builds into; on workers, one folder shared by the run's workers."""
    if not in_worker():
        return factory.mktemp(name)
    root = factory.getbasetemp().parent / name
    root.mkdir(exist_ok=True)
    return root


def built_once(root: Path, key: str, build: Any) -> Path:
    """`root / key`, made by `build(root / key)` unless a worker already made it: the first to ask builds under a
    lock and the others wait and read it (make-tiny and quantize write a folder whole or not at all)."""
    with FileLock(str(root / f"{key}.lock")):
        out = root / key
        return out if out.exists() else build(out)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny Clef release (seed 0), built once per test run (~3 s). Treat it as read-only."""
    from clef_quant.tiny import make_tiny

    return built_once(build_root(tmp_path_factory, "release"), "tiny", lambda out: make_tiny(out, size="tiny", seed=0))


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

    root = build_root(tmp_path_factory, "quantized")

    def build(scheme: str, out: Path) -> Path:
        config = QuantizeConfig(source=str(tiny_dir), out=out, scheme=scheme, calibration_records=QUANTIZE_TEST_RECORDS)
        return quantize(config).out

    @functools.cache
    def get(scheme: str) -> Path:
        return built_once(root, scheme, functools.partial(build, scheme))

    return get


# -- the other Clef models: clef-tiny (the 27B's architecture) and omni-tiny (Clef-Omni's) ----------------------


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory: pytest.TempPathFactory):
    """`family_dir(size) -> Path`: a random-weight release of a make-tiny size (seed 0), built on first use and
    shared by the session. Treat it as read-only."""
    from clef_quant.tiny import make_tiny

    root = build_root(tmp_path_factory, "family")

    @functools.cache
    def get(size: str) -> Path:
        return built_once(root, size, lambda out: make_tiny(out, size=size, seed=0))

    return get


@pytest.fixture(scope="session")
def family_quantized(family_dir, tmp_path_factory: pytest.TempPathFactory):
    """`family_quantized(size, scheme) -> Path`: `family_dir(size)` quantized with `scheme`, built on first use."""
    from clef_quant.quantize.run import QuantizeConfig, quantize

    root = build_root(tmp_path_factory, "family-quantized")

    def build(size: str, scheme: str, out: Path) -> Path:
        config = QuantizeConfig(
            source=str(family_dir(size)), out=out, scheme=scheme, calibration_records=QUANTIZE_TEST_RECORDS
        )
        return quantize(config).out

    @functools.cache
    def get(size: str, scheme: str) -> Path:
        return built_once(root, f"{size}-{scheme}", functools.partial(build, size, scheme))

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
    """`start(name, tiny) -> Starting` for `shared_systemone` and `vllm_serve`. A serial run starts each one that a
    selected test uses with its first test; a worker starts one when a test first asks for it (the modules that
    use them are one unit of work, so one worker does)."""
    from servers import ENGINE_FLAGS, SHARED_API_KEY, observed_systemone, vllm_serve

    from clef_quant.bench.processes import server_env

    env = server_env()  # made here: tests change this process's environment while the servers start
    starting: dict[str, Starting] = {}

    def start(name: str, tiny: Path) -> Starting:
        if name not in starting:
            log = tmp_path_factory.mktemp("logs") / f"shared-{name}.log"
            if name == "shared_systemone":
                server = observed_systemone(tiny, log, "--api-key", SHARED_API_KEY, *ENGINE_FLAGS, env=env)
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
def shared_systemone(session_servers, tiny_dir: Path):
    """One `clef-systemone` on the tiny checkpoint (`--api-key servers.SHARED_API_KEY`, the test engine flags),
    shared by the modules that need nothing else of it. Tests must leave it serving."""
    return session_servers("shared_systemone", tiny_dir).result()


@pytest.fixture(scope="session")
def vllm_serve(session_servers, tiny_dir: Path) -> str:
    """One `vllm serve` on the tiny checkpoint with our architecture (media on), shared like `shared_systemone`."""
    return session_servers("vllm_serve", tiny_dir).result()


# -- the README's examples, beside the suite -------------------------------------------------------------------
# Their bash session (tests/test_readme_examples.py) runs minutes of its own processes; the suite's torch work runs
# on one thread. A serial run starts the session with its first test, so that it uses the machine's other core
# while the suite goes on; on workers, the README module is the first unit handed out and the session runs when
# its test does, on one worker, while the other worker runs the rest.

README_TEST = "test_readme_examples.py::test_readme_examples_run_as_written"
README_ELAPSED: list[float] = []


@contextmanager
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The README session, started now; stopped (if its test did not wait for it) and timed on the way out."""
    from test_readme_examples import start_session

    session = start_session(tmp_path_factory.mktemp("readme"))
    try:
        yield session
    finally:
        session.finish()
        README_ELAPSED.append(session.elapsed)


@pytest.fixture(scope="session", autouse=True)
def readme_beside(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """In a serial run that selects the README test: its session, started with the suite's first test (else None)."""
    if in_worker() or not any(README_TEST in item.nodeid for item in request.session.items):
        yield None
        return
    with readme_run(tmp_path_factory) as session:
        yield session


@pytest.fixture(scope="session")
def readme_session(readme_beside: Any, tmp_path_factory: pytest.TempPathFactory):
    """The README session of test_readme_examples_run_as_written: the one started beside the suite, or one started
    now (on a worker, when that test runs)."""
    if readme_beside is not None:
        yield readme_beside
        return
    with readme_run(tmp_path_factory) as session:
        yield session


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
    module = sys.modules.get("clef_vllm.engine.offline")
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a worker: hand the counts and the README time to the controller, which prints the summary."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["engine_starts"] = dict(ENGINE_STARTS)
        output["readme_elapsed"] = list(README_ELAPSED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", None) or {}
    ENGINE_STARTS.update(output.get("engine_starts", {}))
    README_ELAPSED.extend(output.get("readme_elapsed", []))


def pytest_terminal_summary(terminalreporter) -> None:
    for elapsed in README_ELAPSED:
        terminalreporter.write_sep("-", f"README session: {elapsed:.0f} s")
    if not ENGINE_STARTS:
        return
    total = sum(ENGINE_STARTS.values())
    terminalreporter.write_sep("-", f"engine starts: {total} (README session's own not counted)")
    for what, count in sorted(ENGINE_STARTS.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count:3d}  {what}")
