"""The conductor's local cache of instance images (the iSCSI deploy's source).

The ``iscsi`` deploy writes the image from the conductor's side, so the image
must be here first. Ironic's iSCSI deploy kept a master copy per image and
hard-linked it per node; Ferrum keeps one file per *content*: the cache key
is the checksum the node's ``instance_info`` promises, so two nodes deploying
the same image share one download, and an image whose bytes do not hash to
that value never enters the cache (it is checked while it streams in, then
renamed into place, so a half-written or wrong file is never found).

The cache is bounded: after a new image lands, the least recently used files
are removed until the total fits ``max_bytes``. Files in use by a running
deploy are never removed, even when that leaves the cache over its bound for
a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from services.common import errors

LOG = logging.getLogger(__name__)
CHUNK = 4 * 1024 * 1024
_HEX = re.compile(r"^[0-9a-f]+$")
ALGO_BY_LENGTH = {32: "md5", 64: "sha256", 96: "sha384", 128: "sha512"}


@dataclass(frozen=True)
class ImageRef:
    """Where an image comes from and the hash its bytes must have."""

    url: str
    algo: str
    value: str

    @property
    def key(self) -> str:
        return f"{self.algo}-{self.value}"


def image_ref(instance_info: Mapping[str, Any], *, allow_md5: bool = False) -> ImageRef:
    """The image of a node's ``instance_info``: ``image_os_hash_*`` first, then
    ``image_checksum`` (its algorithm told by its length), as the agent reads them."""
    url = str(instance_info.get("image_url") or instance_info.get("image_source") or "")
    algo = str(instance_info.get("image_os_hash_algo") or "").lower()
    value = str(instance_info.get("image_os_hash_value") or "").strip().lower()
    if not (algo and value):
        value = str(instance_info.get("image_checksum") or "").strip().lower()
        algo = ALGO_BY_LENGTH.get(len(value), "")
    if not algo or not _HEX.match(value) or ALGO_BY_LENGTH.get(len(value)) != algo:
        raise errors.InvalidParameterValue(
            "The iSCSI deploy needs a hex image_os_hash_value (sha256, sha384 or sha512) or image_checksum "
            "in instance_info: the conductor caches images by content and never writes one it cannot verify"
        )
    if algo == "md5" and not allow_md5:
        raise errors.InvalidParameterValue("MD5 image checksums are disabled: give image_os_hash_algo and _value")
    return ImageRef(url=url, algo=algo, value=value)


class ImageCache:
    """Images by content hash under ``directory``, at most ``max_bytes`` of them
    (beyond what running deploys hold)."""

    def __init__(self, directory: Path, *, max_bytes: int, download_timeout: float = 60.0, ca_file: str = "") -> None:
        if max_bytes <= 0:
            raise errors.InvalidParameterValue("image_cache_max_bytes must be positive")
        self.directory = directory
        self.max_bytes = max_bytes
        self.download_timeout = download_timeout
        self.ca_file = ca_file
        self._locks: dict[str, asyncio.Lock] = {}
        self._in_use: dict[str, int] = {}
        self.downloads = 0  # how many images were fetched (tests and logs: a shared image is fetched once)

    def path_of(self, ref: ImageRef) -> Path:
        return self.directory / ref.key

    @contextlib.asynccontextmanager
    async def image(self, ref: ImageRef) -> AsyncIterator[Path]:
        """The cached file of ``ref`` (downloaded first when absent), held for
        the duration of the block so no eviction removes it mid-write."""
        self._in_use[ref.key] = self._in_use.get(ref.key, 0) + 1
        try:
            lock = self._locks.setdefault(ref.key, asyncio.Lock())
            async with lock:
                path = self.path_of(ref)
                if path.exists():
                    await asyncio.to_thread(os.utime, path)  # most recently used
                else:
                    await self._download(ref, path)
                    await self._evict()
            yield path
        finally:
            left = self._in_use.get(ref.key, 1) - 1
            if left:
                self._in_use[ref.key] = left
            else:
                self._in_use.pop(ref.key, None)

    async def _download(self, ref: ImageRef, path: Path) -> None:
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        hasher = hashlib.new(ref.algo)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.download_timeout, sock_read=self.download_timeout)
        ssl_setting: object = True
        if self.ca_file:
            import ssl

            ssl_setting = ssl.create_default_context(cafile=self.ca_file)
        started = time.monotonic()
        size = 0
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(ref.url, ssl=ssl_setting) as reply,  # type: ignore[arg-type]
            ):
                if reply.status >= 300:
                    raise errors.ImageError(f"Downloading the image {ref.url} failed: HTTP {reply.status}")
                out = await asyncio.to_thread(open, partial, "wb")
                try:
                    async for chunk in reply.content.iter_chunked(CHUNK):
                        size += len(chunk)
                        await asyncio.to_thread(_hash_and_write, hasher, out, chunk)
                    await asyncio.to_thread(os.fsync, out.fileno())
                finally:
                    await asyncio.to_thread(out.close)
            if hasher.hexdigest() != ref.value:
                raise errors.ChecksumMismatch(
                    f"Image {ref.url} failed to verify against checksum. Expected {ref.algo} {ref.value}, "
                    f"got {hasher.hexdigest()}"
                )
            await asyncio.to_thread(os.replace, partial, path)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise errors.ImageError(f"Downloading the image {ref.url} failed: {exc or type(exc).__name__}") from None
        except OSError as exc:
            raise errors.ImageError(f"Caching the image {ref.url} failed: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(partial.unlink)
        self.downloads += 1
        elapsed = max(time.monotonic() - started, 1e-6)
        LOG.info("image cached url=%s key=%s bytes=%d rate=%.0fMiB/s", ref.url, ref.key, size, size / elapsed / 2**20)

    async def _evict(self) -> None:
        """Least recently used first, never a file a deploy holds."""

        def scan() -> list[tuple[float, int, Path]]:
            found = []
            for entry in os.scandir(self.directory):
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                st = entry.stat()
                found.append((st.st_mtime, st.st_size, Path(entry.path)))
            return sorted(found)

        entries = await asyncio.to_thread(scan)
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            if path.name in self._in_use:
                continue
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(path.unlink)
            total -= size
            LOG.info("image evicted from the cache key=%s bytes=%d", path.name, size)


def _hash_and_write(hasher: hashlib._Hash, out: object, chunk: bytes) -> None:
    hasher.update(chunk)
    out.write(chunk)  # type: ignore[attr-defined]
