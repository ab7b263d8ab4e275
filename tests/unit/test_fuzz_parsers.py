"""Property-based tests for every parser of untrusted bytes (issue 15).

Each parser gets valid input made by the real tools, mutated by hypothesis
(bytes overwritten, fields set to extreme values, checksums fixed up so the
mutation reaches past them), plus plain random bytes. The property is always
the same: the parser returns a bounded, well-formed result or raises its one
documented error, and never hangs, crashes with another exception or
allocates what the bytes ask for. The runs are derandomized and bounded in
examples so CI sees the same inputs every time and each test takes seconds.
"""

from __future__ import annotations

import asyncio
import binascii
import io
import json
import os
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common import errors
from services.common.images import configdrive_reader, fat, filesystems, iso9660, qcow2stream
from services.common.images.partition_table import read_partition_table

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
MiB = 1024 * 1024


def mutate(seed: bytes, edits: list[tuple[int, int]]) -> bytes:
    data = bytearray(seed)
    for position, value in edits:
        data[position % len(data)] = value
    return bytes(data)


def edits_in(size: int, *, max_size: int = 24) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 255)), max_size=max_size)


def extremes(width: int) -> st.SearchStrategy[int]:
    top = (1 << (8 * width)) - 1
    return st.one_of(
        st.sampled_from([v for v in (0, 1, 2, 127, 128, 4096, top // 2, top - 1, top) if v <= top]), st.integers(0, top)
    )


# ---- qcow2 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qcow2_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    work = tmp_path_factory.mktemp("qcow2fuzz")
    raw = work / "src.raw"
    with open(raw, "wb") as fp:
        fp.truncate(MiB)
        fp.seek(4096)
        fp.write(os.urandom(64 * 1024))
        fp.seek(700 * 1024)
        fp.write(b"ferrum" * 5000)
    images = {}
    for name, opts in (("plain", []), ("compressed", ["-c"]), ("small clusters", ["-o", "cluster_size=4096"])):
        out = work / f"{name}.qcow2"
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", *opts, str(raw), str(out)], check=True)
        images[name] = out.read_bytes()
    return images


HEADER_FIELDS = [(">I", 4), (">Q", 8), (">I", 16), (">I", 20), (">Q", 24), (">I", 32), (">I", 36), (">Q", 40)]


@FUZZ
@given(data=st.data())
def test_qcow2_header_never_trusts_its_fields(qcow2_images: dict[str, bytes], data: st.DataObject) -> None:
    head = bytearray(qcow2_images[data.draw(st.sampled_from(sorted(qcow2_images)))][:512])
    for fmt, offset in data.draw(st.lists(st.sampled_from(HEADER_FIELDS), max_size=3)):
        struct.pack_into(fmt, head, offset, data.draw(extremes(struct.calcsize(fmt))))
    head = bytearray(mutate(bytes(head), data.draw(edits_in(512, max_size=6))))
    head = head[: data.draw(st.sampled_from([512, 104, 72, 71]))]
    try:
        header = qcow2stream.parse_header(bytes(head))
    except (errors.ImageError, qcow2stream.Unsupported):
        return
    assert 8 * header.l1_size <= qcow2stream.MAX_L1_BYTES
    assert 9 <= header.cluster_bits <= 21
    assert header.l1_size * (header.cluster_size * header.cluster_size // 8) >= header.virtual_size


@FUZZ
@given(data=st.data())
def test_qcow2_tables_and_clusters_never_trusted(
    qcow2_images: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    image = qcow2_images[data.draw(st.sampled_from(sorted(qcow2_images)))]
    # Mutations mostly where the tables are: the header cluster, the L1 and the first L2 tables.
    image = mutate(image, data.draw(edits_in(min(len(image), 4 * 65536), max_size=12)))
    image = image[: data.draw(st.integers(512, len(image)))]
    disk = tmp_path_factory.getbasetemp() / "qcow2-fuzz-disk.img"
    fd = os.open(disk, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        os.ftruncate(fd, 2 * MiB)
        header = qcow2stream.parse_header(image[:512])
        converter = qcow2stream.StreamingConverter(header, fd, 2 * MiB, spool_dir=str(disk.parent))
        try:
            piece = data.draw(st.sampled_from([4096, 65536, 1 << 20]))
            for pos in range(0, len(image), piece):
                converter.feed(memoryview(image)[pos : pos + piece], pos)
                assert converter._held <= qcow2stream.MAX_HELD_BYTES
            assert converter.finish() == header.virtual_size <= 2 * MiB
        finally:
            converter.close()
    except (errors.ImageError, qcow2stream.Unsupported):
        pass
    finally:
        os.close(fd)


def test_qcow2_l1_size_from_the_header_is_capped() -> None:
    """The example in the issue: 8 * l1_size was allocated straight from the header."""
    head = bytearray(512)
    struct.pack_into(">4sIQIIQIIQ", head, 0, b"QFI\xfb", 2, 0, 0, 16, 1 << 40, 0, 0xFFFFFFFF, 65536)
    with pytest.raises(errors.ImageError, match="larger than 33554432 bytes"):
        qcow2stream.parse_header(bytes(head))
    struct.pack_into(">I", head, 36, 1)  # one L1 entry maps 512 MiB with 64 KiB clusters: too few for 1 TiB
    with pytest.raises(errors.ImageError, match="too small"):
        qcow2stream.parse_header(bytes(head))


def test_qcow2_overlapping_tables_are_refused(tmp_path: Path) -> None:
    """Every L1 entry pointing at one L2 table would make the reader hold that table thousands of times."""
    cs = 65536
    l1_size = 4096
    image = bytearray(4 * cs)
    struct.pack_into(">4sIQIIQIIQ", image, 0, b"QFI\xfb", 2, 0, 0, 16, l1_size * (cs * cs // 8), 0, l1_size, cs)
    for index in range(l1_size):
        struct.pack_into(">Q", image, cs + 8 * index, 2 * cs)
    header = qcow2stream.parse_header(bytes(image[:512]))
    fd = os.open(tmp_path / "disk", os.O_RDWR | os.O_CREAT)
    try:
        converter = qcow2stream.StreamingConverter(header, fd, header.virtual_size, spool_dir=str(tmp_path))
        with pytest.raises(errors.ImageError, match="used by two L1 entries"):
            converter.feed(memoryview(bytes(image)), 0)
        converter.close()
    finally:
        os.close(fd)


# ---- partition tables --------------------------------------------------------------------


def _gpt_fix_crcs(disk: bytearray) -> None:
    header_size = min(max(struct.unpack_from("<I", disk, 512 + 12)[0], 92), 512)
    entries_lba, count, esize = struct.unpack_from("<QII", disk, 512 + 72)
    start, length = entries_lba * 512, count * esize
    if start + length <= len(disk) and length <= 4 * MiB:
        struct.pack_into("<I", disk, 512 + 88, binascii.crc32(disk[start : start + length]))
    struct.pack_into("<I", disk, 512 + 16, 0)
    struct.pack_into("<I", disk, 512 + 16, binascii.crc32(disk[512 : 512 + header_size]))


@pytest.fixture(scope="module")
def disks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    work = tmp_path_factory.mktemp("ptfuzz")
    made = {}
    for name, argv, stdin in (
        ("gpt", ["sgdisk", "-n1:34:+64K", "-c1:config-2", "-n2:0:+128K", "-t2:ef00"], None),
        (
            "mbr",
            ["sfdisk", "-q"],
            "label: dos\nstart=8, size=64, type=83\nstart=80, size=600, type=5\n"
            "start=96, size=64, type=83\nstart=200, size=64, type=c\n",
        ),
    ):
        path = work / name
        with open(path, "wb") as fp:
            fp.truncate(MiB)
        subprocess.run([*argv, str(path)], input=stdin, text=True, check=True, capture_output=True)
        made[name] = path.read_bytes()
    iso = iso9660.write_iso({"a": b"x"}, label="config-2")
    made["gpt"] = made["gpt"][: 34 * 512] + iso[: 64 * 1024] + made["gpt"][34 * 512 + 64 * 1024 :]
    return made


GPT_FIELDS = [("<I", 12), ("<Q", 24), ("<Q", 32), ("<Q", 40), ("<Q", 48), ("<Q", 72), ("<I", 80), ("<I", 84)]


@FUZZ
@given(data=st.data())
def test_partition_table_reader_bounds_everything(disks: dict[str, bytes], data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["gpt", "mbr", "random"]))
    if kind == "random":
        disk = bytearray(data.draw(st.binary(min_size=0, max_size=4096)))
        disk[510:512] = b"\x55\xaa" if len(disk) >= 512 and data.draw(st.booleans()) else disk[510:512]
    else:
        disk = bytearray(disks[kind])
        if kind == "gpt":
            for fmt, offset in data.draw(st.lists(st.sampled_from(GPT_FIELDS), max_size=3)):
                struct.pack_into(fmt, disk, 512 + offset, data.draw(extremes(struct.calcsize(fmt))))
            entry = data.draw(st.integers(0, 3))
            for offset in data.draw(st.lists(st.sampled_from([32, 40]), max_size=2)):  # first/last LBA
                struct.pack_into("<Q", disk, 1024 + 128 * entry + offset, data.draw(extremes(8)))
        disk = bytearray(mutate(bytes(disk), data.draw(edits_in(34 * 512 if kind == "gpt" else 200 * 512))))
        if kind == "gpt" and data.draw(st.booleans()):
            _gpt_fix_crcs(disk)
        disk = disk[: data.draw(st.sampled_from([len(disk), 600 * 512, 40 * 512, 512]))]
    try:
        table = read_partition_table(io.BytesIO(bytes(disk)))
    except errors.ImageFormatError:
        return
    assert table.table in ("gpt", "mbr")
    assert len(table.partitions) <= 4096 + 4
    assert len([p for p in table.partitions if p.kind == "logical"]) <= 128
    for part in table.partitions:
        assert part.sectors >= 1 and part.number >= 1
        assert part.beyond_end == (part.end >= table.disk_sectors) or part.kind == "extended"
        if part.beyond_end:
            assert part.labels == () and part.filesystem == ""


@FUZZ
@given(boot=st.binary(min_size=0, max_size=4096), signature=st.booleans(), fields=st.data())
def test_file_system_probe_on_any_bytes(boot: bytes, signature: bool, fields: st.DataObject) -> None:
    data = bytearray(boot.ljust(4096, b"\0"))
    if signature:
        data[510:512] = b"\x55\xaa"
        struct.pack_into("<HBHBHHBH", data, 11, *[fields.draw(extremes(w)) for w in (2, 1, 2, 1, 2, 2, 1, 2)])
    found = filesystems.probe(io.BytesIO(bytes(data)), 0)
    assert found.kind in ("", "iso9660", "vfat", "ext", "xfs", "swap")
    assert all(isinstance(label, str) for label in found.labels)
    assert fat.is_fat(bytes(data[:512])) == (found.kind == "vfat") or found.kind == "iso9660"


# ---- ISO9660 and the config-drive reader ----------------------------------------------------


@pytest.fixture(scope="module")
def drive_iso() -> bytes:
    return iso9660.write_iso(
        {
            "openstack/2012-08-10/meta_data.json": json.dumps({"uuid": "u", "hostname": "h"}).encode(),
            "openstack/latest/meta_data.json": json.dumps({"uuid": "u", "hostname": "h"}).encode(),
            "openstack/latest/user_data": b"#cloud-config\n" * 100,
            "openstack/content/0000": b"x" * 5000,
        },
        label="config-2",
    )


@FUZZ
@given(data=st.data())
def test_iso_reader_and_config_drive_reader_on_damaged_images(drive_iso: bytes, data: st.DataObject) -> None:
    # The volume descriptors and the directory records and path tables that follow them.
    edits = data.draw(edits_in(len(drive_iso), max_size=16))
    focused = [(16 * 2048 + p % (12 * 2048), v) for p, v in data.draw(edits_in(12 * 2048, max_size=16))]
    iso = mutate(drive_iso, edits + focused)
    iso = iso[: data.draw(st.sampled_from([len(iso), len(iso) - 2048, 18 * 2048]))]
    try:
        with iso9660.IsoVolume(io.BytesIO(iso)) as volume:
            for path in volume.files():
                assert len(volume.read(path, limit=1 * MiB)) <= 1 * MiB
    except errors.ImageFormatError:
        pass
    try:
        drive = configdrive_reader.read_configdrive(iso)
    except errors.ConfigDriveInvalid:
        return
    assert isinstance(drive.meta_data, dict) and drive.layout in (1, 2)


@FUZZ
@given(blob=st.binary(min_size=0, max_size=40 * 1024))
def test_iso_reader_on_random_bytes(blob: bytes) -> None:
    data = blob.ljust(17 * 2048, b"\0")[: 40 * 1024]
    data = data[: 16 * 2048] + b"\x01CD001\x01" + data[16 * 2048 + 7 :]
    with pytest.raises(errors.ImageFormatError):
        iso9660.IsoVolume(io.BytesIO(data)).close()


# ---- FAT (mtools) -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def floppy() -> bytes:
    return fat.write_image(
        {"parameters.txt": b"ipa-api-url=http://x\n", "openstack/latest/meta_data.json": b'{"uuid": "f"}'},
        label="ir-vfd-dev",
    )


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_fat_reader_on_damaged_images(
    floppy: bytes, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    # The boot sector, both FATs and the root directory of a 1.44 MB floppy live in its first 19 sectors.
    image = mutate(floppy, data.draw(edits_in(19 * 512, max_size=20)))
    path = tmp_path_factory.getbasetemp() / "fat-fuzz.img"
    path.write_bytes(image)
    try:
        volume = fat.FatVolume(path)
        for name in volume.files():
            assert len(volume.read(name, limit=64 * 1024)) <= 64 * 1024
    except errors.ImageFormatError:
        pass
    labels = fat.volume_labels(io.BytesIO(image), 0)
    assert all(len(label) <= 11 for label in labels)


# ---- the iPXE HTTP request parser --------------------------------------------------------------


class RecordingTransport(asyncio.Transport):
    """asyncio's transport interface, recording what the server writes (no socket needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def _request() -> st.SearchStrategy[bytes]:
    token = st.binary(min_size=0, max_size=40)
    methods = st.sampled_from([b"GET", b"HEAD", b"POST", b"BREW", b"G\0T", b""])
    targets = st.one_of(
        st.sampled_from([b"/boot.ipxe", b"/ipxe?mac=52:54:00:12:34:56", b"/ipxe?uuid=x", b"/metrics", b"*", b"/"]),
        token,
        st.just(b"/" + b"a" * 9000),
    )
    versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 extra", b""])
    headers = st.lists(st.tuples(token, token), max_size=4)
    return st.builds(
        lambda m, t, v, h, huge, end: (
            m
            + b" "
            + t
            + b" "
            + v
            + b"\r\n"
            + b"".join(k + b": " + val + b"\r\n" for k, val in h)
            + (b"X-Big: " + b"y" * 40000 + b"\r\n" if huge else b"")
            + end
        ),
        methods,
        targets,
        versions,
        headers,
        st.booleans(),
        st.sampled_from([b"\r\n", b"\n", b"", b"\r\n\r\nGET /boot.ipxe HTTP/1.1\r\n\r\n", b"\r\nbody"]),
    )


@pytest.fixture(scope="module")
def ipxe_replies() -> Any:
    from services.common.metrics import ServiceMetrics
    from services.ipxe.handlers import ScriptReplies
    from services.ipxe.reader import StaticReader
    from services.ipxe.render import ScriptRenderer
    from tests.unit.test_ipxe_scenarios import node
    from tests.unit.test_ipxe_scenarios import settings as ipxe_settings

    config = ipxe_settings()
    metrics = ServiceMetrics("ipxe")
    renderer = ScriptRenderer(StaticReader([node("deploying")]), config)
    return ScriptReplies(renderer, config.ipxe, metrics, None), metrics


@FUZZ
@given(
    requests=st.lists(st.one_of(_request(), st.binary(max_size=200)), min_size=1, max_size=4), cut=st.integers(1, 64)
)
def test_ipxe_http_parser_answers_or_refuses_anything(ipxe_replies: Any, requests: list[bytes], cut: int) -> None:
    from services.ipxe.http_server import HttpConnection, ScriptHttpServer

    replies, metrics = ipxe_replies
    stream = b"".join(requests)

    async def run() -> RecordingTransport:
        transport = RecordingTransport()
        connection = HttpConnection(ScriptHttpServer(replies, metrics))
        connection.connection_made(transport)
        for pos in range(0, len(stream), cut):
            connection.data_received(stream[pos : pos + cut])
        for _ in range(200):  # a per-node script renders in a task: let it finish
            if connection._task is None:
                break
            await asyncio.sleep(0.001)
        assert connection._task is None
        connection.connection_lost(None)
        return transport

    transport = asyncio.run(run())
    out = bytes(transport.out)
    replies_sent = out.count(b"HTTP/1.1 ")
    assert out == b"" or out.startswith(b"HTTP/1.1 ")
    assert replies_sent <= stream.count(b"\n") + 1
    for status in (b"400", b"414", b"431"):
        if out.startswith(b"HTTP/1.1 " + status):
            assert transport.closed and replies_sent == 1
    assert len(out) <= replies_sent * 64 * 1024
