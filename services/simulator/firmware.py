"""What a simulated machine's firmware does after power on.

It walks the boot sequence (the BMC's override first, then the boot order):

* **Pxe** (each NIC in turn): like iPXE handed a bootfile by DHCP, it GETs the boot URL and
  interprets each script with ``services.ipxe.interpret.interpret_script``
  (the machine's MACs and UUID as iPXE variables), following ``chain``
  (bounded hops). A ``kernel`` boot starts a deploy agent on the machine's disk
  from the kernel arguments (``ipa-api-url``, ``BOOTIF``, ``ipa-agent-token``);
  ``local_disk`` boots the disk; ``error``/``exit`` fall through to the next
  device, as firmware does.
* **Hdd**: "boots the OS": reads the disk's partition table and config drive
  and records them as ``os_report``. An empty disk is not bootable.
* **Cd**: downloads the inserted virtual CD and reads its boot loader's kernel
  line (isolinux/GRUB). A deploy ramdisk's line starts the agent, handing it the
  inserted floppy, from which it reads its own parameters (as a virtual-media
  deploy does); any other line is an OS running from RAM (a ramdisk deploy),
  which reads its config drive from the attached media.
* **BiosSetup**: stops in setup.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import aiohttp

from services.agent.cmdline import split as split_cmdline
from services.simulator import disk as disk_reader
from services.simulator import vmedia
from services.simulator.agents import AgentLaunch, real_agent

if TYPE_CHECKING:
    from services.simulator.machine import Machine

LOG = logging.getLogger(__name__)
MAX_SCRIPT_BYTES = 1024 * 1024
MAX_REMOVABLE_BYTES = 64 * 1024**2  # a virtual floppy / USB stick: a parameters file or a config drive
BOOTED, FAILED = "booted", "failed"


async def fetch_text(session: aiohttp.ClientSession, url: str, timeout: float) -> str:
    """GET a script; anything but a 2xx with a bounded body is an error, as for iPXE."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
        if response.status >= 300:
            raise RuntimeError(f"HTTP {response.status}")
        body = await response.content.read(MAX_SCRIPT_BYTES + 1)
        if len(body) > MAX_SCRIPT_BYTES:
            raise RuntimeError("script larger than 1 MiB")
        return body.decode("utf-8", "replace")


async def url_exists(session: aiohttp.ClientSession, url: str, timeout: float) -> str | None:
    """None when ``url`` answers 2xx to a GET of its first byte, else the reason. One byte, so
    checking a 1 GiB ISO costs nothing and the server sees a finished response, not a reset."""
    try:
        async with session.get(
            url, headers={"Range": "bytes=0-0"}, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            await response.read()
            return None if response.status < 300 else f"HTTP {response.status}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return str(exc) or type(exc).__name__


def _bootif_mac(value: str) -> str:
    text = value.strip().lower()
    if text.startswith("01-") and len(text) == 20:
        text = text[3:]
    return text.replace("-", ":")


async def run_firmware(machine: Machine) -> None:
    """The whole boot of one power-on; never raises (a crash is recorded)."""
    try:
        sequence = machine.boot_sequence()
        machine.record("firmware_start", sequence=",".join(sequence))
        for device in sequence:
            handler = DEVICES.get(device)
            if handler is None:
                machine.record("boot_device_skipped", device=device, reason="no such device")
                continue
            if await handler(machine) == BOOTED:
                return
        machine.status = "no_bootable_device"
        machine.record("no_bootable_device")
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        LOG.exception("simulator firmware crashed machine=%s", machine.name)
        machine.status = "firmware_error"
        machine.record("firmware_error", error=str(exc) or type(exc).__name__)


async def boot_pxe(machine: Machine) -> str:
    """Network boot from each NIC in turn, as firmware lists one PXE entry per NIC.

    A NIC whose scripts fail (no answer, 404, an ``error`` action) hands over
    to the next NIC; an ``exit`` (the script returning to the firmware on
    purpose, e.g. to boot the disk) ends network boot for this power-on. A
    round in which every NIC failed is retried ``pxe_retries`` times, as
    Ferrum's first-stage boot.ipxe retries a lookup that found nothing.
    """
    sim = machine.simulator
    if not sim.options.boot_url:
        machine.record("pxe_error", error="no boot URL configured (no DHCP bootfile)")
        return FAILED
    for attempt in range(sim.options.pxe_retries + 1):
        if attempt:
            delay = attempt * sim.options.pxe_retry_delay
            machine.record("pxe_retry", attempt=attempt, of=sim.options.pxe_retries, delay=delay)
            await asyncio.sleep(delay)
        for nic in range(len(machine.macs)):
            result, final = await _boot_pxe_nic(machine, nic)
            if result == BOOTED or final:
                return result
    return FAILED


async def _boot_pxe_nic(machine: Machine, nic: int) -> tuple[str, bool]:
    """(result, whether to stop trying other NICs)."""
    from services.ipxe.interpret import interpret_script

    sim = machine.simulator
    url = sim.options.boot_url
    variables = machine.ipxe_variables(nic)
    for _hop in range(sim.options.max_chain_hops + 1):
        try:
            script = await fetch_text(sim.session, url, sim.options.http_timeout)
        except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as exc:
            machine.record("pxe_error", nic=nic, url=url, error=str(exc) or type(exc).__name__)
            return FAILED, False
        machine.record("pxe_fetch", nic=nic, url=url, size=len(script))
        action = interpret_script(script, variables)
        kind = action.kind
        if kind == "chain":
            url = urljoin(url, action.chain_url)
            machine.record("chain", nic=nic, url=url)
            continue
        if kind == "kernel":
            return await boot_kernel(machine, action, url), True
        if kind == "local_disk":
            machine.record("local_disk", message=action.message or "")
            return await boot_disk(machine), True
        if kind == "sanboot":
            machine.status = "san_boot"
            machine.os_report = {"san_target": action.san_target}
            machine.record("sanboot", target=action.san_target or "")
            return BOOTED, True
        if kind == "exit":
            machine.record("pxe_exit", nic=nic, message=action.message or "")
            return FAILED, True
        machine.record("pxe_error", nic=nic, kind=kind, message=action.message or "")
        return FAILED, False
    machine.record("pxe_error", nic=nic, error=f"more than {sim.options.max_chain_hops} chained scripts")
    return FAILED, False


async def boot_kernel(machine: Machine, action: Any, script_url: str) -> str:
    """The deploy kernel "boots": its command line configures an agent for the disk."""
    raw_args = action.kernel_args
    cmdline = raw_args if isinstance(raw_args, str) else " ".join(raw_args or ())
    kernel_url = urljoin(script_url, action.kernel_url) if action.kernel_url else ""
    initrds = [urljoin(script_url, u) for u in (action.initrd_urls or ())]
    machine.record("kernel", kernel=kernel_url, initrds=initrds, cmdline=cmdline)
    root = split_cmdline(cmdline).get("root", "")
    if root.startswith("UUID=") and not split_cmdline(cmdline).get("ipa-api-url"):
        return await boot_root_filesystem(machine, cmdline, root[len("UUID=") :])
    return await start_ramdisk(machine, cmdline)


async def boot_root_filesystem(machine: Machine, cmdline: str, fs_uuid: str) -> str:
    """An instance kernel netbooted with ``root=UUID=`` (a partition image):
    it mounts the disk's partition holding that file system, and the OS reads
    its config drive as on a local boot. No such file system: the kernel
    panics, as a real one would (VFS: unable to mount root fs)."""
    report = await asyncio.to_thread(disk_reader.inspect_disk, machine.disk_path)
    root = next((p for p in report["partitions"] if p.get("fs_uuid", "").lower() == fs_uuid.lower()), None)
    if root is None:
        machine.status = "kernel_panic"
        machine.record("root_not_found", root=fs_uuid)
        return FAILED
    machine.os_report = {**report, "netboot": True, "cmdline": cmdline, "root": root}
    machine.status = "os"
    drive = report.get("config_drive") or {}
    machine.record(
        "os_booted",
        table=report["table"],
        partitions=len(report["partitions"]),
        config_drive=bool(drive),
        hostname=drive.get("hostname") or "",
        root=fs_uuid,
    )
    return BOOTED


async def start_ramdisk(machine: Machine, cmdline: str, *, removable_media: tuple[bytes, ...] = ()) -> str:
    """Start the deploy agent the kernel command line describes (ipa-api-url, BOOTIF, ...).

    After a virtual-media boot (``boot_method=vmedia``) the agent also gets the
    inserted removable media and reads its own parameters from the floppy there,
    so the api URL may be on neither the command line nor known here."""
    sim = machine.simulator
    args = split_cmdline(cmdline)
    api_url = (args.get("ipa-api-url") or "").split(",")[0].strip()
    vmedia_boot = args.get("boot_method", "").lower() == "vmedia" and bool(removable_media)
    if not api_url and not vmedia_boot:
        machine.status = "ramdisk_idle"
        machine.record("ramdisk_idle", reason="no ipa-api-url on the kernel command line")
        return BOOTED
    macs = list(machine.macs)
    if args.get("BOOTIF"):
        bootif = _bootif_mac(args["BOOTIF"])
        macs = [bootif] + [m for m in macs if m != bootif]
    power_off, reboot = machine.agent_hooks()
    launch = AgentLaunch(
        machine=machine.name,
        kernel_cmdline=cmdline,
        kernel_args=args,
        api_url=api_url,
        macs=tuple(macs),
        disk_path=machine.disk_path,
        disk_serial=machine.disk_serial,
        listen_host=sim.options.agent_host,
        power_off=power_off,
        reboot=reboot,
        set_rescue_password=machine.set_rescue_password,
        hardware=machine.hardware_facts(),
        session=sim.session,
        removable_media=removable_media,
        hba_lun=(machine.lun_path, machine.lun_wwn) if machine.lun_path else (),
    )
    factory = sim.options.agent_factory or real_agent
    agent = None
    try:
        made = factory(launch)
        agent = await made if inspect.isawaitable(made) else made
        await agent.start()
    except asyncio.CancelledError:
        if agent is not None:  # powered off while the agent was starting: leave no socket behind
            await asyncio.shield(agent.stop())
        raise
    except Exception as exc:  # noqa: BLE001 - a ramdisk that fails to start is the machine's state, not a simulator crash
        machine.status = "ramdisk_failed"
        machine.record("agent_error", error=str(exc) or type(exc).__name__)
        return BOOTED
    machine.agent = agent
    machine.status = "ramdisk"
    machine.record(
        "agent_started",
        api_url=getattr(getattr(agent, "options", None), "api_url", api_url),
        callback_url=getattr(agent, "callback_url", ""),
    )
    return BOOTED


async def boot_disk(machine: Machine) -> str:
    """The firmware's disk boot: the HBA's LUN first when it holds an OS (its
    option ROM comes first in the boot order), else the local disk."""
    disk = "local"
    report = await asyncio.to_thread(disk_reader.inspect_disk, machine.disk_path)
    if machine.lun_path:
        lun = await asyncio.to_thread(disk_reader.inspect_disk, machine.lun_path)
        if lun["partitions"]:
            disk, report = "hba-lun0", lun
    if not report["partitions"]:
        machine.record("disk_not_bootable", reason="no partition table" if report["table"] is None else "no partitions")
        return FAILED
    # cloud-init also looks at whole devices: a config drive handed over on virtual media.
    media = await _removable_config_drive(machine)
    if media is not None:
        report["media_config_drive"] = media
        report["config_drive"] = report.get("config_drive") or media
    machine.os_report = report
    machine.status = "os"
    drive = report.get("config_drive") or {}
    machine.record(
        "os_booted",
        disk=disk,
        table=report["table"],
        partitions=len(report["partitions"]),
        config_drive=bool(drive),
        hostname=drive.get("hostname") or "",
    )
    return BOOTED


async def _download_media(machine: Machine, device: str, dest: Path, *, limit: int) -> bool:
    """Fetch the medium inserted in ``device`` to ``dest``; False (recorded) when it cannot be read."""
    slot = machine.virtual_media.get(device)  # a BMC may lack the device
    if slot is None or not slot.inserted or not slot.image:
        return False
    sim = machine.simulator
    try:
        await vmedia.download(sim.session, slot.image, dest, timeout=sim.options.http_timeout, limit=limit)
    except (TimeoutError, aiohttp.ClientError, RuntimeError, OSError, ValueError) as exc:
        machine.record(f"{device.lower()}_error", image=slot.image, error=str(exc) or type(exc).__name__)
        return False
    return True


async def _scratch(machine: Machine) -> Path:
    scratch = Path(machine.simulator.options.state_dir) / "media"
    await asyncio.to_thread(scratch.mkdir, parents=True, exist_ok=True)
    return scratch


async def _removable_config_drive(machine: Machine) -> dict[str, Any] | None:
    """A config drive on the inserted floppy / USB stick, read as cloud-init reads it."""
    image = await _scratch(machine) / f"{machine.name}-removable.img"
    try:
        if not await _download_media(machine, "Floppy", image, limit=MAX_REMOVABLE_BYTES):
            return None
        return await asyncio.to_thread(disk_reader.read_media_config_drive, [("usb", image)])
    finally:
        await asyncio.to_thread(image.unlink, missing_ok=True)


async def boot_cd(machine: Machine) -> str:
    """Boot the inserted virtual CD.

    Its boot loader's kernel line says what runs. A deploy ramdisk (``ipa-api-url``
    or ``boot_method=vmedia`` on it) starts the agent, which gets the inserted
    floppy / USB stick to read its parameters from. Anything else is an OS in
    RAM (a ramdisk deploy's instance), which reads its config drive from the
    attached media as cloud-init does: the CD itself when it is labelled
    config-2 (a combined ISO), else the removable device."""
    slot = machine.virtual_media.get("Cd")
    if slot is None or not slot.inserted or not slot.image:
        machine.record("cd_empty")
        return FAILED
    scratch = await _scratch(machine)
    iso = scratch / f"{machine.name}-cd.iso"
    removable = scratch / f"{machine.name}-removable.img"
    try:
        try:
            size = await vmedia.download(
                machine.simulator.session, slot.image, iso, timeout=machine.simulator.options.http_timeout
            )
            found = await asyncio.to_thread(vmedia.iso_kernel_cmdline, iso)
        except (TimeoutError, aiohttp.ClientError, RuntimeError, OSError, ValueError) as exc:
            machine.record("cd_error", image=slot.image, error=str(exc) or type(exc).__name__)
            return FAILED
        if found is None:
            machine.record("cd_not_bootable", image=slot.image, size=size)
            return FAILED
        cmdline, config = found
        media: tuple[bytes, ...] = ()
        if await _download_media(machine, "Floppy", removable, limit=MAX_REMOVABLE_BYTES):
            data = await asyncio.to_thread(removable.read_bytes)
            media = (data,)
            machine.record("removable_media", image=machine.virtual_media["Floppy"].image, size=len(data))
        machine.record("cd_boot", image=slot.image, config=config, cmdline=cmdline)
        args = split_cmdline(cmdline)
        if args.get("ipa-api-url") or args.get("boot_method", "").lower() == "vmedia":
            return await start_ramdisk(machine, cmdline, removable_media=media)
        devices = [("cdrom", iso), *([("usb", removable)] if media else [])]
        drive = await asyncio.to_thread(disk_reader.read_media_config_drive, devices)
    finally:
        await asyncio.to_thread(iso.unlink, missing_ok=True)
        await asyncio.to_thread(removable.unlink, missing_ok=True)
    machine.os_report = {"ramdisk": True, "cmdline": cmdline, "config_drive": drive}
    machine.status = "os"
    machine.record(
        "os_booted",
        ramdisk=True,
        config_drive=bool(drive),
        hostname=(drive or {}).get("hostname") or "",
    )
    return BOOTED


async def boot_bios_setup(machine: Machine) -> str:
    machine.status = "bios_setup"
    machine.record("bios_setup")
    return BOOTED


async def boot_nothing(machine: Machine) -> str:
    machine.record("boot_device_empty")
    return FAILED


DEVICES = {
    "Pxe": boot_pxe,
    "Hdd": boot_disk,
    "Cd": boot_cd,
    "BiosSetup": boot_bios_setup,
    "Floppy": boot_nothing,
    "Usb": boot_nothing,
}
