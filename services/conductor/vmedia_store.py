"""Virtual-media images in the object store: the conductor's ``MediaImages`` (drivers/media.py).

Three kinds of object, in ``vmedia_container`` (docs/virtual-media.md, "Objects"):

- ``image-<node uuid>``: the parameters floppy (api URL, node UUID, agent
  token). It expires ``deploy_helper_images_ttl`` seconds after upload, as does
  its temp URL; clean up deletes it earlier.
- ``boot-<hash of the recipe>.iso``: a boot ISO every node with the same
  kernel, ramdisk, command line and image shares. Its ``usage_count`` is the
  number of nodes using it; the last release deletes it. The first conductor
  to need it builds it under an advisory lock named after it, so concurrent
  deploys of one image build it once.
- ``boot-<node uuid>.iso``: a node's own ISO, when its command line carries
  its parameters (no floppy slot) or a config drive is folded in (a BMC with
  one slot). Deploy ISOs expire with the TTL; instance ISOs live until clean up.
- ``configdrive-<node uuid>.iso``: a netbooting instance's config drive, kept
  for the instance's life (the deploy's own copy expires with the call-back
  timeout) and attached again at every power on.

Kernels, ramdisks and ESP images are downloaded to the work directory only
while an ISO is built; a failed build leaves neither files nor objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from services.common import errors
from services.common.db.advisory import AdvisoryLocks
from services.common.images import boot_iso, efi, floppy, iso9660
from services.conductor.configdrive_store import ConfigDriveStore
from services.conductor.drivers.base import Task
from services.conductor.drivers.media import IsoRecipe

LOG = logging.getLogger(__name__)
CHUNK = 1024 * 1024
REACHABLE_TIMEOUT = 10.0
MAX_KERNEL_BYTES = 256 * 1024**2
MAX_ESP_BYTES = efi.MAX_ESP_BYTES


@dataclass
class _LocalLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class VirtualMediaStore:
    def __init__(
        self,
        *,
        objectstore: Any | None,
        locks: AdvisoryLocks,
        configdrives: ConfigDriveStore,
        container: str,
        ttl: int,
        work_dir: Path,
        api_url: Callable[[], str],
        download_timeout: float = 60.0,
        max_download: int = 2 * 1024**3,
    ) -> None:
        self.objectstore = objectstore
        self.locks = locks
        self.configdrives = configdrives
        self.container = container
        self.ttl = ttl
        self.work_dir = work_dir
        self._api_url = api_url
        self.download_timeout = download_timeout
        self.max_download = max_download
        self.builds = 0  # ISOs this conductor built (bench/vmedia.py, the cache tests)
        self._local: dict[str, _LocalLock] = {}
        self._default_esp: bytes | None = None
        self._esp_lock = asyncio.Lock()

    # ---- what the boot interfaces call ----------------------------------------------------

    def api_url(self) -> str:
        url = self._api_url()
        if not url:
            raise errors.ImageError(
                "the conductor does not know the api URL the agent must call back "
                "(set FERRUM_CONDUCTOR_VMEDIA_API_URL or the api's public_endpoint)"
            )
        return url.rstrip("/")

    async def publish_floppy(self, node_uuid: str, parameters: Mapping[str, str]) -> str:
        store = self._store()
        image = await asyncio.to_thread(floppy.create_vfat_image, parameters, work_dir=str(self._work()))
        name = f"image-{node_uuid}"
        await store.put_bytes(
            self.container, name, image, delete_after=self.ttl, metadata={"node_uuid": node_uuid, "kind": "floppy"}
        )
        LOG.info("virtual floppy stored node_uuid=%s object=%s ttl=%s", node_uuid, name, self.ttl)
        return str(await store.temp_url(self.container, name, lifetime=self.ttl))

    async def remove_floppy(self, node_uuid: str) -> None:
        await self._store().delete(self.container, f"image-{node_uuid}", missing_ok=True)

    async def acquire_shared_iso(self, recipe: IsoRecipe) -> str:
        store = self._store()
        name = recipe.cache_name()
        async with self._building(name):
            try:
                info = await store.update_metadata(self.container, name, usage_delta=1)
                LOG.info("boot ISO reused object=%s usage_count=%d", name, info.usage_count)
                return name
            except errors.NotFound:
                pass
            await self._build_and_store(name, recipe, usage_count=1, expires=False, metadata={"kind": "shared"})
        return name

    async def shared_iso_url(self, name: str) -> str | None:
        store = self._store()
        if await store.stat(self.container, name) is None:
            return None
        return str(await store.temp_url(self.container, name, lifetime=self.ttl))

    async def release_shared_iso(self, name: str) -> None:
        try:
            count, deleted = await self._store().release(self.container, name)
        except errors.NotFound:
            LOG.warning("boot ISO already gone at release object=%s", name)
            return
        LOG.info("boot ISO released object=%s usage_count=%d deleted=%s", name, count, deleted)

    async def publish_node_iso(
        self, node_uuid: str, recipe: IsoRecipe, *, inject: Mapping[str, bytes] | None = None, expires: bool = True
    ) -> str:
        name = f"boot-{node_uuid}.iso"
        await self._build_and_store(
            name, recipe, usage_count=0, expires=expires, inject=inject, metadata={"node_uuid": node_uuid}
        )
        return str(await self._store().temp_url(self.container, name, lifetime=self.ttl))

    async def node_iso_url(self, node_uuid: str) -> str | None:
        return await self.shared_iso_url(f"boot-{node_uuid}.iso")

    async def remove_node_iso(self, node_uuid: str) -> None:
        await self._store().delete(self.container, f"boot-{node_uuid}.iso", missing_ok=True)

    async def check_reachable(self, url: str, what: str) -> None:
        """A HEAD (a GET of one byte where HEAD is refused), bounded by REACHABLE_TIMEOUT."""
        timeout = aiohttp.ClientTimeout(total=REACHABLE_TIMEOUT)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.head(url, allow_redirects=True) as reply:
                    status = reply.status
                if status in (405, 501):
                    async with session.get(url, headers={"Range": "bytes=0-0"}) as reply:
                        status = reply.status
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise errors.ImageError(f"the {what} {url} is unreachable: {exc or type(exc).__name__}") from None
        if status >= 400:
            raise errors.ImageError(f"the {what} {url} is unreachable: HTTP {status}")

    async def configdrive(self, task: Task) -> tuple[str, dict[str, bytes]] | None:
        store = self._store()
        uuid = task.node["uuid"]
        name = f"configdrive-{uuid}.iso"
        if await store.stat(self.container, name) is None:
            if task.node["instance_info"].get("configdrive") in (None, ""):
                return None
            # The deploy's copy expires with the call-back timeout; the instance keeps its own.
            await self.configdrives.publish(task)
            data = await store.get_bytes(self.configdrives.container, self.configdrives.object_name(uuid))
            await store.put_bytes(self.container, name, data, metadata={"node_uuid": uuid, "kind": "configdrive"})
        else:
            data = await store.get_bytes(self.container, name)

        def files() -> dict[str, bytes]:
            return iso9660.read_iso_files(io.BytesIO(data))

        url = str(await store.temp_url(self.container, name, lifetime=self.ttl))
        return url, await asyncio.to_thread(files)

    async def remove_configdrive(self, node_uuid: str) -> None:
        await self._store().delete(self.container, f"configdrive-{node_uuid}.iso", missing_ok=True)

    # ---- building -------------------------------------------------------------------------

    def _store(self) -> Any:
        if self.objectstore is None:
            raise errors.ImageError("virtual-media boot needs the object store (FERRUM_CONDUCTOR_OBJECTSTORE_ADDRESS)")
        return self.objectstore

    def _work(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return self.work_dir

    @contextlib.asynccontextmanager
    async def _building(self, name: str) -> AsyncIterator[None]:
        """One builder of ``name`` at a time: in this process (so waiters hold no database
        connection), then across conductors (the advisory lock)."""
        entry = self._local.setdefault(name, _LocalLock())
        entry.users += 1
        try:
            async with entry.lock, self.locks.hold(f"vmedia-iso:{self.container}/{name}"):
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._local[name]

    async def _build_and_store(
        self,
        name: str,
        recipe: IsoRecipe,
        *,
        usage_count: int,
        expires: bool,
        metadata: Mapping[str, str],
        inject: Mapping[str, bytes] | None = None,
    ) -> None:
        store = self._store()
        work = await asyncio.to_thread(self._work)
        tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="build-", dir=work))
        try:
            kernel = await self._download(recipe.kernel, tmp / "kernel", "kernel", MAX_KERNEL_BYTES)
            ramdisk = await self._download(recipe.ramdisk, tmp / "ramdisk", "ramdisk", self.max_download)
            esp = await self._esp(recipe.bootloader, tmp)
            started = asyncio.get_running_loop().time()
            out = await asyncio.to_thread(
                boot_iso.create_iso_image,
                tmp / "boot.iso",
                kernel=kernel,
                ramdisk=ramdisk,
                kernel_params=recipe.kernel_params,
                bios=boot_iso.BiosLoader(),
                esp=esp,
                publisher=name[:128],
                inject=inject,
            )
            built = asyncio.get_running_loop().time() - started
            await store.put_file(
                self.container,
                name,
                out,
                delete_after=self.ttl if expires else 0,
                usage_count=usage_count,
                content_type="application/x-iso9660-image",
                metadata={**metadata, "kernel": recipe.kernel[:512], "ramdisk": recipe.ramdisk[:512]},
            )
            self.builds += 1
            LOG.info("boot ISO built object=%s seconds=%.2f usage_count=%d", name, built, usage_count)
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)

    async def _esp(self, bootloader: str, tmp: Path) -> bytes:
        """The EFI system partition: the node's ``bootloader`` image, else Ferrum's GRUB (built once)."""
        if bootloader:
            path = await self._download(
                bootloader, tmp / "esp.img", "bootloader (EFI system partition image)", MAX_ESP_BYTES
            )
            return await asyncio.to_thread(path.read_bytes)
        async with self._esp_lock:
            if self._default_esp is None:

                def build() -> bytes:
                    grub = efi.build_grub_efi(self._work() / "BOOTX64.EFI")
                    return efi.build_esp({"EFI/BOOT/BOOTX64.EFI": grub}, work_dir=str(self._work()))

                self._default_esp = await asyncio.to_thread(build)
        return self._default_esp

    async def _download(self, url: str, dest: Path, what: str, limit: int) -> Path:
        """Fetch ``url`` to ``dest`` (bounded in size and time); ImageError naming the URL otherwise."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.download_timeout, sock_read=self.download_timeout)
        written = 0
        digest = hashlib.sha256()
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as reply:
                if reply.status >= 300:
                    raise errors.ImageError(f"downloading the {what} {url} failed: HTTP {reply.status}")
                out = await asyncio.to_thread(open, dest, "wb")
                try:
                    async for chunk in reply.content.iter_chunked(CHUNK):
                        written += len(chunk)
                        if written > limit:
                            raise errors.ImageError(f"the {what} {url} is larger than {limit} bytes")
                        digest.update(chunk)
                        await asyncio.to_thread(out.write, chunk)
                finally:
                    await asyncio.to_thread(out.close)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise errors.ImageError(f"downloading the {what} {url} failed: {exc or type(exc).__name__}") from None
        except OSError as exc:
            raise errors.ImageError(f"storing the {what} from {url} failed: {exc.strerror or exc}") from None
        LOG.debug("downloaded %s url=%s bytes=%d sha256=%s", what, url, written, digest.hexdigest())
        return dest
