"""``ferrum simulator``: a rack of simulated machines until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from services.common import errors


def add_simulator_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--machines", type=int, default=8, help="how many machines (default 8)")
    parser.add_argument(
        "--state-dir",
        default=".ferrum/simulator",
        help="where disk files and machines.json live (default .ferrum/simulator)",
    )
    parser.add_argument(
        "--boot-url", default="", help="the iPXE bootfile URL DHCP would give, e.g. http://127.0.0.1:8080/boot.ipxe"
    )
    parser.add_argument("--host", default="127.0.0.1", help="Redfish listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="Redfish port (default 8000; 0 = ephemeral)")
    parser.add_argument(
        "--public-url",
        default="",
        help="Redfish URL conductors reach, put in machines.json (default http://HOST:PORT), e.g. http://simulator:8000",
    )
    parser.add_argument(
        "--agent-host",
        default="127.0.0.1",
        help="where the machines' deploy agents listen (default 127.0.0.1); 0.0.0.0 when conductors run elsewhere",
    )
    parser.add_argument("--disk-size", default="1GiB", help="size of each sparse disk file (default 1GiB)")
    parser.add_argument(
        "--hba-lun-size",
        default="0",
        help="give each machine a LUN of this size behind a host bus adapter, with a WWN, for boot from "
        "volume through the HBA (default 0: no HBA; python backend only)",
    )
    parser.add_argument("--username", default="", help="BMC user name (default: no authentication)")
    parser.add_argument("--password", default="", help="BMC password (with --username)")
    parser.add_argument("--name-prefix", default="sim-", help="machine name prefix (default sim-)")
    parser.add_argument(
        "--first-index",
        type=int,
        default=0,
        help="index of the first machine; shifts names, UUIDs and MACs (default 0)",
    )
    parser.add_argument("--nics", type=int, default=1, help="NICs per machine, 1-4 (default 1)")
    parser.add_argument(
        "--boot-order", default="Pxe,Hdd", help="firmware boot order when no override is set (default Pxe,Hdd)"
    )
    parser.add_argument(
        "--pxe-retries",
        type=int,
        default=3,
        help="network-boot rounds retried after one where every NIC failed, as Ferrum's boot.ipxe retries (default 3)",
    )
    parser.add_argument(
        "--pxe-retry-delay",
        type=float,
        default=1.0,
        help="seconds before the first PXE retry; the n-th waits n times as long (default 1)",
    )
    parser.add_argument(
        "--power-delay",
        default="0",
        help="seconds a power request takes to land: N or min,max (default 0; real BMCs: 1,11)",
    )
    parser.add_argument(
        "--backend",
        choices=("python", "qemu"),
        default="python",
        help="python: simulated firmware and embedded agents (default); qemu: each machine is a QEMU VM "
        "that network-boots the real deploy ramdisk (docs/simulator.md)",
    )
    parser.add_argument("--qemu-binary", default="qemu-system-x86_64", help="QEMU to run (qemu backend)")
    parser.add_argument("--qemu-memory", type=int, default=1024, help="MiB of RAM per VM (qemu backend; default 1024)")
    parser.add_argument(
        "--agent-port-base",
        type=int,
        default=0,
        help="host port forwarded to VM i's agent is this + i (qemu backend; default: free ports)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=4096,
        help="Redfish connections open at once; one more is answered 503 (default 4096)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a request head may take to arrive before the connection is dropped (default 10)",
    )
    parser.add_argument(
        "--bmc",
        default="redfish",
        choices=("redfish", "ilo"),
        help="virtual media layout: redfish (Cd/Floppy, standard actions) or ilo (iLO 5: Managers/<m>/VirtualMedia/1 "
        "floppy and /2 CD, Oem.Hpe actions, BootOnNextServerReset)",
    )
    parser.add_argument(
        "--ipmi",
        action="store_true",
        help="each machine also answers IPMI (lanplus, cipher suite 3) on its own UDP port; see machines.json",
    )
    parser.add_argument("--ports-file", help="write the Redfish URL as JSON to this file once serving")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")


async def serve(args: argparse.Namespace) -> int:
    from services.simulator import Simulator, SimulatorOptions
    from services.simulator.options import parse_delay

    simulator = Simulator(
        SimulatorOptions(
            machines=args.machines,
            state_dir=args.state_dir,
            boot_url=args.boot_url,
            host=args.host,
            port=args.port,
            public_url=args.public_url,
            agent_host=args.agent_host,
            disk_size=args.disk_size,
            hba_lun_size=args.hba_lun_size,
            username=args.username,
            password=args.password,
            name_prefix=args.name_prefix,
            first_index=args.first_index,
            nics_per_machine=args.nics,
            boot_order=tuple(t.strip() for t in args.boot_order.split(",") if t.strip()),
            power_delay=parse_delay(args.power_delay),
            pxe_retries=args.pxe_retries,
            pxe_retry_delay=args.pxe_retry_delay,
            backend=args.backend,
            qemu_binary=args.qemu_binary,
            qemu_memory_mib=args.qemu_memory,
            agent_port_base=args.agent_port_base,
            max_connections=args.max_connections,
            header_timeout=args.header_timeout,
            bmc_profile=args.bmc,
            ipmi=args.ipmi,
        )
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await simulator.start()
    try:
        if args.ports_file:
            await asyncio.to_thread(Path(args.ports_file).write_text, json.dumps({"simulator": simulator.redfish_url}))
        print(
            f"simulator: {len(simulator.machines)} machines, Redfish at {simulator.redfish_url}/redfish/v1, "
            f"status at {simulator.redfish_url}/simulator/machines, "
            f"inventory in {Path(args.state_dir) / 'machines.json'}",
            flush=True,
        )
        await stopping.wait()
    finally:
        await simulator.stop()
    return 0


def run_simulator(args: argparse.Namespace) -> int:
    from services.common.logs import configure_logging

    configure_logging(args.log_level.upper(), "text")
    from services.common.open_files import raise_open_files_limit

    raise_open_files_limit()
    try:
        from services.simulator.options import parse_size

        args.disk_size = parse_size(args.disk_size)
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 130
    except (errors.FerrumError, OSError) as exc:
        print(f"ferrum: error: {exc}".splitlines()[0], file=sys.stderr)
        return 2 if isinstance(exc, errors.Invalid) else 1
