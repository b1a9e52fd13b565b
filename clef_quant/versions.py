"""The installed versions of the distributions that decide an output, as manifests and results record them."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata


def installed_versions(distributions: Iterable[str]) -> dict[str, str | None]:
    """`{name: version}` in the order given; None for a distribution that is not installed."""
    versions: dict[str, str | None] = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
