"""The simulator over real protocols: sushy as the Redfish client, a real HTTP
server in the test serving iPXE scripts, real disk files made with sgdisk and
genisoimage, and both a stand-in and the real deploy agent."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pycdlib
import pytest
import sushy
from aiohttp import web

from services.agent import vmedia as agent_vmedia
from services.agent.agent import Disk, options_from_kernel_cmdline
from services.common.aiohttp_serving import start_http_site
from services.common.errors import InvalidParameterValue
from services.conductor.drivers.redfish_client import close_root
from services.simulator import Simulator, SimulatorOptions
from services.simulator.agents import AgentLaunch

USER, PASSWORD = "root", "calvin-pw"
TOKEN = "pregenerated-token-0123456789-abcdefghijkl"

pytestmark = pytest.mark.timeout(180)


async def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class BootServer:
    """The renderer's part: boot.ipxe chains to a per-MAC script; /v1/lookup answers 404."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[str] = []
        self.lookups: list[str] = []
        self.scripts: dict[str, str] = {}  # mac (hyphenated) -> script; missing -> 404
        self.blobs: dict[str, bytes] = {}  # /images/<name> contents (default: 4 KiB of zeros)
        self.runner: web.AppRunner | None = None

    def deploy_script(self) -> str:
        return (
            "#!ipxe\nimgfree\n"
            f"kernel {self.url}/images/deploy_kernel nofb selinux=0 ipa-api-url={self.url} "
            f"ipa-agent-token={TOKEN} BOOTIF=${{mac}} initrd=deploy_ramdisk || goto retry\n"
            f"initrd {self.url}/images/deploy_ramdisk || goto retry\nboot\n:retry\nexit 1\n"
        )

    async def start(self) -> None:
        app = web.Application()

        async def boot(request: web.Request) -> web.Response:
            self.requests.append(request.path_qs)
            return web.Response(text="#!ipxe\necho chaining\nchain nodes/${mac:hexhyp}.ipxe || exit 1\nexit 0\n")

        async def node(request: web.Request) -> web.Response:
            self.requests.append(request.path_qs)
            script = self.scripts.get(request.match_info["mac"])
            return web.Response(text=script) if script else web.Response(status=404, text="unknown")

        async def image(request: web.Request) -> web.Response:
            self.requests.append(request.path_qs)
            return web.Response(body=self.blobs.get(request.match_info["name"], b"\0" * 4096))

        async def lookup(request: web.Request) -> web.Response:
            self.lookups.append(request.query.get("addresses", ""))
            return web.json_response({"error_message": "not found"}, status=404)

        app.router.add_get("/boot.ipxe", boot)
        app.router.add_get("/nodes/{mac}.ipxe", node)
        app.router.add_get("/images/{name}", image)
        app.router.add_get("/v1/lookup", lookup)
        self.runner, port = await start_http_site(app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


class StandInAgent:
    """Records what the firmware asked for; the test drives its power hooks."""

    def __init__(self, launch: AgentLaunch) -> None:
        self.launch = launch
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture(scope="module")
async def boot_server() -> AsyncIterator[BootServer]:
    server = BootServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(scope="module")
async def agents() -> list[StandInAgent]:
    return []


@pytest.fixture(scope="module")
async def sim(
    tmp_path_factory: pytest.TempPathFactory, boot_server: BootServer, agents: list[StandInAgent]
) -> AsyncIterator[Simulator]:
    def factory(launch: AgentLaunch) -> StandInAgent:
        agents.append(StandInAgent(launch))
        return agents[-1]

    simulator = Simulator(
        SimulatorOptions(
            machines=4,
            state_dir=str(tmp_path_factory.mktemp("sim")),
            boot_url=boot_server.url + "/boot.ipxe",
            disk_size=64 * 1024**2,
            username=USER,
            password=PASSWORD,
            agent_factory=factory,
            nics_per_machine=2,
            pxe_retries=0,  # these tests check one round of network boot; the retry has its own test
        )
    )
    await simulator.start()
    try:
        yield simulator
    finally:
        await simulator.stop()


async def redfish(sim: Simulator, fn: Callable[[sushy.Sushy], Any], password: str = PASSWORD) -> Any:
    """Run ``fn(root)`` with a fresh sushy client in a thread, closing it there.

    Left to the garbage collector, sushy's ``__del__`` logs out with a blocking
    request that may run on the event loop thread, which serves the simulator:
    a deadlock. So clients are always closed explicitly.
    """

    def run() -> Any:
        root = sushy.Sushy(sim.redfish_url, username=USER, password=password)
        try:
            return fn(root)
        finally:
            close_root(root)

    return await asyncio.to_thread(run)


async def on_system(sim: Simulator, index: int, fn: Callable[[Any], Any]) -> Any:
    return await redfish(sim, lambda root: fn(root.get_system(sim.machines[index].system_path)))


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def power_off(sim: Simulator, index: int) -> None:
    await sim.machines[index].power_off(reason="test")


# ---- Redfish as sushy sees it ---------------------------------------------------------


async def test_sushy_sees_every_system(sim: Simulator) -> None:
    def read(root: sushy.Sushy) -> list[tuple[str, str, list[str], str]]:
        found = []
        for member in root.get_system_collection().get_members():
            macs = [nic.mac_address for nic in member.ethernet_interfaces.get_members()]
            found.append((member.uuid, member.name, macs, member.power_state.value))
        return found

    found = await redfish(sim, read)
    assert found == [(m.uuid, m.name, list(m.macs), "Off") for m in sim.machines]
    assert sim.machines[0].macs == ("52:54:00:00:00:00", "52:54:00:00:00:01")
    assert sim.machines[3].macs[0] == "52:54:00:00:00:0c"
    assert len({m.uuid for m in sim.machines}) == 4
    inventory = json.loads((Path(sim.options.state_dir) / "machines.json").read_text())
    assert inventory["machines"][2]["driver_info"]["redfish_system_id"] == sim.machines[2].system_path
    assert all(os.path.getsize(m.disk_path) == 64 * 1024**2 for m in sim.machines)
    # Sparse: the files exist but use (almost) no blocks.
    assert os.stat(sim.machines[0].disk_path).st_blocks * 512 < 1024 * 1024


async def test_status_endpoint(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(sim.redfish_url + "/simulator/machines") as resp:
            body = await resp.json()
        async with session.get(f"{sim.redfish_url}/simulator/machines/{sim.machines[1].name}") as resp:
            one = await resp.json()
        async with session.get(sim.redfish_url + "/simulator/machines/nope") as resp:
            assert resp.status == 404
    assert [m["uuid"] for m in body["machines"]] == [m.uuid for m in sim.machines]
    assert one["uuid"] == sim.machines[1].uuid and "boot_log" in one and one["disk_path"].endswith(".img")


async def test_auth_and_sessions(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as session:
        systems = sim.redfish_url + "/redfish/v1/Systems"
        async with session.get(sim.redfish_url + "/redfish/v1/") as resp:
            assert resp.status == 200  # the service root is public
        async with session.get(systems) as resp:
            assert resp.status == 401 and "Basic" in resp.headers["WWW-Authenticate"]
        async with session.get(systems, headers=basic(USER, "nope")) as resp:
            assert resp.status == 401
        async with session.get(systems, headers=basic(USER, PASSWORD)) as resp:
            assert resp.status == 200
        sessions = sim.redfish_url + "/redfish/v1/SessionService/Sessions"
        async with session.post(sessions, json={"UserName": USER, "Password": "nope"}) as resp:
            assert resp.status == 401
        async with session.post(sessions, json={"UserName": USER, "Password": PASSWORD}) as resp:
            assert resp.status == 201
            token, location = resp.headers["X-Auth-Token"], resp.headers["Location"]
        async with session.get(systems, headers={"X-Auth-Token": token}) as resp:
            assert resp.status == 200
        async with session.delete(sim.redfish_url + location, headers={"X-Auth-Token": token}) as resp:
            assert resp.status == 204
        async with session.get(systems, headers={"X-Auth-Token": token}) as resp:
            assert resp.status == 401
    with pytest.raises(sushy.exceptions.AccessError):
        await redfish(sim, lambda root: root.get_system_collection(), password="wrong")


async def test_bad_requests_change_nothing(sim: Simulator) -> None:
    machine = sim.machines[3]
    url = sim.redfish_url + machine.system_path
    async with aiohttp.ClientSession(headers=basic(USER, PASSWORD)) as session:
        for body in (
            {"Boot": {"BootSourceOverrideTarget": "Tape"}},
            {"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Sometimes"}},
            {"Boot": {"BootSourceOverrideTarget": "Pxe", "Colour": "red"}},
            {"AssetTag": "x"},
            {"Boot": "Pxe"},
        ):
            async with session.patch(url, json=body) as resp:
                assert resp.status == 400, body
                assert "error" in await resp.json()
        async with session.patch(url, data="{not json", headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
        async with session.post(url + "/Actions/ComputerSystem.Reset", json={"ResetType": "Explode"}) as resp:
            assert resp.status == 400
        async with session.get(sim.redfish_url + "/redfish/v1/Systems/no-such-system") as resp:
            assert resp.status == 404
        async with session.delete(url) as resp:
            assert resp.status == 405
    assert (machine.boot_target, machine.boot_enabled, machine.power_state) == ("None", "Disabled", "Off")


async def test_boot_override_once_and_continuous(sim: Simulator) -> None:
    async def set_and_read(target: Any, enabled: Any) -> tuple[str, str]:
        def work(s: Any) -> tuple[str, str]:
            s.set_system_boot_options(target=target, enabled=enabled)
            s.refresh()
            return s.boot.target.value, s.boot.enabled.value

        return await on_system(sim, 3, work)

    assert await set_and_read(sushy.BootSource.BIOS_SETUP, sushy.BootSourceOverrideEnabled.ONCE) == (
        "BiosSetup",
        "Once",
    )
    await on_system(sim, 3, lambda s: s.reset_system(sushy.ResetType.ON))
    machine = sim.machines[3]
    await wait_for(lambda: machine.status == "bios_setup", what="BIOS setup")
    # A Once override is used up by the boot that used it.
    assert (machine.boot_target, machine.boot_enabled) == ("None", "Disabled")
    assert await set_and_read(sushy.BootSource.BIOS_SETUP, sushy.BootSourceOverrideEnabled.CONTINUOUS) == (
        "BiosSetup",
        "Continuous",
    )
    await on_system(sim, 3, lambda s: s.reset_system(sushy.ResetType.FORCE_RESTART))
    await wait_for(lambda: machine.boot_count == 2 and machine.status == "bios_setup", what="second boot")
    assert (machine.boot_target, machine.boot_enabled) == ("BiosSetup", "Continuous")
    await on_system(sim, 3, lambda s: s.reset_system(sushy.ResetType.FORCE_OFF))
    assert machine.power_state == "Off" and machine.status == "off"
    await set_and_read(sushy.BootSource.NONE, sushy.BootSourceOverrideEnabled.DISABLED)


async def test_virtual_media_insert_and_eject(sim: Simulator, boot_server: BootServer) -> None:
    image = boot_server.url + "/images/boot.iso"

    async def insert(url: str) -> None:
        def work(s: Any) -> None:
            cd = next(v for v in s.managers[0].virtual_media.get_members() if v.identity == "Cd")
            cd.insert_media(url)

        await on_system(sim, 1, work)

    await insert(image)
    slot = sim.machines[1].virtual_media["Cd"]
    assert (slot.image, slot.inserted) == (image, True)
    assert "/images/boot.iso" in boot_server.requests  # it checked the URL answers
    with pytest.raises(sushy.exceptions.HTTPError):  # a second insert must eject first
        await insert(image)

    def read_and_eject(s: Any) -> tuple[str, bool]:
        cd = s.managers[0].virtual_media.get_member(f"/redfish/v1/Managers/{sim.machines[1].name}/VirtualMedia/Cd")
        seen = (cd.image, cd.inserted)
        cd.eject_media()
        return seen

    assert await on_system(sim, 1, read_and_eject) == (image, True)
    assert (slot.image, slot.inserted) == (None, False)
    with pytest.raises(sushy.exceptions.BadRequestError):
        await insert(boot_server.url + "/missing.iso")
    assert slot.image is None


# ---- network boot ----------------------------------------------------------------------


async def test_pxe_boot_follows_the_chain_and_starts_an_agent(
    sim: Simulator, boot_server: BootServer, agents: list[StandInAgent]
) -> None:
    machine = sim.machines[0]
    hyphen = machine.macs[0].replace(":", "-")
    boot_server.scripts[hyphen] = boot_server.deploy_script()
    before = len(agents)

    def pxe_once_and_power_on(s: Any) -> None:
        s.set_system_boot_options(target=sushy.BootSource.PXE, enabled=sushy.BootSourceOverrideEnabled.ONCE)
        s.reset_system(sushy.ResetType.ON)

    await on_system(sim, 0, pxe_once_and_power_on)
    await wait_for(lambda: machine.status == "ramdisk", what="the deploy ramdisk")
    assert len(agents) == before + 1
    agent = agents[-1]
    assert agent.started and machine.agent is agent
    launch = agent.launch
    assert launch.api_url == boot_server.url
    assert launch.macs == machine.macs  # BOOTIF's MAC first
    assert launch.disk_path == machine.disk_path and launch.disk_serial == machine.disk_serial
    assert launch.kernel_args["ipa-agent-token"] == TOKEN
    assert launch.kernel_args["BOOTIF"] == machine.macs[0]  # ${mac} expanded by the interpreter
    assert f"/nodes/{hyphen}.ipxe" in boot_server.requests
    events = [e["event"] for e in machine.boot_log if e["boot"] == machine.boot_count]
    assert events[:6] == ["power_on", "firmware_start", "pxe_fetch", "chain", "pxe_fetch", "kernel"]
    assert events[-1] == "agent_started"
    kernel = machine.events("kernel")[-1]
    assert kernel["kernel"] == boot_server.url + "/images/deploy_kernel"
    assert kernel["initrds"] == [boot_server.url + "/images/deploy_ramdisk"]

    # The agent's reboot hook restarts the machine: the old agent stops, the firmware runs again.
    first_boot = machine.boot_count
    await launch.reboot()
    await wait_for(lambda: machine.boot_count == first_boot + 1 and machine.status == "ramdisk", what="reboot")
    assert agent.stopped and agents[-1] is not agent and machine.agent is agents[-1]
    # The Once override was used by the first boot; the boot order (Pxe first) applies now.
    assert machine.events("firmware_start")[-1]["sequence"] == "Pxe,Hdd"

    # A hook from the previous boot is ignored; the current agent's power_off powers the machine off.
    await launch.power_off()
    await asyncio.sleep(0.3)
    assert machine.power_state == "On"
    await agents[-1].launch.power_off()
    await wait_for(lambda: machine.power_state == "Off", what="power off by the agent")
    assert agents[-1].stopped and machine.agent is None and machine.status == "off"
    del boot_server.scripts[hyphen]


async def test_error_and_unknown_scripts_fall_through_to_the_disk(sim: Simulator, boot_server: BootServer) -> None:
    machine = sim.machines[2]
    hyphen = [mac.replace(":", "-") for mac in machine.macs]
    boot_server.scripts[hyphen[0]] = "#!ipxe\necho Ferrum: node is not in a deployable state\nexit 1\n"
    await machine.power_on(reason="test")
    await wait_for(lambda: machine.status == "no_bootable_device", what="fall through")
    events = [e for e in machine.boot_log if e["boot"] == machine.boot_count]
    errors = [e for e in events if e["event"] == "pxe_error"]
    # NIC 0 got an error script, then the firmware tried NIC 1 (no script: 404), then the empty disk.
    assert [e["nic"] for e in errors] == [0, 1]
    assert "not in a deployable state" in errors[0]["message"] and "HTTP 404" in errors[1]["error"]
    assert f"/nodes/{hyphen[1]}.ipxe" in boot_server.requests
    assert [e["event"] for e in events][-2:] == ["disk_not_bootable", "no_bootable_device"]

    # An `exit 0` returns to the firmware on purpose: no other NIC is tried, the disk is next.
    boot_server.scripts[hyphen[0]] = "#!ipxe\necho Ferrum: booting the local disk\nexit 0\n"
    await machine.reset(reason="test")
    await wait_for(lambda: machine.boot_count == 2 and machine.status == "no_bootable_device", what="exit 0")
    kinds = [e["event"] for e in machine.boot_log if e["boot"] == 2]
    assert "pxe_exit" in kinds and "pxe_error" not in kinds and kinds.count("pxe_fetch") == 2
    del boot_server.scripts[hyphen[0]]
    await power_off(sim, 2)


async def test_pxe_from_the_second_nic(sim: Simulator, boot_server: BootServer, agents: list[StandInAgent]) -> None:
    """The node's port may be the machine's second NIC: firmware gets there after the first fails."""
    machine = sim.machines[2]
    second = machine.macs[1].replace(":", "-")
    boot_server.scripts[second] = boot_server.deploy_script()
    await machine.power_on(reason="test")
    await wait_for(lambda: machine.status == "ramdisk", what="the ramdisk via NIC 1")
    launch = agents[-1].launch
    assert launch.kernel_args["BOOTIF"] == machine.macs[1]
    assert launch.macs == (machine.macs[1], machine.macs[0])  # the booting NIC first
    del boot_server.scripts[second]
    await power_off(sim, 2)


async def test_a_round_where_every_nic_failed_is_retried(tmp_path: Path, boot_server: BootServer) -> None:
    """As boot.ipxe retries a failed lookup: a machine powered on while the
    renderer answers errors (a database restart) boots once it answers again."""
    simulator = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp_path),
            disk_size=8 * 1024**2,
            boot_url=boot_server.url + "/boot.ipxe",
            first_index=520,
            pxe_retries=2,
            pxe_retry_delay=0.2,
        )
    )
    await simulator.start()
    try:
        machine = simulator.machines[0]
        hyphen = machine.macs[0].replace(":", "-")
        boot_server.scripts[hyphen] = "#!ipxe\necho Ferrum: boot data is unavailable right now\nexit 1\n"
        await machine.power_on(reason="test")
        await wait_for(lambda: machine.events("pxe_retry"), what="a retry")
        boot_server.scripts[hyphen] = "#!ipxe\necho Ferrum: booting the local disk\nexit 0\n"
        await wait_for(lambda: machine.status == "no_bootable_device", what="the retried boot")
        kinds = [e["event"] for e in machine.boot_log if e["boot"] == machine.boot_count]
        assert kinds.index("pxe_error") < kinds.index("pxe_retry") < kinds.index("pxe_exit"), kinds
        assert machine.boot_count == 1  # one power-on, retried inside its firmware

        # Every round failing: the retries run out and the firmware goes on to the disk.
        boot_server.scripts[hyphen] = "#!ipxe\necho Ferrum: no node here\nexit 1\n"
        await machine.reset(reason="test")
        await wait_for(lambda: machine.boot_count == 2 and machine.status == "no_bootable_device", what="give up")
        kinds = [e["event"] for e in machine.boot_log if e["boot"] == 2]
        assert kinds.count("pxe_retry") == 2 and kinds.count("pxe_error") == 3, kinds
        del boot_server.scripts[hyphen]
    finally:
        await simulator.stop()


async def test_pxe_boot_starts_the_real_agent(tmp_path: Path, boot_server: BootServer) -> None:
    """The default factory runs services.agent: it looks itself up with the machine's MAC."""
    simulator = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp_path),
            disk_size=8 * 1024**2,
            boot_url=boot_server.url + "/boot.ipxe",
            first_index=500,
        )
    )
    await simulator.start()
    try:
        machine = simulator.machines[0]
        hyphen = machine.macs[0].replace(":", "-")
        boot_server.scripts[hyphen] = boot_server.deploy_script()
        await machine.power_on(reason="test")
        await wait_for(lambda: machine.status in ("ramdisk", "ramdisk_failed"), what="agent start")
        assert machine.status == "ramdisk", list(machine.boot_log)
        await wait_for(lambda: any(machine.macs[0] in a for a in boot_server.lookups), what="a lookup")
        callback = machine.events("agent_started")[-1]["callback_url"]
        async with aiohttp.ClientSession() as session, session.get(callback + "/v1/status") as resp:
            assert resp.status == 200
        await machine.power_off(reason="test")
        assert machine.agent is None
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                async with session.get(callback + "/v1/status"):
                    pass
        del boot_server.scripts[hyphen]
    finally:
        await simulator.stop()


def deploy_iso(config: str) -> bytes:
    """A bootable-looking deploy ISO: isolinux.cfg carries the kernel line (Rock Ridge names)."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, rock_ridge="1.09", joliet=3, vol_ident="VMEDIA_BOOT_ISO")
    iso.add_directory("/ISOLINUX", rr_name="isolinux", joliet_path="/isolinux")
    data = config.encode()
    iso.add_fp(
        io.BytesIO(data),
        len(data),
        "/ISOLINUX/ISOLINUX.CFG;1",
        rr_name="isolinux.cfg",
        joliet_path="/isolinux/isolinux.cfg",
    )
    iso.add_fp(io.BytesIO(b"kernel"), 6, "/VMLINUZ.;1", rr_name="vmlinuz", joliet_path="/vmlinuz")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def parameters_floppy(work: Path, text: str) -> bytes:
    """The 1440 KiB vfat 'ir-vfd-dev' image with parameters.txt, made with mtools."""
    image, params = work / "floppy.img", work / "parameters.txt"
    params.write_text(text)
    env = {**os.environ, "MTOOLS_SKIP_CHECK": "1"}
    subprocess.run(
        ["mformat", "-C", "-f", "1440", "-v", "ir-vfd-dev", "-i", str(image), "::"],
        check=True,
        capture_output=True,
        env=env,
    )
    subprocess.run(
        ["mcopy", "-i", str(image), str(params), "::parameters.txt"], check=True, capture_output=True, env=env
    )
    return image.read_bytes()


async def test_virtual_media_boot_starts_the_agent(
    sim: Simulator, boot_server: BootServer, agents: list[StandInAgent], tmp_path: Path
) -> None:
    machine = sim.machines[2]
    await machine.power_off(reason="test")
    boot_server.blobs["deploy.iso"] = deploy_iso(
        "default deploy\nlabel deploy\n  kernel /vmlinuz\n"
        f"  append initrd=/initrd.img nofb ipa-api-url={boot_server.url} boot_method=vmedia "
        f"ipa-agent-token=iso-token-that-the-floppy-overrides BOOTIF={machine.macs[1]}\n"
    )
    boot_server.blobs["params.img"] = await asyncio.to_thread(
        parameters_floppy, tmp_path, f"ipa-agent-token={TOKEN}\nipa-global-request-id=req-123\n"
    )

    def insert_and_boot(s: Any) -> None:
        media = {v.identity: v for v in s.managers[0].virtual_media.get_members()}
        media["Cd"].insert_media(boot_server.url + "/images/deploy.iso")
        media["Floppy"].insert_media(boot_server.url + "/images/params.img")
        s.set_system_boot_options(target=sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE)
        s.reset_system(sushy.ResetType.ON)

    await on_system(sim, 2, insert_and_boot)
    await wait_for(lambda: machine.status in ("ramdisk", "ramdisk_failed", "no_bootable_device"), what="CD boot")
    assert machine.status == "ramdisk", list(machine.boot_log)
    launch = agents[-1].launch
    assert launch.api_url == boot_server.url
    assert launch.kernel_args["boot_method"] == "vmedia" and "initrd" not in launch.kernel_args
    assert launch.macs[0] == machine.macs[1]  # BOOTIF names the second NIC
    # The firmware hands the agent the inserted floppy, as a machine's kernel sees the device;
    # the agent finds it by its label (mformat wrote it upper case) and its values win.
    assert launch.removable_media == (boot_server.blobs["params.img"],)
    floppy = await asyncio.to_thread(agent_vmedia.image_parameters, launch.removable_media)
    options = options_from_kernel_cmdline(launch.kernel_cmdline, floppy_parameters=floppy, disks=(Disk("/dev/null"),))
    assert (options.agent_token, options.global_request_id) == (TOKEN, "req-123")
    cd_boot = machine.events("cd_boot")[-1]
    assert cd_boot["config"] == "isolinux/isolinux.cfg"
    assert machine.events("removable_media")[-1]["size"] == 1440 * 1024
    assert not any((Path(sim.options.state_dir) / "media").iterdir())  # scratch copies are deleted
    await power_off(sim, 2)

    # Media that is no ISO is not bootable: the firmware moves on (Pxe has no script: 404, then the disk).
    def swap_cd(s: Any) -> None:
        media = {v.identity: v for v in s.managers[0].virtual_media.get_members()}
        media["Cd"].eject_media()
        media["Cd"].insert_media(boot_server.url + "/images/garbage.iso")
        s.set_system_boot_options(target=sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE)
        s.reset_system(sushy.ResetType.ON)

    await on_system(sim, 2, swap_cd)
    await wait_for(lambda: machine.status == "no_bootable_device", what="fall through")
    assert machine.events("cd_not_bootable")[-1]["image"].endswith("/garbage.iso")
    await power_off(sim, 2)


# ---- booting the OS from the disk ------------------------------------------------------


def write_config_drive_disk(disk: Path, work: Path) -> None:
    """GPT: an ext4 root and a config-2 ISO partition, as a deploy leaves them."""
    content = work / "cd" / "openstack" / "latest"
    content.mkdir(parents=True)
    (content / "meta_data.json").write_text(
        json.dumps(
            {
                "uuid": "6a4b8f3e-3a59-4c47-9d3b-1f2e3d4c5b6a",
                "hostname": "web-1.example",
                "public_keys": {"mykey": "ssh-ed25519 AAAAC3Nza test@example"},
            }
        )
    )
    (content / "network_data.json").write_text(
        json.dumps({"links": [{"id": "eth0", "type": "phy"}], "networks": [], "services": []})
    )
    (content / "user_data").write_text("#cloud-config\nhostname: web-1\n")
    iso = work / "cd.iso"
    subprocess.run(
        [
            "genisoimage",
            "-quiet",
            "-o",
            str(iso),
            "-ldots",
            "-allow-lowercase",
            "-allow-multidot",
            "-l",
            "-J",
            "-r",
            "-V",
            "config-2",
            str(work / "cd"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["sgdisk", "-n1:2048:+16M", "-t1:8300", "-c1:root", "-n2:0:+2M", "-t2:8300", "-c2:config-2", str(disk)],
        check=True,
        capture_output=True,
    )
    root = work / "root.img"
    with open(root, "wb") as fp:
        fp.truncate(16 * 1024**2)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "cloudimg-rootfs", str(root)], check=True, capture_output=True)
    table = json.loads(
        subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True, text=True).stdout
    )["partitiontable"]["partitions"]
    with open(disk, "r+b") as out:
        out.seek(table[0]["start"] * 512)
        out.write(root.read_bytes())
        out.seek(table[1]["start"] * 512)
        out.write(iso.read_bytes())


async def test_disk_boot_reads_the_partition_table_and_config_drive(sim: Simulator, tmp_path: Path) -> None:
    machine = sim.machines[1]
    await asyncio.to_thread(write_config_drive_disk, Path(machine.disk_path), tmp_path)

    def hdd_once_and_power_on(s: Any) -> None:
        s.set_system_boot_options(target=sushy.BootSource.HDD, enabled=sushy.BootSourceOverrideEnabled.ONCE)
        s.reset_system(sushy.ResetType.ON)

    await on_system(sim, 1, hdd_once_and_power_on)
    await wait_for(lambda: machine.status == "os", what="the OS to boot")
    report = machine.os_report
    assert report is not None and report["table"] == "gpt"
    parts = report["partitions"]
    assert [(p["number"], p["name"], p["filesystem"], p["label"]) for p in parts] == [
        (1, "root", "ext", "cloudimg-rootfs"),
        (2, "config-2", "iso9660", "config-2"),
    ]
    assert parts[0]["start"] == 2048 * 512 and parts[0]["size"] == 16 * 1024**2
    drive = report["config_drive"]
    assert drive["uuid"] == "6a4b8f3e-3a59-4c47-9d3b-1f2e3d4c5b6a"
    assert drive["hostname"] == "web-1.example"
    assert drive["public_keys"] == ["ssh-ed25519 AAAAC3Nza test@example"]
    assert drive["network_data"]["links"][0]["id"] == "eth0"
    assert drive["user_data"] == "#cloud-config\nhostname: web-1\n"
    assert machine.events("os_booted")[-1]["hostname"] == "web-1.example"
    # The firmware never touched the network for an Hdd boot.
    assert machine.events("pxe_fetch") == [] or machine.events("pxe_fetch")[-1]["boot"] != machine.boot_count
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{sim.redfish_url}/simulator/machines/{machine.uuid}") as resp,
    ):
        assert (await resp.json())["os_report"]["config_drive"]["hostname"] == "web-1.example"
    await power_off(sim, 1)


# ---- scale -----------------------------------------------------------------------------


async def test_a_thousand_machines_answer_the_systems_collection(tmp_path: Path) -> None:
    started = time.monotonic()
    simulator = Simulator(SimulatorOptions(machines=1000, state_dir=str(tmp_path), disk_size="1GiB"))
    await simulator.start()
    try:
        elapsed = time.monotonic() - started

        def read(root: sushy.Sushy) -> tuple[int, str, str]:
            members = root.get_system_collection().members_identities
            last = root.get_system(simulator.machines[-1].system_path)
            return len(members), last.uuid, last.power_state.value

        count, last_uuid, power = await redfish(simulator, read)
        assert (count, last_uuid, power) == (1000, simulator.machines[-1].uuid, "Off")
        assert len({m.macs[0] for m in simulator.machines}) == 1000
        assert len(os.listdir(tmp_path / "disks")) == 1000
        print(f"1000 machines started in {elapsed:.2f} s")
    finally:
        await simulator.stop()


async def test_not_found_bodies_are_redfish_errors(sim: Simulator) -> None:
    async with aiohttp.ClientSession(headers=basic(USER, PASSWORD)) as session:
        for path in (
            '/redfish/v1/Systems/"quoted"',
            f"/redfish/v1/Managers/{sim.machines[0].name}/VirtualMedia/Tape",
            "/redfish/v1/Nothing",
        ):
            async with session.get(sim.redfish_url + path) as resp:
                assert resp.status == 404, path
                assert (await resp.json())["error"]["code"] == "Base.1.0.ResourceMissingAtURI"


async def test_public_url_is_what_conductors_are_told(tmp_path: Path) -> None:
    """In compose, conductors reach the simulator by service name, not by its listen address."""
    with pytest.raises(InvalidParameterValue):
        SimulatorOptions(machines=1, state_dir=str(tmp_path), public_url="http://simulator:8000/redfish").validate()
    simulator = Simulator(
        SimulatorOptions(
            machines=2, state_dir=str(tmp_path), disk_size=1024**2, public_url="http://simulator:8000/", port=0
        )
    )
    await simulator.start()
    try:
        inventory = json.loads((tmp_path / "machines.json").read_text())
        assert inventory["redfish_url"] == "http://simulator:8000"
        assert {m["driver_info"]["redfish_address"] for m in inventory["machines"]} == {"http://simulator:8000"}
        async with aiohttp.ClientSession() as session, session.get(simulator.redfish_url + "/redfish/v1/Systems") as r:
            assert r.status == 200  # still served where it listens
            assert len((await r.json())["Members"]) == 2
    finally:
        await simulator.stop()
