"""What a quantized release may carry: an allowlist, so nothing executable reaches the Hub unvetted.

A release folder is read by tools that run code they find in it: transformers imports the modules `auto_map`
names (with `trust_remote_code`), Python imports a `sitecustomize.py` or a package `__init__.py` on its path,
and pickles run code when loaded. `quantize` therefore copies only the files a Clef release is made of:

- the backbone it writes itself (`config.json`, `model*.safetensors`, its index, `recipe.yaml`);
- tokenizer and processor files, the chat template and the generation config, byte for byte;
- licence and notice files; the source's own model card, renamed `source_card.md` (`card` writes `README.md`);
- the head's two files, byte for byte at the folder's root (where vLLM >= 0.33, SGLang and llama.cpp detect a
  Clef model), also from a source that keeps them in `clef_head/`;
- `joint_schema_model.py`, the release's own code, carried unchanged as the release format documents and listed
  in the manifest's `included` section (clef-quant and clef-vllm never import or run it).

A licence, notice, passenger or card file that would run as code (a `#!` first line, a code suffix) is not
carried as such: it is left out like any other file unless `--include` names it, so a release always passes its
own `inspect`. A symlink of the source is followed only to a file inside the source folder (or, for a Hub
snapshot, inside that repository's cache, where the snapshot's files link to): a release holds files of its
source, never whatever a link points at elsewhere. Other symlinks are named in a warning and never carried,
whatever `--include` says.

Every other file of the source, and every `auto_map` (or `custom_pipelines`) key of a JSON file, is left out and
named in one warning, unless an `--include PATTERN` names it (`fnmatch` on the folder-relative path; an `auto_map`
key is named `FILE:auto_map`). What is included that way is listed in the manifest's `included` section, which is
what `inspect` accepts as deliberate: it fails a folder holding code or `auto_map` that no entry there names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from clef_quant.documents import parse_json
from clef_quant.quantize.errors import QuantizeError
from clef_quant.release_folder.atomic import write_json_atomic
from clef_vllm.head.files import HEAD_CONFIG, HEAD_WEIGHTS

RELEASE_CODE = "joint_schema_model.py"
SOURCE_CARD = "README.md"
SOURCE_CARD_COPY = "source_card.md"

# Byte-for-byte passengers: serving and encoding read them unchanged.
PASSENGER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "generation_config.json",
)
# What `save_pretrained` writes for the backbone; the source's copies of these are replaced, not carried.
BACKBONE_OUTPUTS = re.compile(
    r"^(config\.json|recipe\.yaml|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json)$"
)
LICENCE_FILE = re.compile(r"^(licen[cs]e|notice|copying)([-_.][\w.-]*)?$", re.IGNORECASE)
# Repository bookkeeping of a Hub snapshot or a git checkout: never release content, not worth a warning.
REPO_METADATA = re.compile(r"^(\.gitattributes|\.gitignore|\.git/.*|\.cache/.*)$")

# Keys that make transformers import code named in the file (with trust_remote_code).
REMOTE_CODE_KEYS = ("auto_map", "custom_pipelines")
# Files that run code when imported, executed or loaded (pickles).
_CODE_SUFFIX_LIST = (
    ".py .pyc .pyo .pyd .pyw .pth .so .dylib .dll .exe .sh .bash .zsh .fish .bat .cmd .ps1 .js .mjs .cjs .ipynb "
    ".pkl .pickle .pt .bin .ckpt .joblib .npy .whl .egg .jar"
)
CODE_SUFFIXES = frozenset(_CODE_SUFFIX_LIST.split(" "))
CODE_REASON = "release code carried unchanged, as the release format documents; never imported or run"
INCLUDE_REASON = "--include {pattern}"


@dataclass(frozen=True)
class Included:
    """A file or JSON key carried on purpose although it may run code: why, in the manifest's words."""

    path: str  # a folder-relative file, or FILE:KEY for a remote-code key
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "why": self.why}


@dataclass
class ReleaseContents:
    """The plan for one source folder: what is copied where, what is left out, what is included on purpose."""

    copies: dict[str, str] = field(default_factory=dict)  # source-relative path -> release-relative path
    left_out: list[str] = field(default_factory=list)  # source paths and FILE:auto_map keys not carried
    included: list[Included] = field(default_factory=list)
    keep_keys: set[str] = field(default_factory=set)  # FILE:KEY entries to keep in the written JSON files
    unused_patterns: list[str] = field(default_factory=list)  # --include patterns that named nothing
    not_followed: list[str] = field(default_factory=list)  # "NAME -> TARGET" for symlinks never carried

    def warnings(self) -> list[str]:
        found = []
        if self.not_followed:
            found.append(
                f"symlinks not followed, never carried ({len(self.not_followed)}: to a folder, or outside the source): "
                f"{', '.join(self.not_followed)}; copy the file into the source to carry it"
            )
        if self.left_out:
            found.append(
                f"left out of the release ({len(self.left_out)}, not part of a Clef release and possibly code): "
                f"{', '.join(self.left_out)}; pass --include PATTERN to carry one on purpose"
            )
        if self.unused_patterns:
            found.append(f"--include matched nothing in the source: {', '.join(self.unused_patterns)}")
        return found


def source_files(source_dir: Path) -> list[str]:
    """Every regular file of a source folder, and every symlink to one inside it (or inside the Hub cache of a
    snapshot), as relative POSIX paths, sorted."""
    source_dir = Path(source_dir)
    skipped = set(unfollowed_links(source_dir))
    found = []
    for path in source_dir.rglob("*"):
        name = path.relative_to(source_dir).as_posix()
        if path.is_file() and name not in skipped:
            found.append(name)
    return sorted(found)


def unfollowed_links(source_dir: Path) -> dict[str, str]:
    """`{name: target}` for each symlink of a source that quantize does not follow: one to a folder, or to
    anything outside the folder (outside the repository's cache for a Hub snapshot)."""
    source_dir = Path(source_dir)
    root = _link_root(source_dir)
    links = {}
    for path in source_dir.rglob("*"):
        if not path.is_symlink():
            continue
        target = path.resolve()
        if not path.is_file() or not target.is_relative_to(root):
            links[path.relative_to(source_dir).as_posix()] = os.readlink(path)
    return links


def _link_root(source_dir: Path) -> Path:
    """Where a source's symlinks may point: the folder itself, or for a Hub snapshot (`models--ORG--NAME/
    snapshots/REV`) that repository's cache folder, whose `blobs/` hold the snapshot's files."""
    source_dir = source_dir.resolve()
    if source_dir.parent.name == "snapshots" and source_dir.parent.parent.name.startswith("models--"):
        return source_dir.parent.parent
    return source_dir


def _matches(name: str, patterns: Sequence[str], used: set[str] | None = None) -> str | None:
    found = next((p for p in patterns if fnmatchcase(name, p)), None)
    if found is not None and used is not None:
        used.add(found)
    return found


def head_prefix_of(source_dir: Path, head_dir: Path) -> str:
    """Where the head's files are in the source ("" or "clef_head/"); a head folder reached through a symlink is
    refused like any linked folder, since its files would not be carried."""
    source_dir, head_dir = Path(source_dir), Path(head_dir)
    if head_dir.absolute() == source_dir.absolute():
        return ""
    name = head_dir.relative_to(source_dir).as_posix()
    if head_dir.is_symlink() or not head_dir.resolve().is_relative_to(source_dir.resolve()):
        raise QuantizeError(
            f"{head_dir} is a symlink to {os.readlink(head_dir)}; quantize follows no symlink to a folder: "
            f"copy the head's files into {source_dir} (at its root)"
        )
    return f"{name}/"


def plan_contents(source_dir: Path, head_dir: Path, include: Sequence[str] = ()) -> ReleaseContents:
    """Sort every file of `source_dir` into copied, left out or included on purpose."""
    source_dir = Path(source_dir)
    head_prefix = head_prefix_of(source_dir, head_dir)
    contents = ReleaseContents()
    contents.not_followed = [f"{name} -> {target}" for name, target in sorted(unfollowed_links(source_dir).items())]
    used: set[str] = set()
    for name in source_files(source_dir):
        if REPO_METADATA.match(name) or BACKBONE_OUTPUTS.match(name):
            continue
        if name in (f"{head_prefix}{HEAD_WEIGHTS}", f"{head_prefix}{HEAD_CONFIG}"):
            contents.copies[name] = name.rsplit("/", 1)[-1]
        elif (name in PASSENGER_FILES or LICENCE_FILE.match(name)) and not runs_once_copied(source_dir / name):
            contents.copies[name] = name
        elif name == SOURCE_CARD and not runs_once_copied(source_dir / name):
            contents.copies[name] = SOURCE_CARD_COPY
        elif name == RELEASE_CODE:
            contents.copies[name] = name
            contents.included.append(Included(name, CODE_REASON))
        elif pattern := _matches(name, include, used):
            contents.copies[name] = name
            if is_code(source_dir / name):
                contents.included.append(Included(name, INCLUDE_REASON.format(pattern=pattern)))
        else:
            contents.left_out.append(name)
    # config.json is written by save_pretrained from the loaded config, which keeps the source's keys.
    for name in ["config.json", *(copy for copy in contents.copies.values() if copy.endswith(".json"))]:
        source = source_dir / ("config.json" if name == "config.json" else _source_of(contents, name))
        for key in remote_code_keys(source):
            entry = f"{name}:{key}"
            if pattern := _matches(entry, include, used):
                contents.keep_keys.add(entry)
                contents.included.append(Included(entry, INCLUDE_REASON.format(pattern=pattern)))
            else:
                contents.left_out.append(entry)
    contents.unused_patterns = [p for p in include if p not in used]
    return contents


def _source_of(contents: ReleaseContents, copy: str) -> str:
    return next(src for src, dst in contents.copies.items() if dst == copy)


def remote_code_keys(path: Path) -> list[str]:
    """The remote-code keys at the top of a JSON file ([] for anything that is not a JSON object)."""
    try:
        data = parse_json(Path(path).read_bytes(), where=str(path), error=ValueError)
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict):
        return []
    return [key for key in REMOTE_CODE_KEYS if key in data]


def strip_remote_code_keys(path: Path, keep: Iterable[str] = ()) -> list[str]:
    """Remove the remote-code keys of a JSON file in place (atomically) unless kept; returns the removed keys."""
    found = remote_code_keys(path)
    removed = [key for key in found if key not in set(keep)]
    if not removed:
        return []
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    for key in removed:
        del data[key]
    write_json_atomic(Path(path), data)
    return removed


def is_code_name(name: str) -> bool:
    suffix = Path(name).suffix.lower()
    return suffix in CODE_SUFFIXES


def is_code(path: Path) -> bool:
    """True for a file that runs code when imported, executed or loaded: by suffix, exec bit or a `#!` line."""
    try:
        return runs_once_copied(path) or bool(path.stat().st_mode & 0o111)
    except OSError:
        return False


def runs_once_copied(path: Path) -> bool:
    """`is_code` for the copy quantize writes, which is 0644 whatever the source's mode: by suffix or `#!` line."""
    if is_code_name(path.name):
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def code_in_folder(folder: Path, skip: Iterable[str] = ()) -> list[str]:
    """Files of a folder that may run code, and FILE:KEY remote-code keys of its JSON files; sorted."""
    folder = Path(folder)
    skipped = set(skip)
    found = []
    for path in folder.rglob("*"):
        name = path.relative_to(folder).as_posix()
        if name in skipped or path.is_symlink() or not path.is_file():
            continue
        if is_code(path):
            found.append(name)
        elif path.suffix == ".json":
            found += [f"{name}:{key}" for key in remote_code_keys(path)]
    return sorted(found)
