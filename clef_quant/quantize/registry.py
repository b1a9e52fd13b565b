"""The schemes `--scheme` accepts, read from the recipe files themselves: adding a scheme is adding one file.

A shipped recipe file is two YAML documents. The first, a mapping under `clef:`, says what clef-quant needs to
know about the scheme (its name on the command line, what inspect will call its modules, whether it calibrates,
scans or streams, and the model card's words about it). The second, after the `---` line, is the llm-compressor
recipe: only that part is filled, handed to llm-compressor and recorded in the manifest.

Every list of schemes (`--help`, the scan's candidates and defaults, the benchmarks' defaults, the streaming
default, `--scheme auto`'s ladder, the card's texts) is read from one `Registry`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clef_quant import shipped
from clef_quant.quantize.errors import QuantizeError

FRONT_MATTER_KEY = "clef"
RECIPE_SUFFIX = ".yaml"
# The line that ends the front matter document; what follows is the llm-compressor recipe.
_DOCUMENT_END = re.compile(r"^---[ \t]*$", re.MULTILINE)


class CardText(BaseModel):
    """The quantized model card's words about the label a scheme stores (the card shows them per label)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str  # what the label stores, after "scheme | **LABEL**:"
    hardware: str | None = None  # where it runs at full speed
    cpu: str | None = None  # what was run on CPU in this project; absent: nothing is claimed


class ScanEntry(BaseModel):
    """How `clef-quant scan` lists the scheme: its place among the candidates, and whether it is scanned when
    no `--scheme` is given (`--scheme auto` climbs the default schemes in this order, smallest first)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order: int
    default: bool = False


class Scheme(BaseModel):
    """One recipe file's front matter (the mapping under `clef:`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")  # on the command line and in the manifest
    order: int | None = None  # place in every list of schemes; without one, after those that have one, by name
    # What inspect calls the Linear modules the recipe quantizes (compressed-tensors preset names).
    labels: tuple[str, ...] = Field(min_length=1)
    calibration: bool  # needs calibration requests (tests check it against the recipe's modifiers)
    streaming: bool = False  # quantized shard by shard by default (output bit-identical to the loaded model's)
    scan: ScanEntry | None = None  # None: not scannable (a modifier changes more than Linear weights)
    bench: bool = False  # one of `bench quantize-vs-plain`'s default schemes
    card: CardText | None = None  # the words about its one label; schemes sharing a label leave it to one


@dataclass(frozen=True)
class SchemeFile:
    scheme: Scheme
    path: Traversable
    template: str  # the llm-compressor recipe after the front matter, kept so that a run never reads the file again


def split_front_matter(text: str) -> tuple[dict[str, Any] | None, str]:
    """(front matter, recipe text) of a recipe file; a file whose first document is not a `clef:` mapping has no
    front matter and is all recipe (a user's plain llm-compressor recipe)."""
    end = _DOCUMENT_END.search(text)
    if end is None:
        return None, text
    try:
        head = yaml.safe_load(text[: end.start()])
    except yaml.YAMLError:
        return None, text
    if not isinstance(head, dict) or set(head) != {FRONT_MATTER_KEY}:
        return None, text
    return head[FRONT_MATTER_KEY], text[end.end() :].lstrip("\n")


def _read(path: Traversable) -> SchemeFile:
    front, template = split_front_matter(path.read_text(encoding="utf-8"))
    if front is None:
        raise QuantizeError(f"recipe {path} has no `{FRONT_MATTER_KEY}:` front matter before its `---` line")
    try:
        return SchemeFile(Scheme.model_validate(front), path, template)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise QuantizeError(f"recipe {path}: front matter {problems}") from None


@dataclass(frozen=True)
class Registry:
    files: tuple[SchemeFile, ...]  # in the order of every list of schemes

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.scheme.name for f in self.files)

    def scheme(self, name: str) -> Scheme:
        return self._file(name).scheme

    def recipe_path(self, name: str) -> Traversable:
        return self._file(name).path

    def recipe_template(self, name: str) -> str:
        """The scheme's recipe as the registry read it (front matter left out)."""
        return self._file(name).template

    def _file(self, name: str) -> SchemeFile:
        for found in self.files:
            if found.scheme.name == name:
                return found
        raise QuantizeError(unknown_scheme(name, self.names))

    def scannable(self) -> tuple[str, ...]:
        scanned = [f.scheme for f in self.files if f.scheme.scan is not None]
        return tuple(s.name for s in sorted(scanned, key=lambda s: s.scan.order if s.scan else 0))

    def check_scannable(self, names: tuple[str, ...] | list[str]) -> None:
        """The one refusal of a scheme `scan` cannot switch on unit by unit (the command line's and the library's)."""
        bad = [name for name in names if name not in self.scannable()]
        if bad:
            raise QuantizeError(f"cannot scan {', '.join(bad)}; choose one of {', '.join(self.scannable())}")

    def default_scan(self) -> tuple[str, ...]:
        return tuple(name for name in self.scannable() if (self.scheme(name).scan or ScanEntry(order=0)).default)

    def streaming_default(self) -> tuple[str, ...]:
        return tuple(f.scheme.name for f in self.files if f.scheme.streaming)

    def bench_default(self) -> tuple[str, ...]:
        return tuple(f.scheme.name for f in self.files if f.scheme.bench)

    def card_texts(self) -> dict[str, CardText]:
        """The card's words per label."""
        return {f.scheme.labels[0]: f.scheme.card for f in self.files if f.scheme.card is not None}


def unknown_scheme(name: str, names: tuple[str, ...]) -> str:
    """The one wording of an unknown `--scheme`, in the CLI's parser and in the library."""
    return f"unknown scheme {name!r}; choose one of {', '.join(names)}"


def load_registry(folder: Traversable) -> Registry:
    """Every `*.yaml` recipe in `folder`, checked as a whole: one name per scheme, card words for a label once."""
    files = [
        _read(entry)
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.is_file() and entry.name.endswith(RECIPE_SUFFIX)
    ]
    problems: list[str] = []
    seen: dict[str, str] = {}
    described: dict[str, str] = {}
    for found in files:
        scheme = found.scheme
        if scheme.name in seen:
            problems.append(f"scheme {scheme.name} is named by both {seen[scheme.name]} and {found.path.name}")
        seen[scheme.name] = found.path.name
        if scheme.card is not None:
            if len(scheme.labels) != 1:
                problems.append(f"{found.path.name} has card words but stores {len(scheme.labels)} labels")
            elif scheme.labels[0] in described:
                problems.append(
                    f"{found.path.name} and {described[scheme.labels[0]]} both have card words for {scheme.labels[0]}"
                )
            else:
                described[scheme.labels[0]] = found.path.name
    if problems:
        raise QuantizeError(f"recipes in {folder}: {'; '.join(problems)}")
    ordered = sorted(files, key=lambda f: (f.scheme.order is None, f.scheme.order or 0, f.scheme.name))
    return Registry(tuple(ordered))


@functools.cache
def schemes() -> Registry:
    """The registry of the shipped `recipes/` folder."""
    return load_registry(shipped.recipes())
