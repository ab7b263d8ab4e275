"""The ``ferrum`` command. The only place that reads the environment and flags."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from services.common.config import ConfigError, Settings, describe_options, load_settings

ALL_SERVICES = ["objectstore", "ipxe", "conductor", "api"]
EPILOG = "Every option can also be set with a FERRUM_* environment variable or a TOML file (--config); run `ferrum options` for the list."


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config file (also FERRUM_CONFIG)")
    parser.add_argument("--database-url", help="PostgreSQL URL; empty = embedded PostgreSQL (FERRUM_DATABASE_URL)")
    parser.add_argument("--state-dir", help="where embedded PostgreSQL and local objects live (default ./.ferrum)")
    parser.add_argument("--ports-file", help="write the bound endpoints as JSON to this file once serving")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferrum",
        description="Ferrum: bare-metal provisioning with an Ironic-compatible API.",
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stack = sub.add_parser(
        "stack",
        help="run api, conductor, ipxe and objectstore (and embedded PostgreSQL) in one process",
        description="Run the whole control plane in one process until Ctrl-C/SIGTERM. "
        "REST API on 127.0.0.1:6385, iPXE on 127.0.0.1:8080 (see docs/ports-and-endpoints.md).",
        epilog=EPILOG,
    )
    _common(stack)
    stack.add_argument("--ephemeral", action="store_true", help="bind every port to a free ephemeral port")

    api = sub.add_parser("api", help="run the REST (Ironic v1) and gRPC api service", epilog=EPILOG)
    _common(api)
    api.add_argument("--host", help="listen address (default 127.0.0.1)")
    api.add_argument("--port", type=int, help="REST port (default 6385)")
    api.add_argument("--grpc-port", type=int, help="gRPC port (default 6386)")

    conductor = sub.add_parser(
        "conductor", help="run a conductor (state machine, drivers, periodic work)", epilog=EPILOG
    )
    _common(conductor)
    conductor.add_argument("--host", help="listen address, also the address registered for the api (default 127.0.0.1)")
    conductor.add_argument("--grpc-port", type=int, help="gRPC port (default 6387)")
    conductor.add_argument("--metrics-port", type=int, help="/metrics HTTP port (default 6388)")
    conductor.add_argument("--hostname", help="name the conductor registers and locks nodes under (default host-pid)")
    conductor.add_argument("--conductor-group", help="conductor group this conductor serves")

    ipxe = sub.add_parser("ipxe", help="run the iPXE script renderer", epilog=EPILOG)
    _common(ipxe)
    ipxe.add_argument("--host", help="listen address (default 127.0.0.1)")
    ipxe.add_argument("--port", type=int, help="HTTP port (default 8080)")
    ipxe.add_argument("--grpc-port", type=int, help="gRPC port (default 8081)")

    store = sub.add_parser("objectstore", help="run the object store shim", epilog=EPILOG)
    _common(store)
    store.add_argument("--host", help="listen address (default 127.0.0.1)")
    store.add_argument("--grpc-port", type=int, help="gRPC port (default 6390)")
    store.add_argument("--http-port", type=int, help="temp-URL download port (default 6391)")
    store.add_argument("--root", help="directory of the filesystem backend (default STATE_DIR/objects)")

    from services.agent.cli import add_agent_arguments

    add_agent_arguments(
        sub.add_parser(
            "agent",
            help="IPA-compatible deploy agent (the ramdisk side): lookup, heartbeat, command API, image writing",
            description="Run one deploy agent: look the node up on the api, heartbeat, serve the command API "
            "(default port 9999) and write images to the given disks. See docs/agent.md.",
        )
    )
    from services.simulator.cli import add_simulator_arguments

    add_simulator_arguments(
        sub.add_parser(
            "simulator",
            help="a rack of simulated machines behind one Redfish service (network boot, agents, disks)",
            description="Run N simulated machines behind one Redfish BMC service: sparse disk files, iPXE-like "
            "network boot from --boot-url, embedded deploy agents. See docs/simulator.md.",
        )
    )

    from services.ramdisk.cli import add_image_arguments, add_ramdisk_arguments

    add_ramdisk_arguments(
        sub.add_parser(
            "ramdisk",
            help="build the deploy ramdisk (kernel + initramfs with Ferrum's agent) from Debian packages",
            description="Build the deploy kernel and initramfs from this machine's Debian package sources. "
            "See docs/ramdisk.md.",
        )
    )
    add_image_arguments(
        sub.add_parser(
            "image",
            help="build disk images (a bootable demo OS) from Debian packages",
            description="Build disk images to deploy. See docs/ramdisk.md.",
        )
    )

    demo = sub.add_parser(
        "demo",
        help="provision a rack of simulated Redfish machines end to end over the REST API",
        description="Start the embedded stack and a simulator of N Redfish machines, build a small "
        "GPT + ext4 disk image, enroll the machines over the Ironic REST API, deploy the image with a "
        "config drive (iPXE + agent), verify every disk byte for byte, undeploy, and stop.",
        epilog=EPILOG,
    )
    _common(demo)
    demo.add_argument(
        "--nodes", type=int, help="how many machines to provision (default 8; 2 with --backend qemu, at most 4)"
    )
    demo.add_argument(
        "--backend",
        choices=("python", "qemu"),
        default="python",
        help="python: simulated machines (default); qemu: real VMs that network-boot the deploy ramdisk "
        "built from Debian packages and boot the OS written to their disks",
    )

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_sub.add_parser("upgrade", help="apply pending schema migrations (idempotent, safe concurrently)")
    upgrade.add_argument("--config", help="TOML config file")
    upgrade.add_argument("--database-url", help="PostgreSQL URL (required unless FERRUM_DATABASE_URL is set)")
    rotate = db_sub.add_parser(
        "rotate-key",
        help="re-encrypt every stored secret under the current secret key (idempotent, resumable)",
        description="Re-encrypt BMC passwords, agent tokens and config drives, in PostgreSQL and in the object "
        "store, under the first key of FERRUM_SECURITY_SECRET_KEY_FILE (or FERRUM_SECURITY_SECRET_KEY); also "
        "encrypts a deployment that had no key. Safe to run again. See docs/security.md.",
        epilog=EPILOG,
    )
    rotate.add_argument("--config", help="TOML config file (also FERRUM_CONFIG)")
    rotate.add_argument("--database-url", help="PostgreSQL URL; empty = the embedded PostgreSQL (stop the stack first)")
    rotate.add_argument("--state-dir", help="where embedded PostgreSQL and local objects live (default ./.ferrum)")
    rotate.add_argument("--batch-size", type=int, default=100, help="rows per transaction (default 100)")

    sub.add_parser("options", help="list every configuration option with its environment variable")
    return parser


def settings_from(args: argparse.Namespace, env: dict[str, str]) -> Settings:
    overrides: dict[str | None, dict[str, Any]] = {}
    if getattr(args, "database_url", None):
        overrides.setdefault("database", {})["url"] = args.database_url
    if getattr(args, "state_dir", None):
        overrides.setdefault(None, {})["state_dir"] = args.state_dir
    section = args.command if args.command in ("api", "conductor", "ipxe", "objectstore") else None
    if section:
        for flag in ("host", "port", "grpc_port", "metrics_port", "http_port", "hostname", "conductor_group", "root"):
            value = getattr(args, flag, None)
            if value is not None:
                overrides.setdefault(section, {})[flag] = value
    if getattr(args, "ephemeral", False) or args.command == "demo":
        for sec, keys in (
            ("api", ("port", "grpc_port")),
            ("conductor", ("grpc_port", "metrics_port")),
            ("ipxe", ("port", "grpc_port")),
            ("objectstore", ("grpc_port", "http_port")),
        ):
            for key in keys:
                overrides.setdefault(sec, {})[key] = 0
    return load_settings(env, config_file=getattr(args, "config", None), overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "agent":
        from services.agent.cli import run_agent

        return run_agent(args)
    if args.command == "simulator":
        from services.simulator.cli import run_simulator

        return run_simulator(args)
    if args.command == "options":
        print(describe_options())
        return 0
    try:
        settings = settings_from(args, dict(os.environ))
    except ConfigError as exc:
        print(f"ferrum: error: {exc}", file=sys.stderr)
        return 2
    if args.command == "demo" and args.backend == "qemu":
        from services.demo_vm import guest_settings

        settings = guest_settings(settings)
    if args.command in ("ramdisk", "image"):
        from services.ramdisk.cli import run_image, run_ramdisk

        return (run_ramdisk if args.command == "ramdisk" else run_image)(args, settings.state_dir)
    from services.common.logs import configure_logging

    # The demo draws progress bars: only warnings, unless a level was asked for.
    level = "WARNING" if args.command == "demo" and "FERRUM_LOG_LEVEL" not in os.environ else settings.log_level
    configure_logging(level, settings.log_format)
    from services.common.open_files import raise_open_files_limit

    raise_open_files_limit()  # every listener's connection cap must fit under it (docs/security.md)
    try:
        return asyncio.run(_run(args, settings))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a start-up failure: one clear line, nothing left running
        from services.common import errors
        from services.common.db.embedded import EmbeddedPostgresError
        from services.common.keyring import KeyringError

        if isinstance(exc, (ConfigError, OSError, EmbeddedPostgresError, errors.FerrumError, KeyringError)) or type(
            exc
        ).__module__.startswith("asyncpg"):
            print(f"ferrum: error: {exc}".splitlines()[0], file=sys.stderr)
            return 1
        raise


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    from services import runtime

    if args.command == "stack":
        return await runtime.serve(settings, ALL_SERVICES, ports_file=args.ports_file)
    if args.command in ("api", "conductor", "ipxe", "objectstore"):
        return await runtime.serve(settings, [args.command], ports_file=args.ports_file)
    if args.command == "db" and args.db_command == "rotate-key":
        from services import rotate_key

        if args.batch_size < 1:
            raise ConfigError("--batch-size must be at least 1")
        return await rotate_key.run(settings, batch_size=args.batch_size)
    if args.command == "db":
        from services.common.db import migrate

        if not settings.database.url:
            raise ConfigError("ferrum db upgrade needs --database-url or FERRUM_DATABASE_URL")
        applied = await migrate.upgrade(settings.database.url)
        print(
            f"schema at version {await migrate.current_version(settings.database.url)}"
            + (f" (applied {applied})" if applied else " (nothing to do)")
        )
        return 0
    if args.command == "demo":
        simulators: list[Any] = []
        if args.backend == "qemu":
            from pathlib import Path

            from rich.console import Console

            from services.demo_vm import prepare_files, run_vm_demo
            from services.ramdisk.debian import PackageError

            # Built before the stack starts: nothing slow may run on its event loop.
            try:
                files = await asyncio.to_thread(prepare_files, Path(settings.state_dir), Console())
            except (PackageError, ValueError) as exc:
                print(f"ferrum: error: cannot build the VMs' ramdisk and image: {exc}", file=sys.stderr)
                return 1
            demo: Any = lambda stack: run_vm_demo(  # noqa: E731 - the stack is only known once it runs
                stack, nodes=2 if args.nodes is None else args.nodes, files=files, simulators=simulators
            )
        else:
            from services.demo import run_demo

            demo = lambda stack: run_demo(stack, nodes=8 if args.nodes is None else args.nodes, simulators=simulators)  # noqa: E731
        try:
            return await runtime.serve(settings, ALL_SERVICES, until=demo)
        finally:
            for simulator in simulators:
                await simulator.stop()
    raise AssertionError(args.command)


if __name__ == "__main__":
    raise SystemExit(main())
