"""The streaming qcow2 converter against Debian's qemu-img: every image,
fed in odd-sized pieces, must come out byte-identical to ``qemu-img convert
-O raw`` on a disk full of old data."""

from __future__ import annotations

import os
import random
import struct
import subprocess
from pathlib import Path

import pytest

from services.common import errors
from services.common.images import qcow2stream

MiB = 1024 * 1024
DISK = 12 * MiB


def qemu_img(*args: str) -> None:
    subprocess.run(["qemu-img", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qcow2") / "src.raw"
    rnd = random.Random(42)
    with open(path, "wb") as fh:
        fh.truncate(10 * MiB)
        for mib in range(0, 10, 2):
            fh.seek(mib * MiB + rnd.randrange(0, 4096))
            fh.write(rnd.randbytes(300_000))
    return path


def move_l2_tables_to_the_end(path: Path) -> None:
    """Lay the file out so data clusters come before their L2 table (exercises the spool)."""
    data = bytearray(path.read_bytes())
    cluster = 1 << struct.unpack(">I", data[20:24])[0]
    l1_size, l1_offset = struct.unpack(">I", data[36:40])[0], struct.unpack(">Q", data[40:48])[0]
    data += bytes(-len(data) % cluster)
    for i in range(l1_size):
        entry = struct.unpack(">Q", data[l1_offset + 8 * i : l1_offset + 8 * i + 8])[0]
        old = entry & qcow2stream.OFFSET_MASK
        if old:
            new = len(data)
            data += data[old : old + cluster]
            data[old : old + cluster] = bytes(cluster)
            data[l1_offset + 8 * i : l1_offset + 8 * i + 8] = struct.pack(
                ">Q", (entry & ~qcow2stream.OFFSET_MASK) | new
            )
    path.write_bytes(bytes(data))


def convert(image: Path, disk: Path, *, piece_sizes: tuple[int, ...], seed: int = 1) -> tuple[int, int]:
    with open(disk, "wb") as fh:
        fh.write(b"\xee" * DISK)
    data = image.read_bytes()
    fd = os.open(disk, os.O_WRONLY)
    converter = qcow2stream.StreamingConverter(
        qcow2stream.parse_header(data[:512]), fd, DISK, spool_dir=str(disk.parent)
    )
    try:
        rnd, pos = random.Random(seed), 0
        while pos < len(data):
            piece = memoryview(data)[pos : pos + rnd.choice(piece_sizes)]
            converter.feed(piece, pos)
            pos += len(piece)
        size = converter.finish()
        return size, len(converter._spool_index)
    finally:
        converter.close()
        os.close(fd)


@pytest.mark.parametrize(
    "name, create",
    [
        ("plain", ["-O", "qcow2"]),
        ("compressed", ["-O", "qcow2", "-c"]),
        ("version 2", ["-O", "qcow2", "-o", "compat=0.10"]),
        ("4k clusters", ["-O", "qcow2", "-o", "cluster_size=4096"]),
        ("2M compressed clusters", ["-O", "qcow2", "-c", "-o", "cluster_size=2M"]),
        ("L2 after data", ["-O", "qcow2"]),
        ("compressed, L2 after data", ["-O", "qcow2", "-c"]),
        ("rewritten by qemu-io", ["-O", "qcow2"]),
    ],
)
def test_streamed_conversion_matches_qemu_img(source: Path, tmp_path: Path, name: str, create: list[str]) -> None:
    image = tmp_path / "image.qcow2"
    qemu_img("convert", "-f", "raw", *create, str(source), str(image))
    if name.startswith("rewritten"):
        subprocess.run(
            ["qemu-io", "-c", "write -P 0x55 1M 3M", "-c", "write -z 4M 2M", "-c", "discard 8M 1M", str(image)],
            check=True,
            capture_output=True,
        )
    if "L2 after data" in name:
        move_l2_tables_to_the_end(image)
    expected = tmp_path / "expected.raw"
    qemu_img("convert", "-f", "qcow2", "-O", "raw", str(image), str(expected))
    disk = tmp_path / "disk.img"
    size, spooled = convert(image, disk, piece_sizes=(3, 1000, 65536, 100_001, 8 * MiB))
    want = expected.read_bytes()
    with open(disk, "rb") as fh:
        assert size == len(want) and fh.read(size) == want
        assert fh.read() == b"\xee" * (DISK - size)  # past the virtual size: untouched
    if "L2 after data" in name:
        assert spooled > 10  # the data clusters waited in the spool for their table
    else:
        assert spooled <= 16  # only the header, refcount and L1 clusters before the first table
    assert not list(tmp_path.glob("ferrum-agent-qcow2-spool-*"))


def test_empty_image_zeroes_the_disk(tmp_path: Path) -> None:
    image = tmp_path / "empty.qcow2"
    qemu_img("create", "-f", "qcow2", str(image), "5M")
    size, _ = convert(image, tmp_path / "disk.img", piece_sizes=(4096,))
    assert size == 5 * MiB and (tmp_path / "disk.img").read_bytes()[:size] == bytes(size)


def test_truncated_image_is_an_error(source: Path, tmp_path: Path) -> None:
    image = tmp_path / "image.qcow2"
    qemu_img("convert", "-f", "raw", "-O", "qcow2", str(source), str(image))
    image.write_bytes(image.read_bytes()[:-100_000])
    with pytest.raises(errors.ImageError, match="truncated"):
        convert(image, tmp_path / "disk.img", piece_sizes=(65536,))


def test_unsupported_features_and_refusals(source: Path, tmp_path: Path) -> None:
    ext = tmp_path / "ext.qcow2"
    qemu_img("create", "-f", "qcow2", "-o", "extended_l2=on", str(ext), "4M")
    with pytest.raises(qcow2stream.Unsupported, match="incompatible features"):
        qcow2stream.parse_header(ext.read_bytes()[:512])
    backed = tmp_path / "backed.qcow2"
    qemu_img("create", "-f", "qcow2", "-F", "raw", "-b", str(source), str(backed))
    header = qcow2stream.parse_header(backed.read_bytes()[:512])
    with pytest.raises(errors.ImageError, match="backing file"):
        qcow2stream.StreamingConverter(header, 0, DISK, spool_dir=str(tmp_path))
    big = tmp_path / "big.qcow2"
    qemu_img("create", "-f", "qcow2", str(big), "1G")
    with pytest.raises(errors.ImageError, match="larger than the disk"):
        qcow2stream.StreamingConverter(
            qcow2stream.parse_header(big.read_bytes()[:512]), 0, DISK, spool_dir=str(tmp_path)
        )
    with pytest.raises(errors.ImageError, match="not a qcow2"):
        qcow2stream.parse_header(b"\0" * 512)
