"""Clients of the serving benchmarks: every request is counted as answered or failed, never both.

A failed request (an HTTP status other than 200, or no response at all) is an error with a reason; it adds
nothing to a throughput (requests/s counts answered requests) or a latency, and has no answer, so an agreement
count never pairs it with anything: a server that fails every request reports its errors, not a speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

REASON_CHARS = 200  # of a failed response's body, in the reason


@dataclass
class ClientTally:
    """What the clients of one run saw."""

    answered: int = 0
    errors: int = 0
    first_error: str | None = None
    latencies_ms: list[float] = field(default_factory=list)  # of answered requests only

    def failed(self, reason: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = reason

    def rate(self, seconds: float) -> float:
        """Answered requests per second over `seconds` of wall time; 0 when none was answered."""
        return self.answered / seconds if seconds > 0 else 0.0


def failure_reason(response: httpx.Response) -> str:
    """`HTTP 404: {"detail":"Not Found"}`: the status and the start of the body's first line."""
    lines = response.text.strip().splitlines()
    body = lines[0][:REASON_CHARS] if lines else ""
    return f"HTTP {response.status_code}: {body}".rstrip(": ")


async def post_counted(http: httpx.AsyncClient, url: str, tally: ClientTally | None, **kwargs: Any) -> Any | None:
    """POST once; the response's JSON when it is a 200, else None, with the failure counted in `tally` (None: a
    warm-up, counted nowhere)."""
    start = time.perf_counter()
    try:
        response = await http.post(url, timeout=600, **kwargs)
    except httpx.HTTPError as exc:
        if tally is not None:
            tally.failed(f"{type(exc).__name__}: {exc}".rstrip(": "))
        return None
    elapsed_ms = (time.perf_counter() - start) * 1000
    if response.status_code != 200:
        if tally is not None:
            tally.failed(failure_reason(response))
        return None
    try:
        answer = response.json()
    except ValueError:
        if tally is not None:
            tally.failed(f"HTTP 200 with a body that is not JSON: {response.text[:REASON_CHARS]}")
        return None
    if tally is not None:
        tally.answered += 1
        tally.latencies_ms.append(elapsed_ms)
    return answer
