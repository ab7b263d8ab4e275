"""``ferrum agent``: one agent in its own process (the ramdisk's main).

Settings come from flags, or from a kernel command line file
(``--kernel-cmdline /proc/cmdline``, read through
:func:`services.agent.parameters.read_parameters`) with flags winning; a
command line with ``boot_method=vmedia`` adds the virtual floppy's
``parameters.txt`` (``services/agent/vmedia.py``), which wins over it. Disks
are given with ``--disk PATH[,name=/dev/sda,serial=..,wwn=..,model=..,rotational=0]``
or found in sysfs (``--discover-disks``, what the ramdisk's init passes).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from services.agent import vmedia
from services.agent.agent import Agent, Disk, options_from_kernel_cmdline
from services.agent.parameters import read_parameters
from services.common import errors

LOG = logging.getLogger(__name__)


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kernel-cmdline",
        metavar="FILE",
        help="read ipa-api-url, BOOTIF, ipa-node-uuid, ipa-agent-token ... from this file "
        "(e.g. /proc/cmdline); flags below win",
    )
    parser.add_argument("--api-url", help="Ironic-compatible api base URL, e.g. http://127.0.0.1:6385")
    parser.add_argument("--mac", action="append", default=[], help="a NIC MAC used for lookup (repeatable)")
    parser.add_argument(
        "--disk",
        action="append",
        default=[],
        metavar="PATH[,name=..,serial=..,wwn=..,model=..,rotational=0|1]",
        help="a disk (file or block device) the agent may write (repeatable; this or --discover-disks)",
    )
    parser.add_argument(
        "--discover-disks",
        action="store_true",
        help="add every disk listed in /sys/block (what a ramdisk on a real machine does)",
    )
    parser.add_argument(
        "--vmedia-device",
        action="append",
        default=[],
        metavar="PATH",
        help="where to look for the ir-vfd-dev virtual floppy when booted with boot_method=vmedia "
        "(repeatable; default /dev/disk/by-label/ir-vfd-dev, else every block device)",
    )
    parser.add_argument("--node-uuid", help="node UUID hint for lookup")
    parser.add_argument("--agent-token", help="pre-generated agent token (else the lookup's)")
    parser.add_argument("--listen-host", help="command API listen address (default 127.0.0.1)")
    parser.add_argument("--listen-port", type=int, help="command API port (default 9999; 0 = ephemeral)")
    parser.add_argument("--advertise-host", help="host put in the callback_url (default the listen address)")
    parser.add_argument(
        "--advertise-port",
        type=int,
        help="port put in the callback_url, when a NAT forwards it (default the bound one)",
    )
    parser.add_argument("--lookup-timeout", type=float, help="give up the lookup after this many seconds (default 300)")
    parser.add_argument("--lookup-interval", type=float, help="seconds between lookups (default 1)")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        help="fixed heartbeat interval (default: heartbeat_timeout x random 0.3-0.6, as IPA)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        help="command API connections open at once; one more is answered 503 (default 128)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        help="seconds a request head may take to arrive before the connection is dropped (default 10)",
    )
    parser.add_argument("--allow-md5", action="store_true", help="accept md5 image checksums")
    parser.add_argument("--ca-file", help="extra CA bundle for https api, image and config drive URLs")
    parser.add_argument("--insecure", action="store_true", help="do not verify TLS certificates (test labs only)")
    parser.add_argument(
        "--cert-file", dest="tls_cert_file", help="serve the command API over TLS with this PEM certificate"
    )
    parser.add_argument("--key-file", dest="tls_key_file", help="the key of --cert-file")
    parser.add_argument(
        "--auto-tls",
        action="store_true",
        help="serve the command API over TLS with a self-signed certificate made at start (IPA's auto TLS)",
    )
    parser.add_argument(
        "--tmp-dir",
        help="where out-of-order qcow2 clusters are spooled, or qcow2 images staged for qemu-img (default system temp)",
    )
    parser.add_argument(
        "--qcow2-via-qemu-img",
        action="store_true",
        help="stage qcow2 images in --tmp-dir and convert them with qemu-img instead of streaming them",
    )
    parser.add_argument(
        "--no-direct-io",
        action="store_true",
        help="write raw images through the page cache instead of O_DIRECT (docs/agent.md has the figures)",
    )
    parser.add_argument(
        "--exit-on-power-off",
        action="store_true",
        help="exit the process after standby.power_off / standby.run_image (a stand-in for the machine going down)",
    )
    parser.add_argument(
        "--power-off-command",
        help="run this after standby.power_off (the ramdisk's init passes 'poweroff -f')",
    )
    parser.add_argument(
        "--reboot-command", help="run this after standby.run_image / reboot (the ramdisk's init passes 'reboot -f')"
    )
    parser.add_argument("--ports-file", help='write {"agent": callback_url} as JSON here once serving')
    parser.add_argument("--log-level", default="INFO", help="log level (default INFO)")


def parse_disk(spec: str) -> Disk:
    path, *pairs = spec.split(",")
    fields: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in ("name", "serial", "wwn", "model", "rotational"):
            raise errors.InvalidParameterValue(f"bad --disk field {pair!r} (name, serial, wwn, model, rotational)")
        fields[key] = value.lower() in ("1", "true", "yes") if key == "rotational" else value
    if not path:
        raise errors.InvalidParameterValue("--disk needs a path")
    return Disk(path=path, **fields)


def options_from_args(args: argparse.Namespace) -> Any:
    text = read_parameters(kernel_cmdline=Path(args.kernel_cmdline) if args.kernel_cmdline else None)
    disks = [parse_disk(d) for d in args.disk]
    if getattr(args, "discover_disks", False):
        from services.agent.blockdevices import discover_disks

        known = {d.path for d in disks}
        disks += [d for d in discover_disks() if d.path not in known]
    overrides: dict[str, Any] = {"disks": tuple(disks)}
    if args.mac:
        overrides["macs"] = tuple(args.mac)
    for flag in (
        "api_url",
        "node_uuid",
        "agent_token",
        "listen_host",
        "listen_port",
        "advertise_host",
        "advertise_port",
        "lookup_timeout",
        "lookup_interval",
        "heartbeat_interval",
        "tmp_dir",
        "ca_file",
        "max_connections",
        "header_timeout",
        "tls_cert_file",
        "tls_key_file",
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides[flag] = value
    if args.allow_md5:
        overrides["allow_md5"] = True
    if args.insecure:
        overrides["insecure"] = True
    if args.auto_tls:
        overrides["auto_tls"] = True
    if args.qcow2_via_qemu_img:
        overrides["qcow2_stream"] = False
    if args.no_direct_io:
        overrides["direct_io"] = False
    if "listen_port" not in overrides and "ipa-listen-port" not in text:
        overrides["listen_port"] = 9999
    floppy = None
    if vmedia.wants_floppy(text):
        floppy = vmedia.machine_parameters([Path(d) for d in args.vmedia_device] or None)
    return options_from_kernel_cmdline(text, floppy_parameters=floppy, **overrides)


async def run_power_command(command: str) -> None:
    """What "power off" or "reboot" means in a ramdisk: the machine's own command.

    It is started and waited for; ``poweroff -f`` ends the machine, and with it
    this process, so a command that returns has failed and is logged."""
    process = await asyncio.create_subprocess_exec(*shlex.split(command), stdin=asyncio.subprocess.DEVNULL)
    code = await process.wait()
    LOG.error("power command returned command=%r exit_code=%s", command, code)


async def serve(args: argparse.Namespace) -> int:
    stopping = asyncio.Event()

    def leave(command: str | None) -> Any:
        async def hook() -> None:
            if command:
                await run_power_command(command)
            if args.exit_on_power_off:
                stopping.set()

        return hook

    options = dataclasses.replace(
        await asyncio.to_thread(options_from_args, args),  # reading the floppy blocks (mtools)
        power_off=leave(getattr(args, "power_off_command", None)),
        reboot=leave(getattr(args, "reboot_command", None)),
    )
    agent = Agent(options)
    await agent.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    if args.ports_file:
        await asyncio.to_thread(Path(args.ports_file).write_text, json.dumps({"agent": agent.callback_url}))
    print(f"agent command API at {agent.callback_url}", flush=True)
    try:
        await stopping.wait()
    finally:
        await agent.stop()
    return 0


def run_agent(args: argparse.Namespace) -> int:
    from services.common.logs import configure_logging

    configure_logging(args.log_level, "text")
    from services.common.open_files import raise_open_files_limit

    raise_open_files_limit()
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 130
    except (errors.FerrumError, OSError) as exc:
        print(f"ferrum: error: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 2
