"""Serial consoles without a stack: the proxy's bounds with a source made here (real
sockets on 127.0.0.1), the driver_info parser of ipmitool-socat, how a polled console
log is cut into new lines, and Ironic's boolean strings."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

import pytest

from services.api.node_states import boolean_argument
from services.common import errors
from services.common.config import ConductorConfig, ConfigError, console_port_range
from services.common.ports import unused_tcp_port
from services.conductor.console_proxy import ConsoleProxies, ConsoleSession
from services.conductor.drivers.console import SolProcess, new_entries, parse_ipmi_info
from services.conductor.drivers.ipmi_info import parse_driver_info
from services.simulator.console import tail_entries


def config(**values: object) -> ConductorConfig:
    return dataclasses.replace(ConductorConfig(), **values)  # type: ignore[arg-type]  # test values


async def echo_source(session: ConsoleSession) -> None:
    """Says hello, then echoes what is typed, upper-cased."""
    session.publish(b"hello\r\n")
    while True:
        session.publish((await session.keys.get()).upper())


async def read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = await asyncio.wait_for(reader.read(4096), 5)
        assert chunk, seen
        seen += chunk
    return seen


async def test_relay_scrollback_clients_bound_and_stop() -> None:
    proxies = ConsoleProxies(config(max_consoles=2, console_max_clients=2, console_scrollback=64))
    try:
        await proxies.start("n1", echo_source, description="echo")
        port = proxies.get("n1").port  # type: ignore[union-attr]
        first = await asyncio.open_connection("127.0.0.1", port)
        assert b"hello" in await read_until(first[0], b"hello")  # the scrollback, sent first
        first[1].write(b"abc")
        await first[1].drain()
        assert b"ABC" in await read_until(first[0], b"ABC")
        second = await asyncio.open_connection("127.0.0.1", port)
        assert b"ABC" in await read_until(second[0], b"ABC")  # what came before it joined
        third = await asyncio.open_connection("127.0.0.1", port)
        busy = await asyncio.wait_for(third[0].read(), 5)
        assert b"already has 2 clients" in busy  # told, then closed
        # The bound on consoles: a second fits, a third is refused before anything starts.
        await proxies.start("n2", echo_source, description="echo")
        with pytest.raises(errors.TooManyConsoles, match="max_consoles"):
            await proxies.start("n3", echo_source, description="echo")
        proxies.check_capacity("n1")  # restarting a running one is always allowed
        info = proxies.info("n1")
        assert info["type"] == "socat" and info["url"] == f"tcp://127.0.0.1:{port}"
        assert info["websocket_url"].startswith("ws://127.0.0.1:") and "/consoles/n1/" in info["websocket_url"]
        assert await proxies.stop("n1") is True
        assert await asyncio.wait_for(first[0].read(), 5) == b""  # clients are closed
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(errors.ServiceUnavailable):
            proxies.info("n1")
        for _, writer in (first, second, third):
            writer.close()
    finally:
        await proxies.close()
    assert proxies.running() == set()
    with pytest.raises(errors.ServiceUnavailable, match="stopping"):
        await proxies.start("n4", echo_source, description="echo")


async def test_a_failing_source_is_shown_and_started_again() -> None:
    runs = 0

    async def flaky(session: ConsoleSession) -> None:
        nonlocal runs
        runs += 1
        session.publish(f"run {runs}\r\n".encode())
        raise errors.BMCError("the BMC went away")

    proxies = ConsoleProxies(config())
    try:
        await proxies.start("n1", flaky, description="flaky")
        reader, writer = await asyncio.open_connection("127.0.0.1", proxies.get("n1").port)  # type: ignore[union-attr]
        seen = await read_until(reader, b"run 2")
        assert b"[ferrum console: the BMC went away; reconnecting in 0.5 s]" in seen
        writer.close()
    finally:
        await proxies.close()


async def test_ports_come_from_the_range() -> None:
    while True:  # two free neighbours below the ephemeral range, where no client connection lands
        low = unused_tcp_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", low + 1))
                break
            except OSError:
                continue
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", low))
    blocker.listen()
    proxies = ConsoleProxies(config(console_port_range=f"{low}:{low + 1}"))
    try:
        await proxies.start("n1", echo_source, description="echo")
        assert proxies.get("n1").port == low + 1  # type: ignore[union-attr]  # low is taken
        with pytest.raises(errors.TooManyConsoles, match="No free console port"):
            await proxies.start("n2", echo_source, description="echo")
        with pytest.raises(errors.InvalidParameterValue, match="Cannot listen"):
            await proxies.start("n3", echo_source, description="echo", port=low)  # ipmi_terminal_port in use
    finally:
        blocker.close()
        await proxies.close()


def test_port_range_option() -> None:
    assert console_port_range("") is None
    assert console_port_range("10000:10100") == (10000, 10100)
    for bad in ("10000", "10100:10000", "0:10", "a:b", "1:70000"):
        with pytest.raises(ConfigError):
            console_port_range(bad)


def test_ipmi_driver_info() -> None:
    driver_info: dict[str, object] = {"ipmi_address": "10.0.0.5", "ipmi_username": "root", "ipmi_password": "s3cret"}
    node = {"uuid": "n", "driver_info": driver_info}
    info = parse_ipmi_info(node)
    assert (info.port, info.cipher_suite, info.terminal_port) == (623, 3, None)
    process = SolProcess(info, "/usr/bin/ipmitool")
    argv = process.argv("sol", "activate")
    assert argv[:9] == ["/usr/bin/ipmitool", "-I", "lanplus", "-C", "3", "-H", "10.0.0.5", "-p", "623"]
    assert "-E" in argv and "s3cret" not in argv and process.env()["IPMI_PASSWORD"] == "s3cret"
    driver_info.update(ipmi_port="6230", ipmi_cipher_suite=17, ipmi_terminal_port=10001)
    assert parse_ipmi_info(node).port == 6230 and parse_ipmi_info(node).terminal_port == 10001
    with pytest.raises(errors.MissingParameter, match="ipmi_address"):
        parse_ipmi_info({"uuid": "n", "driver_info": {}})
    for key, value in (("ipmi_port", "x"), ("ipmi_terminal_port", 70000), ("ipmi_cipher_suite", 18)):
        with pytest.raises(errors.InvalidParameterValue, match=key):
            parse_ipmi_info({"uuid": "n", "driver_info": {"ipmi_address": "a", key: value}})
    with pytest.raises(errors.InvalidParameterValue, match=r"protocol version 2\.0"):
        parse_ipmi_info({"uuid": "n", "driver_info": {"ipmi_address": "a", "ipmi_protocol_version": "1.5"}})


def test_console_and_power_share_one_driver_info_parser() -> None:
    """Only the cipher-suite rule differs: ipmitool takes 0-17, pyghmi 3 and 17."""
    node = {"uuid": "n", "driver_info": {"ipmi_address": "10.0.0.5", "ipmi_cipher_suite": "1"}}
    assert parse_ipmi_info(node).cipher_suite == 1
    with pytest.raises(errors.InvalidParameterValue, match="pyghmi implements cipher suites 3 and 17"):
        parse_driver_info(node)
    node["driver_info"] = {"ipmi_address": "10.0.0.5", "ipmi_cipher_suite": 17, "ipmi_priv_level": "operator"}
    console, power = parse_ipmi_info(node), parse_driver_info(node)
    assert console == power and console.priv_level == "OPERATOR"
    assert SolProcess(console, "ipmitool").argv("sol", "activate")[9:11] == ["-L", "OPERATOR"]
    for extra in ({"ipmi_bridging": "single"}, {"ipmi_address": "bmc:623"}, {"ipmi_username": "u" * 17}):
        bad = {"uuid": "n", "driver_info": {"ipmi_address": "10.0.0.5", **extra}}
        for parse in (parse_ipmi_info, parse_driver_info):
            with pytest.raises(errors.InvalidParameterValue):
                parse(bad)


def test_new_entries_of_a_polled_log() -> None:
    log = [("7", "a"), ("8", "b"), ("9", "c")]
    assert new_entries(log, None) == log
    assert new_entries(log, "8") == [("9", "c")]
    assert new_entries(log, "9") == []
    assert new_entries(log, "42") == log  # Ids went backwards: the log started over
    assert new_entries(log, "3") == log  # older than all kept: everything is new
    named = [("x", "a"), ("y", "b")]
    assert new_entries(named, "x") == [("y", "b")] and new_entries(named, "gone") == named


def test_serial_log_entries_are_numbered_by_offset(tmp_path: Path) -> None:
    log = tmp_path / "serial.log"
    log.write_bytes(b"SeaBIOS\r\n\r\n\x1b[2Jboot\npartial")
    assert tail_entries(log, 10) == [(9, "SeaBIOS"), (20, "boot")]  # the partial line waits
    log.write_bytes(log.read_bytes() + b" line\n")
    assert tail_entries(log, 10)[-1] == (33, "partial line")
    assert tail_entries(tmp_path / "missing.log", 5) == []


def test_ironic_boolean_strings() -> None:
    assert boolean_argument("enabled", True) is True
    assert boolean_argument("enabled", " Yes ") is True and boolean_argument("enabled", "off") is False
    assert boolean_argument("enabled", 1) is True and boolean_argument("enabled", 0) is False
    with pytest.raises(errors.InvalidParameterValue, match="Invalid enabled: Unrecognized value 'maybe'"):
        boolean_argument("enabled", "maybe")
    with pytest.raises(errors.InvalidParameterValue):
        boolean_argument("enabled", None)
