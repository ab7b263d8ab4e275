"""The redfish interfaces against an independent Redfish implementation:
sushy-tools' emulator with its fake system driver, run as a real process.

The fake driver applies power changes 1-11 s after the request, so every
check relies on the driver's own polling (never a fixed sleep).
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests

from services.common import errors
from services.common.ports import unused_tcp_port
from services.conductor.drivers import base
from services.conductor.drivers.redfish import RedfishManagement, RedfishPower

SYSTEM_A = "0f8a9c57-6f43-4c8e-9c55-7a8b2e1d0001"
SYSTEM_B = "0f8a9c57-6f43-4c8e-9c55-7a8b2e1d0002"
MAC_A = "52:54:00:7e:00:01"
USER, PASSWORD = "admin", "s3cret-pw"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """sushy-emulator with two fake systems and basic auth, stopped by PID."""
    tmp = tmp_path_factory.mktemp("sushy-emulator")
    htpasswd = tmp / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    config = tmp / "emulator.conf"
    config.write_text(
        "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
        "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(tmp / 'state')!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
        "SUSHY_EMULATOR_FAKE_SYSTEMS = [\n"
        f"  {{'uuid': {SYSTEM_A!r}, 'name': 'fake-a', 'power_state': 'Off', 'nics': [{{'mac': {MAC_A!r}}}]}},\n"
        f"  {{'uuid': {SYSTEM_B!r}, 'name': 'fake-b', 'power_state': 'Off', 'nics': [{{'mac': '52:54:00:7e:00:02'}}]}},\n"
        "]\n"
    )
    port = unused_tcp_port()
    binary = Path(sys.executable).parent / "sushy-emulator"
    with open(tmp / "emulator.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [str(binary), "--config", str(config), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sushy-emulator exited: {(tmp / 'emulator.log').read_text()[-2000:]}")
            try:
                if requests.get(url + "/redfish/v1/", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sushy-emulator did not answer within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def make_task(url: str, system: str | None = SYSTEM_A, **extra: object) -> base.Task:
    info: dict[str, object] = {
        "redfish_address": url,
        "redfish_username": USER,
        "redfish_password": PASSWORD,
        "redfish_verify_ca": False,
        **extra,
    }
    if system:
        info["redfish_system_id"] = f"/redfish/v1/Systems/{system}"
    node = {"uuid": "7c8e2f4a-1f0e-4a44-9f0b-3c2b1d1e0a01", "driver": "redfish", "driver_info": info}
    return base.Task(node=node, ports=[], driver=None, conductor="test")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def power() -> RedfishPower:
    return RedfishPower({"redfish_power_timeout": 60, "redfish_poll_interval": 0.5})


@pytest.fixture(scope="module")
def management() -> RedfishManagement:
    return RedfishManagement({})


async def test_power_on_reboot_and_off_wait_for_the_emulator(emulator: str, power: RedfishPower) -> None:
    task = make_task(emulator)
    assert await power.get_power_state(task) == "power off"
    await power.set_power_state(task, "power on")
    # set_power_state returned only once the emulator reported the change.
    assert await power.get_power_state(task) == "power on"
    await power.reboot(task)
    assert await power.get_power_state(task) == "power on"
    await power.set_power_state(task, "power off")
    assert await power.get_power_state(task) == "power off"
    # Asking for the state it is already in is a no-op, not a wait.
    started = time.monotonic()
    await power.set_power_state(task, "power off")
    assert time.monotonic() - started < 5
    assert len(power.connections) == 1  # one cached connection per BMC and credentials


async def test_power_timeout_is_a_clear_error(emulator: str) -> None:
    # A timeout shorter than the emulator's 1-11 s delay must fail, naming the state.
    impatient = RedfishPower({"redfish_poll_interval": 0.2})
    task = make_task(emulator, system=SYSTEM_B)
    try:
        with pytest.raises(errors.BMCError, match=r"Timed out waiting .* 'power on'"):
            await impatient.set_power_state(task, "power on", timeout=0.5)
    finally:
        # The change still lands later; settle the system back to off for other runs.
        patient = RedfishPower({"redfish_poll_interval": 0.5})
        await patient.set_power_state(task, "power on")
        await patient.set_power_state(task, "power off")
    assert await patient.get_power_state(task) == "power off"


async def test_boot_override(emulator: str, management: RedfishManagement) -> None:
    task = make_task(emulator)
    await management.set_boot_device(task, "pxe", persistent=False)
    # sushy-tools' fake driver reads a Once override back as Continuous: check the device only.
    assert (await management.get_boot_device(task))["boot_device"] == "pxe"
    await management.set_boot_device(task, "disk", persistent=True)
    assert await management.get_boot_device(task) == {"boot_device": "disk", "persistent": True}
    await management.set_boot_device(task, "cdrom", persistent=True)
    assert (await management.get_boot_device(task))["boot_device"] == "cdrom"


async def test_system_uuid_and_macs(emulator: str, management: RedfishManagement) -> None:
    task = make_task(emulator)
    assert await management.get_system_uuid(task) == SYSTEM_A
    assert await management.get_mac_addresses(task) == [MAC_A]


async def test_wrong_password_says_authentication_failed(emulator: str) -> None:
    power = RedfishPower({})
    task = make_task(emulator, redfish_password="wrong")
    with pytest.raises(errors.BMCError, match="authentication failed"):
        await power.get_power_state(task)
    assert len(power.connections) == 0  # a rejected connection is not kept
    for auth in ("basic", "session"):
        with pytest.raises(errors.BMCError, match="authentication failed"):
            await power.get_power_state(make_task(emulator, redfish_password="wrong", redfish_auth_type=auth))


async def test_basic_auth_type_works(emulator: str) -> None:
    power = RedfishPower({})
    assert await power.get_power_state(make_task(emulator, redfish_auth_type="basic")) in ("power on", "power off")


async def test_unreachable_bmc_says_unreachable() -> None:
    power = RedfishPower({"redfish_request_timeout": 3})
    with pytest.raises(errors.BMCError, match="unreachable"):
        await power.get_power_state(make_task(f"http://127.0.0.1:{unused_tcp_port()}"))


async def test_two_systems_need_a_system_id(emulator: str) -> None:
    power = RedfishPower({})
    with pytest.raises(errors.InvalidParameterValue, match="redfish_system_id"):
        await power.get_power_state(make_task(emulator, system=None))
    with pytest.raises(errors.BMCError, match="not found"):
        await power.get_power_state(make_task(emulator, system="no-such-system"))


async def test_virtual_media(emulator: str, management: RedfishManagement) -> None:
    from aiohttp import web

    from services.common.aiohttp_serving import start_http_site

    fetched: list[str] = []

    async def serve(request: web.Request) -> web.Response:
        fetched.append(request.path)
        return web.Response(body=b"\0" * 2048)

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner, port = await start_http_site(app, "127.0.0.1", 0)
    try:
        task = make_task(emulator)
        url = f"http://127.0.0.1:{port}/boot.iso"
        await management.insert_virtual_media(task, "cdrom", url)
        assert "/boot.iso" in fetched  # the emulator downloads what is inserted
        cd = next(m for m in await management.get_virtual_media(task) if "CD" in m["media_types"])
        assert (cd["image"], cd["inserted"]) == (url, True)
        await management.eject_virtual_media(task, "cdrom")
        cd = next(m for m in await management.get_virtual_media(task) if "CD" in m["media_types"])
        assert cd["inserted"] is False
    finally:
        await runner.cleanup()


# ---- a virtual-media deploy over REST against the emulator (issue 17) ---------------------------


@pytest.fixture(scope="module")
async def vmedia_stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """api + conductor + object store with redfish-virtual-media enabled."""
    from services.runtime import ALL_SERVICES_ORDER, RunningStack
    from tests.conftest import test_settings

    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("vmedia-state"),
        conductor={
            "hostname": "sushy-vmedia-conductor",
            "enabled_boot_interfaces": ("fake", "ipxe", "redfish-virtual-media"),
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    try:
        yield stack
    finally:
        await stack.close()


async def test_virtual_media_deploy_over_rest_inserts_cd_and_floppy_in_the_emulator(
    emulator: str, vmedia_stack: Any
) -> None:
    """sushy-tools downloads what is inserted: the conductor's temp URLs must serve it. While the
    deploy waits for the agent (the fake system runs none), the emulator holds the shared deploy
    ISO in its Cd and the node's floppy in its Floppy, with a boot override to Cd and the power on;
    undeploying ejects both and deletes the objects."""
    import aiohttp

    from tests.restclient import call, wait_state

    conductor = next(s for s in vmedia_stack.services if s.name == "conductor")
    store, container = conductor.objectstore, conductor.manager.vmedia.container
    kernel = bytearray(4096)
    kernel[0x1FE:0x200], kernel[0x202:0x206] = b"\x55\xaa", b"HdrS"
    await store.put_bytes("sushy-vmedia", "vmlinuz", bytes(kernel))
    await store.put_bytes("sushy-vmedia", "initrd", b"\x1f\x8b\x08\x00" + b"\0" * 100)
    async with aiohttp.ClientSession() as session:
        env = {"session": session, "api": vmedia_stack.endpoints["api REST (Ironic v1)"]}
        _, node = await call(
            env,
            "POST",
            "/v1/nodes",
            {
                "driver": "redfish",
                "boot_interface": "redfish-virtual-media",
                "deploy_interface": "direct",
                "automated_clean": False,  # no agent runs behind the emulator: this checks the BMC side only
                "driver_info": {
                    **make_task(emulator, system=SYSTEM_B).node["driver_info"],
                    "deploy_kernel": await store.temp_url("sushy-vmedia", "vmlinuz", lifetime=600),
                    "deploy_ramdisk": await store.temp_url("sushy-vmedia", "initrd", lifetime=600),
                },
                "instance_info": {
                    "image_source": await store.temp_url("sushy-vmedia", "vmlinuz", lifetime=600),
                    "image_os_hash_algo": "sha256",
                    "image_os_hash_value": "0" * 64,
                },
            },
            expect=201,
        )
        uuid = node["uuid"]
        await call(env, "POST", "/v1/ports", {"node_uuid": uuid, "address": "52:54:00:7e:00:02"}, expect=201)
        for verb, state in (("manage", "manageable"), ("provide", "available")):
            await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": verb}, expect=202)
            await wait_state(env, uuid, state)
        await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
        waiting = await wait_state(env, uuid, "wait call-back", timeout=120)
        assert waiting["last_error"] is None and waiting["power_state"] == "power on"

        auth = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
        system = f"{emulator}/redfish/v1/Systems/{SYSTEM_B}"

        async def get(path: str) -> dict[str, Any]:
            async with session.get(path, headers=auth) as reply:
                assert reply.status == 200, path
                return dict(await reply.json())

        cd, floppy = await get(f"{system}/VirtualMedia/Cd"), await get(f"{system}/VirtualMedia/Floppy")
        assert cd["Inserted"] is True and "/boot-" in cd["Image"] and ".iso" in cd["Image"]
        assert floppy["Inserted"] is True and f"/image-{uuid}" in floppy["Image"]
        assert (await get(system))["Boot"]["BootSourceOverrideTarget"] == "Cd"
        names = {o.name for o in await store.list(container)}
        assert f"image-{uuid}" in names and any(n.startswith("boot-") for n in names)

        await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "deleted"}, expect=202)
        done = await wait_state(env, uuid, "available", timeout=120)
        assert done["power_state"] == "power off"
        cd, floppy = await get(f"{system}/VirtualMedia/Cd"), await get(f"{system}/VirtualMedia/Floppy")
        assert cd["Inserted"] is False and floppy["Inserted"] is False
        try:
            left = [o.name for o in await store.list(container)]
        except errors.NotFound:
            left = []
        assert not left, left


async def test_bios_on_the_fake_driver_is_refused_clearly(emulator: str) -> None:
    """sushy-tools serves Bios only with a driver that keeps BIOS attributes (libvirt,
    Nova); its fake driver has none: its systems link no Bios resource, the BIOS URL
    answers 501, and the redfish bios refuses as on any BMC without one (issue 21 item 4)."""
    from services.conductor.drivers.redfish_bios import RedfishBIOS

    bios = RedfishBIOS({})
    try:
        with pytest.raises(errors.UnsupportedDriverExtension, match="has no Bios resource"):
            await bios.cache_bios_settings(make_task(emulator))
        with pytest.raises(errors.UnsupportedDriverExtension, match="has no Bios resource"):
            await bios.apply_configuration(make_task(emulator), [{"name": "ProcTurboMode", "value": "Disabled"}])
    finally:
        await bios.close()
    raw = requests.get(f"{emulator}/redfish/v1/Systems/{SYSTEM_A}", auth=(USER, PASSWORD), timeout=10).json()
    assert "Bios" not in raw
    answer = requests.get(f"{emulator}/redfish/v1/Systems/{SYSTEM_A}/BIOS", auth=(USER, PASSWORD), timeout=10)
    assert answer.status_code == 501, answer.text
