"""Files that are whole or absent: written to a hidden sibling, then renamed over the target.

A rename within one folder is atomic, so a reader (or a run killed half-way) sees the old file or the new one,
never half of either. Every file is 0644 and every folder 0755 whatever the process' umask or the writing library
chose, so a server running as another user can read a release.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_MODE = 0o644
DIR_MODE = 0o755


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8), mode 0644, through a temporary sibling and a rename."""
    path = Path(path)
    # The PID keeps two processes writing the same file from sharing one temporary file.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as indented JSON with a final newline (non-ASCII kept readable), written like `write_text_atomic`."""
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def normalize_modes(folder: Path) -> None:
    """Every file under `folder` 0644 and every folder 0755 (safetensors writes its files 0600)."""
    folder = Path(folder)
    os.chmod(folder, DIR_MODE)
    for path in folder.rglob("*"):
        if path.is_symlink():
            continue
        os.chmod(path, DIR_MODE if path.is_dir() else FILE_MODE)
