"""docs/drivers.md's example works as printed: its module is written out and
imported through the entry points its pyproject.toml block declares, enabled
by its operator config block through Ferrum's config loader, composed by the
real registry, and driven against a PDU served on 127.0.0.1."""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import AsyncIterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from services.common import errors, states
from services.common.aiohttp_serving import start_http_site
from services.common.config import load_settings
from services.common.db.records import node_with
from services.conductor.drivers import base, capabilities
from services.conductor.drivers.installed import Installed
from services.conductor.drivers.registry import DriverRegistry
from tests.support.node_records import node_record

DOC = Path(__file__).resolve().parents[2] / "docs" / "drivers.md"


def block(first_line: str) -> str:
    """The fenced block of docs/drivers.md whose first line is ``first_line``."""
    for match in re.finditer(r"```(?:python|toml)\n(.*?)```", DOC.read_text(), re.S):
        if match.group(1).splitlines()[0] == first_line:
            return match.group(1)
    raise AssertionError(f"docs/drivers.md has no block starting {first_line!r}")


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The doc's module, importable under its own name as an installed package's would be."""
    where = tmp_path_factory.mktemp("ferrum-pdu")
    (where / "ferrum_pdu.py").write_text(block("# ferrum_pdu.py"))
    sys.path.insert(0, str(where))
    try:
        yield where
    finally:
        sys.path.remove(str(where))
        sys.modules.pop("ferrum_pdu", None)


@pytest.fixture(scope="module")
def registry(example: Path) -> DriverRegistry:
    declared = tomllib.loads(block("# pyproject.toml of the ferrum-pdu package"))["project"]["entry-points"]
    points = [EntryPoint(name, value, group) for group, named in declared.items() for name, value in named.items()]
    assert {p.group for p in points} == {
        "ferrum.hardware.types",
        "ferrum.hardware.interfaces.power",
        "ferrum.hardware.interfaces.management",
    }
    config_file = example / "ferrum.toml"
    config_file.write_text(block("# ferrum.toml (--config or FERRUM_CONFIG)"))
    settings = load_settings({}, config_file=str(config_file))
    return DriverRegistry(settings.conductor, Installed.from_entry_points(extra=points))


@pytest.fixture(scope="module")
async def pdu() -> AsyncIterator[dict[str, Any]]:
    """A PDU's HTTP API: outlets that are on or off, and every request it got."""
    outlets: dict[str, str] = {"12": "off"}
    requests: list[tuple[str, str]] = []

    async def outlet(request: web.Request) -> web.Response:
        number = request.match_info["number"]
        if number not in outlets:
            raise web.HTTPNotFound()
        if request.method == "PUT":
            outlets[number] = (await request.json())["state"]
        requests.append((request.method, outlets[number]))
        return web.json_response({"state": outlets[number]})

    app = web.Application()
    app.router.add_route("*", "/outlets/{number}", outlet)
    runner, port = await start_http_site(app, "127.0.0.1", 0)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "outlets": outlets, "requests": requests}
    finally:
        await runner.cleanup()


def task(registry: DriverRegistry, driver_info: dict[str, Any], **node: Any) -> base.Task:
    record = node_record(**{"uuid": "pdu-node", "driver": "pdu", "driver_info": driver_info, **node})
    return base.Task(node=record, ports=[], driver=registry.compose(record), conductor="c")


def test_the_example_loads_and_composes_with_the_documented_defaults(registry: DriverRegistry) -> None:
    assert {"fake-hardware", "redfish", "pdu"} == set(registry.hardware_types)
    resolved = registry.resolve_interfaces("pdu", {})
    assert resolved["power_interface"] == "pdu" and resolved["management_interface"] == "netboot"
    assert (resolved["boot_interface"], resolved["deploy_interface"]) == ("ipxe", "direct")
    for kind, default in base.OPTIONAL_KIND_DEFAULTS.items():
        assert resolved[f"{kind}_interface"] == default
    props = registry.properties("pdu")
    assert "pdu_address" in props and "pdu_outlet" in props and "deploy_kernel" in props
    assert registry.describe()["pdu"]["power"] == ["pdu"]
    # The shipped types are unaffected by the new implementations.
    assert registry.supported("redfish", "power") == ["redfish"]


async def test_the_example_validates_without_the_network(registry: DriverRegistry) -> None:
    no_address = task(registry, {"pdu_outlet": 12})
    with pytest.raises(errors.MissingParameter, match="pdu_address"):
        await no_address.driver.power.validate(no_address)
    bad = task(registry, {"pdu_address": "http://192.0.2.1", "pdu_outlet": "twelve"})
    with pytest.raises(errors.InvalidParameterValue, match="pdu_outlet"):
        await bad.driver.power.validate(bad)
    good = task(registry, {"pdu_address": "http://192.0.2.1", "pdu_outlet": "12"})
    await good.driver.power.validate(good)  # 192.0.2.1 is never contacted


async def test_the_example_drives_a_real_pdu(registry: DriverRegistry, pdu: dict[str, Any]) -> None:
    t = task(registry, {"pdu_address": pdu["url"], "pdu_outlet": 12})
    power = t.driver.power
    assert await power.get_power_state(t) == states.POWER_OFF
    await power.set_power_state(t, states.POWER_ON)
    assert pdu["outlets"]["12"] == "on" and await power.get_power_state(t) == states.POWER_ON
    pdu["requests"].clear()
    await power.reboot(t)
    assert pdu["requests"] == [("PUT", "off"), ("PUT", "on")]
    with pytest.raises(errors.UnsupportedDriverExtension, match="the power interface 'pdu'"):
        await power.set_power_state(t, states.SOFT_POWER_OFF)
    missing = task(registry, {"pdu_address": pdu["url"], "pdu_outlet": 99})
    with pytest.raises(errors.BMCError, match="404"):
        await missing.driver.power.get_power_state(missing)
    # The management interface says what it can and refuses what it cannot.
    assert t.driver.management.get_supported_boot_devices(t) == ["pxe"]
    await t.driver.management.set_boot_device(t, "pxe", persistent=True)
    with pytest.raises(errors.UnsupportedDriverExtension, match="booting from 'disk'"):
        await t.driver.management.set_boot_device(t, "disk")


async def test_the_example_meets_the_boot_volume_rule_through_ipxe(registry: DriverRegistry) -> None:
    t = task(registry, {"pdu_address": "http://192.0.2.1", "pdu_outlet": 1})
    t.volume_targets = [
        {"uuid": "t-0", "volume_type": "iscsi", "boot_index": 0, "volume_id": "v-0", "properties": {}, "extra": {}}
    ]
    assert not capabilities.check_capability(t.driver.power, "iscsi_volume_boot")
    capabilities.check(t)  # ipxe boots iSCSI volumes


def test_the_documented_boot_from_volume_rule_runs() -> None:
    """The boot-from-volume deploy rule as printed in the docs is real code: it
    refuses the ramdisk deploy, and direct meets it (also with force_deployment)."""
    namespace: dict[str, Any] = {**vars(capabilities)}
    exec(block("# capabilities.py: the boot-from-volume deploy rule"), namespace)
    rule = namespace["volume_deploy_needs"]
    registry = DriverRegistry(load_settings({"FERRUM_CONDUCTOR_ENABLED_DEPLOY_INTERFACES": "direct,ramdisk"}).conductor)
    record = node_record(uuid="bfv", driver="redfish", deploy_interface="ramdisk", instance_info={})
    t = base.Task(node=record, ports=[], driver=registry.compose(record), conductor="c")
    t.volume_targets = [
        {"uuid": "t-0", "volume_type": "iscsi", "boot_index": 0, "volume_id": "v-0", "properties": {}, "extra": {}}
    ]
    (missing,) = capabilities.unmet(t, rules=[rule])
    assert (missing.need.kind, missing.need.capability, missing.interface.name) == (
        "deploy",
        "boot_from_volume",
        "ramdisk",
    )
    forced = node_with(record, {"deploy_interface": "direct", "instance_info": {"force_deployment": True}})
    t = base.Task(node=forced, ports=[], driver=registry.compose(forced), conductor="c")
    t.volume_targets = [
        {"uuid": "t-0", "volume_type": "iscsi", "boot_index": 0, "volume_id": "v-0", "properties": {}, "extra": {}}
    ]
    assert list(rule(t))[1].capability == "iscsi_volume_deploy"
    assert capabilities.unmet(t, rules=[rule]) == []
