"""Putting the config drive onto the deployed disk (CONTRACT 3.4).

The value is a URL (downloaded with retries; the body is base64+gzip or a raw
ISO) or the base64+gzip string itself. Decoding and the partition work live
in the shared disk-and-image package (``services.common.images``), which the
api and the conductor use too, so the ramdisk never imports the conductor.
"""

from __future__ import annotations

import asyncio

import aiohttp

from services.agent import download
from services.agent.checksum import is_url
from services.common import errors
from services.common.images.configdrive import decode_configdrive
from services.common.images.configdrive_partition import ConfigDrivePlacement, write_configdrive_partition

MAX_DOWNLOAD = 128 * 1024 * 1024  # the gzip+base64 text of a 64 MiB ISO fits well under this
ISO_MAGIC_OFFSET = 32769  # "CD001" of the primary volume descriptor


async def config_drive_iso(
    session: aiohttp.ClientSession,
    value: str,
    *,
    policy: download.RetryPolicy = download.DEFAULT_POLICY,
    tls: download.TLS = True,
) -> bytes:
    """The ISO bytes for a config drive value (URL or gzip+base64 string)."""
    if is_url(value):
        body = await download.fetch_bytes(session, value, limit=MAX_DOWNLOAD, policy=policy, tls=tls)
        if body[ISO_MAGIC_OFFSET : ISO_MAGIC_OFFSET + 5] == b"CD001":
            return body
        try:
            text = body.decode("ascii")
        except UnicodeDecodeError:
            return body  # IPA: what is not base64 is used as a raw image
        return await asyncio.to_thread(decode_configdrive, text)
    return await asyncio.to_thread(decode_configdrive, value)


async def write_config_drive(
    session: aiohttp.ClientSession,
    disk_path: str,
    value: str,
    *,
    policy: download.RetryPolicy = download.DEFAULT_POLICY,
    tls: download.TLS = True,
) -> ConfigDrivePlacement:
    """Decode or download the config drive and write its partition; returns the placement."""
    if not isinstance(value, str) or not value:
        raise errors.InvalidParameterValue("configdrive must be a URL or a gzip+base64 string")
    iso = await config_drive_iso(session, value, policy=policy, tls=tls)
    return await asyncio.to_thread(write_configdrive_partition, disk_path, iso)
