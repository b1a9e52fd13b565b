"""Everything `clef-systemone` is started with, declared once.

`ServeConfig` is the engine's settings (`EngineSettings`, whose fields are flags too) plus the server's own: each
field made with `setting(...)` is one command-line flag, whose name, type, default, help and bounds all come from
the field, and `clef-systemone`'s parser is generated from these fields (`server/cli.py`). Adding a setting is
adding a field. The bounds hold for a config built in Python too: a value out of bounds raises `SettingsError`
naming the flag, whoever built the config.

Defaults that belong to another object (the request limits, the connection limits, the maximum length) are read
from that object, so each default has one home. This module imports no HTTP package: the tools that start a
server build its settings here (`command_line()`), without the server's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clef_vllm.engine.engine_settings import EngineSettings
from clef_vllm.engine.flags import setting

API_KEY_ENV = "CLEF_SYSTEMONE_API_KEY"
KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may take before the server closes it, and how many may be open."""

    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_connections: int = 512


_CONNECTIONS = ConnectionLimits()


@dataclass(frozen=True)
class ServeConfig(EngineSettings):
    """Everything `clef-systemone` is started with: the engine's settings and the server's own flags."""

    served_model_name: str | None = setting(
        None,
        help="name reported by /v1/models and echoed when a request has no model (default: the model card's "
        "name, else the folder's name, else the Hub id)",
    )
    host: str = setting("127.0.0.1", help="address to bind (127.0.0.1: loopback only)", show_default=False)
    port: int = setting(8000, help="port to listen on", at_least=0, at_most=65535)
    api_key: str | None = setting(
        None, help=f"require 'Authorization: Bearer KEY' (or set {API_KEY_ENV})", env=API_KEY_ENV
    )
    # A cap under 1 KiB would refuse every request: the smallest useful body is about 60 bytes, a real one more.
    max_body_mb: float = setting(
        13.0, help="larger bodies get 413; counted after decompression; at least 1 KiB", at_least=KIB / MIB
    )
    header_timeout: float = setting(
        _CONNECTIONS.header_timeout, help="seconds for a request's headers to arrive, else 408 and close", above=0
    )
    body_timeout: float = setting(
        _CONNECTIONS.body_timeout, help="seconds for a request's whole body to arrive, else 408 and close", above=0
    )
    idle_timeout: float = setting(5.0, help="seconds an idle keep-alive connection stays open", at_least=0)
    max_connections: int = setting(
        _CONNECTIONS.max_connections, help="open connections beyond this get 503 and are closed", at_least=1
    )

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * MIB)

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(self.header_timeout, self.body_timeout, self.max_connections)

    def vllm_kwargs(self) -> dict[str, Any]:
        return {**super().vllm_kwargs(), "served_model_name": self.served_model_name}
