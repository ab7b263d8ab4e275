"""The redfish management interface's boot mode, indicator LED and secure
boot (API 1.63/1.76) against sushy-tools' emulator run as a real process
(the same emulator fixture as test_redfish_sushy_tools)."""

from __future__ import annotations

import pytest

from services.common import errors
from services.conductor.drivers.redfish import RedfishManagement
from tests.integration.test_redfish_sushy_tools import SYSTEM_B, emulator, make_task  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def management() -> RedfishManagement:
    return RedfishManagement({})


async def test_boot_mode_round_trip(emulator: str, management: RedfishManagement) -> None:  # noqa: F811
    task = make_task(emulator, system=SYSTEM_B)
    assert management.get_supported_boot_modes(task) == ["bios", "uefi"]
    await management.set_boot_mode(task, "uefi")
    assert await management.get_boot_mode(task) == "uefi"
    await management.set_boot_mode(task, "bios")
    assert await management.get_boot_mode(task) == "bios"
    with pytest.raises(errors.InvalidParameterValue, match="Invalid boot mode"):
        await management.set_boot_mode(task, "efi")


async def test_indicator_led(emulator: str, management: RedfishManagement) -> None:  # noqa: F811
    task = make_task(emulator, system=SYSTEM_B)
    supported = await management.get_supported_indicators(task)
    assert supported == {"system": {"led": {"readonly": False, "states": ["BLINKING", "OFF", "ON"]}}}
    assert await management.get_supported_indicators(task, "chassis") == {}
    await management.set_indicator_state(task, "system", "led", "BLINKING")
    assert await management.get_indicator_state(task, "system", "led") == "BLINKING"
    await management.set_indicator_state(task, "system", "led", "OFF")
    assert await management.get_indicator_state(task, "system", "led") == "OFF"
    with pytest.raises(errors.InvalidParameterValue, match="led@system only"):
        await management.get_indicator_state(task, "chassis", "led")
    with pytest.raises(errors.InvalidParameterValue, match="Invalid state"):
        await management.set_indicator_state(task, "system", "led", "PURPLE")


async def test_secure_boot_is_a_clear_error_when_the_bmc_has_none(emulator: str, management: RedfishManagement) -> None:  # noqa: F811
    """The emulator's fake driver exposes no SecureBoot resource: a BMC error naming the action, not a crash."""
    task = make_task(emulator, system=SYSTEM_B)
    try:
        await management.set_secure_boot_state(task, True)
    except errors.FerrumError as exc:
        assert "secure boot" in exc.message
    else:
        assert await management.get_secure_boot_state(task) is True
