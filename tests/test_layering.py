"""The layers of docs/architecture.md, checked on the import graph of the source files.

Every `import` and `from ... import` of every module counts, at module level or inside a function: a lazy import
still makes the lower layer need the higher one. Imports are read with `ast`, so nothing is imported to check.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"clef_quant": ROOT / "clef_quant", "clef_vllm": ROOT / "vllm_plugin" / "clef_vllm"}

# The modules directly in clef_quant/ (formatting, documents, shipped, reference ...): the floor of clef_quant.
BASE = "top-level modules"
# "Inside clef_quant" in docs/architecture.md: the clef_quant packages each part may import, besides clef_vllm and
# itself. The command layer (cli/ and `python -m clef_quant`) may import anything and is imported by nothing.
ALLOWED = {
    "bench": {"quantize", "evaluation", "release_folder", BASE},
    "publish": {"evaluation", "quantize", "tiny", "release_folder", BASE},
    "quantize": {"release_folder", BASE},
    "evaluation": {"release_folder", BASE},
    "tiny": {"release_folder", BASE},
    "release_folder": {BASE},
    BASE: {BASE},
}
COMMAND_LAYER = ("clef_quant.cli", "clef_quant.__main__")

# "Who calls whom" in docs/architecture.md: clef_vllm's layers are its folders, lowest first. An import goes to its
# own layer or one below, and each layer names the third-party packages it must not import: the format and the
# head run without vLLM, and nothing under the server speaks HTTP. The modules directly in clef_vllm/ (the errors
# every layer raises) are the floor under all of them.
HTTP = frozenset({"fastapi", "starlette", "uvicorn", "h11", "httpx"})
CLEF_VLLM_LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("format", HTTP | {"vllm"}),
    ("head", HTTP | {"vllm"}),
    ("engine", HTTP),
    ("server", frozenset()),
)
CLEF_VLLM_FLOOR = ("errors",)


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str  # dotted name of the module (or package) it reads
    where: str  # path:line, for the failure message

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def module_name(package: str, path: Path) -> str:
    parts = path.relative_to(SOURCES[package]).with_suffix("").parts
    return ".".join((package, *parts[:-1]) if parts[-1] == "__init__" else (package, *parts))


def known_modules() -> set[str]:
    return {module_name(package, path) for package, root in SOURCES.items() for path in root.rglob("*.py")}


def imports_in(text: str, importer: str, is_package: bool, modules: set[str], path: str) -> list[Import]:
    """The imports of one module's source, anywhere in it, each resolved to the module it reads."""
    # The package relative imports start from: the module itself for a package's __init__.py, else its parent.
    own_package = importer if is_package else importer.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(text, filename=path)):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [Import(importer, alias.name, where) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_package.split(".")[: len(own_package.split(".")) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # `from clef_quant import shipped` reads the module clef_quant.shipped, not the package.
            read = {f"{source}.{alias.name}" for alias in node.names} & modules or {source}
            found += [Import(importer, name, where) for name in sorted(read)]
    return found


def all_imports() -> list[Import]:
    modules = known_modules()
    return [
        found
        for package, root in SOURCES.items()
        for path in sorted(root.rglob("*.py"))
        for found in imports_in(
            path.read_text(encoding="utf-8"),
            module_name(package, path),
            path.name == "__init__.py",
            modules,
            str(path.relative_to(ROOT)),
        )
    ]


def part_of(module: str) -> str:
    """The part of clef_quant a module belongs to: its package under clef_quant/, or BASE for a top-level module."""
    parts = module.split(".")
    if len(parts) == 1:
        return BASE  # `import clef_quant` itself
    if (SOURCES["clef_quant"] / parts[1]).is_dir():
        return parts[1]
    return BASE


def in_command_layer(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in COMMAND_LAYER)


def is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    return all_imports()


def test_the_graph_counts_lazy_and_relative_imports_by_the_module_they_read() -> None:
    text = (
        "import clef_quant.formatting\n"
        "def main():\n"
        "    from clef_quant import cli\n"
        "    from ..evaluation.metrics import kl_divergence\n"
        "    from . import head_report\n"
    )
    found = imports_in(text, "clef_quant.bench.head", False, known_modules(), "head.py")
    assert [(i.imported, i.where) for i in found] == [
        ("clef_quant.formatting", "head.py:1"),
        ("clef_quant.cli", "head.py:3"),
        ("clef_quant.evaluation.metrics", "head.py:4"),
        ("clef_quant.bench.head_report", "head.py:5"),
    ]
    assert [part_of(i.imported) for i in found] == [BASE, "cli", "evaluation", "bench"]


def test_clef_vllm_never_imports_clef_quant(graph: list[Import]) -> None:
    """clef-vllm ships inside every release, without clef-quant."""
    wrong = [str(i) for i in graph if is_under(i.importer, "clef_vllm") and is_under(i.imported, "clef_quant")]
    assert wrong == [], "\n".join(wrong)


def test_the_library_never_imports_the_command_layer(graph: list[Import]) -> None:
    wrong = [
        str(i)
        for i in graph
        if is_under(i.importer, "clef_quant") and not in_command_layer(i.importer) and in_command_layer(i.imported)
    ]
    assert wrong == [], "\n".join(wrong)


def test_every_part_of_clef_quant_has_a_declared_layer() -> None:
    packages = {path.parent.name for path in SOURCES["clef_quant"].glob("*/__init__.py")}
    assert packages - {"cli"} == set(ALLOWED) - {BASE}


def test_the_tool_packages_import_only_the_layers_below(graph: list[Import]) -> None:
    wrong = []
    for i in graph:
        if not is_under(i.importer, "clef_quant") or in_command_layer(i.importer):
            continue
        if not is_under(i.imported, "clef_quant") or in_command_layer(i.imported):
            continue  # clef_vllm and third-party packages are under every layer; the CLI has its own test
        importer, imported = part_of(i.importer), part_of(i.imported)
        if importer != imported and imported not in ALLOWED[importer]:
            wrong.append(f"{i} ({importer} may import only {', '.join(sorted(ALLOWED[importer]))})")
    assert wrong == [], "\n".join(wrong)


def test_no_library_module_imports_the_tests(graph: list[Import]) -> None:
    test_modules = {path.stem for path in (ROOT / "tests").glob("*.py")} | {"tests", "conftest", "plugins"}
    wrong = [str(i) for i in graph if i.imported.split(".")[0] in test_modules]
    assert wrong == [], "\n".join(wrong)


# What a tool reads of the server: the settings it starts one with (`ServeConfig`, whose `command_line()` writes
# the flags), which import no HTTP package and no other part of the server.
SERVER_SETTINGS = "clef_vllm.server.settings"


def test_only_the_server_reads_the_server_package_but_its_settings(graph: list[Import]) -> None:
    """HTTP is the top of clef_vllm: the format, the tools and the strict JSON they share sit below it."""
    wrong = [
        str(i)
        for i in graph
        if is_under(i.imported, "clef_vllm.server")
        and i.imported != SERVER_SETTINGS
        and not is_under(i.importer, "clef_vllm.server")
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_server_settings_import_no_http_and_no_other_part_of_the_server(graph: list[Import]) -> None:
    reads: dict[str, set[str]] = {}
    for i in graph:
        reads.setdefault(i.importer, set()).add(i.imported)
    seen, todo = set(), [SERVER_SETTINGS]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [name for name in reads.get(module, ()) if is_under(name, "clef_vllm")]
    third_party = {name.split(".")[0] for module in seen for name in reads.get(module, ())}
    assert third_party & HTTP == set()
    assert {m for m in seen if is_under(m, "clef_vllm.server")} <= {SERVER_SETTINGS, "clef_vllm.server"}


def clef_vllm_layer(module: str) -> int | None:
    """The layer of a clef_vllm module: its folder's position in CLEF_VLLM_LAYERS, -1 for the floor, None for the
    package itself or a module outside every layer."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "clef_vllm":
        return None
    if len(parts) == 2 and parts[1] in CLEF_VLLM_FLOOR:
        return -1
    names = [name for name, _ in CLEF_VLLM_LAYERS]
    return names.index(parts[1]) if parts[1] in names else None


def test_every_module_of_clef_vllm_is_in_a_layer_folder_or_the_floor() -> None:
    root = SOURCES["clef_vllm"]
    folders = {path.parent.name for path in root.glob("*/__init__.py")}
    assert folders == {name for name, _ in CLEF_VLLM_LAYERS}, "a folder of clef_vllm/ is not a declared layer"
    loose = {path.stem for path in root.glob("*.py")} - {"__init__", *CLEF_VLLM_FLOOR}
    assert loose == set(), f"modules directly in clef_vllm/ belong in a layer's folder: {', '.join(sorted(loose))}"


def test_clef_vllm_imports_only_its_own_layer_and_those_below(graph: list[Import]) -> None:
    wrong = []
    for i in graph:
        importer = clef_vllm_layer(i.importer) if is_under(i.importer, "clef_vllm") else None
        if importer is None:
            continue
        name, refused = CLEF_VLLM_LAYERS[importer] if importer >= 0 else ("the floor", frozenset())
        imported = clef_vllm_layer(i.imported) if is_under(i.imported, "clef_vllm") else None
        if imported is not None and imported > importer:
            wrong.append(f"{i} ({name} may not import {CLEF_VLLM_LAYERS[imported][0]})")
        elif i.imported.split(".")[0] in refused or (importer < 0 and is_under(i.imported, "clef_vllm")):
            wrong.append(f"{i} ({name} may not import {i.imported.split('.')[0]})")
    assert wrong == [], "\n".join(wrong)


def test_the_clef_vllm_layer_check_finds_an_import_that_goes_up() -> None:
    text = "from clef_vllm.server.settings import ServeConfig\nimport fastapi\n"
    found = imports_in(text, "clef_vllm.format.request", False, known_modules(), "request.py")
    layers = [clef_vllm_layer(i.imported) for i in found if is_under(i.imported, "clef_vllm")]
    assert layers == [3] and clef_vllm_layer("clef_vllm.format.request") == 0
    assert "fastapi" in CLEF_VLLM_LAYERS[0][1] and "fastapi" in CLEF_VLLM_LAYERS[2][1]


def run_time_cycles(imports: list[Import]) -> list[list[str]]:
    """The import loops among clef_vllm's modules, counting every import that runs (lazy ones too; those under
    `if TYPE_CHECKING:` never run and are left out by the caller). Each loop is listed once, as a strongly
    connected group of modules."""
    edges: dict[str, set[str]] = {}
    for i in imports:
        if is_under(i.importer, "clef_vllm") and is_under(i.imported, "clef_vllm") and i.importer != i.imported:
            edges.setdefault(i.importer, set()).add(i.imported)
            edges.setdefault(i.imported, set())
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in sorted(edges[module]):
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while (top := stack.pop()) != module:
                group.append(top)
            if group:
                groups.append(sorted([module, *group]))

    for module in sorted(edges):
        if module not in order:
            visit(module)
    return groups


def without_type_checking(text: str) -> str:
    """A module's source with the bodies of its `if TYPE_CHECKING:` blocks emptied: imports that never run."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = [ast.Pass()]
    return ast.unparse(tree)


def run_time_imports() -> list[Import]:
    """Every import of clef_vllm that runs."""
    modules = known_modules()
    return [
        found
        for path in sorted(SOURCES["clef_vllm"].rglob("*.py"))
        for found in imports_in(
            without_type_checking(path.read_text(encoding="utf-8")),
            module_name("clef_vllm", path),
            path.name == "__init__.py",
            modules,
            str(path),
        )
    ]


def test_clef_vllm_has_no_run_time_import_loop() -> None:
    loops = run_time_cycles(run_time_imports())
    assert loops == [], "import loops: " + "; ".join(" <-> ".join(loop) for loop in loops)


def test_the_loop_check_finds_a_lazy_loop_and_skips_type_checking_imports() -> None:
    a = "from clef_vllm.format import text\n"
    b = "def f():\n    from clef_vllm.format import encoding\n"
    c = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clef_vllm.format import encoding\n"
    modules = known_modules()
    lazy = imports_in(a, "clef_vllm.format.encoding", False, modules, "e") + imports_in(
        b, "clef_vllm.format.text", False, modules, "t"
    )
    assert run_time_cycles(lazy) == [["clef_vllm.format.encoding", "clef_vllm.format.text"]]
    typed = imports_in(a, "clef_vllm.format.encoding", False, modules, "e") + imports_in(
        without_type_checking(c), "clef_vllm.format.text", False, modules, "t"
    )
    assert run_time_cycles(typed) == []
