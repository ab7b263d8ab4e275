"""Read a config drive the way cloud-init's ConfigDrive datasource does, in pure Python.

The simulator plays the booted OS: it has to find ``config-2`` and report
what cloud-init would see, without Debian's python or a mount. The choices
follow ``cloudinit.sources.helpers.openstack.ConfigDriveReader.read_v2``: the
newest known ``openstack/<version>`` directory wins (``latest`` only when no
dated one is present), ``meta_data.json`` is mandatory, the rest optional.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class ConfigDriveData:
    version: str  # the openstack/<version> directory read
    meta_data: dict[str, Any]
    user_data: bytes | None
    network_data: Any | None
    vendor_data: Any | None  # vendor_data2.json

    @property
    def hostname(self) -> str | None:
        return self.meta_data.get("hostname")

    @property
    def public_keys(self) -> list[str]:
        """The keys, as cloud-init normalises ``public_keys`` (dict values, list, or one string)."""
        keys = self.meta_data.get("public_keys") or {}
        if isinstance(keys, str):
            keys = [keys]
        elif isinstance(keys, Mapping):
            keys = list(keys.values())
        return [line.strip() for key in keys for line in str(key).splitlines() if line.strip()]

    @property
    def macs(self) -> list[str]:
        links = self.network_data.get("links") if isinstance(self.network_data, dict) else None
        links = links if isinstance(links, list) else []
        return [
            str(link["ethernet_mac_address"]).lower()
            for link in links
            if isinstance(link, dict) and link.get("ethernet_mac_address")
        ]


def _json(files: Mapping[str, bytes], path: str) -> Any | None:
    if path not in files:
        return None
    try:
        return json.loads(files[path])
    except ValueError as exc:
        raise errors.ConfigDriveInvalid(f"config drive file {path} is not valid JSON: {exc}") from exc


def parse_configdrive_files(files: Mapping[str, bytes]) -> ConfigDriveData:
    """What cloud-init reads from the config drive tree ``files`` (relative path -> bytes)."""
    present = {path.split("/")[1] for path in files if path.startswith("openstack/") and path.count("/") >= 2}
    dated = [v for v in KNOWN_VERSIONS if v in present]
    version = dated[-1] if dated else "latest"
    base = f"openstack/{version}"
    meta = _json(files, f"{base}/meta_data.json")
    if not isinstance(meta, dict):
        raise errors.ConfigDriveInvalid(f"config drive has no {base}/meta_data.json object")
    return ConfigDriveData(
        version=version,
        meta_data=meta,
        user_data=files.get(f"{base}/user_data"),
        network_data=_json(files, f"{base}/network_data.json"),
        vendor_data=_json(files, f"{base}/vendor_data2.json"),
    )


def read_configdrive(iso: bytes) -> ConfigDriveData:
    """Parse the config drive ISO image ``iso`` (for instance from ``read_configdrive_partition``)."""
    if not iso9660.is_iso9660(iso):
        raise errors.ConfigDriveInvalid("the config drive is not an ISO9660 image")
    return parse_configdrive_files(iso9660.read_iso_files(io.BytesIO(iso)))
