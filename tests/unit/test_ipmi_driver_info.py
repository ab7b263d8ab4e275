"""The ipmitool interfaces' fast checks: driver_info parsing and its messages,
properties, options, composition of the ``ipmi`` hardware type."""

from __future__ import annotations

import dataclasses

import pytest

from services.common import errors
from services.common.config import ConductorConfig
from services.common.secret_keys import is_secret_key
from services.conductor.drivers import base
from services.conductor.drivers.ipmi import IpmiManagement, IpmiPower, node_boot_mode
from services.conductor.drivers.ipmi_client import IpmiInfo, map_error, parse_driver_info
from services.conductor.drivers.registry import DriverRegistry
from tests.support.node_records import node_record

UUID = "6f1f9d39-64c3-4c7b-9d0b-2c61a5b2a8c1"


def node(**info: object) -> dict[str, object]:
    return {"uuid": UUID, "driver": "ipmi", "driver_info": info}


def test_defaults_are_ironics() -> None:
    info = parse_driver_info(node(ipmi_address="10.0.0.5"))
    assert info == IpmiInfo(
        address="10.0.0.5", port=623, username="", password="", priv_level="ADMINISTRATOR", cipher_suite=3
    )
    assert info.describe() == "10.0.0.5:623"


def test_full_driver_info_is_parsed() -> None:
    info = parse_driver_info(
        node(
            ipmi_address=" bmc-7.example ",
            ipmi_port="6230",
            ipmi_username="admin",
            ipmi_password="secret",
            ipmi_priv_level="operator",
            ipmi_cipher_suite="17",
            ipmi_bridging="no",
            ipmi_terminal_port=8023,
            ipmi_protocol_version="2.0",
        )
    )
    assert (info.address, info.port, info.username, info.password) == ("bmc-7.example", 6230, "admin", "secret")
    assert (info.priv_level, info.cipher_suite, info.terminal_port) == ("OPERATOR", 17, 8023)
    assert info.describe() == "admin@bmc-7.example:6230"
    assert parse_driver_info(node(ipmi_address="[fd00::7]")).where() == "[fd00::7]:623"


def test_sessions_are_keyed_without_the_password_in_clear() -> None:
    a = parse_driver_info(node(ipmi_address="h", ipmi_password="one"))
    b = parse_driver_info(node(ipmi_address="h", ipmi_password="two"))
    c = parse_driver_info(node(ipmi_address="h", ipmi_password="one", ipmi_cipher_suite=17))
    assert len({a.cache_key(), b.cache_key(), c.cache_key()}) == 3
    assert "one" not in repr(a.cache_key())


@pytest.mark.parametrize(
    "info, error, text",
    [
        ({}, errors.MissingParameter, "missing driver_info: ipmi_address"),
        ({"ipmi_address": "  "}, errors.MissingParameter, "ipmi_address"),
        ({"ipmi_address": "https://bmc"}, errors.InvalidParameterValue, "bare IP address or hostname"),
        ({"ipmi_address": "bmc:623"}, errors.InvalidParameterValue, "must not carry a port; set ipmi_port"),
        ({"ipmi_address": "bmc", "ipmi_port": 0}, errors.InvalidParameterValue, "ipmi_port must be a port number"),
        ({"ipmi_address": "bmc", "ipmi_port": "x"}, errors.InvalidParameterValue, "ipmi_port must be a port number"),
        ({"ipmi_address": "bmc", "ipmi_port": 70000}, errors.InvalidParameterValue, "1-65535"),
        ({"ipmi_address": "bmc", "ipmi_port": True}, errors.InvalidParameterValue, "ipmi_port"),
        ({"ipmi_address": "bmc", "ipmi_password": 5}, errors.InvalidParameterValue, "ipmi_password must be a string"),
        ({"ipmi_address": "bmc", "ipmi_username": "u" * 17}, errors.InvalidParameterValue, "longer than IPMI allows"),
        ({"ipmi_address": "bmc", "ipmi_password": "p" * 21}, errors.InvalidParameterValue, "(20 bytes)"),
        (
            {"ipmi_address": "bmc", "ipmi_priv_level": "ROOT"},
            errors.InvalidParameterValue,
            "ipmi_priv_level 'ROOT' is not one of CALLBACK, USER, OPERATOR, ADMINISTRATOR",
        ),
        (
            {"ipmi_address": "bmc", "ipmi_cipher_suite": 1},
            errors.InvalidParameterValue,
            "ipmi_cipher_suite 1 is not supported; pyghmi implements cipher suites 3 and 17",
        ),
        ({"ipmi_address": "bmc", "ipmi_cipher_suite": "x"}, errors.InvalidParameterValue, "ipmi_cipher_suite"),
        (
            {"ipmi_address": "bmc", "ipmi_bridging": "single"},
            errors.InvalidParameterValue,
            "ipmi_bridging 'single' is not supported.*set ipmi_bridging to 'no'",
        ),
        ({"ipmi_address": "bmc", "ipmi_bridging": "dual"}, errors.InvalidParameterValue, "'dual' is not supported"),
        ({"ipmi_address": "bmc", "ipmi_bridging": "triple"}, errors.InvalidParameterValue, "no, single, dual"),
        (
            {"ipmi_address": "bmc", "ipmi_protocol_version": "1.5"},
            errors.InvalidParameterValue,
            "ipmi_protocol_version '1.5' is not supported.*IPMI 2.0",
        ),
        ({"ipmi_address": "bmc", "ipmi_protocol_version": "3"}, errors.InvalidParameterValue, "1.5, 2.0"),
        ({"ipmi_address": "bmc", "ipmi_terminal_port": -1}, errors.InvalidParameterValue, "ipmi_terminal_port"),
    ],
)
def test_bad_driver_info_is_refused_with_a_clear_message(
    info: dict[str, object], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text) as caught:
        parse_driver_info(node(**info))
    assert UUID in str(caught.value)


async def test_validate_uses_the_parser() -> None:
    power = IpmiPower({})
    try:
        task = base.Task(node=node(ipmi_address="bmc", ipmi_cipher_suite=2), ports=[], driver=None, conductor="t")  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidParameterValue, match="cipher suite"):
            await power.validate(task)
    finally:
        await power.close()


def test_errors_name_the_bmc_and_say_what_to_check() -> None:
    import pyghmi.exceptions as pexc

    info = parse_driver_info(node(ipmi_address="10.1.2.3", ipmi_username="root", ipmi_password="pw"))
    auth = map_error(info, "read the power state", pexc.IpmiException("Incorrect password provided"))
    assert "authentication failed for root@10.1.2.3:623" in str(auth) and "ipmi_password" in str(auth)
    silent = map_error(info, "read the power state", pexc.IpmiException("timeout"))
    assert "10.1.2.3:623 did not answer" in str(silent)
    refused = map_error(info, "set the boot device to safe", pexc.IpmiException("Invalid data field in request"))
    assert "refused to set the boot device to safe" in str(refused) and "0xcc" in str(refused)
    assert "pw" not in str(auth) + str(silent) + str(refused)


def test_password_is_a_secret_key() -> None:
    assert is_secret_key("ipmi_password")  # masked by the api, sealed at rest
    assert not is_secret_key("ipmi_username") and not is_secret_key("ipmi_address")


def test_boot_mode_comes_from_the_node() -> None:
    assert node_boot_mode(node_record()) == "uefi"
    assert node_boot_mode(node_record(boot_mode="bios")) == "bios"
    assert node_boot_mode(node_record(properties={"capabilities": "boot_mode:bios"})) == "bios"
    assert node_boot_mode(node_record(instance_info={"deploy_boot_mode": "bios"})) == "bios"


async def test_options_reach_the_interfaces_and_the_cache_is_shared() -> None:
    options = vars(ConductorConfig(ipmi_power_timeout=7.5, ipmi_poll_interval=0.25, ipmi_timeout=4, ipmi_retries=2))
    power, management = IpmiPower(options), IpmiManagement(options)
    other = IpmiPower(vars(ConductorConfig(ipmi_timeout=9)))
    try:
        assert (power.power_timeout, power.poll_interval, power.timeout) == (7.5, 0.25, 4.0)
        assert power.sessions is management.sessions and power.sessions.retries == 2
        assert other.sessions is not power.sessions  # other settings, other cache
        assert power._executor._max_workers == ConductorConfig().ipmi_workers == 16
    finally:
        for interface in (power, management, other):
            await interface.close()
    again = IpmiPower(options)
    assert again.sessions is not power.sessions  # a closed cache is not handed out again
    await again.close()


def test_the_ipmi_hardware_type_is_enabled_by_default() -> None:
    config = ConductorConfig()
    assert "ipmi" in config.enabled_hardware_types
    assert "ipmitool" in config.enabled_power_interfaces and "ipmitool" in config.enabled_management_interfaces
    registry = DriverRegistry(dataclasses.replace(config, enabled_deploy_interfaces=("direct", "iscsi", "fake")))
    resolved = registry.resolve_interfaces("ipmi", {})
    assert (resolved["power_interface"], resolved["management_interface"]) == ("ipmitool", "ipmitool")
    assert (resolved["boot_interface"], resolved["deploy_interface"]) == ("ipxe", "direct")
    assert registry.supported("ipmi", "storage") == ["noop", "external", "fake"]  # cinder when enabled
    with pytest.raises(errors.InvalidParameterValue):
        registry.resolve_interfaces("ipmi", {"power_interface": "redfish"})
    props = registry.properties("ipmi")
    assert {"ipmi_address", "ipmi_port", "ipmi_password", "ipmi_cipher_suite", "ipmi_bridging"} <= set(props)
