"""Read a config drive exactly the way cloud-init's ConfigDrive datasource does, in pure Python.

The simulator plays the booted OS and the demo shows what that OS found, so
both must see what cloud-init would, not an approximation. The rules are
those of ``cloudinit.sources.helpers.openstack`` (Debian's cloud-init 22.4,
``ConfigDriveReader`` and ``BaseReader``), and a test runs cloud-init itself
on the same drives to keep them honest:

- **Version**: every name under ``openstack/`` (directories and files alike)
  is a candidate; the newest of cloud-init's known dated versions that is
  present wins; ``latest`` is used only when none is present. An unknown
  date (``2099-01-01``) is ignored, and a present version is used even if it
  lacks files an older one has.
- **Files** in that version: ``meta_data.json`` is mandatory and must be a
  JSON object; ``user_data`` (bytes), ``vendor_data.json``,
  ``vendor_data2.json`` and ``network_data.json`` are optional and, when
  present, must be JSON objects, arrays or strings. Anything else is broken.
- **Meta data**: ``uuid`` is mandatory (it becomes ``instance-id``),
  ``hostname`` becomes ``local-hostname`` (cloud-init never falls back to
  ``name``), ``random_seed`` must be base64, ``files`` and
  ``network_config`` point at ``openstack/<content_path>`` files that must
  exist, ``meta.dsmode`` is the datasource mode.
- ``ec2/latest/meta-data.json`` is read when present.
- Without a readable ``meta_data.json`` cloud-init falls back to the
  pre-2012 layout (``meta.js``, ``etc/network/interfaces``,
  ``root/.ssh/authorized_keys``); so does this reader.

cloud-init raises ``NonReadable`` (not a config drive) or ``BrokenMetadata``
(a broken one); both mean "try the next device", and both are
ConfigDriveInvalid here with cloud-init's reason in the message. Drives are
untrusted: one file is read up to :data:`MAX_FILE_BYTES`, all of them up to
:data:`MAX_TOTAL_BYTES`, and at most :data:`MAX_INJECTED_FILES` injected files.
"""

from __future__ import annotations

import base64
import io
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.common import errors
from services.common.images import iso9660

# cloud-init's OS_VERSIONS, oldest first
KNOWN_VERSIONS = (
    "2012-08-10",
    "2013-04-04",
    "2013-10-17",
    "2015-10-15",
    "2016-06-30",
    "2016-10-06",
    "2017-02-22",
    "2018-08-27",
)
LATEST = "latest"
MAX_FILE_BYTES = 64 * 1024 * 1024  # no file can be larger than the drive
MAX_TOTAL_BYTES = 128 * 1024 * 1024  # hard links let a small drive claim many large files
MAX_INJECTED_FILES = 1000


class DriveFiles(Protocol):
    """The file tree of a mounted config drive, as the reader needs it."""

    def listdir(self, path: str) -> list[str]:
        """Names in directory ``path`` (relative, no leading slash); FileNotFoundError when it is not one."""
        ...

    def is_dir(self, path: str) -> bool: ...

    def read(self, path: str, *, limit: int) -> bytes:
        """The file's bytes; FileNotFoundError when absent, ImageFormatError when larger than ``limit``."""
        ...


class FileMap:
    """A :class:`DriveFiles` over a mapping of relative paths to bytes (a tree built in memory)."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self._files = {path.strip("/"): data for path, data in files.items()}
        self._dirs = {""}
        for path in self._files:
            parts = path.split("/")
            self._dirs.update("/".join(parts[:depth]) for depth in range(1, len(parts)))

    def listdir(self, path: str) -> list[str]:
        path = path.strip("/")
        if path not in self._dirs:
            raise FileNotFoundError(path)
        prefix = f"{path}/" if path else ""
        names = {rel[len(prefix) :].split("/", 1)[0] for rel in [*self._files, *self._dirs] if rel.startswith(prefix)}
        return sorted(name for name in names if name)

    def is_dir(self, path: str) -> bool:
        return path.strip("/") in self._dirs

    def read(self, path: str, *, limit: int) -> bytes:
        data = self._files.get(path.strip("/"))
        if data is None:
            raise FileNotFoundError(path)
        if len(data) > limit:
            raise errors.ImageFormatError(f"{path} is {len(data)} bytes, more than {limit}")
        return data


@dataclass(frozen=True)
class ConfigDriveData:
    """What cloud-init's reader returns, with cloud-init's names in the comments."""

    layout: int  # 2: openstack/<version>/ (read_v2); 1: the pre-2012 files (read_v1)
    version: str  # the openstack/<version> directory read; "" for layout 1
    meta_data: dict[str, Any]  # "metadata" as in the JSON file (layout 1: cloud-init's v1 dict)
    user_data: bytes | None  # "userdata"
    vendor_data: Any | None = None  # "vendordata": vendor_data.json
    vendor_data2: Any | None = None  # "vendordata2": vendor_data2.json (what Ironic and openstacksdk write)
    network_data: Any | None = None  # "networkdata": network_data.json
    files: dict[str, bytes] = field(default_factory=dict)  # "files": injected files by target path
    network_config: str | None = None  # "network_config": the ENI file meta_data points at
    ec2_metadata: dict[str, Any] = field(default_factory=dict)  # "ec2-metadata"
    dsmode: str | None = None  # "dsmode" from meta_data.meta

    @property
    def instance_id(self) -> str | None:
        """cloud-init's ``instance-id``: the meta data's ``uuid``."""
        key = "uuid" if self.layout == 2 else "instance-id"
        value = self.meta_data.get(key)
        return None if value is None else str(value)

    @property
    def hostname(self) -> str | None:
        """cloud-init's ``local-hostname``: the meta data's ``hostname``, or None (then the OS keeps its own)."""
        return self.meta_data.get("hostname") if self.layout == 2 else None

    @property
    def public_keys(self) -> list[str]:
        """The keys as cloud-init's ``normalize_pubkey_data`` lists them."""
        data = self.meta_data.get("public_keys" if self.layout == 2 else "public-keys")
        if not data:
            return []
        if isinstance(data, str):
            return data.splitlines()
        if isinstance(data, list):
            return list(data)
        keys: list[str] = []
        if isinstance(data, dict):
            for entry in data.values():
                for key in [entry] if isinstance(entry, str) else entry if isinstance(entry, list) else []:
                    if key:
                        keys.append(key)
        return keys

    @property
    def macs(self) -> list[str]:
        links = self.network_data.get("links") if isinstance(self.network_data, dict) else None
        links = links if isinstance(links, list) else []
        return [
            str(link["ethernet_mac_address"]).lower()
            for link in links
            if isinstance(link, dict) and link.get("ethernet_mac_address")
        ]


class _Budget:
    """Reads from one drive, bounded in bytes per file and in all."""

    def __init__(self, tree: DriveFiles) -> None:
        self.tree, self.total = tree, 0

    def read(self, path: str) -> bytes | None:
        """The file, or None when there is no such file (a directory counts as absent, as for open())."""
        try:
            data = self.tree.read(path, limit=MAX_FILE_BYTES)
        except FileNotFoundError:
            return None
        except errors.ImageFormatError as exc:
            raise errors.ConfigDriveInvalid(f"config drive file {path} cannot be read: {exc.message}") from None
        self.total += len(data)
        if self.total > MAX_TOTAL_BYTES:
            raise errors.ConfigDriveInvalid(f"config drive files add up to more than {MAX_TOTAL_BYTES} bytes")
        return data

    def exists(self, path: str) -> bool:
        return self.tree.is_dir(path) or self.read(path) is not None


def _json(data: bytes, path: str, root_types: tuple[type, ...]) -> Any:
    """cloud-init's ``util.load_json``: UTF-8, JSON, and a root of one of ``root_types``; else broken."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise errors.ConfigDriveInvalid(f"Failed to process path {path}: {exc}") from None
    if not isinstance(value, root_types):
        raise errors.ConfigDriveInvalid(
            f"Failed to process path {path}: a JSON {'/'.join(t.__name__ for t in root_types)} was expected, "
            f"not {type(value).__name__}"
        )
    return value


def choose_version(tree: DriveFiles) -> str:
    """The ``openstack/<version>`` cloud-init reads: its newest known version present, else ``latest``."""
    try:
        present = set(tree.listdir("openstack"))
    except FileNotFoundError:
        present = set()
    for version in reversed(KNOWN_VERSIONS):
        if version in present:
            return version
    return LATEST


def read_drive(tree: DriveFiles) -> ConfigDriveData:
    """What cloud-init reads from the config drive ``tree`` (``read_config_drive``: v2, else v1).

    Raises ConfigDriveInvalid when cloud-init would find it unreadable or broken.
    """
    try:
        return _read_v2(_Budget(tree))
    except _NonReadable as first:
        try:
            return _read_v1(_Budget(tree))
        except _NonReadable:
            raise errors.ConfigDriveInvalid(str(first)) from None


class _NonReadable(errors.ConfigDriveInvalid):
    """cloud-init's NonReadable: this is not a config drive of that layout (the next layout is tried)."""


def _read_v2(files: _Budget) -> ConfigDriveData:
    version = choose_version(files.tree)
    base = f"openstack/{version}"
    meta_raw = files.read(f"{base}/meta_data.json")
    if meta_raw is None:
        raise _NonReadable(f"Missing mandatory path: {base}/meta_data.json")
    meta = _json(meta_raw, f"{base}/meta_data.json", (dict,))
    user_data = files.read(f"{base}/user_data")
    optional: dict[str, Any] = {}
    for name in ("vendor_data.json", "vendor_data2.json", "network_data.json"):
        raw = files.read(f"{base}/{name}")
        optional[name] = None if raw is None else _json(raw, f"{base}/{name}", (dict, list, str))
    if "random_seed" in meta:
        try:
            base64.b64decode(meta["random_seed"])
        except (ValueError, TypeError) as exc:
            raise errors.ConfigDriveInvalid(f"Badly formatted metadata random_seed entry: {exc}") from None
    injected: dict[str, bytes] = {}
    items = meta.get("files", [])
    for item in items if isinstance(items, list) else []:
        if isinstance(item, (str, list)) and "path" not in item:
            continue
        if not isinstance(item, dict):
            raise errors.ConfigDriveInvalid(f"Failed to read provided file: {item!r} is not an object")
        if "path" not in item:
            continue
        if len(injected) >= MAX_INJECTED_FILES:
            raise errors.ConfigDriveInvalid(f"meta_data.json lists more than {MAX_INJECTED_FILES} files")
        injected[str(item["path"])] = _content(files, item)
    network_config = None
    net_item = meta.get("network_config")
    if net_item:
        if not isinstance(net_item, dict):
            raise errors.ConfigDriveInvalid("Failed to read network configuration: not an object")
        raw = _content(files, net_item)
        try:
            network_config = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise errors.ConfigDriveInvalid(f"Failed to read network configuration: {exc}") from None
    dsmode = None
    if isinstance(meta.get("meta"), dict) and "dsmode" in meta["meta"]:
        dsmode = meta["meta"]["dsmode"]
    ec2 = _ec2_metadata(files)
    if "uuid" not in meta:
        raise errors.ConfigDriveInvalid("No 'uuid' entry in metadata")
    return ConfigDriveData(
        layout=2,
        version=version,
        meta_data=meta,
        user_data=user_data,
        vendor_data=optional["vendor_data.json"],
        vendor_data2=optional["vendor_data2.json"],
        network_data=optional["network_data.json"],
        files=injected,
        network_config=network_config,
        ec2_metadata=ec2,
        dsmode=dsmode,
    )


def _content(files: _Budget, item: Mapping[str, Any]) -> bytes:
    """The file an ``openstack/content`` pointer names (``content_path``, relative to ``openstack/``)."""
    pointer = str(item.get("content_path", "")).lstrip("/")
    if not [piece for piece in pointer.split("/") if piece]:
        raise errors.ConfigDriveInvalid(f"Item {dict(item)!r} has no valid content path")
    path = posixpath.normpath(f"openstack/{pointer}")
    data = None if path.startswith("../") else files.read(path)
    if data is None:
        raise errors.ConfigDriveInvalid(f"Failed to read provided file {item.get('path', pointer)}: no {path}")
    return data


def _ec2_metadata(files: _Budget) -> dict[str, Any]:
    path = "ec2/latest/meta-data.json"
    if files.tree.is_dir(path):
        raise errors.ConfigDriveInvalid(f"Failed to process path {path}: it is a directory")
    raw = files.read(path)
    return {} if raw is None else _json(raw, path, (dict,))


_V1_FILES = ("etc/network/interfaces", "meta.js", "root/.ssh/authorized_keys")


def _read_v1(files: _Budget) -> ConfigDriveData:
    """The pre-2012 layout, as ``ConfigDriveReader.read_v1`` turns it into meta data."""
    read = {name: files.read(name) for name in _V1_FILES if files.exists(name)}
    if not read:
        raise _NonReadable("no config drive files found")
    unreadable = [name for name, data in read.items() if data is None]
    if unreadable:
        raise errors.ConfigDriveInvalid(f"Failed to read: {unreadable[0]}")
    found = {name: data for name, data in read.items() if data is not None}
    meta_js = _json(found["meta.js"], "meta.js", (dict,)) if "meta.js" in found else {}
    authorized = found.get("root/.ssh/authorized_keys", b"")
    keydata = meta_js.get("public-keys", authorized)
    meta: dict[str, Any] = {
        "network_config": found.get("etc/network/interfaces", b"").decode("utf-8", "replace"),
        "meta_js": meta_js,
        "authorized_keys": authorized.decode("utf-8", "replace"),
    }
    if keydata:
        if not isinstance(keydata, str):
            raise errors.ConfigDriveInvalid("Failed to process root/.ssh/authorized_keys: cloud-init reads it as bytes")
        meta["public-keys"] = [line for line in keydata.splitlines() if line and not line.startswith("#")]
    if "instance-id" in meta_js:
        meta["instance-id"] = meta_js["instance-id"]
    user = meta_js.get("user-data", "")
    return ConfigDriveData(
        layout=1,
        version="",
        meta_data=meta,
        user_data=user.encode("utf-8") if isinstance(user, str) else None,
        dsmode=meta_js.get("dsmode"),
    )


def parse_configdrive_files(files: Mapping[str, bytes]) -> ConfigDriveData:
    """What cloud-init reads from the config drive tree ``files`` (relative path -> bytes)."""
    return read_drive(FileMap(files))


def read_configdrive(iso: bytes) -> ConfigDriveData:
    """Parse the config drive ISO image ``iso`` (for instance from ``read_configdrive_partition``)."""
    if not iso9660.is_iso9660(iso):
        raise errors.ConfigDriveInvalid("the config drive is not an ISO9660 image")
    try:
        with iso9660.IsoVolume(io.BytesIO(iso)) as volume:
            return read_drive(volume)
    except errors.ImageFormatError as exc:
        raise errors.ConfigDriveInvalid(f"the config drive ISO cannot be read: {exc.message}") from None
