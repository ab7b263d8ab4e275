"""Issue 16's api findings over REST and gRPC against a live stack:

- #5 a node cannot be stranded in a conductor group no conductor serves;
- #6 secrets are masked at any depth, and credentials inside URLs, wherever
  the api returns node fields (and volume targets, deploy templates);
- #8 a body nested 100,000 deep is a 400, not a 500 RecursionError;
- #12 a value the iPXE renderer would refuse is refused when it is set, and
  one that got in anyway fails the deploy at once with a last_error.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import struct_pb2

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc

V = {"X-OpenStack-Ironic-API-Version": "1.78"}
KERNEL, RAMDISK = "http://192.0.2.9/deploy.kernel", "http://192.0.2.9/deploy.initramfs"
UNSERVED = "nobody-serves-this-group"
NO_VALID_HOST = (
    "No valid host was found. Reason: No conductor service registered which supports driver fake-hardware "
    f'for conductor group "{UNSERVED}". Ensure the driver is valid and enabled.'
)


class Rest:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"data": raw, "headers": {**V, "Content-Type": "application/json"}}
        if raw is None:
            kwargs = {"json": body, "headers": V}
        async with self.session.request(method, self.base + path, **kwargs) as r:
            text = await r.text()
            return r.status, json.loads(text) if text else None


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


@pytest.fixture(scope="module")
async def rest(stack: Any):
    async with aiohttp.ClientSession() as session:
        yield Rest(session, stack.endpoints["api REST (Ironic v1)"])


@pytest.fixture(scope="module")
async def nodes(stack: Any):
    channel = grpc.aio.insecure_channel(stack.endpoints["api gRPC"])
    yield pb_grpc.NodeServiceStub(channel)
    await channel.close()


async def create(rest: Rest, **fields: Any) -> dict[str, Any]:
    status, body = await rest.call("POST", "/v1/nodes", {"driver": "fake-hardware", **fields})
    assert status == 201, body
    return dict(body)


# -- #5: conductor groups ------------------------------------------------------


async def test_create_in_an_unserved_group_is_refused(rest: Rest, nodes: Any) -> None:
    status, body = await rest.call(
        "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "stranded-new", "conductor_group": UNSERVED}
    )
    assert status == 400 and fault(body) == NO_VALID_HOST
    assert json.loads(body["error_message"])["faultcode"] == "Client"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await nodes.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", conductor_group=UNSERVED))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and caught.value.details() == NO_VALID_HOST
    status, _ = await rest.call("GET", "/v1/nodes/stranded-new")
    assert status == 404


async def test_patch_to_an_unserved_group_is_refused_and_changes_nothing(rest: Rest, nodes: Any) -> None:
    node = await create(rest, name="stay-routable")
    status, body = await rest.call(
        "PATCH", "/v1/nodes/stay-routable", [{"op": "replace", "path": "/conductor_group", "value": UNSERVED}]
    )
    assert status == 400 and fault(body) == NO_VALID_HOST
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await nodes.PatchNode(
            pb.PatchNodeRequest(
                ident="stay-routable",
                patch_json=json.dumps([{"op": "replace", "path": "/conductor_group", "value": UNSERVED}]),
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and caught.value.details() == NO_VALID_HOST
    status, after = await rest.call("GET", "/v1/nodes/stay-routable")
    assert after["conductor_group"] == "" and after["updated_at"] == node["updated_at"]
    # The node can still be changed: every later change used to be a 503.
    status, body = await rest.call(
        "PATCH", "/v1/nodes/stay-routable", [{"op": "add", "path": "/extra/still", "value": "fine"}]
    )
    assert status == 200 and body["extra"] == {"still": "fine"}
    # A served group (groups are case-insensitive on the ring) is accepted.
    status, body = await rest.call(
        "PATCH", "/v1/nodes/stay-routable", [{"op": "replace", "path": "/conductor_group", "value": ""}]
    )
    assert status == 200


async def test_a_node_stranded_by_sql_can_be_patched_back(stack: Any, rest: Rest) -> None:
    """The change goes to the conductor of the group it names, as in Ironic, so a
    node already in an unserved group can be moved back without SQL."""
    node = await create(rest, name="rescued-by-patch")
    await stack.pool.execute("UPDATE nodes SET conductor_group = $1 WHERE uuid = $2::uuid", UNSERVED, node["uuid"])
    status, body = await rest.call(
        "PATCH", "/v1/nodes/rescued-by-patch", [{"op": "replace", "path": "/conductor_group", "value": ""}]
    )
    assert status == 200 and body["conductor_group"] == ""


# -- #6: masking ---------------------------------------------------------------

SECRET_DRIVER_INFO = {
    "redfish_address": "https://10.0.0.1",
    "redfish_username": "admin",
    "redfish_password": "bmc-secret-1",
    "bmc": {"password": "bmc-secret-2", "nested": [{"auth_token": "bmc-secret-3"}]},
    "image_https_proxy": "http://proxyuser:bmc-secret-4@proxy.example:3128",
    "snmp_priv_key": "bmc-secret-5",
}
SECRET_INSTANCE_INFO = {
    "image_source": "http://img.example/disk.raw",
    "image_url_password": "img-secret-1",
    "image_checksum": "0" * 64,
    "mirror": "https://img-secret-2@mirror.example/disk.raw",
}


def no_secret_in(text: str) -> None:
    for secret in ("bmc-secret", "img-secret", "log-secret", "step-secret", "chap-secret", "tpl-secret"):
        assert secret not in text, (secret, text[:2000])


async def test_secrets_are_masked_everywhere_the_api_shows_a_node(stack: Any, rest: Rest, nodes: Any) -> None:
    node = await create(rest, name="masked", driver_info=SECRET_DRIVER_INFO, instance_info=SECRET_INSTANCE_INFO)
    await stack.pool.execute(
        "UPDATE nodes SET last_error = $1, clean_step = $2 WHERE uuid = $3::uuid",
        "image download from http://u:log-secret@img.example/x failed",
        {"interface": "bios", "step": "apply", "args": {"admin_password": "step-secret"}},
        node["uuid"],
    )
    texts = [json.dumps(node)]
    for path in (
        "/v1/nodes/masked",
        "/v1/nodes/masked?fields=driver_info,instance_info,last_error,clean_step",
        "/v1/nodes/detail",
        "/v1/nodes?fields=name,driver_info,instance_info,last_error",
        "/v1/nodes/masked/states",
    ):
        status, body = await rest.call("GET", path)
        assert status == 200, body
        texts.append(json.dumps(body))
    status, patched = await rest.call("PATCH", "/v1/nodes/masked", [{"op": "add", "path": "/extra/x", "value": 1}])
    assert status == 200
    texts.append(json.dumps(patched))
    grpc_node = await nodes.GetNode(pb.GetNodeRequest(ident="masked"))
    texts.append(str(grpc_node))
    listed = await nodes.ListNodes(pb.ListNodesRequest())
    texts.append(str(listed))
    for text in texts:
        no_secret_in(text)
    _, shown = await rest.call("GET", "/v1/nodes/masked")
    assert shown["driver_info"]["bmc"] == {"password": "******", "nested": [{"auth_token": "******"}]}
    assert shown["driver_info"]["image_https_proxy"] == "http://proxyuser:******@proxy.example:3128"
    assert shown["driver_info"]["redfish_username"] == "admin"  # not a secret
    assert shown["instance_info"]["image_url_password"] == "******"
    assert shown["instance_info"]["mirror"] == "https://******@mirror.example/disk.raw"
    assert shown["last_error"] == "image download from http://u:******@img.example/x failed"
    assert shown["clean_step"]["args"] == {"admin_password": "******"}
    # Stored as given: a patch still works on the real values.
    stored = await stack.pool.fetchval("SELECT driver_info->'bmc'->>'password' FROM nodes WHERE name = 'masked'")
    assert stored == "bmc-secret-2"


async def test_volume_target_and_deploy_template_secrets_are_masked(rest: Rest) -> None:
    node = await create(rest, name="masked-volume")
    status, target = await rest.call(
        "POST",
        "/v1/volume/targets",
        {
            "node_uuid": node["uuid"],
            "volume_type": "iscsi",
            "boot_index": 0,
            "volume_id": "v-masked",
            "properties": {"auth_method": "CHAP", "auth_username": "u", "auth_password": "chap-secret"},
        },
    )
    assert status == 201, target
    status, template = await rest.call(
        "POST",
        "/v1/deploy_templates",
        {
            "name": "CUSTOM_MASKED",
            "steps": [
                {
                    "interface": "bios",
                    "step": "apply_configuration",
                    "args": {"settings": [], "admin_password": "tpl-secret"},
                    "priority": 10,
                }
            ],
        },
    )
    assert status == 201, template
    texts = [json.dumps(target), json.dumps(template)]
    for path in (
        f"/v1/volume/targets/{target['uuid']}",
        "/v1/volume/targets?detail=true",
        "/v1/deploy_templates?detail=true",
    ):
        status, body = await rest.call("GET", path)
        assert status == 200, body
        texts.append(json.dumps(body))
    for text in texts:
        no_secret_in(text)
    assert target["properties"]["auth_password"] == "******" and target["properties"]["auth_username"] == "u"


# -- #8: nesting ---------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000, b'{"driver": "fake-hardware", "extra": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001],
)
async def test_a_body_nested_100k_deep_is_a_400(rest: Rest, raw: bytes) -> None:
    for method, path in (("POST", "/v1/nodes"), ("PATCH", "/v1/nodes/masked"), ("POST", "/v1/ports")):
        started = time.perf_counter()
        status, body = await rest.call(method, path, raw=raw)
        assert status == 400, (path, body)
        assert "deeper than the maximum depth of 25" in fault(body)
        assert time.perf_counter() - started < 2.0


async def test_nan_and_infinity_in_a_body_are_a_clear_400(rest: Rest) -> None:
    status, body = await rest.call("POST", "/v1/nodes", raw=b'{"driver": "fake-hardware", "properties": {"x": NaN}}')
    assert status == 400 and "NaN is not a valid JSON number" in fault(body)


# -- #12: values that can never boot ---------------------------------------------

BAD_BOOT_VALUES = [
    ("driver_info", "kernel_append_params", "console=ttyS0\nchain http://evil/", "a newline ('\\n')"),
    ("driver_info", "kernel_append_params", "nofb ${net0/mac}", "'$'"),
    ("driver_info", "kernel_append_params", "a\tb", "a tab ('\\t')"),
    ("instance_info", "kernel_append_params", "root=/dev/sda\r\n", "a carriage return ('\\r')"),
    ("instance_info", "ramdisk_kernel_arguments", 'quiet "x"', "'\"'"),
    ("driver_info", "deploy_kernel", "http://h/k ernel", "a space (' ')"),
    ("driver_info", "deploy_ramdisk", "http://h/r||goto x", "'|'"),
    ("driver_info", "deploy_kernel", "ftp://h/kernel", "must be an absolute http/https URL"),
    ("driver_info", "rescue_kernel", "http://h/k\n", "a newline ('\\n')"),
    ("instance_info", "boot_iso", "http://h/a.iso&&chain", "'&&'"),
    ("instance_info", "kernel", "http://h/{k}", "'{'"),
]


@pytest.mark.parametrize(
    ("index", "section", "key", "value", "named"), [(i, *case) for i, case in enumerate(BAD_BOOT_VALUES)]
)
async def test_values_the_renderer_refuses_are_refused_when_set(
    rest: Rest, nodes: Any, index: int, section: str, key: str, value: str, named: str
) -> None:
    name = f"boot-bad-{index}"
    status, body = await rest.call(
        "POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, section: {key: value}}
    )
    assert status == 400, body
    assert f"{section} {key}" in fault(body) and named in fault(body), fault(body)
    status, _ = await rest.call("GET", f"/v1/nodes/{name}")
    assert status == 404
    await create(rest, name=name)
    status, body = await rest.call(
        "PATCH", f"/v1/nodes/{name}", [{"op": "add", "path": f"/{section}/{key}", "value": value}]
    )
    assert status == 400 and f"{section} {key}" in fault(body) and named in fault(body), body
    _, after = await rest.call("GET", f"/v1/nodes/{name}")
    assert key not in after[section]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        info = struct_pb2.Struct()
        info.update({key: value})
        fields: dict[str, Any] = {section: info}
        await nodes.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", **fields))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{section} {key}" in (caught.value.details() or "")


async def test_good_boot_values_are_accepted(rest: Rest) -> None:
    node = await create(
        rest,
        name="boot-good",
        driver_info={"deploy_kernel": KERNEL, "deploy_ramdisk": RAMDISK, "kernel_append_params": "%default% quiet"},
        instance_info={"kernel_append_params": "console=ttyS1,115200n8 ip=dhcp"},
    )
    assert node["driver_info"]["kernel_append_params"] == "%default% quiet"


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"target_iqn": "iqn.2026-01.org.example:x\ngoto y"}, "properties target_iqn"),
        ({"target_portal": "10.0.0.1:99999"}, "properties target_portal port"),
        ({"target_portals": ["10.0.0.1:3260", "evil host"]}, "properties target_portals host"),
        ({"target_lun": -1}, "properties target_lun"),
        ({"auth_method": "CHAP", "auth_username": "u", "auth_password": "pw with space"}, "auth_password"),
    ],
)
async def test_volume_target_values_the_renderer_refuses_are_refused(
    rest: Rest, properties: dict[str, Any], named: str
) -> None:
    node = await create(rest)
    target = {"node_uuid": node["uuid"], "volume_type": "iscsi", "boot_index": 0, "volume_id": "v"}
    status, body = await rest.call("POST", "/v1/volume/targets", {**target, "properties": properties})
    assert status == 400 and named in fault(body), body
    status, created = await rest.call("POST", "/v1/volume/targets", target)
    assert status == 201
    status, body = await rest.call(
        "PATCH", f"/v1/volume/targets/{created['uuid']}", [{"op": "add", "path": "/properties", "value": properties}]
    )
    assert status == 400 and named in fault(body), body
    status, body = await rest.call(
        "POST", "/v1/volume/connectors", {"node_uuid": node["uuid"], "type": "iqn", "connector_id": "iqn.x y"}
    )
    assert status == 400 and "connector connector_id" in fault(body)


async def wait_for(rest: Rest, ident: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        _, node = await rest.call("GET", f"/v1/nodes/{ident}")
        if node["provision_state"] == state and node["reservation"] is None:
            return dict(node)
        assert time.monotonic() < deadline, (node["provision_state"], node["last_error"])
        await asyncio.sleep(0.05)


async def test_a_bad_value_written_with_sql_fails_the_deploy_at_once(stack: Any, rest: Rest) -> None:
    """Before: the deploy went to wait call-back and waited for its timeout with no
    last_error. Now the ipxe boot interface checks before it powers the machine on."""
    node = await create(
        rest,
        name="sql-bad-append",
        boot_interface="ipxe",
        deploy_interface="direct",
        driver_info={"deploy_kernel": KERNEL, "deploy_ramdisk": RAMDISK},
        instance_info={"image_source": "http://192.0.2.9/disk.raw", "image_checksum": "0" * 64},
    )
    status, body = await rest.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:16:12:01"})
    assert status == 201, body
    await stack.pool.execute(
        "UPDATE nodes SET provision_state = 'available', power_state = 'power off',"
        " driver_info = driver_info || $1::jsonb WHERE uuid = $2::uuid",
        {"kernel_append_params": "console=ttyS0\ngoto evil"},
        node["uuid"],
    )
    status, body = await rest.call("PUT", "/v1/nodes/sql-bad-append/states/provision", {"target": "active"})
    assert status == 202, body
    failed = await wait_for(rest, "sql-bad-append", "deploy failed")
    assert "driver_info kernel_append_params contains a newline" in failed["last_error"], failed["last_error"]
    assert failed["power_state"] != "power on"  # never booted into a script that cannot render
