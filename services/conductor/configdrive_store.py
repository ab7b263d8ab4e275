"""Where a node's config drive waits for the agent (seed 000, CONTRACT.md 3.2).

A gzip+base64 string (what Nova sends) up to ``upload_threshold`` bytes stays
in instance_info as it was sent, which is Ironic's default for every drive
(``[deploy]configdrive_use_object_store`` is off there): the deploy verb
already wrote it with the state change, so it is as durable as the deploy,
any conductor can hand it out, and the deploy makes no upload, no file
fsync and no further write for it. With the object store (the default in
the stack), larger strings, drives built from a dict and plain base64 (which
IPA cannot gunzip) are uploaded as ``configdrive-<node uuid>`` with a time
to live of the call-back timeout plus a margin, and only a temp URL is kept
on the node, so no large blob sits in PostgreSQL. The upload asks to be
encrypted at rest (``encrypt-at-rest``), which a store with a key does
whatever its config drive container is called; an inline string is
encrypted at rest with instance_info's other secrets (docs/security.md,
"Secrets at rest"). Without an object store, drives up to ``inline_limit``
stay inline (gzip+base64) and larger ones are refused with a message that
says what to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from services.common import errors
from services.common.objectstore_client import ENCRYPT_AT_REST, SMALL_PUT_LIMIT
from services.conductor.drivers.base import Task

LOG = logging.getLogger(__name__)


class ConfigDriveStore:
    def __init__(
        self,
        *,
        objectstore: Any | None,
        container: str,
        lifetime: int,
        inline_limit: int,
        upload_threshold: int = 0,
    ) -> None:
        self.objectstore = objectstore
        self.container = container
        self.lifetime = lifetime
        self.inline_limit = inline_limit
        self.upload_threshold = upload_threshold

    @contextlib.asynccontextmanager
    async def checking(self, value: Any) -> AsyncIterator[asyncio.Future[bytes] | None]:
        """Decode an inline drive (base64 of a gzipped image) in a worker thread
        while the block runs; None for no drive, a URL or a dict (built later,
        from the node).

        The deploy verb awaits it before its first write, so bad base64, bad
        gzip, a payload that is neither kind of drive or one over the limit is
        a 400 that changes nothing (from REST and gRPC alike), and the decoding
        overlaps the taking of the node's lock instead of adding to the
        request. The verb hands the image on with the task
        (``configdrive_image``), so the deploy does not decode it again. A
        block that ends without awaiting it (a locked node) drops the job."""
        from services.common.images import configdrive as builder

        if not isinstance(value, str) or not value or builder.looks_like_url(value):
            yield None
            return
        job = asyncio.ensure_future(asyncio.to_thread(builder.decode_configdrive, value))
        try:
            yield job
        finally:
            job.cancel()  # also marks an error nobody awaited as seen (no "never retrieved" report)

    def object_name(self, node_uuid: str) -> str:
        return f"configdrive-{node_uuid}"

    def keeps_inline(self, value: str) -> bool:
        """Whether a string drive the deploy verb accepted stays in instance_info as sent:
        gzip+base64 (what IPA decodes), at most ``upload_threshold`` bytes long."""
        from services.common.images import configdrive as builder

        return len(value) <= self.upload_threshold and builder.is_gzip_base64(value)

    async def store(self, task: Task, *, upload: bool = False) -> str | None:
        """Turn instance_info.configdrive into what the agent gets: a URL or an inline
        string. ``upload`` puts even a small string in the object store (virtual media
        needs a URL)."""
        from services.common.images import configdrive as builder

        value = task.node["instance_info"].get("configdrive")
        if value is None or value == "":
            return None
        if isinstance(value, str) and builder.looks_like_url(value):
            return value
        if isinstance(value, str) and self.objectstore is not None and not upload and self.keeps_inline(value):
            task.configdrive_image = None  # the verb's decoding only checked it
            return value
        if isinstance(value, dict):
            iso = await asyncio.to_thread(builder.build_configdrive, task.node, task.ports, value)
        elif isinstance(value, str):
            # The deploy verb decoded this very string already. Used once and let go: the task
            # lives as long as the deploy, which may wait minutes for its agent.
            decoded, task.configdrive_image = task.configdrive_image, None
            iso = decoded if decoded is not None else await asyncio.to_thread(builder.decode_configdrive, value)
        else:
            raise errors.ConfigDriveInvalid("The config drive must be a string or an object")
        if self.objectstore is not None:
            name = self.object_name(task.node["uuid"])
            metadata = {"node_uuid": task.node["uuid"], ENCRYPT_AT_REST: "true"}
            if len(iso) <= SMALL_PUT_LIMIT:  # stored and signed in one call
                _, url = await self.objectstore.put_small(
                    self.container,
                    name,
                    iso,
                    delete_after=self.lifetime,
                    metadata=metadata,
                    temp_url_lifetime=self.lifetime,
                )
            else:
                await self.objectstore.put_bytes(
                    self.container, name, iso, delete_after=self.lifetime, metadata=metadata
                )
                url = await self.objectstore.temp_url(self.container, name, lifetime=self.lifetime)
            LOG.info("config drive stored node_uuid=%s bytes=%d object=%s", task.node["uuid"], len(iso), name)
            return url
        encoded = await asyncio.to_thread(builder.encode_configdrive, iso)
        if len(encoded) > self.inline_limit:
            raise errors.ConfigDriveInvalid(
                f"The config drive is {len(encoded)} bytes encoded, over the {self.inline_limit} bytes that "
                "can be kept in the database without an object store; configure the object store "
                "(FERRUM_CONDUCTOR_OBJECTSTORE_ADDRESS) or raise FERRUM_CONDUCTOR_CONFIGDRIVE_INLINE_LIMIT"
            )
        return encoded

    async def publish(self, task: Task) -> str:
        """The node's config drive as an ISO behind a temp URL, for virtual media.

        A boot interface that attaches the drive as a virtual CD instead of
        having the agent write it calls this (through ``Task.publish_configdrive``);
        it works whether the deploy kept the drive inline or uploaded it.
        """
        from services.common.images import configdrive as builder

        if self.objectstore is None:
            raise errors.ConfigDriveInvalid("Publishing a config drive for virtual media needs the object store")
        value = task.node["instance_info"].get("configdrive")
        name = self.object_name(task.node["uuid"])
        if isinstance(value, str) and builder.looks_like_url(value):
            if await self.objectstore.stat(self.container, name) is not None:
                return value
            raise errors.ConfigDriveInvalid(
                f"The config drive of node {task.node['uuid']} is an external URL; attach it directly"
            )
        url = await self.store(task, upload=True)
        if url is None:
            raise errors.ConfigDriveInvalid(f"Node {task.node['uuid']} has no config drive")
        return url

    async def read_iso(self, task: Task) -> bytes | None:
        """The node's config drive as ISO bytes, for a conductor that writes it
        itself (the iSCSI deploy): from the object store when the deploy put it
        there (the temp URL is the machine's view, not necessarily ours), else
        from the external URL, else decoded or built from instance_info."""
        from services.common.images import configdrive as builder

        value = task.node["instance_info"].get("configdrive")
        if value is None or value == "":
            return None
        if isinstance(value, str) and builder.looks_like_url(value):
            name = self.object_name(task.node["uuid"])
            if self.objectstore is not None and await self.objectstore.stat(self.container, name) is not None:
                return bytes(await self.objectstore.get_bytes(self.container, name))
            return await _download_configdrive(value)
        if isinstance(value, dict):
            return await asyncio.to_thread(builder.build_configdrive, task.node, task.ports, value)
        if isinstance(value, str):
            return await asyncio.to_thread(builder.decode_configdrive, value)
        raise errors.ConfigDriveInvalid("The config drive must be a string or an object")

    async def remove(self, task: Task) -> None:
        """Delete the uploaded drive on tear down (it would expire anyway).

        A node whose instance_info names no drive has none stored: ``store``
        only uploads one named there, and the deploy records the URL before it
        goes on. So no object store call (a gRPC call and a DELETE) is made
        for it; one left by a deploy that died between the upload and that
        write still expires with its time to live. Neither has a drive kept
        inline: the copy virtual media publishes of one (``publish``) expires
        the same way."""
        from services.common.images import configdrive as builder

        value = task.node["instance_info"].get("configdrive")
        if self.objectstore is None or not value:
            return
        if isinstance(value, str) and not builder.looks_like_url(value) and self.keeps_inline(value):
            return
        try:
            await self.objectstore.delete(self.container, self.object_name(task.node["uuid"]), missing_ok=True)
        except errors.FerrumError as exc:
            LOG.warning("could not delete the config drive node_uuid=%s reason=%s", task.node["uuid"], exc.message)


MAX_CONFIGDRIVE_DOWNLOAD = 128 * 1024 * 1024
ISO_MAGIC_OFFSET = 32769


async def _download_configdrive(url: str) -> bytes:
    """An external config drive URL: its body is an ISO or the gzip+base64 text of one."""
    import aiohttp

    from services.common.images.configdrive import decode_configdrive

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
            session.get(url) as reply,
        ):
            if reply.status >= 300:
                raise errors.ConfigDriveError(f"Downloading the config drive failed: HTTP {reply.status}")
            body = await reply.content.read(MAX_CONFIGDRIVE_DOWNLOAD + 1)
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise errors.ConfigDriveError(f"Downloading the config drive failed: {exc or type(exc).__name__}") from None
    if len(body) > MAX_CONFIGDRIVE_DOWNLOAD:
        raise errors.ConfigDriveError("The config drive download is larger than 128 MiB")
    if body[ISO_MAGIC_OFFSET : ISO_MAGIC_OFFSET + 5] == b"CD001":
        return body
    return await asyncio.to_thread(decode_configdrive, body.decode("ascii", errors="replace"))
