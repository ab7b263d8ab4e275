"""The deploy verb's config drive check (``ConfigDriveStore.checking``) and the hand-off
of the image it decoded to the deploy's ``store``, without an object store (the
drive then stays inline, re-encoded from the image)."""

from __future__ import annotations

import asyncio
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
