"""A streaming qcow2 reader: converts a qcow2 image to the raw disk as its
bytes arrive, with no copy of the image in memory or on local storage.

Why it works: qcow2 files written by ``qemu-img convert``/``create`` put the
header, refcounts and the L1 table first, and allocate each L2 table before
the data clusters it maps, so reading the file front to back the mapping of
a data cluster is known by the time the cluster goes by. The reader keeps
only the L1/L2 tables (a few hundred KiB per TiB with 64 KiB clusters) and
writes each data cluster straight to its guest offset; compressed (zlib)
clusters are inflated one at a time. Clusters whose mapping is not yet known
when they pass (a file laid out differently) are spooled to a temporary file
and placed once their L2 table arrives, so any valid layout converts; only
such out-of-order clusters touch local storage. Guest ranges the image does
not allocate (or marks zero) are zeroed at the end, so a previously used disk
ends up byte-identical to ``qemu-img convert`` output.

Supported: versions 2 and 3, no encryption, no backing file, no external
data file, no extended L2 entries, zlib compression. ``parse_header`` raises
``Unsupported`` for the rest and the caller falls back to qemu-img.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import struct
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from services.common import errors

MAGIC = b"QFI\xfb"
OFFSET_MASK = 0x00FFFFFFFFFFFE00
COMPRESSED = 1 << 62
ZERO_FLAG = 1
INCOMPAT_DIRTY = 1
KNOWN_HEADER = 104  # bytes of the v3 header this reader needs
MAX_L1_BYTES = 32 * 1024 * 1024  # qemu's QCOW_MAX_L1_SIZE: a bigger L1 table is refused, as qemu refuses it
MAX_HELD_BYTES = 64 * 1024 * 1024  # tables and compressed clusters held at once (an L1 + a few clusters)
_ZEROS = bytes(1024 * 1024)


def write_zeros(fd: int, offset: int, length: int) -> None:
    """Write zeros over [offset, offset+length): the plain way to clear what the image leaves unallocated.

    The agent passes its own ``zero_range``, which punches holes in file-backed disks instead.
    """
    end = offset + length
    while offset < end:
        offset += os.pwrite(fd, memoryview(_ZEROS)[: min(len(_ZEROS), end - offset)], offset)


class Unsupported(Exception):
    """A valid qcow2 feature this reader does not handle (use qemu-img)."""


@dataclass(frozen=True)
class Header:
    version: int
    cluster_bits: int
    virtual_size: int
    l1_size: int
    l1_offset: int
    backing_file_offset: int

    @property
    def cluster_size(self) -> int:
        return 1 << self.cluster_bits


def parse_header(head: bytes) -> Header:
    if len(head) < 72 or head[:4] != MAGIC:
        raise errors.ImageError("not a qcow2 image")
    (version, backing_off, _backing_size, cluster_bits, size, crypt, l1_size, l1_off) = struct.unpack(
        ">IQIIQIIQ", head[4:48]
    )
    if version not in (2, 3):
        raise Unsupported(f"qcow2 version {version}")
    if not 9 <= cluster_bits <= 21:
        raise errors.ImageError(f"qcow2 cluster_bits {cluster_bits} out of range")
    if crypt:
        raise Unsupported("encrypted qcow2")
    if version == 3:
        if len(head) < KNOWN_HEADER:
            raise Unsupported("short qcow2 v3 header")
        incompatible = struct.unpack(">Q", head[72:80])[0]
        header_length = struct.unpack(">I", head[100:104])[0]
        if incompatible & ~INCOMPAT_DIRTY:
            raise Unsupported(f"qcow2 incompatible features {incompatible:#x}")
        if header_length > 104 and len(head) > 104 and head[104] != 0:
            raise Unsupported("qcow2 compression type other than zlib")
        if not KNOWN_HEADER <= header_length <= 1 << cluster_bits:
            raise errors.ImageError(f"qcow2 header length {header_length} is invalid")
    _check_l1(size, cluster_bits, l1_size, l1_off)
    return Header(version, cluster_bits, size, l1_size, l1_off, backing_off)


def _check_l1(size: int, cluster_bits: int, l1_size: int, l1_off: int) -> None:
    """The L1 table must fit qemu's limit, cover the virtual size and start on a cluster, as qemu checks.

    ``l1_size`` comes straight from the image: it sizes the one allocation
    the reader makes from the header, so it is bounded before anything else.
    """
    if 8 * l1_size > MAX_L1_BYTES:
        raise errors.ImageError(f"qcow2 L1 table of {l1_size} entries is larger than {MAX_L1_BYTES} bytes")
    per_l1_entry = 1 << (2 * cluster_bits - 3)  # guest bytes one L2 table maps
    if l1_size < -(-size // per_l1_entry):
        raise errors.ImageError(f"qcow2 L1 table of {l1_size} entries is too small for the virtual size {size}")
    if l1_size and l1_off % (1 << cluster_bits):
        raise errors.ImageError(f"qcow2 L1 table offset {l1_off} is not aligned to a cluster")


@dataclass
class _Pending:
    """Bytes wanted at [start, end) of the file (a table or a compressed cluster)."""

    start: int
    end: int
    on_complete: Callable[[bytes], None]
    buf: bytearray | None = None
    got: int = 0
    may_end_early: bool = False  # a compressed cluster's declared length may run past the end of the file

    def take(self, block: memoryview, block_start: int) -> bool:
        lo, hi = max(self.start, block_start), min(self.end, block_start + len(block))
        if hi > lo:
            if self.buf is None:
                self.buf = bytearray(self.end - self.start)
            self.buf[lo - self.start : hi - self.start] = block[lo - block_start : hi - block_start]
            self.got += hi - lo
        return self.got == self.end - self.start


class StreamingConverter:
    """Feed the qcow2 file's bytes in order (``feed``), then ``finish``.

    Not thread-safe: call from one thread at a time (the agent calls it from
    worker threads, one block after another)."""

    def __init__(
        self,
        header: Header,
        fd: int,
        disk_size: int,
        *,
        spool_dir: str,
        zero_range: Callable[[int, int, int], None] = write_zeros,
    ) -> None:
        if header.backing_file_offset:
            raise errors.ImageError("qcow2 image has a backing file; refused")
        if header.virtual_size > disk_size:
            raise errors.ImageError(
                f"qcow2 virtual size {header.virtual_size} is larger than the disk ({disk_size} bytes)"
            )
        self.h, self.fd, self.spool_dir, self._zero_range = header, fd, spool_dir, zero_range
        self.cs = header.cluster_size
        self.entries_per_l2 = self.cs // 8
        self.pos = 0
        self.data_map: dict[int, int] = {}  # host cluster index -> guest offset
        self.guest_written = bytearray(-(-header.virtual_size // self.cs))
        self.bytes_written = 0
        self._heap: list[tuple[int, int, _Pending]] = []
        self._active: list[_Pending] = []
        self._seq = itertools.count()
        self._l1_done = False
        self._l2_waiting = 0
        self._l2_offsets: set[int] = set()
        self._held = 0  # bytes of the pending tables and compressed clusters being filled
        self._spool_fd: int | None = None
        self._spool_path: str | None = None
        self._spool_index: dict[int, int] = {}  # host cluster index -> offset in the spool
        if header.l1_size:
            self._want(header.l1_offset, header.l1_offset + 8 * header.l1_size, self._on_l1)
        else:
            self._l1_done = True

    # ---- tables -------------------------------------------------------------------------

    def _want(self, start: int, end: int, on_complete: Callable[[bytes], None], *, may_end_early: bool = False) -> None:
        pending = _Pending(start, end, on_complete, may_end_early=may_end_early)
        if start < self.pos:  # partly streamed past already: that part must be in the spool
            have = min(end, self.pos) - start
            pending.buf = bytearray(end - start)
            pending.buf[:have] = self._read_spooled(start, have)
            pending.got = have
            if have == end - start:
                on_complete(bytes(pending.buf))
                return
        heapq.heappush(self._heap, (start, next(self._seq), pending))

    def _on_l1(self, table: bytes) -> None:
        self._l1_done = True
        for index, entry in enumerate(struct.unpack(f">{self.h.l1_size}Q", table)):
            l2_offset = entry & OFFSET_MASK
            if l2_offset:
                if l2_offset in self._l2_offsets:
                    raise errors.ImageError(f"qcow2 L2 table at {l2_offset} is used by two L1 entries")
                self._l2_offsets.add(l2_offset)
                self._l2_waiting += 1
                self._want(l2_offset, l2_offset + self.cs, self._l2_handler(index))

    def _l2_handler(self, l1_index: int) -> Callable[[bytes], None]:
        def on_l2(table: bytes) -> None:
            self._l2_waiting -= 1
            base = l1_index * self.entries_per_l2 * self.cs
            for j, entry in enumerate(struct.unpack(f">{self.entries_per_l2}Q", table)):
                guest = base + j * self.cs
                if not entry or guest >= self.h.virtual_size:
                    continue
                if entry & COMPRESSED:
                    self._map_compressed(entry, guest)
                elif entry & ZERO_FLAG or not entry & OFFSET_MASK:
                    continue  # reads as zeros: zero-filled at the end
                else:
                    self._map_data((entry & OFFSET_MASK) >> self.h.cluster_bits, guest)

        return on_l2

    def _map_data(self, host_cluster: int, guest: int) -> None:
        if (host_cluster << self.h.cluster_bits) >= self.pos:
            self.data_map[host_cluster] = guest
            return
        self._write_guest(self._read_spooled(host_cluster << self.h.cluster_bits, self.cs), guest)

    def _map_compressed(self, entry: int, guest: int) -> None:
        shift = 62 - (self.h.cluster_bits - 8)
        offset = entry & ((1 << shift) - 1)
        sectors = ((entry & (COMPRESSED - 1)) >> shift) + 1
        length = sectors * 512 - (offset & 511)

        def inflate(data: bytes) -> None:
            try:
                raw = zlib.decompressobj(-12).decompress(data, self.cs)
            except zlib.error as exc:
                raise errors.ImageError(f"corrupt compressed qcow2 cluster at {offset}: {exc}") from None
            if len(raw) < min(self.cs, self.h.virtual_size - guest):
                raise errors.ImageError(f"short compressed qcow2 cluster at {offset}")
            self._write_guest(raw, guest)

        self._want(offset, offset + length, inflate, may_end_early=True)

    # ---- data ---------------------------------------------------------------------------

    def _write_guest(self, data: bytes | memoryview, guest: int) -> None:
        end = min(guest + len(data), self.h.virtual_size)
        if end <= guest:
            return
        view = memoryview(data)[: end - guest]
        offset = guest
        while view:
            done = os.pwrite(self.fd, view, offset)
            view, offset = view[done:], offset + done
        self.bytes_written += end - guest
        for cluster in range(guest // self.cs, -(-end // self.cs)):
            self.guest_written[cluster] = 1

    def _spool(self, cluster: int, piece: memoryview, within: int) -> None:
        if self._spool_fd is None:
            self._spool_fd, self._spool_path = tempfile.mkstemp(prefix="ferrum-agent-qcow2-spool-", dir=self.spool_dir)
        slot = self._spool_index.setdefault(cluster, len(self._spool_index) * self.cs)
        os.pwrite(self._spool_fd, piece, slot + within)

    def _read_spooled(self, start: int, length: int) -> bytes:
        out = bytearray()
        while len(out) < length:
            cluster, within = divmod(start + len(out), self.cs)
            slot = self._spool_index.get(cluster)
            if slot is None or self._spool_fd is None:
                raise errors.ImageError(
                    f"qcow2 data at offset {start + len(out)} was needed before its table and was not kept"
                )
            want = min(self.cs - within, length - len(out))
            out += os.pread(self._spool_fd, want, slot + within)
        return bytes(out)

    def _hold(self, pending: _Pending) -> _Pending:
        """Account for a pending range about to be filled; refuse images that need too many at once.

        A valid image never has overlapping tables or compressed clusters, so
        at any file offset only a few are being filled. A hostile one can
        point thousands of L1 or L2 entries at the same bytes.
        """
        self._held += pending.end - pending.start
        if self._held > MAX_HELD_BYTES:
            raise errors.ImageError(
                f"qcow2 image needs more than {MAX_HELD_BYTES} bytes of tables and compressed clusters at "
                f"offset {pending.start} (overlapping tables or clusters)"
            )
        return pending

    def _complete(self, pending: _Pending) -> None:
        self._held -= pending.end - pending.start
        pending.on_complete(bytes(pending.buf or b""))

    def _mapping_complete(self) -> bool:
        return self._l1_done and self._l2_waiting == 0

    def feed(self, block: memoryview, offset: int) -> None:
        """The next bytes of the file (``offset`` must be where the last block ended)."""
        if offset != self.pos:
            raise errors.ImageError(f"qcow2 stream out of order: got offset {offset}, expected {self.pos}")
        end = offset + len(block)
        run_guest = run_start = run_end = -1
        cluster_start = offset - offset % self.cs
        while cluster_start < end:
            lo, hi = max(cluster_start, offset), min(cluster_start + self.cs, end)
            piece = block[lo - offset : hi - offset]
            while self._heap and self._heap[0][0] < hi:
                self._active.append(self._hold(heapq.heappop(self._heap)[2]))
            if self._active:
                still = []
                for pending in self._active:
                    if pending.take(piece, lo):
                        self._complete(pending)
                    else:
                        still.append(pending)
                self._active = still
                while self._heap and self._heap[0][0] < hi:  # tables found by a table just completed
                    pending = self._hold(heapq.heappop(self._heap)[2])
                    if pending.take(piece, lo):
                        self._complete(pending)
                    else:
                        self._active.append(pending)
            cluster = cluster_start >> self.h.cluster_bits
            guest = self.data_map.get(cluster)
            if guest is not None:
                if hi == cluster_start + self.cs:
                    del self.data_map[cluster]
                guest += lo - cluster_start
                if run_guest >= 0 and run_end == lo and run_guest + (run_end - run_start) == guest:
                    run_end = hi
                else:
                    if run_guest >= 0:
                        self._write_guest(block[run_start - offset : run_end - offset], run_guest)
                    run_guest, run_start, run_end = guest, lo, hi
            elif not self._mapping_complete():
                self._spool(cluster, piece, lo - cluster_start)  # unknown yet: keep it until the tables say
            self.pos = hi
            cluster_start += self.cs
        if run_guest >= 0:
            self._write_guest(block[run_start - offset : run_end - offset], run_guest)

    def finish(self) -> int:
        """Check nothing is missing, zero what the image leaves unallocated; returns the virtual size."""
        for pending in self._active + [p for _, _, p in self._heap]:
            if pending.may_end_early and pending.got and pending.start + pending.got == self.pos and pending.buf:
                # A compressed run may be declared longer than what is left of the file.
                pending.on_complete(bytes(pending.buf[: pending.got]))
            else:
                raise errors.ImageError(f"qcow2 image is truncated: bytes {pending.start}-{pending.end} are missing")
        self._active, self._heap = [], []
        if not self._mapping_complete():
            raise errors.ImageError("qcow2 image is truncated: its tables are incomplete")
        if self.data_map:
            raise errors.ImageError(f"qcow2 image is truncated: {len(self.data_map)} data clusters are missing")
        marks, index = bytes(self.guest_written), 0
        while (index := marks.find(0, index)) >= 0:
            stop = marks.find(1, index)
            stop = len(marks) if stop < 0 else stop
            start = index * self.cs
            self._zero_range(self.fd, start, min(stop * self.cs, self.h.virtual_size) - start)
            index = stop
        return self.h.virtual_size

    def close(self) -> None:
        if self._spool_fd is not None:
            os.close(self._spool_fd)
            self._spool_fd = None
        if self._spool_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._spool_path)
            self._spool_path = None
