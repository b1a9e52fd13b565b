"""Servers started by benchmarks and tests get ports that nothing else takes before they bind: not the kernel's
ephemeral ports (outgoing connections and engines' internal sockets draw those), never one already listening."""

from __future__ import annotations

import socket

import pytest

from clef_quant.bench import processes


def test_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    low = processes._ephemeral_low()
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(processes.LISTEN_PORTS_FLOOR <= port < low for port in ports)


def test_a_port_a_server_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        taken = server.getsockname()[1]
        monkeypatch.setattr(processes.random.Random, "sample", lambda self, population, k: [taken, 24680])
        processes._handed_out.discard(24680)
        assert processes.free_port() == 24680
