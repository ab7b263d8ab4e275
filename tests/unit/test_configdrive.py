"""Config drive builder and decoder, checked by the consumers that matter.

cloud-init's own reader (Debian's package, run by Debian's python3, not our
virtualenv) parses what we build; openstacksdk's own builder (genisoimage)
makes the strings Nova sends, which we must decode.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from openstack.baremetal import configdrive as sdk_configdrive

from services.common import errors
from services.common.images import configdrive, configdrive_reader, fat, iso9660

SYSTEM_PYTHON = "/usr/bin/python3"

# Runs inside Debian's python3 with the cloud-init package: both of its config
# drive entry points, plus its network_data -> network config conversion.
_CLOUD_INIT_SCRIPT = r"""
import json, sys
from cloudinit.sources.helpers import openstack
from cloudinit.sources import DataSourceConfigDrive
src, macs = sys.argv[1], json.loads(sys.argv[2])
v2 = openstack.ConfigDriveReader(src).read_v2()
via_datasource = DataSourceConfigDrive.read_config_drive(src)
net = openstack.convert_net_json(v2.get("networkdata"), known_macs=macs) if v2.get("networkdata") and macs else None
def plain(o):
    return o.decode("utf-8", "replace") if isinstance(o, bytes) else repr(o)
print(json.dumps({"v2": v2, "datasource": via_datasource, "network_config": net}, default=plain))
"""

NODE = {"uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123", "name": "node-7"}
PORTS = [
    {
        "uuid": "9f1a7c54-1a52-4bf4-a6a0-2f9d3c0a6b01",
        "address": "52:54:00:aa:bb:02",
        "extra": {},
        "internal_info": {"tenant_vif_port_id": "vif-2"},
    },
    {"uuid": "0c2a3b86-4f44-4a4b-9d5e-7e4f1c9b2a00", "address": "52:54:00:AA:BB:01", "extra": {}, "internal_info": {}},
]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFerrumTestKey ferrum@test"


def cloud_init_read(directory: str | os.PathLike[str], macs: dict[str, str] | None = None) -> dict[str, Any]:
    """What Debian's cloud-init makes of the config drive files under ``directory``."""
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", _CLOUD_INIT_SCRIPT, os.fspath(directory), json.dumps(macs or {})],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def extract(iso: bytes, dest: Path) -> list[str]:
    return iso9660.extract_iso(io.BytesIO(iso), dest)


def test_dict_becomes_an_iso_cloud_init_reads(tmp_path: Path) -> None:
    contents = {
        "meta_data": {"hostname": "web-7.example.org", "public_keys": {"default": KEY}},
        "user_data": "#cloud-config\nruncmd:\n  - echo hello ünïcode\n",
        "vendor_data": {"cloud-init": "#cloud-config\npackages: [htop]\n"},
    }
    iso = configdrive.build_configdrive(NODE, PORTS, contents)

    assert iso9660.volume_labels(io.BytesIO(iso)) == ["config-2", "config-2"]
    files = extract(iso, tmp_path)
    for version in ("2012-08-10", "latest"):
        for name in ("meta_data.json", "network_data.json", "user_data", "vendor_data2.json"):
            assert f"openstack/{version}/{name}" in files

    seen = cloud_init_read(tmp_path, {"52:54:00:aa:bb:01": "eno1", "52:54:00:aa:bb:02": "eno2"})
    v2 = seen["v2"]
    assert v2["metadata"]["uuid"] == NODE["uuid"]
    assert v2["metadata"]["instance-id"] == NODE["uuid"]
    assert v2["metadata"]["name"] == "node-7"
    assert v2["metadata"]["local-hostname"] == "web-7.example.org"
    assert v2["metadata"]["public_keys"] == {"default": KEY}
    assert v2["userdata"] == contents["user_data"]
    assert v2["vendordata2"] == contents["vendor_data"]
    links = v2["networkdata"]["links"]
    assert sorted(link["ethernet_mac_address"] for link in links) == ["52:54:00:aa:bb:01", "52:54:00:aa:bb:02"]
    assert all(link["type"] == "phy" and link["mtu"] == 1500 for link in links)
    assert [link.get("vif_id") for link in links] == [None, "vif-2"]
    physical = {c["mac_address"]: c for c in seen["network_config"]["config"] if c["type"] == "physical"}
    assert set(physical) == {"52:54:00:aa:bb:01", "52:54:00:aa:bb:02"}
    assert physical["52:54:00:aa:bb:01"]["name"] == "eno1"
    assert all(s["type"] == "dhcp4" for c in physical.values() for s in c["subnets"])
    assert seen["datasource"]["metadata"]["uuid"] == NODE["uuid"]


def test_user_data_dict_and_given_network_data_kept(tmp_path: Path) -> None:
    network = {
        "links": [{"id": "l0", "type": "phy", "ethernet_mac_address": "52:54:00:00:00:09", "mtu": 9000}],
        "networks": [
            {
                "id": "n0",
                "type": "ipv4",
                "link": "l0",
                "ip_address": "192.0.2.9",
                "netmask": "255.255.255.0",
                "network_id": "net",
            }
        ],
        "services": [],
    }
    user = {"ignition": {"version": "3.0.0"}}
    iso = configdrive.build_configdrive(
        {"uuid": NODE["uuid"], "name": None},
        PORTS,
        {"meta_data": {"uuid": "explicit", "hostname": "h"}, "network_data": network, "user_data": user},
    )
    extract(iso, tmp_path)
    v2 = cloud_init_read(tmp_path)["v2"]
    assert v2["metadata"]["uuid"] == "explicit"
    assert "name" not in v2["metadata"]
    assert v2["networkdata"] == network
    assert json.loads(v2["userdata"]) == user
    assert (tmp_path / "openstack/latest/user_data").read_bytes() == json.dumps(user).encode()
    assert not (tmp_path / "openstack/latest/vendor_data2.json").exists()


def test_minimal_dict_without_ports(tmp_path: Path) -> None:
    iso = configdrive.build_configdrive(NODE, [], {})
    files = extract(iso, tmp_path)
    assert files == ["openstack/2012-08-10/meta_data.json", "openstack/latest/meta_data.json"]
    v2 = cloud_init_read(tmp_path)["v2"]
    assert v2["metadata"] == {"uuid": NODE["uuid"], "name": "node-7", "instance-id": NODE["uuid"]}
    assert v2["userdata"] == ""


def test_same_files_as_openstacksdk(tmp_path: Path) -> None:
    """Our tree is byte-identical to openstacksdk's populate_directory for the same input."""
    meta = {"uuid": NODE["uuid"], "name": "node-7", "hostname": "h", "public_keys": {"k": KEY}}
    network: dict[str, list[Any]] = {"links": [], "networks": [], "services": []}
    vendor = {"a": 1}
    ours = configdrive.configdrive_files(
        NODE, PORTS, {"meta_data": meta, "network_data": network, "vendor_data": vendor, "user_data": "text"}
    )
    with sdk_configdrive.populate_directory(meta, b"text", network_data=network, vendor_data=vendor) as d:
        theirs = {str(p.relative_to(d)): p.read_bytes() for p in Path(d).rglob("*") if p.is_file()}
    assert ours == theirs


def test_big_user_data_shares_one_extent(tmp_path: Path) -> None:
    blob = os.urandom(3 * 1024 * 1024)
    user_data = base64.b64encode(blob).decode()
    iso = configdrive.build_configdrive(NODE, PORTS, {"user_data": user_data})
    assert len(iso) < len(user_data) + 1024 * 1024  # both versions point at the same bytes
    extract(iso, tmp_path)
    assert (tmp_path / "openstack/2012-08-10/user_data").read_text() == user_data
    assert (tmp_path / "openstack/latest/user_data").read_text() == user_data
    image = tmp_path / "drive.iso"
    image.write_bytes(iso)
    listing = (
        subprocess.run(["isoinfo", "-R", "-f", "-i", str(image)], capture_output=True, timeout=60, check=True)
        .stdout.decode()
        .split()
    )
    assert "/openstack/latest/user_data" in listing and "/openstack/2012-08-10/meta_data.json" in listing


def test_oversized_dict_is_refused() -> None:
    blob = base64.b64encode(os.urandom(49 * 1024 * 1024)).decode()  # 65+ MiB of text
    with pytest.raises(errors.InvalidParameterValue, match="64MiB"):
        configdrive.build_configdrive(NODE, [], {"user_data": blob})


@pytest.mark.parametrize("bad", [{"user_data": 5}, {"meta_data": "x"}, {"surprise": {}}, ["not", "a", "dict"]])
def test_bad_dict_is_refused(bad: Any) -> None:
    with pytest.raises(errors.InvalidParameterValue, match="Invalid configdrive format"):
        configdrive.build_configdrive(NODE, [], bad)


def test_openstacksdk_string_decodes_and_cloud_init_reads_it(tmp_path: Path) -> None:
    network = {
        "links": [{"id": "p", "type": "phy", "ethernet_mac_address": "52:54:00:aa:bb:01", "mtu": 1500}],
        "networks": [{"id": "n", "type": "ipv4_dhcp", "link": "p", "network_id": "x"}],
        "services": [],
    }
    value = sdk_configdrive.build(
        {"uuid": NODE["uuid"], "hostname": "sdk-host", "public_keys": {"0": KEY}},
        user_data=b"#!/bin/sh\necho sdk\n",
        network_data=network,
        vendor_data={"v": True},
    )
    iso = configdrive.decode_configdrive(value)
    assert iso9660.volume_labels(io.BytesIO(iso))[0] == "config-2"
    extract(iso, tmp_path)
    v2 = cloud_init_read(tmp_path)["v2"]
    assert v2["metadata"]["local-hostname"] == "sdk-host"
    assert v2["metadata"]["public_keys"] == {"0": KEY}
    assert v2["userdata"] == "#!/bin/sh\necho sdk\n"
    assert v2["networkdata"] == network
    assert v2["vendordata2"] == {"v": True}


def test_encode_decode_round_trip_and_plain_base64() -> None:
    iso = configdrive.build_configdrive(NODE, PORTS, {"user_data": "x"})
    encoded = configdrive.encode_configdrive(iso)
    assert gzip.decompress(base64.b64decode(encoded)) == iso
    assert configdrive.decode_configdrive(encoded) == iso
    wrapped = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))  # MIME-style line breaks
    assert configdrive.decode_configdrive(wrapped) == iso
    assert configdrive.decode_configdrive(base64.b64encode(iso).decode()) == iso


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not base64 at all!", "not a valid base64 string"),
        ("YWJ", "not a valid base64 string"),
        (base64.b64encode(b"\x1f\x8b\x08\x00garbage that is not deflate").decode(), "not valid gzip data"),
        (
            base64.b64encode(gzip.compress(random.Random(1).randbytes(100_000), mtime=0)[:-200]).decode(),
            "truncated gzip data",
        ),
        (
            base64.b64encode(gzip.compress(b"hello, not an iso", mtime=0)).decode(),
            "neither an ISO9660 image nor a VFAT",
        ),
        (base64.b64encode(b"\0" * 40_000).decode(), "neither an ISO9660 image nor a VFAT"),
        # A FAT image is a config drive only when it is labelled config-2, as cloud-init looks for it.
        (configdrive.encode_configdrive(fat.write_image({"a": b"x"}, label="DATA")), "nor a VFAT image labelled"),
        ("", "empty"),
        ({"meta_data": {}}, "expected a base64 string"),
    ],
)
def test_decode_errors_are_clear(value: Any, message: str) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=message) as caught:
        configdrive.decode_configdrive(value)
    assert caught.value.http_status == 400


def test_65_mib_after_decompression_is_refused() -> None:
    iso = configdrive.build_configdrive(NODE, [], {})
    bomb = iso + b"\0" * (65 * 1024 * 1024 - len(iso))  # a valid ISO head, 65 MiB in all
    value = base64.b64encode(gzip.compress(bomb, compresslevel=1)).decode()
    assert len(value) < 1024 * 1024  # small on the wire ...
    with pytest.raises(errors.InvalidParameterValue, match=r"maximum limit of 64MiB"):
        configdrive.decode_configdrive(value)  # ... refused after decompression
    with pytest.raises(errors.InvalidParameterValue, match=r"maximum limit of 1MiB"):
        configdrive.decode_configdrive(configdrive.encode_configdrive(iso + b"\0" * (2 << 20)), limit=1 << 20)
    plain = base64.b64encode(bomb).decode()
    with pytest.raises(errors.InvalidParameterValue, match=r"maximum limit of 64MiB"):
        configdrive.decode_configdrive(plain)


def test_looks_like_url() -> None:
    assert configdrive.looks_like_url("https://objects.example/configdrive-x?temp_url_sig=1")
    assert configdrive.looks_like_url("http://10.0.0.1/cd.iso.gz")
    assert configdrive.looks_like_url("swift://container/object")  # Ironic's rule: contains "://"
    assert not configdrive.looks_like_url("H4sIAAAAAAAA/+3BAQ0AAADCoPdPbQ43oAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    assert configdrive.is_http_url("HTTPS://x/y") and not configdrive.is_http_url("swift://c/o")


def test_pure_python_reader_agrees_with_cloud_init(tmp_path: Path) -> None:
    iso = configdrive.build_configdrive(
        NODE,
        PORTS,
        {
            "meta_data": {"hostname": "h7", "public_keys": {"a": KEY}},
            "user_data": "#cloud-config\n",
            "vendor_data": {"x": 1},
        },
    )
    extract(iso, tmp_path)
    v2 = cloud_init_read(tmp_path)["v2"]
    ours = configdrive_reader.read_configdrive(iso)
    assert ours.version == "2012-08-10"  # cloud-init picks the newest dated directory it knows
    assert ours.meta_data["uuid"] == v2["metadata"]["uuid"] and ours.hostname == v2["metadata"]["local-hostname"]
    assert ours.public_keys == [KEY]
    assert ours.user_data is not None and ours.user_data.decode() == v2["userdata"]
    assert ours.network_data == v2["networkdata"] and ours.vendor_data2 == v2["vendordata2"]
    assert ours.vendor_data is None and "vendordata" not in v2
    assert ours.macs == ["52:54:00:aa:bb:01", "52:54:00:aa:bb:02"]
    with pytest.raises(errors.ConfigDriveInvalid, match=r"meta_data\.json"):
        configdrive_reader.parse_configdrive_files({"openstack/latest/user_data": b"x"})


def vfat_drive(tmp_path: Path, *, label: str = "config-2") -> bytes:
    """A VFAT config drive the way Nova makes one (config_drive_format=vfat): the files
    openstacksdk's builder puts on its ISO, on FAT labelled config-2."""
    iso = configdrive.decode_configdrive(
        sdk_configdrive.build(
            {"uuid": NODE["uuid"], "hostname": "vfat-host", "public_keys": {"0": KEY}},
            user_data=b"#cloud-config\nfinal_message: vfat\n",
        )
    )
    tree = tmp_path / "tree"
    names = extract(iso, tree)
    files = {name: (tree / name).read_bytes() for name in names if (tree / name).is_file()}
    return fat.write_image(files, label=label, size=4 * 1024 * 1024)


def test_vfat_config_drive_is_accepted_and_read_as_cloud_init_does(tmp_path: Path) -> None:
    drive = vfat_drive(tmp_path)
    assert configdrive.drive_format(drive) == "vfat"
    assert configdrive.decode_configdrive(configdrive.encode_configdrive(drive)) == drive
    assert configdrive.decode_configdrive(base64.b64encode(drive).decode()) == drive
    ours = configdrive_reader.read_configdrive(drive)
    assert ours.hostname == "vfat-host" and ours.instance_id == NODE["uuid"]
    assert ours.user_data == b"#cloud-config\nfinal_message: vfat\n"
    # cloud-init on the same files, as a mounted vfat drive shows them
    mounted = tmp_path / "mounted"
    volume = fat.FatVolume(_write(tmp_path / "drive.img", drive))
    for name in volume.files():
        (mounted / name).parent.mkdir(parents=True, exist_ok=True)
        (mounted / name).write_bytes(volume.read(name))
    v2 = cloud_init_read(mounted)["v2"]
    assert v2["metadata"]["local-hostname"] == "vfat-host" and v2["metadata"]["uuid"] == NODE["uuid"]


def test_unlabelled_vfat_is_not_a_config_drive(tmp_path: Path) -> None:
    drive = vfat_drive(tmp_path, label="OTHER")
    assert configdrive.drive_format(drive) is None
    with pytest.raises(errors.ConfigDriveInvalid, match="nor a VFAT image labelled config-2"):
        configdrive_reader.read_configdrive(drive)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
