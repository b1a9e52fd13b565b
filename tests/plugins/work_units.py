"""Units of work on two workers (`make test` runs `pytest -n 2`, pytest-xdist), declared with the `unit` marker.

The suite is bound by CPU work in processes it starts (servers, CLI runs, engines), and one worker leaves a core idle
between them. A worker takes one unit at a time and runs it whole. A unit is one test module, unless the module names
a unit of its own, `pytestmark = pytest.mark.unit("NAME")`: the modules on the session's shared servers are one unit,
so that one worker starts those servers and the other never waits for them. `order=N` hands a unit out before the
units with a larger N and before those without an order, which follow in the collection's order (a unit whose
modules ask for different places takes the first): the longest units go first, so that both workers end together
(with `--no-loadscope-reorder`, which `make test` passes).

A module without a marker is a unit of its own, so no module is ever left out of the schedule; a marker on a test or
a class, or with other arguments, fails the collection of its module. The controller does not collect: each worker
writes the units of the modules it collected to a folder the controller gave it, before it reports its collection,
and the scheduler reads them once every worker has reported.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MARKER = "unit"
UNITS_FOLDER_KEY = "clef_work_units"  # in each worker's workerinput: the folder it writes its modules' units to
UNITS_FOLDER = pytest.StashKey[Path]()


def in_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def send_to_controller(session: pytest.Session, key: str, value: Any) -> None:
    """On a worker, at the end of its session: `value` (JSON-like) for the controller, which reads it with
    `sent_by` when the worker goes down; nothing in a serial run."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[key] = value


def sent_by(node: Any, key: str, default: Any) -> Any:
    """On the controller: what a worker that went down sent under `key`, or `default`."""
    return (getattr(node, "workeroutput", None) or {}).get(key, default)


@dataclass(frozen=True)
class Unit:
    name: str
    order: int | None  # None: handed out after every unit with an order

    @property
    def rank(self) -> tuple[bool, int]:
        return (self.order is None, self.order or 0)


def unit_arguments(name: str | None = None, *, order: int | None = None) -> tuple[str | None, int | None]:
    """The marker's signature: `pytest.mark.unit(name=None, *, order=None)`."""
    return name, order


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def declared_unit(module: pytest.Module) -> Unit:
    """The unit the module's `unit` marker declares; without one, the module file alone. ValueError: arguments the
    marker does not take."""
    marker = module.get_closest_marker(MARKER)
    if marker is None:
        return Unit(module.path.name, None)
    try:
        name, order = unit_arguments(*marker.args, **marker.kwargs)
    except TypeError as exc:
        raise ValueError(f"pytest.mark.unit(name=None, *, order=None): {exc}") from None
    if not isinstance(name, str | None) or not isinstance(order, int | None) or isinstance(order, bool):
        raise ValueError(f"pytest.mark.unit takes a str name and an int order, not {marker.args} {marker.kwargs}")
    return Unit(name or module.path.name, order)


def marker_problem(
    collector: pytest.Module | pytest.Class, children: list[pytest.Item | pytest.Collector]
) -> str | None:
    """What is wrong with the `unit` marker of `collector`'s module or of one of the tests it collected, if anything."""
    module = collector.getparent(pytest.Module)  # `collector` itself for a module
    if module is None:
        return None
    if collector is module:
        try:
            declared_unit(module)
        except ValueError as exc:
            return f"{module.nodeid}: {exc}"
    # A worker runs whole units: a unit smaller than a module would set the module's fixtures up on both workers.
    on_module = module.get_closest_marker(MARKER)
    for child in children:
        if isinstance(child, pytest.Item) and child.get_closest_marker(MARKER) is not on_module:
            return f"{child.nodeid}: the unit marker belongs on the module (pytestmark), not on a test or a class"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A wrong `unit` marker fails the collection of its module (or class), so that it is reported as a collection
    error, by a worker too (an exception in a later hook would only end the worker)."""
    report = yield
    if report.passed and isinstance(collector, pytest.Module | pytest.Class):
        problem = marker_problem(collector, report.result)
        if problem is not None:
            report.outcome = "failed"
            report.longrepr = problem
            report.result = []
    return report


def module_units(items: list[pytest.Item]) -> dict[str, Unit]:
    """The unit of each module that has collected tests, by the module part of their node ids."""
    units: dict[str, Unit] = {}
    for item in items:
        key = module_of(item.nodeid)
        if key not in units:
            module = item.getparent(pytest.Module)
            units[key] = declared_unit(module) if module is not None else Unit(Path(key).name, None)
    return units


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: the items in the order their units are handed out (ties keep the collection's order), which is
    the order of the scheduler's queue with `--no-loadscope-reorder`; and the units, written for the controller."""
    if not in_worker():
        return
    units = module_units(items)
    # A unit goes where the first of its modules asks it to go.
    ranks: dict[str, tuple[bool, int]] = {}
    for unit in units.values():
        ranks[unit.name] = min(ranks.get(unit.name, unit.rank), unit.rank)
    items.sort(key=lambda item: ranks[units[module_of(item.nodeid)].name])
    workerinput: dict[str, Any] = config.workerinput  # type: ignore[attr-defined]
    if UNITS_FOLDER_KEY in workerinput:
        path = Path(workerinput[UNITS_FOLDER_KEY]) / f"{workerinput['workerid']}.json"
        path.write_text(json.dumps({module: unit.name for module, unit in units.items()}), encoding="utf-8")


def units_folder(config: pytest.Config) -> Path:
    """The controller's folder for the workers' units, made on first use and removed at the end of the run."""
    if UNITS_FOLDER not in config.stash:
        config.stash[UNITS_FOLDER] = Path(tempfile.mkdtemp(prefix="pytest-work-units-"))
    return config.stash[UNITS_FOLDER]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[UNITS_FOLDER_KEY] = str(units_folder(node.config))


def pytest_unconfigure(config: pytest.Config) -> None:
    if UNITS_FOLDER in config.stash:
        shutil.rmtree(config.stash[UNITS_FOLDER], ignore_errors=True)


def read_units(folder: Path) -> dict[str, str]:
    """Unit names by module node id, as the workers wrote them (their collections are the same: xdist checks)."""
    units: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        units.update(json.loads(path.read_text(encoding="utf-8")))
    return units


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with the units as the scopes. It groups tests by what `_split_scope` returns, a
    private method of pytest-xdist: pyproject.toml pins the version this subclass was written against."""
    from xdist.scheduler import LoadScopeScheduling

    folder = units_folder(config)

    class ByWorkUnit(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            # First called in `schedule()`, once every worker has reported its collection (and so written its file).
            if self.units is None:
                self.units = read_units(folder)
            return self.units[module_of(nodeid)]

    return ByWorkUnit(config, log)
