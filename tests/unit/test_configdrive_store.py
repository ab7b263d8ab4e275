"""The deploy verb's config drive check (``ConfigDriveStore.checking``), the hand-off
of the image it decoded to the deploy's ``store`` without an object store (the
drive then stays inline, re-encoded from the image), and with one, which drives
stay inline as sent and which are uploaded."""

from __future__ import annotations

import asyncio
import base64
import gc
from typing import Any

import pytest

from services.common import errors
from services.common.images import configdrive
from services.conductor.configdrive_store import ConfigDriveStore
from services.conductor.drivers.base import Task

NODE: dict[str, Any] = {"uuid": "1be26c0b-03f2-4d2d-ae87-c02d7f33c123", "name": "cd-store", "instance_info": {}}


def inline_store() -> ConfigDriveStore:
    return ConfigDriveStore(objectstore=None, container="c", lifetime=60, inline_limit=4 * 1024 * 1024)


async def test_checking_decodes_an_inline_drive_and_refuses_a_bad_one() -> None:
    iso = configdrive.build_configdrive(NODE, [], {"meta_data": {"hostname": "a"}})
    async with inline_store().checking(configdrive.encode_configdrive(iso)) as job:
        assert job is not None and await job == iso
    async with inline_store().checking("H4sIAAAA") as job:  # truncated gzip
        assert job is not None
        with pytest.raises(errors.InvalidParameterValue):
            await job
    nothing_to_decode: tuple[Any, ...] = (None, "", "http://images/drive.iso", {"meta_data": {}})
    for nothing in nothing_to_decode:
        async with inline_store().checking(nothing) as job:
            assert job is None


async def test_a_check_left_unawaited_is_dropped_without_an_unretrieved_error() -> None:
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: seen.append(context))
    async with inline_store().checking("H4sIAAAA") as job:
        assert job is not None
        # The request is refused (a locked node) after the decoding failed, without awaiting it.
        await asyncio.wait_for(asyncio.wait({job}), 10)
    assert job.done() and not job.cancelled()
    del job
    gc.collect()  # an error nobody retrieved is reported when its future is collected
    assert seen == []


async def test_store_uses_the_decoded_image_once_and_lets_it_go() -> None:
    first = configdrive.build_configdrive(NODE, [], {"meta_data": {"hostname": "first"}})
    second = configdrive.build_configdrive(NODE, [], {"meta_data": {"hostname": "second"}})
    node = {**NODE, "instance_info": {"configdrive": configdrive.encode_configdrive(first)}}
    task = Task(node=node, ports=[], driver=None, conductor="c")  # type: ignore[arg-type]  # store reads no interface
    task.configdrive_image = second  # what the verb decoded (a different image, to see which is used)
    stored = await inline_store().store(task)
    assert stored is not None and configdrive.decode_configdrive(stored) == second
    assert task.configdrive_image is None
    again = await inline_store().store(task)  # a resumed deploy decodes the string itself
    assert again is not None and configdrive.decode_configdrive(again) == first


class RecordingObjectStore:
    """The object store calls ConfigDriveStore makes, recorded (the stack tests use the real one)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls: list[str] = []

    async def put_small(self, container: str, name: str, data: bytes, **_: Any) -> tuple[None, str]:
        self.calls.append(f"put {name}")
        self.objects[name] = bytes(data)
        return None, f"http://objects/{container}/{name}?temp_url_sig=x"

    async def delete(self, container: str, name: str, *, missing_ok: bool = False) -> None:
        self.calls.append(f"delete {name}")
        self.objects.pop(name, None)


def object_store_backed(threshold: int = 64 * 1024) -> tuple[ConfigDriveStore, RecordingObjectStore]:
    objects = RecordingObjectStore()
    drives = ConfigDriveStore(
        objectstore=objects, container="c", lifetime=60, inline_limit=4 * 1024 * 1024, upload_threshold=threshold
    )
    return drives, objects


def task_with(value: Any) -> Task:
    node = {**NODE, "instance_info": {"configdrive": value}}
    return Task(node=node, ports=[], driver=None, conductor="c")  # type: ignore[arg-type]  # store reads no interface


async def test_a_small_gzip_string_stays_inline_as_sent_and_nothing_is_uploaded_or_deleted() -> None:
    iso = configdrive.build_configdrive(NODE, [], {"meta_data": {"hostname": "small"}})
    value = configdrive.encode_configdrive(iso)
    assert len(value) < 64 * 1024
    drives, objects = object_store_backed()
    task = task_with(value)
    task.configdrive_image = iso
    assert await drives.store(task) == value
    assert task.configdrive_image is None and objects.calls == []
    await drives.remove(task)
    assert objects.calls == []  # nothing was stored for it


async def test_what_stays_inline_is_uploaded_when_asked_larger_or_not_gzip() -> None:
    iso = configdrive.build_configdrive(NODE, [], {"meta_data": {"hostname": "big"}})
    value = configdrive.encode_configdrive(iso)
    name = f"configdrive-{NODE['uuid']}"
    # Over the threshold: uploaded, and the node keeps the URL, which tear down deletes.
    drives, objects = object_store_backed(threshold=len(value) - 1)
    url = await drives.store(task_with(value))
    assert url is not None and url.startswith("http://objects/c/") and objects.objects[name] == iso
    await drives.remove(task_with(url))
    assert objects.calls == [f"put {name}", f"delete {name}"]
    # Plain base64 of the image (accepted, but IPA only gunzips inline strings): uploaded.
    drives, objects = object_store_backed()
    plain = base64.b64encode(iso).decode()
    assert not configdrive.is_gzip_base64(plain) and configdrive.is_gzip_base64(value)
    assert (await drives.store(task_with(plain)) or "").startswith("http://") and objects.objects[name] == iso
    # Virtual media needs a URL even for a small string (publish).
    drives, objects = object_store_backed()
    assert (await drives.publish(task_with(value))).startswith("http://") and objects.objects[name] == iso
    # Threshold 0: every drive is uploaded.
    drives, objects = object_store_backed(threshold=0)
    assert (await drives.store(task_with(value)) or "").startswith("http://") and objects.calls == [f"put {name}"]
