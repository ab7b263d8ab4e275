"""The redfish interfaces' fast checks: driver_info parsing, properties, composition."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.config import ConductorConfig
from services.conductor.drivers import base
from services.conductor.drivers.redfish import RedfishManagement, RedfishPower
from services.conductor.drivers.redfish_client import ConnectionCache, parse_driver_info
from services.conductor.drivers.registry import DriverRegistry


def node(**info: object) -> dict[str, object]:
    return {"uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123", "driver": "redfish", "driver_info": info}


def task(**info: object) -> base.Task:
    return base.Task(node=node(**info), ports=[], driver=None, conductor="test")  # type: ignore[arg-type]


def test_full_driver_info_is_parsed() -> None:
    info = parse_driver_info(
        node(
            redfish_address="https://bmc.example:8443/",
            redfish_system_id="/redfish/v1/Systems/1/",
            redfish_username="admin",
            redfish_password="secret",
            redfish_verify_ca="false",
            redfish_auth_type="Session",
        )
    )
    assert info.address == "https://bmc.example:8443"
    assert info.system_id == "/redfish/v1/Systems/1"
    assert (info.username, info.password, info.verify_ca, info.auth_type) == ("admin", "secret", False, "session")


def test_defaults_and_bare_forms() -> None:
    info = parse_driver_info(node(redfish_address="10.0.0.5", redfish_system_id="abc"))
    assert info.address == "https://10.0.0.5"  # no scheme: https, as Ironic
    assert info.system_id == "/redfish/v1/Systems/abc"  # a bare Id becomes the standard path
    assert info.verify_ca is True and info.auth_type == "auto"
    assert info.username is None and info.password is None
    assert parse_driver_info(node(redfish_address="http://h")).system_id is None


def test_verify_ca_path_must_exist(tmp_path: object) -> None:
    bundle = __file__
    assert parse_driver_info(node(redfish_address="http://h", redfish_verify_ca=bundle)).verify_ca == bundle
    with pytest.raises(errors.InvalidParameterValue, match="redfish_verify_ca"):
        parse_driver_info(node(redfish_address="http://h", redfish_verify_ca="/no/such/ca.pem"))


@pytest.mark.parametrize(
    "info, error, text",
    [
        ({}, errors.MissingParameter, "redfish_address"),
        ({"redfish_address": ""}, errors.MissingParameter, "redfish_address"),
        ({"redfish_address": "ftp://bmc"}, errors.InvalidParameterValue, "http or https"),
        ({"redfish_address": "http://"}, errors.InvalidParameterValue, "scheme://host"),
        ({"redfish_address": "http://u:p@bmc"}, errors.InvalidParameterValue, "no credentials"),
        ({"redfish_address": "http://bmc?x=1"}, errors.InvalidParameterValue, "query"),
        ({"redfish_address": "http://bmc:99999"}, errors.InvalidParameterValue, "invalid port"),
        (
            {"redfish_address": "http://bmc", "redfish_auth_type": "kerberos"},
            errors.InvalidParameterValue,
            "basic, session, auto",
        ),
        (
            {"redfish_address": "http://bmc", "redfish_system_id": "/a b"},
            errors.InvalidParameterValue,
            "redfish_system_id",
        ),
        ({"redfish_address": "http://bmc", "redfish_system_id": 5}, errors.InvalidParameterValue, "redfish_system_id"),
        ({"redfish_address": "http://bmc", "redfish_password": 5}, errors.InvalidParameterValue, "redfish_password"),
    ],
)
def test_bad_driver_info_is_rejected(info: dict[str, object], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        parse_driver_info(node(**info))


async def test_validate_is_offline_and_uses_the_same_checks() -> None:
    power, management = RedfishPower({}), RedfishManagement({})
    # An address nobody listens on validates: validate never touches the network.
    await power.validate(task(redfish_address="http://127.0.0.1:1"))
    await management.validate(task(redfish_address="http://127.0.0.1:1"))
    with pytest.raises(errors.MissingParameter):
        await power.validate(task())
    assert len(power.connections) == 0


def test_properties_and_supported_values() -> None:
    power, management = RedfishPower({}), RedfishManagement({})
    props = power.get_properties()
    assert set(props) == {
        "redfish_address",
        "redfish_system_id",
        "redfish_username",
        "redfish_password",
        "redfish_verify_ca",
        "redfish_auth_type",
    }
    assert "Required" in props["redfish_address"]
    assert management.get_properties() == props
    assert management.get_supported_boot_devices(task()) == ["pxe", "disk", "cdrom", "bios"]
    assert set(power.get_supported_power_states()) == {
        "power on",
        "power off",
        "rebooting",
        "soft rebooting",
        "soft power off",
    }


async def test_bad_requests_are_rejected_before_any_call() -> None:
    power, management = RedfishPower({}), RedfishManagement({})
    with pytest.raises(errors.InvalidParameterValue, match="cannot set"):
        await power.set_power_state(task(redfish_address="http://127.0.0.1:1"), "inspecting")
    with pytest.raises(errors.InvalidParameterValue, match="Invalid boot device"):
        await management.set_boot_device(task(redfish_address="http://127.0.0.1:1"), "floppy")
    assert len(power.connections) == 0 and len(management.connections) == 0


def test_options_come_from_the_conductor_config() -> None:
    power = RedfishPower(vars(ConductorConfig(redfish_power_timeout=7.5, redfish_poll_interval=0.25)))
    assert (power.power_timeout, power.poll_interval) == (7.5, 0.25)
    assert RedfishPower({}).power_timeout == 60.0


def test_cache_key_changes_with_the_password() -> None:
    a = parse_driver_info(node(redfish_address="http://h", redfish_username="u", redfish_password="one"))
    b = parse_driver_info(node(redfish_address="http://h", redfish_username="u", redfish_password="two"))
    assert a.cache_key() != b.cache_key()
    assert "one" not in "".join(a.cache_key())
    assert len(ConnectionCache()) == 0


def test_redfish_hardware_type_composes() -> None:
    registry = DriverRegistry(ConductorConfig(enabled_deploy_interfaces=("fake",)))
    assert "redfish" in registry.hardware_types
    resolved = registry.resolve_interfaces("redfish", {})
    assert resolved["power_interface"] == "redfish"
    assert resolved["management_interface"] == "redfish"
    assert resolved["boot_interface"] == "ipxe"
    assert resolved["deploy_interface"] == "fake"  # direct is preferred when enabled
    with pytest.raises(errors.InvalidParameterValue, match="Valid interfaces"):
        registry.resolve_interfaces("redfish", {"power_interface": "fake"})
    driver = registry.compose({"driver": "redfish"})
    assert isinstance(driver.power, RedfishPower) and isinstance(driver.management, RedfishManagement)
    assert "redfish_password" in registry.properties("redfish")


def test_each_interface_has_its_own_bounded_pool() -> None:
    """BMC I/O has its own threads, so hung BMCs cannot starve the default executor."""
    power = RedfishPower(vars(ConductorConfig(redfish_workers=3)))
    management = RedfishManagement(vars(ConductorConfig()))
    assert power._executor._max_workers == 3 and management._executor._max_workers == 16
    assert power._executor is not management._executor


async def test_close_releases_the_pool() -> None:
    power = RedfishPower({})
    await power.close()  # nothing cached: no BMC is contacted
    assert power._executor._shutdown and len(power.connections) == 0
