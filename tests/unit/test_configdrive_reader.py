"""Our config-drive reader against cloud-init's own, drive by drive.

Each drive below is written twice: as a directory that Debian's cloud-init
(``/usr/bin/python3``, not our virtualenv) reads with
``DataSourceConfigDrive.read_config_drive`` (v2, then v1, as at boot), and as
an ISO that our reader opens. Both must pick the same ``openstack/<version>``,
read the same files, and fail on the same drives.
"""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

import pytest

from services.common import errors
from services.common.images import configdrive_reader, iso9660

SYSTEM_PYTHON = "/usr/bin/python3"

_CLOUD_INIT = r"""
import base64, json, sys
from cloudinit import sources
from cloudinit.sources import DataSourceConfigDrive
from cloudinit.sources.helpers import openstack

def plain(o):
    if isinstance(o, bytes):
        return {"__bytes__": base64.b64encode(o).decode()}
    raise TypeError(type(o).__name__)

out = {}
for name, path in json.loads(sys.argv[1]).items():
    version = openstack.ConfigDriveReader(path)._find_working_version()
    try:
        got = DataSourceConfigDrive.read_config_drive(path)
    except (openstack.NonReadable, openstack.BrokenMetadata) as exc:
        out[name] = {"error": type(exc).__name__, "version": version}
        continue
    md = got["metadata"]
    keys = sources.normalize_pubkey_data(md.get("public_keys" if got["version"] == 2 else "public-keys"))
    out[name] = {"result": got, "version": version, "keys": keys, "hostname": md.get("local-hostname")}
print(json.dumps(out, default=plain))
"""


def _b(value: Any) -> Any:
    """JSON-safe form of bytes, as the cloud-init script prints them."""
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _b(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_b(v) for v in value]
    return value


def as_cloud_init(data: configdrive_reader.ConfigDriveData) -> dict[str, Any]:
    """Our record in the shape of cloud-init's ``read_config_drive`` result."""
    if data.layout == 1:
        meta = dict(data.meta_data)
        for key in ("network_config", "authorized_keys"):  # cloud-init keeps these as the file's bytes
            meta[key] = meta[key].encode() if meta[key] else ""
        assert data.user_data is not None  # the layout-1 drives here carry a user-data string
        result: dict[str, Any] = {"version": 1, "metadata": meta, "files": {}, "userdata": data.user_data.decode()}
        if data.dsmode is not None:
            result["dsmode"] = data.dsmode
        return _b(result)
    meta = dict(data.meta_data)
    if "random_seed" in meta:
        meta["random_seed"] = base64.b64decode(meta["random_seed"])
    meta["instance-id"] = meta["uuid"]
    if "hostname" in meta:
        meta["local-hostname"] = meta["hostname"]
    result = {"version": 2, "metadata": meta, "userdata": "" if data.user_data is None else data.user_data}
    for ours, theirs in (
        ("vendor_data", "vendordata"),
        ("vendor_data2", "vendordata2"),
        ("network_data", "networkdata"),
    ):
        if getattr(data, ours) is not None:
            result[theirs] = getattr(data, ours)
    result["files"] = data.files
    if data.network_config is not None:
        result["network_config"] = data.network_config
    if data.dsmode is not None:
        result["dsmode"] = data.dsmode
    result["ec2-metadata"] = data.ec2_metadata
    return _b(result)


def meta(version: str, **extra: Any) -> bytes:
    return json.dumps({"uuid": f"uuid-{version}", "hostname": f"host-{version}", **extra}).encode()


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFerrumKey k@x"
DRIVES: dict[str, dict[str, bytes]] = {
    "several dated versions and latest": {
        "openstack/2012-08-10/meta_data.json": meta("2012-08-10"),
        "openstack/2012-08-10/vendor_data.json": b'{"old": true}',
        "openstack/2016-10-06/meta_data.json": meta("2016-10-06", public_keys={"a": KEY, "b": [KEY, ""]}),
        "openstack/2016-10-06/vendor_data.json": b'"#cloud-config\\n"',
        "openstack/2016-10-06/vendor_data2.json": b'{"static": {"x": 1}}',
        "openstack/2016-10-06/user_data": b"#!/bin/sh\necho 2016\n",
        "openstack/latest/meta_data.json": meta("latest"),
        "openstack/latest/user_data": b"latest wins only without a known date",
    },
    "latest only": {
        "openstack/latest/meta_data.json": meta("latest", public_keys=f"{KEY}\n{KEY}"),
        "openstack/latest/network_data.json": b'[{"not": "a dict"}]',
    },
    "unknown future date is ignored": {
        "openstack/2099-01-01/meta_data.json": meta("2099-01-01"),
        "openstack/2012-08-10/meta_data.json": meta("2012-08-10"),
        "openstack/latest/meta_data.json": meta("latest"),
    },
    "unknown date and latest": {
        "openstack/2099-01-01/meta_data.json": meta("2099-01-01"),
        "openstack/latest/meta_data.json": meta("latest", name="no-hostname-here"),
    },
    "Ironic's layout, no hostname": {
        "openstack/2012-08-10/meta_data.json": json.dumps({"uuid": "u", "name": "node-1"}).encode(),
        "openstack/2012-08-10/vendor_data2.json": b'{"v": 2}',
        "openstack/latest/meta_data.json": json.dumps({"uuid": "u", "name": "node-1"}).encode(),
    },
    "newest version lacks meta_data": {
        "openstack/2012-08-10/meta_data.json": meta("2012-08-10"),
        "openstack/2018-08-27/user_data": b"x",
    },
    "a file named like the newest version": {
        "openstack/2012-08-10/meta_data.json": meta("2012-08-10"),
        "openstack/2018-08-27": b"not a directory",
    },
    "everything cloud-init reads": {
        "openstack/2013-10-17/meta_data.json": json.dumps(
            {
                "uuid": "u-all",
                "hostname": "all.example",
                "random_seed": base64.b64encode(b"\x00\x01seed").decode(),
                "files": [
                    {"path": "/etc/motd", "content_path": "/content/0000"},
                    {"content_path": "/content/0001"},
                    "a bare string is skipped",
                ],
                "network_config": {"content_path": "/content/0001"},
                "meta": {"dsmode": "net", "role": "web"},
            }
        ).encode(),
        "openstack/2013-10-17/network_data.json": b'{"links": [], "networks": [], "services": []}',
        "openstack/2013-10-17/user_data": b"\xff\xfe binary user data",
        "openstack/content/0000": b"welcome\n",
        "openstack/content/0001": b"auto eth0\niface eth0 inet dhcp\n",
        "ec2/latest/meta-data.json": b'{"instance-id": "i-1", "local-ipv4": "10.0.0.2"}',
    },
    "network_data is a number": {
        "openstack/latest/meta_data.json": meta("latest"),
        "openstack/latest/network_data.json": b"5",
    },
    "meta_data is not JSON": {"openstack/latest/meta_data.json": b"{uuid: 1"},
    "meta_data without uuid": {"openstack/latest/meta_data.json": b'{"hostname": "h"}'},
    "random_seed is not base64": {"openstack/latest/meta_data.json": meta("latest", random_seed="abc")},
    "injected file missing": {
        "openstack/latest/meta_data.json": meta("latest", files=[{"path": "/x", "content_path": "/content/9"}]),
    },
    "pre-2012 layout": {
        "meta.js": json.dumps(
            {
                "instance-id": "i-v1",
                "user-data": "#cloud-config\n",
                "public-keys": f"{KEY}\n# comment\n",
                "dsmode": "local",
            }
        ).encode(),
        "etc/network/interfaces": b"auto lo\n",
    },
    "nothing a config drive holds": {"README": b"hello"},
}


@pytest.fixture(scope="module")
def cloud_init(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """cloud-init's reading of every drive, in one Debian python process."""
    root = tmp_path_factory.mktemp("drives")
    paths = {}
    for index, (name, files) in enumerate(DRIVES.items()):
        base = root / f"d{index}"
        base.mkdir()
        for rel, data in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_bytes(data)
        paths[name] = str(base)
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", _CLOUD_INIT, json.dumps(paths)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", list(DRIVES))
def test_reader_reads_what_cloud_init_reads(name: str, cloud_init: dict[str, Any]) -> None:
    theirs = cloud_init[name]
    iso = iso9660.write_iso(DRIVES[name], label="config-2")
    tree = configdrive_reader.FileMap(DRIVES[name])
    assert configdrive_reader.choose_version(tree) == theirs["version"]
    if "error" in theirs:
        with pytest.raises(errors.ConfigDriveInvalid):
            configdrive_reader.read_configdrive(iso)
        with pytest.raises(errors.ConfigDriveInvalid):
            configdrive_reader.read_drive(tree)
        return
    ours = configdrive_reader.read_configdrive(iso)
    assert as_cloud_init(ours) == theirs["result"]
    assert ours.public_keys == theirs["keys"]
    assert ours.hostname == theirs["hostname"]
    assert as_cloud_init(configdrive_reader.read_drive(tree)) == theirs["result"]


def test_the_drives_cover_what_they_claim(cloud_init: dict[str, Any]) -> None:
    """Guards the table above: the interesting outcomes really occur."""
    assert cloud_init["several dated versions and latest"]["version"] == "2016-10-06"
    assert cloud_init["unknown future date is ignored"]["version"] == "2012-08-10"
    assert cloud_init["latest only"]["version"] == "latest"
    assert cloud_init["Ironic's layout, no hostname"]["hostname"] is None
    assert cloud_init["pre-2012 layout"]["result"]["version"] == 1
    assert cloud_init["newest version lacks meta_data"]["error"] == "NonReadable"
    assert cloud_init["network_data is a number"]["error"] == "BrokenMetadata"
    assert cloud_init["everything cloud-init reads"]["result"]["dsmode"] == "net"


def test_bounds_on_hostile_drives() -> None:
    big = b"x" * (configdrive_reader.MAX_FILE_BYTES + 1)
    with pytest.raises(errors.ConfigDriveInvalid, match="more than"):
        configdrive_reader.parse_configdrive_files(
            {"openstack/latest/meta_data.json": meta("latest"), "openstack/latest/user_data": big}
        )
    many = [{"path": f"/f{i}", "content_path": "/content/0"} for i in range(configdrive_reader.MAX_INJECTED_FILES + 1)]
    with pytest.raises(errors.ConfigDriveInvalid, match="more than 1000 files"):
        configdrive_reader.parse_configdrive_files(
            {"openstack/latest/meta_data.json": meta("latest", files=many), "openstack/content/0": b"."}
        )
    # One 40 MiB extent shared by four names: 160 MiB if read naively.
    shared = {f"openstack/content/{i}": b"y" * (40 * 1024 * 1024) for i in range(4)}
    files = [{"path": f"/f{i}", "content_path": f"/content/{i}"} for i in range(4)]
    iso = iso9660.write_iso(
        {"openstack/latest/meta_data.json": meta("latest", files=files), **shared}, label="config-2"
    )
    assert len(iso) < 50 * 1024 * 1024
    with pytest.raises(errors.ConfigDriveInvalid, match="add up to more than"):
        configdrive_reader.read_configdrive(iso)
    with pytest.raises(errors.ConfigDriveInvalid, match="not an ISO9660"):
        configdrive_reader.read_configdrive(b"\0" * 40000)
