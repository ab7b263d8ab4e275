"""The virtual-media and iLO driver_info fields: Ironic's names and older aliases read, bad values
refused with the field named, nothing touched on the network; the shared ISO's name is the
recipe's hash and the netboot decision follows the deploy interface and boot_option."""

from __future__ import annotations

from typing import Any

import pytest

from services.common import errors
from services.conductor.drivers.ilo import PROLIANT_SYSTEM, IloVirtualMediaBoot, parse_ilo_driver_info
from services.conductor.drivers.media import IsoRecipe
from services.conductor.drivers.vmedia_boot import VirtualMediaBoot, netboots, parse_vmedia_info, rebase

UUID = "1be26c0b-03f2-4d2d-ae87-c02d7f33c123"


def node(driver_info: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"uuid": UUID, "driver_info": driver_info, **fields}


def test_deploy_iso_or_kernel_and_ramdisk_is_required() -> None:
    with pytest.raises(
        errors.MissingParameter, match=r"deploy_iso, or deploy_kernel and deploy_ramdisk.*deploy_ramdisk"
    ):
        parse_vmedia_info(node({"deploy_kernel": "http://x/k"}), aliases=VirtualMediaBoot.aliases)
    info = parse_vmedia_info(node({"deploy_iso": "https://x/d.iso"}), aliases=VirtualMediaBoot.aliases)
    assert info.iso == "https://x/d.iso" and info.kernel is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"deploy_iso": "file:///etc/passwd"}, "deploy_iso must be an http"),
        ({"deploy_kernel": "http://x/k k", "deploy_ramdisk": "http://x/r"}, "deploy_kernel must be an http"),
        ({"deploy_iso": "http://x/d.iso", "bootloader": 7}, "bootloader must be an http"),
        ({"deploy_iso": "http://x/d.iso", "config_via_removable": "maybe"}, "config_via_removable must be a boolean"),
        ({"deploy_iso": "http://x/d.iso", "kernel_append_params": "a; reboot"}, "kernel command line"),
        ({"deploy_iso": "http://x/d.iso", "kernel_append_params": ["a"]}, "kernel_append_params must be a string"),
    ],
)
def test_bad_values_are_refused_naming_the_field(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=problem):
        parse_vmedia_info(node(fields), aliases=VirtualMediaBoot.aliases)


def test_older_names_are_read() -> None:
    redfish = parse_vmedia_info(
        node({"redfish_deploy_iso": "http://x/r.iso", "config_via_floppy": "yes"}), aliases=VirtualMediaBoot.aliases
    )
    assert redfish.iso == "http://x/r.iso" and redfish.config_via_removable is True
    ilo = parse_vmedia_info(
        node({"ilo_deploy_iso": "http://x/i.iso", "ilo_bootloader": "http://x/esp.img"}),
        aliases=IloVirtualMediaBoot.aliases,
    )
    assert (ilo.iso, ilo.bootloader) == ("http://x/i.iso", "http://x/esp.img")
    # The current name wins over the old one.
    both = parse_vmedia_info(
        node({"deploy_iso": "http://x/new.iso", "ilo_deploy_iso": "http://x/old.iso"}),
        aliases=IloVirtualMediaBoot.aliases,
    )
    assert both.iso == "http://x/new.iso"


def test_ilo_fields_become_redfish_settings() -> None:
    info = parse_ilo_driver_info(
        node({"ilo_address": "10.0.0.5", "ilo_username": "u", "ilo_password": "p", "client_port": "8443"})
    )
    assert info.address == "https://10.0.0.5:8443" and info.system_id == PROLIANT_SYSTEM
    v6 = parse_ilo_driver_info(node({"ilo_address": "fd00::5", "ilo_username": "u", "ilo_password": "p"}))
    assert v6.address == "https://[fd00::5]"
    given = parse_ilo_driver_info(
        node({"ilo_address": "http://127.0.0.1:8000", "ilo_username": "u", "ilo_password": "p", "ilo_system_id": "abc"})
    )
    assert given.address == "http://127.0.0.1:8000" and given.system_id == "/redfish/v1/Systems/abc"


def test_bad_ilo_fields_name_the_ilo_field() -> None:
    with pytest.raises(errors.MissingParameter, match="ilo_password"):
        parse_ilo_driver_info(node({"ilo_address": "h", "ilo_username": "u"}))
    with pytest.raises(errors.InvalidParameterValue, match="client_port"):
        parse_ilo_driver_info(node({"ilo_address": "h", "ilo_username": "u", "ilo_password": "p", "client_port": "x"}))
    with pytest.raises(errors.InvalidParameterValue, match="ilo_system_id") as caught:
        parse_ilo_driver_info(
            node({"ilo_address": "h", "ilo_username": "u", "ilo_password": "p", "ilo_system_id": "a b"})
        )
    assert "redfish_" not in caught.value.message


def test_the_shared_iso_is_named_by_its_whole_recipe() -> None:
    base = IsoRecipe("http://x/k", "http://x/r", "console=ttyS0 boot_method=vmedia")
    assert base.cache_name() == IsoRecipe("http://x/k", "http://x/r", "console=ttyS0 boot_method=vmedia").cache_name()
    assert base.cache_name().startswith("boot-") and base.cache_name().endswith(".iso")
    others = {
        IsoRecipe("http://x/k2", "http://x/r", base.kernel_params).cache_name(),
        IsoRecipe("http://x/k", "http://x/r2", base.kernel_params).cache_name(),
        IsoRecipe("http://x/k", "http://x/r", base.kernel_params + " x").cache_name(),
        IsoRecipe("http://x/k", "http://x/r", base.kernel_params, image="img").cache_name(),
        IsoRecipe("http://x/k", "http://x/r", base.kernel_params, bootloader="http://x/esp").cache_name(),
    }
    assert len(others) == 5 and base.cache_name() not in others


def test_netboot_and_rebase() -> None:
    assert netboots({"deploy_interface": "ramdisk", "instance_info": {}})
    assert netboots({"deploy_interface": "direct", "instance_info": {"boot_option": "netboot"}})
    assert netboots({"deploy_interface": "direct", "instance_info": {"capabilities": {"boot_option": "netboot"}}})
    assert not netboots({"deploy_interface": "direct", "instance_info": {"boot_option": "local"}})
    url = "http://10.1.0.2:7480/t/abc/boot.iso?sig=1"
    assert rebase(url, "https://proxy.example/store/") == "https://proxy.example/store/t/abc/boot.iso?sig=1"
    assert rebase(url, None) == url
