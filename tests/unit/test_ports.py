"""Ports picked for servers that are told their port before they start."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.common.ports import AVOID, LOWEST, ephemeral_floor, unused_tcp_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = unused_tcp_ports(20)
    assert len(set(ports)) == 20
    floor = ephemeral_floor()
    assert all(LOWEST <= port < floor and port not in AVOID for port in ports)
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[0]))  # free right after the pick


def test_the_floor_comes_from_the_kernel_file(tmp_path: Path) -> None:
    ranges = tmp_path / "range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_floor(ranges) == 40000
    assert ephemeral_floor(tmp_path / "missing") == 32768
    ranges.write_text("garbage")
    assert ephemeral_floor(ranges) == 32768


def test_a_taken_port_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr("services.common.ports.LOWEST", busy)
        monkeypatch.setattr("services.common.ports.ephemeral_floor", lambda: busy + 8)
        ports = unused_tcp_ports(2)
    assert busy not in ports and all(busy < port < busy + 8 for port in ports)
