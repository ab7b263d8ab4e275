"""The conductor's image cache (iSCSI deploy): by content, verified, bounded,
one download per image however many deploys ask at once, and never an
eviction of an image a deploy holds. A real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from services.common import errors
from services.common.aiohttp_serving import start_http_site
from services.conductor.image_cache import ImageCache, ImageRef, image_ref

MiB = 1024 * 1024


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, bytes], list[str]]]:
    images = {f"img{i}": os.urandom(MiB) for i in range(3)}
    requests: list[str] = []

    async def get(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        requests.append(name)
        await asyncio.sleep(0.05)  # long enough for concurrent askers to overlap
        return web.Response(body=images[name])

    app = web.Application()
    app.router.add_get("/{name}", get)
    runner, port = await start_http_site(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", images, requests
    finally:
        await runner.cleanup()


def ref(base: str, images: dict[str, bytes], name: str) -> ImageRef:
    return ImageRef(url=f"{base}/{name}", algo="sha256", value=hashlib.sha256(images[name]).hexdigest())


async def test_one_download_for_many_askers_and_bytes_verified(
    tmp_path: Path, served: tuple[str, dict[str, bytes], list[str]]
) -> None:
    base, images, requests = served
    cache = ImageCache(tmp_path / "cache", max_bytes=10 * MiB)
    wanted = ref(base, images, "img0")

    async def use() -> bytes:
        async with cache.image(wanted) as path:
            return path.read_bytes()

    got = await asyncio.gather(*(use() for _ in range(5)))
    assert got == [images["img0"]] * 5 and requests == ["img0"] and cache.downloads == 1


async def test_a_wrong_checksum_never_enters_the_cache(
    tmp_path: Path, served: tuple[str, dict[str, bytes], list[str]]
) -> None:
    base, _, _ = served
    cache = ImageCache(tmp_path / "cache", max_bytes=10 * MiB)
    bad = ImageRef(url=f"{base}/img1", algo="sha256", value="0" * 64)
    with pytest.raises(errors.ChecksumMismatch):
        async with cache.image(bad):
            pass
    assert list((tmp_path / "cache").iterdir()) == []


async def test_least_recently_used_is_evicted_but_never_one_in_use(
    tmp_path: Path, served: tuple[str, dict[str, bytes], list[str]]
) -> None:
    base, images, _ = served
    cache = ImageCache(tmp_path / "cache", max_bytes=2 * MiB + MiB // 2)  # room for two
    first, second, third = (ref(base, images, n) for n in ("img0", "img1", "img2"))
    async with cache.image(first):
        async with cache.image(second):
            pass
        os.utime(cache.path_of(second), (1, 1))  # second is the least recently used
        async with cache.image(third):  # first is held: second goes, the bound holds
            assert cache.path_of(first).exists() and not cache.path_of(second).exists()
    async with cache.image(second):  # now first is not held and least recently used: it goes
        pass
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([second.key, third.key])


def test_image_ref_reads_instance_info() -> None:
    info = {"image_source": "http://h/i", "image_os_hash_algo": "sha512", "image_os_hash_value": "a" * 128}
    assert image_ref(info) == ImageRef(url="http://h/i", algo="sha512", value="a" * 128)
    assert image_ref({"image_source": "http://h/i", "image_checksum": "B" * 64}).algo == "sha256"
    with pytest.raises(errors.InvalidParameterValue, match="MD5"):
        image_ref({"image_source": "http://h/i", "image_checksum": "c" * 32})
    with pytest.raises(errors.InvalidParameterValue, match="hex"):
        image_ref({"image_source": "http://h/i", "image_os_hash_algo": "sha256", "image_os_hash_value": "zz"})
