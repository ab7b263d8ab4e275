"""``ferrum ramdisk build`` and ``ferrum image build-demo``.

Both build from this machine's Debian package sources into
``<state dir>/ramdisk`` and ``<state dir>/images`` (or ``--output``), with
downloads cached in ``<state dir>/cache/debian``; both print what they made,
how long it took and how big it is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MiB = 1024 * 1024
BUILD_GOAL_SECONDS = 120  # issue 20's goals for the deploy ramdisk
SIZE_GOAL_BYTES = 80 * MiB


def add_ramdisk_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="ramdisk_command", required=True, metavar="ACTION")
    build = actions.add_parser(
        "build",
        help="build the deploy kernel + initramfs (Debian's kernel, busybox, Python and Ferrum's agent)",
        description="Build ferrum-agent.kernel and ferrum-agent.initramfs from this machine's Debian package "
        "sources. See docs/ramdisk.md.",
    )
    _output_arguments(build, "ramdisk")


def add_image_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    demo = actions.add_parser(
        "build-demo",
        help="build a bootable GPT disk image whose tiny OS prints what its config drive says",
        description="Build ferrum-demo-os.raw: GPT, syslinux, Debian's kernel and a busybox initramfs that "
        "prints hostname=<meta_data.json hostname> from the config-2 drive on the serial console.",
    )
    _output_arguments(demo, "images")
    demo.add_argument("--size-mib", type=int, default=32, help="image size in MiB (default 32)")


def _output_arguments(parser: argparse.ArgumentParser, default_dir: str) -> None:
    parser.add_argument(
        "--output", help=f"directory for the result (default STATE_DIR/{default_dir}, STATE_DIR = --state-dir)"
    )
    parser.add_argument("--state-dir", help="state directory; downloads are cached in STATE_DIR/cache/debian")
    parser.add_argument("--config", help="TOML config file (for state_dir)")


def _paths(args: argparse.Namespace, state_dir: str, default_dir: str) -> tuple[Path, Path]:
    state = Path(state_dir)
    return Path(args.output) if args.output else state / default_dir, state / "cache" / "debian"


def run_ramdisk(args: argparse.Namespace, state_dir: str) -> int:
    from services.ramdisk.debian import PackageError
    from services.ramdisk.deploy_ramdisk import build_ramdisk

    output, cache = _paths(args, state_dir, "ramdisk")
    try:
        built = build_ramdisk(output, cache=cache)
    except (PackageError, OSError, ValueError) as exc:
        print(f"ferrum: error: ramdisk build failed: {exc}", file=sys.stderr)
        return 1
    print(f"kernel:    {built.kernel} ({built.kernel.stat().st_size / MiB:.1f} MiB, {built.kernel_package})")
    print(
        f"initramfs: {built.initramfs} ({built.compressed_bytes / MiB:.1f} MiB compressed, "
        f"{built.uncompressed_bytes / MiB:.1f} MiB unpacked; goal < {SIZE_GOAL_BYTES // MiB} MiB)"
    )
    print(
        f"built in {built.seconds:.1f} s (goal < {BUILD_GOAL_SECONDS} s) from {built.packages} Debian packages "
        f"({built.downloaded_bytes / MiB:.1f} MiB, cached in {cache})"
    )
    return 0


def run_image(args: argparse.Namespace, state_dir: str) -> int:
    from services.ramdisk.debian import PackageError
    from services.ramdisk.demo_os import build_demo_os

    output, cache = _paths(args, state_dir, "images")
    try:
        built = build_demo_os(output, cache=cache, size_mib=args.size_mib)
    except (PackageError, OSError, ValueError) as exc:
        print(f"ferrum: error: demo image build failed: {exc}", file=sys.stderr)
        return 1
    print(f"image: {built.path} ({built.size / MiB:.0f} MiB raw GPT, sha256 {built.sha256})")
    print(f"built in {built.seconds:.1f} s with {built.kernel_package}")
    return 0
