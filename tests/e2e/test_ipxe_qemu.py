"""Real iPXE (Debian's ipxe-qemu ROM in QEMU, TCG) network-boots through
Ferrum's renderer: DHCP hands out our /boot.ipxe, which chains the per-node
script by MAC. The deploy VM boots from a NIC no node knows, so boot.ipxe
must fall back to its second NIC (``${net1/mac}``); for that node, in
``deploying``, the per-node script fetches a real Debian
kernel and a busybox initramfs whose /init prints a marker on the serial
console. A second VM with an unknown MAC must show our error text; a third,
whose node is ``manageable``, shows the reason and goes straight back to the
firmware without trying other identities. Another VM does the deploy under
UEFI (OVMF). Boot from volume, over REST, is tests/e2e/test_boot_from_volume_qemu.py.

The packages, kernel and initramfs come from ``tests/e2e/bootfiles.py``
(run by ``scripts/bootstrap.sh``); the stack fixture depends on them, so
nothing slow runs while a stack's event loop is running.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid as uuidlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings
from tests.e2e.bootfiles import MARKER, ensure_initramfs, ensure_kernel, ensure_packages
from tests.fileserver import serving_files

BOOT_WAIT = 180.0
DEPLOY_MAC, UNKNOWN_MAC, MANAGEABLE_MAC = "52:54:00:e2:e0:01", "52:54:00:e2:e0:99", "52:54:00:e2:e0:02"
OVMF_CODE, OVMF_VARS = Path("/usr/share/OVMF/OVMF_CODE_4M.fd"), Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
UEFI_MAC = "52:54:00:e2:e0:0e"
UNENROLLED_FIRST_NIC = "52:54:00:e2:e0:10"  # the deploy VM boots from this NIC; its node knows only the second
V = {"X-OpenStack-Ironic-API-Version": "1.56"}

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def marker() -> str:
    return MARKER


@pytest.fixture(scope="module")
def boot_files(marker: str) -> tuple[Path, Path]:
    """Packages, kernel and initramfs: all before the stack starts (the stack depends on this)."""
    ensure_packages()
    return ensure_kernel(), ensure_initramfs(marker)


@pytest.fixture(scope="module")
async def file_server(boot_files: tuple[Path, Path]) -> AsyncIterator[tuple[int, list[str]]]:
    """The kernel and initramfs over HTTP on 127.0.0.1 (10.0.2.2 from the guests)."""
    kernel, initrd = boot_files
    fetched: list[str] = []
    async with serving_files({"/vmlinuz": kernel, "/initrd": initrd}, fetched) as port:
        yield port, fetched


@pytest.fixture(scope="module")
async def stack(
    boot_files: tuple[Path, Path], database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Any]:
    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("state"),
        conductor={"hostname": "e2e-c"},
        ipxe={"api_url": "http://10.0.2.2:6385", "retry_delay": 5},
    )
    running = RunningStack()
    await running.start(settings, list(ALL_SERVICES_ORDER))
    try:
        yield running
    finally:
        await running.close()


async def start_vm(
    serial: Path, *, boot_url: str, mac: str, smbios_uuid: str, second_mac: str = "", uefi_vars: Path | None = None
) -> asyncio.subprocess.Process:
    """A VM booting from its first NIC; ``second_mac`` adds a NIC without a boot file;
    ``uefi_vars`` (a writable copy of OVMF's variable store) makes it a UEFI (OVMF, q35) machine."""
    second = ["-netdev", "user,id=n1", "-device", f"virtio-net-pci,netdev=n1,mac={second_mac}"] if second_mac else []
    uefi = (
        [
            "-machine",
            "q35",
            "-drive",
            f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
            "-drive",
            f"if=pflash,format=raw,file={uefi_vars}",
        ]
        if uefi_vars
        else []
    )
    return await asyncio.create_subprocess_exec(
        "qemu-system-x86_64",
        *uefi,
        "-accel",
        "tcg",
        "-m",
        "512",
        "-boot",
        "n",
        "-no-reboot",
        # -nographic makes SeaBIOS (and so iPXE) write to the serial port too.
        "-nographic",
        "-monitor",
        "none",
        "-serial",
        f"file:{serial}",
        "-uuid",
        smbios_uuid,
        "-netdev",
        f"user,id=n0,bootfile={boot_url}",
        "-device",
        f"virtio-net-pci,netdev=n0,mac={mac}",
        *second,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def stop_vm(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def wait_for_text(serial: Path, texts: list[str], process: asyncio.subprocess.Process, timeout: float) -> str:
    """The serial log once it holds every one of ``texts`` (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    content = ""
    while time.monotonic() < deadline:
        content = serial.read_text(errors="replace") if serial.exists() else ""
        if all(text in content for text in texts):
            return content
        if process.returncode is not None:
            break
        await asyncio.sleep(1.0)
    content = serial.read_text(errors="replace") if serial.exists() else ""
    missing = [t for t in texts if t not in content]
    raise AssertionError(
        f"serial console never showed {missing} (qemu rc={process.returncode}); last output:\n{content[-3000:]}"
    )


async def enroll(stack: Any, *, name: str, mac: str, state: str, driver_info: dict[str, str]) -> str:
    api = stack.endpoints["api REST (Ironic v1)"]
    async with aiohttp.ClientSession() as http:
        body = {"driver": "fake-hardware", "name": name, "driver_info": driver_info}
        async with http.post(f"{api}/v1/nodes", json=body, headers=V) as r:
            assert r.status == 201, await r.text()
            node = str((await r.json())["uuid"])
        async with http.post(f"{api}/v1/ports", json={"node_uuid": node, "address": mac}, headers=V) as r:
            assert r.status == 201, await r.text()
    await stack.pool.execute("UPDATE nodes SET provision_state = $1 WHERE uuid = $2::uuid", state, node)
    return node


async def test_real_ipxe_boots_deploy_ramdisk_and_reports_unknown_mac(
    stack: Any,
    file_server: tuple[int, list[str]],
    marker: str,
    tmp_path: Path,
) -> None:
    port, fetched = file_server
    renderer_port = stack.endpoints["ipxe HTTP"].rsplit(":", 1)[1].split("/")[0]
    boot_url = f"http://10.0.2.2:{renderer_port}/boot.ipxe"
    info = {"deploy_kernel": f"http://10.0.2.2:{port}/vmlinuz", "deploy_ramdisk": f"http://10.0.2.2:{port}/initrd"}
    node = await enroll(stack, name="qemu-deploy", mac=DEPLOY_MAC, state="deploying", driver_info=info)
    idle = await enroll(stack, name="qemu-idle", mac=MANAGEABLE_MAC, state="manageable", driver_info=info)

    deploy_log, unknown_log, idle_log = (tmp_path / f"{n}.serial" for n in ("deploy", "unknown", "idle"))
    unknown_uuid = str(uuidlib.uuid4())
    vms = [
        await start_vm(
            deploy_log,
            boot_url=boot_url,
            mac=UNENROLLED_FIRST_NIC,
            second_mac=DEPLOY_MAC,
            smbios_uuid=str(uuidlib.uuid4()),
        ),
        await start_vm(unknown_log, boot_url=boot_url, mac=UNKNOWN_MAC, smbios_uuid=unknown_uuid),
        await start_vm(idle_log, boot_url=boot_url, mac=MANAGEABLE_MAC, smbios_uuid=str(uuidlib.uuid4())),
    ]
    try:
        deployed, unknown, idle_out = await asyncio.gather(
            wait_for_text(
                deploy_log,
                [
                    f"Ferrum: no node has a port with MAC {UNENROLLED_FIRST_NIC}",
                    f"Ferrum: looking up this machine by MAC {DEPLOY_MAC} (net1)",
                    f"Ferrum: node {node} is in state deploying",
                    marker,
                    "BOOTIF=01-52-54-00-e2-e0-01",  # the /proc/cmdline line /init prints after the marker
                ],
                vms[0],
                BOOT_WAIT,
            ),
            wait_for_text(
                unknown_log,
                [
                    f"Ferrum: no node has a port with MAC {UNKNOWN_MAC}",
                    f"Ferrum: no node has UUID {unknown_uuid}",
                    "Ferrum: no node matches any MAC or the SMBIOS UUID of this machine",
                ],
                vms[1],
                BOOT_WAIT,
            ),
            # A known node that must not boot: our reason, then straight back to the
            # firmware (SeaBIOS's "Boot failed"), without trying the SMBIOS UUID.
            wait_for_text(
                idle_log,
                [
                    f"Ferrum: node {idle} is in provision state",
                    "[manageable]",
                    "Ferrum: exiting to the next boot device",
                    "Boot failed",
                ],
                vms[2],
                BOOT_WAIT,
            ),
        )
    finally:
        for vm in vms:
            await stop_vm(vm)
    assert "/vmlinuz" in fetched and "/initrd" in fetched
    # The kernel got the agent's arguments from the per-node script.
    cmdline = deployed[deployed.index(marker) :]  # /init printed /proc/cmdline after the marker
    assert f"ipa-node-uuid={node}" in cmdline and "BOOTIF=01-52-54-00-e2-e0-01" in cmdline
    assert "ipa-api-url=http://10.0.2.2:6385" in cmdline
    assert "Ferrum: cannot network-boot this machine" in unknown and marker not in unknown
    back_to_firmware = idle_out.index("Boot failed")
    assert idle_out.index("Ferrum: exiting to the next boot device") < back_to_firmware
    assert "by SMBIOS UUID" not in idle_out[:back_to_firmware] and marker not in idle_out


async def test_real_uefi_ipxe_boots_deploy_ramdisk(
    stack: Any, file_server: tuple[int, list[str]], marker: str, tmp_path: Path
) -> None:
    """The same deploy through UEFI iPXE (OVMF, q35): it needs ``initrd=<name>`` on the kernel line."""
    port, _ = file_server
    renderer_port = stack.endpoints["ipxe HTTP"].rsplit(":", 1)[1].split("/")[0]
    info = {"deploy_kernel": f"http://10.0.2.2:{port}/vmlinuz", "deploy_ramdisk": f"http://10.0.2.2:{port}/initrd"}
    node = await enroll(stack, name="qemu-uefi", mac=UEFI_MAC, state="clean wait", driver_info=info)
    await stack.pool.execute("UPDATE nodes SET boot_mode = 'uefi' WHERE uuid = $1::uuid", node)
    variables = tmp_path / "OVMF_VARS.fd"
    shutil.copyfile(OVMF_VARS, variables)
    serial = tmp_path / "uefi.serial"
    vm = await start_vm(
        serial,
        boot_url=f"http://10.0.2.2:{renderer_port}/boot.ipxe",
        mac=UEFI_MAC,
        smbios_uuid=str(uuidlib.uuid4()),
        uefi_vars=variables,
    )
    try:
        out = await wait_for_text(
            serial,
            [
                f"Ferrum: node {node} is in state clean wait",
                "Ferrum: loading the deploy kernel and ramdisk (uefi)",
                marker,
                "initrd=deploy_ramdisk",  # the /proc/cmdline line /init prints after the marker
            ],
            vm,
            BOOT_WAIT,
        )
    finally:
        await stop_vm(vm)
    cmdline = out[out.index(marker) :]
    assert "BOOTIF=01-52-54-00-e2-e0-0e" in cmdline and "initrd=deploy_ramdisk" in cmdline
