"""Issue 20, bad input: a ramdisk that never calls back, on a real VM.

The VM network-boots a ramdisk that runs no agent (busybox printing one
line, then idling). The conductor's call-back timeout fails the deploy, and
its ``last_error`` quotes the last line of the VM's serial console, which
the conductor read through the BMC (the QEMU backend's Redfish Console log
service): the operator sees *why* without a console of their own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.ports import unused_tcp_port
from services.conductor.service import ConductorService
from services.ramdisk import cpio
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.e2e.bootfiles import ensure_kernel, ensure_packages
from tests.restclient import call, wait_state

pytestmark = pytest.mark.timeout(600)
LAST_WORDS = "FERRUM-TEST: this ramdisk has no agent and will never call back"
CALLBACK_TIMEOUT = 45.0


@pytest.fixture(scope="module")
def silent_ramdisk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Debian's kernel and a busybox initramfs that prints LAST_WORDS and idles (before the stack starts)."""
    ensure_packages()
    root = tmp_path_factory.mktemp("silent") / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copyfile("/bin/busybox", root / "bin" / "busybox")
    os.chmod(root / "bin" / "busybox", 0o755)
    (root / "init").write_text(
        "#!/bin/busybox sh\n/bin/busybox mkdir -p /proc /dev\n/bin/busybox mount -t devtmpfs dev /dev\n"
        f"echo '{LAST_WORDS}' > /dev/console\nwhile true; do /bin/busybox sleep 3600; done\n"
    )
    os.chmod(root / "init", 0o755)
    initrd = root.parent / "initrd.cpio"
    with open(initrd, "wb") as out:
        cpio.write_tree(root, out)
    return ensure_kernel(), initrd


@pytest.fixture(scope="module")
async def lab(
    silent_ramdisk: tuple[Path, Path], database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp(), prefix="timeout-lab-"))
    api_port, objects_port = unused_tcp_port(), unused_tcp_port()
    settings = test_settings(
        database_url,
        tmp / "state",
        api={"port": api_port},
        conductor={
            "hostname": "timeout-conductor",
            "automated_clean": False,
            "deploy_callback_timeout": CALLBACK_TIMEOUT,
            "timeout_check_interval": 2.0,
        },
        ipxe={"api_url": f"http://10.0.2.2:{api_port}", "retry_delay": 5},
        objectstore={"http_port": objects_port, "public_url": f"http://10.0.2.2:{objects_port}"},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            disk_size=64 * 1024 * 1024,
            name_prefix="silent-",
            backend="qemu",
            qemu_memory_mib=256,
        ).validate()
    )
    await simulator.start()
    conductor = next(s for s in stack.services if s.name == "conductor")
    assert isinstance(conductor, ConductorService) and conductor.objectstore is not None
    store = conductor.objectstore
    kernel, initrd = silent_ramdisk
    await store.put_file("timeout", "kernel", kernel, via="grpc")
    await store.put_file("timeout", "initrd", initrd, via="grpc")
    session = aiohttp.ClientSession()
    try:
        yield {
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
            "kernel": await store.temp_url("timeout", "kernel", lifetime=900),
            "initrd": await store.temp_url("timeout", "initrd", lifetime=900),
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


async def test_ramdisk_that_never_calls_back_fails_with_the_last_console_line(lab: dict[str, Any]) -> None:
    machine = lab["sim"].machines[0]
    _, node = await call(
        lab,
        "POST",
        "/v1/nodes",
        {
            "name": "silent-vm",
            "driver": "redfish",
            "boot_interface": "ipxe",
            "deploy_interface": "direct",
            "driver_info": {
                **lab["sim"].driver_info(machine),
                # quiet: the kernel's late info lines (TSC calibration, clocksource) would
                # otherwise land after the ramdisk's last words on the console.
                "kernel_append_params": lab["sim"].driver_info(machine).get("kernel_append_params", "%default%")
                + " quiet",
                "deploy_kernel": lab["kernel"],
                "deploy_ramdisk": lab["initrd"],
            },
            "instance_info": {
                "image_source": lab["initrd"],
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": "0" * 64,
            },
        },
        expect=201,
    )
    uuid = node["uuid"]
    await call(lab, "POST", "/v1/ports", {"node_uuid": uuid, "address": machine.macs[0]}, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": verb}, expect=202)
        await wait_state(lab, uuid, state, timeout=60)
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    await wait_state(lab, uuid, "wait call-back", timeout=60)
    failed = await wait_state(lab, uuid, "deploy failed", timeout=CALLBACK_TIMEOUT + 120)
    assert "Timeout reached while waiting for callback" in failed["last_error"], failed["last_error"]
    # The line may begin with iPXE's last characters: the UART drops what was still in flight
    # (seen: "...initrd... o" + LAST_WORDS) when the kernel takes it over with nothing to say.
    assert "; the console last showed: " in failed["last_error"], failed["last_error"]
    assert failed["last_error"].endswith(LAST_WORDS), failed["last_error"]
    assert machine.process is not None  # the machine itself is still up, idling in its ramdisk
