"""Booting from virtual media: what firmware finds on an inserted ISO.

A boot ISO carries the kernel command line in its boot loader configuration
(isolinux ``append``, GRUB ``linux``/``linuxefi``). The simulator downloads
the media to a scratch file (bounded), reads it, deletes it, and starts what
the line describes. An inserted vfat floppy or USB image labelled
``ir-vfd-dev`` is not the firmware's business: the agent reads its
``parameters.txt`` itself (``services/agent/vmedia.py``, CONTRACT.md 6.1).
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import aiohttp

from services.common import errors
from services.common.images import iso9660

MAX_MEDIA_BYTES = 2 * 1024**3
MAX_CONFIG_BYTES = 1024 * 1024  # a boot loader configuration or parameters.txt is a few KiB
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
        out = await asyncio.to_thread(open, dest, "wb")
        try:
            async for chunk in response.content.iter_chunked(CHUNK):
                written += len(chunk)
                if written > limit:
                    raise RuntimeError(f"media larger than {limit} bytes")
                await asyncio.to_thread(out.write, chunk)
        finally:
            await asyncio.to_thread(out.close)
    return written


def iso_kernel_cmdline(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """(kernel command line, config file it came from) of a bootable ISO, or None."""
    with open(path, "rb") as fp:
        try:
            volume = iso9660.IsoVolume(fp)
        except errors.ImageFormatError:
            return None
        with volume:
            present = {path.lower(): path for path in volume.files()}  # firmware looks names up in any case
            for name in BOOT_CONFIGS:
                if name not in present:
                    continue
                try:
                    text = volume.read(present[name], limit=MAX_CONFIG_BYTES).decode("utf-8", "replace")
                except errors.ImageFormatError:
                    continue
                first, second = (_LINUX, _APPEND) if "grub" in name else (_APPEND, _LINUX)
                match = first.search(text) or second.search(text)
                if match is not None:
                    return _INITRD_WORD.sub(" ", match.group(1)).strip(), name
            return None
