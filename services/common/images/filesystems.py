"""What file system a partition holds and its labels, from its first bytes (what ``blkid`` reports).

Two callers need this: the config-drive placement searches for a ``config-2``
label the way IPA's ``lsblk -o label`` does, and the simulator reports what a
booting OS would find. Every probe is a few fixed-size reads at known offsets,
so it is safe on any bytes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import BinaryIO

from services.common.images import fat, iso9660

_EXT_MAGIC = b"\x53\xef"
_SWAP_MAGICS = (b"SWAPSPACE2", b"SWAP-SPACE")


@dataclass(frozen=True)
class Filesystem:
    kind: str  # "iso9660" | "vfat" | "ext" | "xfs" | "swap" | "" (nothing known)
    labels: tuple[str, ...] = ()  # every label blkid may report, most specific first

    @property
    def label(self) -> str:
        return self.labels[0] if self.labels else ""


NONE = Filesystem("")


def probe(fp: BinaryIO, offset: int) -> Filesystem:
    """The file system at byte ``offset`` of ``fp``.

    ISO9660 is tried first: a config drive written over an old file system
    keeps that file system's superblock only where the ISO's zeroed system
    area does not reach, and the ISO is what the disk now means.
    """
    labels = iso9660.volume_labels(fp, offset)
    if labels:
        return Filesystem("iso9660", _unique(labels))
    fp.seek(offset)
    head = fp.read(4096)
    if fat.is_fat(head[:512]):
        return Filesystem("vfat", _unique(fat.volume_labels(fp, offset)))
    if len(head) >= 1024 + 136 and head[1024 + 56 : 1024 + 58] == _EXT_MAGIC:
        return Filesystem("ext", _unique([_text(head[1024 + 120 : 1024 + 136])]))
    if head[:4] == b"XFSB":
        return Filesystem("xfs", _unique([_text(head[108:120])]))
    if len(head) == 4096 and head[4086:4096] in _SWAP_MAGICS:
        return Filesystem(
            "swap", _unique([_text(head[1024 + 28 : 1024 + 44])]) if head[4086:4096] == _SWAP_MAGICS[0] else ()
        )
    return NONE


def filesystem_uuid(fp: BinaryIO, offset: int) -> str:
    """The UUID ``blkid`` reports for the file system at ``offset`` (ext, xfs,
    swap; vfat's volume id), "" when there is none. What a kernel's
    ``root=UUID=`` names."""
    fp.seek(offset)
    head = fp.read(4096)
    if len(head) >= 1024 + 136 and head[1024 + 56 : 1024 + 58] == _EXT_MAGIC:
        return str(uuid.UUID(bytes=head[1024 + 104 : 1024 + 120]))
    if head[:4] == b"XFSB" and len(head) >= 48:
        return str(uuid.UUID(bytes=head[32:48]))
    if len(head) == 4096 and head[4086:4096] == _SWAP_MAGICS[0]:
        return str(uuid.UUID(bytes=head[1024 + 12 : 1024 + 28]))
    if fat.is_fat(head[:512]):
        fat32 = head[82:87] == b"FAT32"
        raw = head[67:71] if fat32 else head[39:43]
        value = int.from_bytes(raw, "little")
        return f"{value >> 16:04X}-{value & 0xFFFF:04X}"
    return ""


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()


def _unique(labels: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(label for label in labels if label))
