"""Boot from volume, scenario 5: real iPXE loads a kernel and initramfs whose
command line says ``root=/dev/nfs nfsroot=<server>:<path>,<options> ip=dhcp rw``,
and the machine runs with that NFS export as its root.

The export is served by NFS-Ganesha (``tests/e2e/nfs_server.py``, NFSv4 on
127.0.0.1, 10.0.2.2 from the guest); the kernel and initramfs come from
``tests/e2e/bootfiles.py`` (``ensure_nfs_initramfs``). The iPXE script here
is written by hand; ``nfs_root_boot`` gives what a renderer needs to write
the same one (the ``nfsroot=`` value and the kernel/initrd files).
"""

from __future__ import annotations

import asyncio
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.e2e.bootfiles import NFS_ROOT_MARKER_PREFIX, NfsBootFiles, ensure_nfs_initramfs, ensure_packages
from tests.e2e.nfs_server import (
    GUEST_HOST,
    NfsRootBoot,
    NfsServer,
    ensure_nfs_packages,
    nfs_root_boot,
    running_nfs_server,
)
from tests.e2e.test_ipxe_qemu import start_vm, stop_vm, wait_for_text

BOOT_WAIT = 240.0
NFS_MAC = "52:54:00:e2:e0:5f"

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def nfs_boot_files() -> NfsBootFiles:
    """Packages, kernel and the NFS-root initramfs, before anything else starts."""
    ensure_packages()
    ensure_nfs_packages()
    return ensure_nfs_initramfs()


@pytest.fixture(scope="module")
def nfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NfsServer]:
    marker = f"nfs-root-marker-{uuidlib.uuid4().hex[:12]}"
    with running_nfs_server(tmp_path_factory.mktemp("nfs"), marker=marker) as server:
        yield server


@pytest.fixture(scope="module")
def boot(nfs_server: NfsServer, nfs_boot_files: NfsBootFiles) -> NfsRootBoot:
    return nfs_root_boot(nfs_server, nfs_boot_files)


@pytest.fixture(scope="module")
async def boot_server(boot: NfsRootBoot) -> AsyncIterator[tuple[int, list[str]]]:
    """The hand-written iPXE script, the kernel and the initramfs over HTTP on 127.0.0.1."""
    fetched: list[str] = []
    holder: dict[str, str] = {}

    async def serve(request: web.Request) -> web.StreamResponse:
        fetched.append(request.path)
        if request.path == "/boot.ipxe":
            return web.Response(text=holder["script"])
        path = {"/vmlinuz": boot.kernel, "/initrd": boot.initrd}.get(request.path)
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path)

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    holder["script"] = boot.ipxe_script(f"http://{GUEST_HOST}:{port}")
    try:
        yield port, fetched
    finally:
        await runner.cleanup()


async def test_ipxe_boots_a_machine_onto_an_nfs_root(
    boot: NfsRootBoot, nfs_server: NfsServer, boot_server: tuple[int, list[str]], tmp_path: Path
) -> None:
    port, fetched = boot_server
    serial = tmp_path / "nfs.serial"
    started = time.monotonic()
    vm = await start_vm(
        serial, boot_url=f"http://{GUEST_HOST}:{port}/boot.ipxe", mac=NFS_MAC, smbios_uuid=str(uuidlib.uuid4())
    )
    try:
        out = await wait_for_text(serial, [NFS_ROOT_MARKER_PREFIX + boot.marker], vm, BOOT_WAIT)
        booted_after = time.monotonic() - started
        # /sbin/init on the export writes /ferrum-booted, syncs and powers off.
        deadline = time.monotonic() + 60
        while vm.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
    finally:
        await stop_vm(vm)
    print(f"NFS root marker on the console {booted_after:.1f} s after QEMU started")
    assert fetched[:3] == ["/boot.ipxe", "/vmlinuz", "/initrd"]
    assert f"ferrum-nfsroot: kernel command line: {boot.kernel_args()}" in out
    # The initramfs mounted the export, then the export's own /sbin/init ran with it as /.
    assert f"ferrum-nfsroot: mounted: {GUEST_HOST}:/export /newroot nfs4 rw," in out
    assert "switching to the NFS root's /sbin/init" in out
    assert f"ferrum-nfsroot: / is now: {GUEST_HOST}:/export / nfs4 rw," in out
    booted = nfs_server.export / "ferrum-booted"
    assert booted.is_file() and booted.read_text().startswith("booted 6.1."), "the guest's write never reached"
