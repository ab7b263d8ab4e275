"""The iscsi deploy's validate (seed 002): with virtual-media boot, the
ramdisk learns where to call back from the floppy the conductor builds, so a
conductor that does not know the api URL refuses the deploy up front."""

from __future__ import annotations

from typing import Any, cast

import pytest

from services.common import errors
from services.common.config import load_settings
from services.common.db.records import PortRecord
from services.conductor.drivers import base
from services.conductor.drivers.registry import DriverRegistry
from tests.support.node_records import node_record

ENV = {
    "FERRUM_CONDUCTOR_ENABLED_BOOT_INTERFACES": "ipxe,redfish-virtual-media",
    "FERRUM_CONDUCTOR_ENABLED_DEPLOY_INTERFACES": "direct,iscsi",
}


class Media:
    """The conductor's media store, as far as validate asks it."""

    def __init__(self, url: str) -> None:
        self.url = url

    def api_url(self) -> str:
        if not self.url:
            raise errors.ImageError("the conductor does not know the api URL the agent must call back")
        return self.url


def task(boot: str, media: Any) -> base.Task:
    registry = DriverRegistry(load_settings(ENV).conductor)
    node = node_record(
        uuid="2b0b1a3c-1f7e-4a59-9a55-6b3c0c1e0d01",
        driver="redfish",
        boot_interface=boot,
        deploy_interface="iscsi",
        instance_info={
            "image_source": "http://images/os.raw",
            "image_os_hash_algo": "sha256",
            "image_os_hash_value": "0" * 64,
        },
    )
    # The deploy reads only these keys of a port.
    ports = [cast(PortRecord, {"uuid": "p", "address": "52:54:00:00:00:01", "pxe_enabled": True})]
    return base.Task(node=node, ports=ports, driver=registry.compose(node), conductor="c", media=media)


async def test_virtual_media_boot_needs_the_api_url_the_ramdisk_calls_back() -> None:
    unknown = task("redfish-virtual-media", Media(""))
    with pytest.raises(errors.InvalidParameterValue, match="could not call back to pass_deploy_info"):
        await unknown.driver.deploy.validate(unknown)
    known = task("redfish-virtual-media", Media("http://api.example:6385"))
    await known.driver.deploy.validate(known)


async def test_ipxe_boot_leaves_the_api_url_to_the_renderer() -> None:
    netboot = task("ipxe", Media(""))
    await netboot.driver.deploy.validate(netboot)
