"""The text the model reads for a JSON value of a request: one home, used by the prompt (`encoding`) and by the
limits measured on what the model reads (`request`)."""

from __future__ import annotations

import json
from typing import Any


def render(value: Any) -> str:
    """Text of a JSON value as the model sees it: strings as they are, anything else as compact sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def option_text(option_id: str, description: Any) -> str:
    body: dict[str, Any] = {"option_id": option_id}
    if description is not None:
        body["description"] = description
    return render(body)
