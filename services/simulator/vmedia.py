"""Booting from virtual media: what firmware finds on an inserted ISO (and floppy).

A deploy ISO carries the ramdisk's kernel command line in its boot loader
configuration (isolinux ``append``, GRUB ``linux``/``linuxefi``), and an
optional vfat floppy or USB image labelled ``ir-vfd-dev`` carries extra
``key=value`` lines in ``parameters.txt`` that win over the command line
(CONTRACT.md section 6.1). The simulator downloads the media to a scratch file
(bounded), reads it, deletes it, and starts the agent with what it found.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import aiohttp

from services.simulator.disk import iso_files, read_iso_file

MAX_MEDIA_BYTES = 2 * 1024**3
CHUNK = 1024 * 1024
BOOT_CONFIGS = (
    "isolinux/isolinux.cfg",
    "isolinux.cfg",
    "syslinux/syslinux.cfg",
    "syslinux.cfg",
    "boot/grub/grub.cfg",
    "efi/boot/grub.cfg",
    "boot/grub2/grub.cfg",
    "grub.cfg",
)
_APPEND = re.compile(r"^\s*append\s+(.*)$", re.IGNORECASE | re.MULTILINE)
_LINUX = re.compile(r"^\s*linux(?:efi)?\s+\S+\s*(.*)$", re.MULTILINE)
_INITRD_WORD = re.compile(r"(^|\s)initrd=\S+")


async def download(
    session: aiohttp.ClientSession, url: str, dest: Path, *, timeout: float, limit: int = MAX_MEDIA_BYTES
) -> int:
    """Stream ``url`` into ``dest``; more than ``limit`` bytes or a non-2xx is an error."""
    written = 0
    async with session.get(
        url, timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout, sock_connect=timeout)
    ) as response:
        if response.status >= 300:
            raise RuntimeError(f"HTTP {response.status}")
        with await asyncio.to_thread(open, dest, "wb") as out:
            async for chunk in response.content.iter_chunked(CHUNK):
                written += len(chunk)
                if written > limit:
                    raise RuntimeError(f"media larger than {limit} bytes")
                await asyncio.to_thread(out.write, chunk)
    return written


def iso_kernel_cmdline(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """(kernel command line, config file it came from) of a bootable ISO, or None."""
    import pycdlib

    iso = pycdlib.PyCdlib()
    try:
        iso.open(str(path))
    except Exception:  # noqa: BLE001 - pycdlib raises assorted errors on media that is not an ISO: no boot config
        return None
    try:
        kwarg, files = iso_files(iso)
        for name in BOOT_CONFIGS:
            if name not in files:
                continue
            text = read_iso_file(iso, kwarg, files[name]).decode("utf-8", "replace")
            first, second = (_LINUX, _APPEND) if "grub" in name else (_APPEND, _LINUX)
            match = first.search(text) or second.search(text)
            if match is not None:
                return _INITRD_WORD.sub(" ", match.group(1)).strip(), name
        return None
    finally:
        iso.close()


async def floppy_parameters(path: str | os.PathLike[str]) -> dict[str, str]:
    """``parameters.txt`` of a vfat image (read with mtools), as key/value pairs."""
    proc = await asyncio.create_subprocess_exec(
        "mtype",
        "-i",
        str(path),
        "::parameters.txt",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "MTOOLS_SKIP_CHECK": "1"},
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(err.decode(errors="replace").strip() or "cannot read parameters.txt")
    params: dict[str, str] = {}
    for line in out.decode("utf-8", "replace").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key:
            params[key.strip()] = value.strip()
    return params
