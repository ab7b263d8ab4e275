"""The ``cinder`` storage interface against a real Cinder 29 (tests/support/cinder_service.py):
cinder-api/scheduler/volume with RabbitMQ, and the LVM driver exporting volumes over
iSCSI with tgtd. One Cinder serves the whole module; every check reads Cinder's own
view of the volumes afterwards, and the iSCSI data the interface records is used to
log in and read the volume (qemu-io, CHAP).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
import pytest

from services.common import errors
from services.common.db.records import NodeVolumeTarget
from services.conductor.drivers import base
from services.conductor.drivers.cinder import IN_USE, CinderStorage
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings
from tests.restclient import call, wait_state
from tests.support.cinder_service import cinder_service
from tests.support.cinder_smoke import Rest
from tests.support.node_records import node_record

pytestmark = pytest.mark.timeout(300)

INITIATOR = "iqn.2026-11.io.ferrum:node-1"


@pytest.fixture(scope="module")
def cinder() -> Iterator[dict[str, Any]]:
    with cinder_service() as info:
        yield info


@pytest.fixture(scope="module")
def rest(cinder: dict[str, Any]) -> Rest:
    return Rest(cinder)


def options(cinder: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "cinder_url": cinder["url"],
        "cinder_project_id": cinder["project_id"],
        "cinder_auth_strategy": "noauth",
        "cinder_url_timeout": 10,
        "cinder_retries": 1,
        "cinder_retry_interval": 0.1,
        **extra,
    }


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v3"  # nothing listens once the socket is closed


def create_volume(rest: Rest, name: str) -> str:
    status, body = rest.call("POST", "/volumes", {"volume": {"size": 1, "name": name}})
    assert status == 202, (status, body)  # a 5xx printed cinder-api's log to stderr
    volume_id: str = body["volume"]["id"]
    rest.wait_status(volume_id, "available")
    return volume_id


def make_task(
    volume_ids: list[str], *, provision_state: str = "deploying", instance_uuid: str | None = None, **instance_info: Any
) -> tuple[base.Task, dict[str, dict[str, Any]]]:
    node_uuid = str(uuid.uuid4())
    targets: list[NodeVolumeTarget] = [
        {
            "uuid": str(uuid.uuid4()),
            "volume_type": "iscsi",
            "boot_index": index,
            "volume_id": volume_id,
            "properties": {},
            "extra": {},
        }
        for index, volume_id in enumerate(volume_ids)
    ]
    task = base.Task(
        node=node_record(
            uuid=node_uuid,
            instance_uuid=instance_uuid,
            instance_info=dict(instance_info),
            properties={"capabilities": "iscsi_boot:true"},
            provision_state=provision_state,
        ),
        ports=[],
        driver=None,  # type: ignore[arg-type]  # the storage interface never reads it
        conductor="test",
        volume_targets=targets,
        volume_connectors=[
            {"uuid": str(uuid.uuid4()), "type": "iqn", "connector_id": INITIATOR, "extra": {}},
            {"uuid": str(uuid.uuid4()), "type": "ip", "connector_id": "127.0.0.1", "extra": {}},
        ],
    )
    saved: dict[str, dict[str, Any]] = {}

    async def save_volume_target_properties(target_uuid: str, properties: Mapping[str, Any]) -> None:
        saved[target_uuid] = dict(properties)

    task.save_volume_target_properties = save_volume_target_properties  # the conductor's hook
    return task, saved


def iscsi_read(props: Mapping[str, Any]) -> str:
    """Log in with the recorded portal/IQN/LUN/CHAP and read the first block (qemu-io over libiscsi)."""
    opts = (
        f"driver=raw,file.driver=iscsi,file.transport=tcp,file.portal={props['target_portal']},"
        f"file.target={props['target_iqn']},file.lun={props['target_lun']},file.user={props['auth_username']},"
        f"file.password-secret=chap,file.initiator-name={INITIATOR}"
    )
    secret = f"secret,id=chap,data={props['auth_password']}"
    done = subprocess.run(
        ["qemu-io", "--object", secret, "--image-opts", opts, "-c", "read 0 4096"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "read 4096/4096" in done.stdout, (done.stdout, done.stderr)
    return done.stdout


async def test_no_targets_needs_no_cinder() -> None:
    storage = CinderStorage({})  # no url at all: nothing to check, nothing to attach
    task, _ = make_task([])
    await storage.validate(task)
    await storage.attach_volumes(task)
    await storage.detach_volumes(task)
    assert storage.should_write_image(task)


def test_should_write_image() -> None:
    storage = CinderStorage({})
    boot, _ = make_task(["v-boot"])
    assert not storage.should_write_image(boot)  # boot volume, no image: the volume holds the OS
    forced, _ = make_task(["v-boot"], image_source="http://images/x.qcow2", force_deployment=True)
    assert storage.should_write_image(forced)  # seed 004 scenario 4: the image goes onto the volume
    data_only, _ = make_task(["v-boot"])
    data_only.volume_targets[0]["boot_index"] = 1
    assert storage.should_write_image(data_only)


async def test_attach_and_detach(cinder: dict[str, Any], rest: Rest) -> None:
    boot_id = create_volume(rest, "ferrum-boot")
    data_id = create_volume(rest, "ferrum-data")
    instance = str(uuid.uuid4())
    task, saved = make_task([boot_id, data_id], instance_uuid=instance)
    storage = CinderStorage(options(cinder))
    await storage.validate(task)

    await storage.attach_volumes(task)

    node_uuid = task.node["uuid"]
    for target in task.volume_targets:
        volume = rest.volume(target["volume_id"])
        assert volume["status"] == "in-use"
        (attachment,) = volume["attachments"]
        assert attachment["server_id"] == instance
        assert attachment["host_name"] == node_uuid
        meta = json.loads(volume["metadata"][f"ironic_node_{node_uuid}"])
        assert meta["instance_uuid"] == instance and meta["last_action"] == "attached"
        props = saved[target["uuid"]]
        assert target["properties"] == props
        assert props["target_portal"] == cinder["iscsi_portal"]
        assert props["target_iqn"].endswith(target["volume_id"]) and props["target_lun"] == 1
        assert props["auth_method"] == "CHAP" and props["auth_username"] and props["auth_password"]
        assert props["volume_id"] == target["volume_id"]
    iscsi_read(saved[task.volume_targets[0]["uuid"]])  # the recorded data opens the boot volume

    # Attaching again (a retried deploy) skips what is attached and keeps its properties.
    saved.clear()
    await storage.attach_volumes(task)
    assert saved == {}
    assert [len(rest.volume(v)["attachments"]) for v in (boot_id, data_id)] == [1, 1]

    # A detach pass that stopped after os-begin_detaching (Cinder answered 500 to os-detach)
    # left the boot volume "detaching": the next pass finishes it instead of being refused.
    status, _ = rest.call("POST", f"/volumes/{boot_id}/action", {"os-begin_detaching": None})
    assert status == 202 and rest.volume(boot_id)["status"] == "detaching"
    await storage.detach_volumes(task)
    for volume_id in (boot_id, data_id):
        volume = rest.volume(volume_id)
        assert volume["status"] == "available" and volume["attachments"] == []
        assert json.loads(volume["metadata"][f"ironic_node_{node_uuid}"])["last_action"] == "detached"
    await storage.detach_volumes(task)  # nothing attached: nothing to do


async def test_validate_unknown_volume(cinder: dict[str, Any]) -> None:
    missing = str(uuid.uuid4())
    task, _ = make_task([missing])
    target = task.volume_targets[0]["uuid"]
    with pytest.raises(errors.InvalidParameterValue, match=rf"volume target {target} names volume {missing}.*not"):
        await CinderStorage(options(cinder)).validate(task)


async def test_attach_unknown_volume(cinder: dict[str, Any]) -> None:
    missing = str(uuid.uuid4())
    task, saved = make_task([missing])
    with pytest.raises(errors.HardwareError, match=rf"cannot find volume {missing}.*could not be found"):
        await CinderStorage(options(cinder)).attach_volumes(task)
    assert saved == {}


async def test_unreachable_cinder_fails_fast(cinder: dict[str, Any]) -> None:
    url = closed_port_url()
    task, _ = make_task([str(uuid.uuid4())])
    storage = CinderStorage(options(cinder, cinder_url=url, cinder_url_timeout=5))
    started = time.monotonic()
    with pytest.raises(errors.InvalidParameterValue, match=rf"Cinder at {url} cannot be reached"):
        await storage.validate(task)
    assert time.monotonic() - started < 5


async def test_unset_options_are_refused() -> None:
    task, _ = make_task([str(uuid.uuid4())])
    with pytest.raises(errors.InvalidParameterValue, match="cinder_url is not set"):
        await CinderStorage({}).validate(task)
    with pytest.raises(errors.InvalidParameterValue, match="cinder_project_id is not set"):
        await CinderStorage({"cinder_url": "http://127.0.0.1:1/v3"}).validate(task)
    with pytest.raises(errors.InvalidParameterValue, match="supports noauth, keystone"):
        await CinderStorage({"cinder_auth_strategy": "token"}).validate(task)
    with pytest.raises(errors.InvalidParameterValue, match="needs cinder_auth_url, cinder_username, cinder_password"):
        await CinderStorage({"cinder_auth_strategy": "keystone", "cinder_project_id": "p"}).validate(task)


async def test_volume_in_use_elsewhere_is_refused(cinder: dict[str, Any], rest: Rest) -> None:
    volume_id = create_volume(rest, "ferrum-taken")
    other, _ = make_task([volume_id])
    storage = CinderStorage(options(cinder))
    await storage.attach_volumes(other)
    task, saved = make_task([volume_id])
    with pytest.raises(errors.HardwareError, match=rf"cannot attach volume {volume_id} .*'in-use' \(attached to "):
        await storage.attach_volumes(task)
    assert saved == {}
    volume = rest.volume(volume_id)
    assert volume["status"] == "in-use" and [a["server_id"] for a in volume["attachments"]] == [other.node["uuid"]]
    await storage.detach_volumes(other)


async def test_cinder_refusal_part_way_undoes_the_attached_ones(cinder: dict[str, Any], rest: Rest) -> None:
    good = create_volume(rest, "ferrum-good")
    broken = create_volume(rest, "ferrum-broken")
    # Cinder's own refusal: os-reserve of a volume Cinder holds in another state.
    rest.action(broken, "os-reset_status", {"status": "error"})
    task, _ = make_task([good, broken])
    storage = CinderStorage(options(cinder))
    with pytest.raises(errors.HardwareError, match=rf"cannot reserve volume {broken} .*status is error"):
        await storage.attach_volumes(task)
    assert rest.volume(good)["status"] == "available" and rest.volume(good)["attachments"] == []
    assert rest.volume(broken)["status"] == "error"


async def test_volume_reserved_by_someone_else_is_refused_by_cinder(cinder: dict[str, Any], rest: Rest) -> None:
    volume_id = create_volume(rest, "ferrum-reserved")
    rest.action(volume_id, "os-reserve")  # someone else's reservation: status attaching
    task, _ = make_task([volume_id])
    with pytest.raises(errors.HardwareError, match=rf"cannot reserve volume {volume_id} .*status is attaching"):
        await CinderStorage(options(cinder)).attach_volumes(task)
    rest.action(volume_id, "os-unreserve")
    assert rest.volume(volume_id)["status"] == "available"


async def test_detach_errors(cinder: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    url = closed_port_url()
    storage = CinderStorage(options(cinder, cinder_url=url, cinder_retries=2, cinder_retry_interval=0.05))
    deleting, _ = make_task([str(uuid.uuid4())], provision_state="deleting")
    started = time.monotonic()
    with pytest.raises(errors.HardwareError, match=rf"Cinder at {url}: cannot find volume"):
        await storage.detach_volumes(deleting)
    assert time.monotonic() - started < 5
    assert sum("trying again" in r.getMessage() for r in caplog.records) == 2  # 3 attempts
    active, _ = make_task([str(uuid.uuid4())], provision_state="active")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        await storage.detach_volumes(active)  # an active node's errors are logged, not raised
    assert any("cannot find volume" in r.getMessage() for r in caplog.records)


def test_toggle_attachments_with_power_option() -> None:
    task: Any = None  # the option is the conductor's, not the node's
    assert CinderStorage({}).power_toggles_attachments(task) is True
    assert CinderStorage({"toggle_attachments_with_power": "false"}).power_toggles_attachments(task) is False
    with pytest.raises(errors.InvalidParameterValue):
        CinderStorage({"toggle_attachments_with_power": "maybe"}).power_toggles_attachments(task)


async def test_keystone_token_and_catalog(cinder: dict[str, Any], rest: Rest) -> None:
    """keystone: a v3 password token, the endpoint from its catalog, cached across calls.

    Keystone here is a minimal v3 token endpoint (Keystone is not what is under
    test); it issues the token Cinder's noauth accepts for the project, so the
    calls that follow reach the real Cinder with the token it handed out.
    """
    from aiohttp import web

    project = cinder["project_id"]
    requests: list[dict[str, Any]] = []

    async def tokens(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        auth = body["auth"]
        if auth["identity"]["password"]["user"]["password"] != "pw":
            return web.json_response(
                {"error": {"code": 401, "message": "The request you have made requires authentication."}}, status=401
            )
        token = {
            "project": {"id": project, "name": "ferrum"},
            "expires_at": "2099-01-01T00:00:00.000000Z",
            "catalog": [
                {"type": "identity", "endpoints": [{"interface": "public", "url": "http://127.0.0.1:1/v3"}]},
                {"type": "block-storage", "endpoints": [{"interface": "public", "url": f"{cinder['url']}/{project}"}]},
            ],
        }
        return web.json_response({"token": token}, status=201, headers={"X-Subject-Token": f"ferrum:{project}"})

    app = web.Application()
    app.router.add_post("/v3/auth/tokens", tokens)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        keystone = {
            "cinder_auth_strategy": "keystone",
            "cinder_auth_url": f"http://127.0.0.1:{port}",
            "cinder_username": "ferrum",
            "cinder_password": "pw",
            "cinder_project_name": "ferrum",
            "cinder_url_timeout": 10,
        }
        volume_id = create_volume(rest, "ferrum-keystone")
        task, saved = make_task([volume_id])
        storage = CinderStorage(keystone)
        await storage.validate(task)
        await storage.attach_volumes(task)
        assert rest.volume(volume_id)["status"] == "in-use"
        assert saved[task.volume_targets[0]["uuid"]]["target_portal"] == cinder["iscsi_portal"]
        await storage.detach_volumes(task)
        assert rest.volume(volume_id)["status"] == "available"
        assert len(requests) == 1  # one token for all the calls
        scope = requests[0]["auth"]["scope"]["project"]
        assert scope == {"name": "ferrum", "domain": {"name": "Default"}}
        wrong = CinderStorage({**keystone, "cinder_password": "nope"})
        with pytest.raises(errors.InvalidParameterValue, match="Keystone refused the token request: The request you"):
            await wrong.validate(task)
    finally:
        await runner.cleanup()


# -- over REST: deploy, power and tear down of a node whose boot volume Cinder attaches ----


@pytest.fixture(scope="module")
async def env(
    cinder: dict[str, Any], database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("state"),
        conductor={
            "hostname": "cinder-conductor",
            "automated_clean": False,
            "enabled_storage_interfaces": ("noop", "external", "cinder", "fake"),
            **options(cinder),
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    session = aiohttp.ClientSession()
    try:
        yield {"stack": stack, "session": session, "api": stack.endpoints["api REST (Ironic v1)"]}
    finally:
        await session.close()
        await stack.close()


async def rest_node(env: dict[str, Any], volume_id: str, mac: str) -> tuple[str, str]:
    body = {
        "driver": "fake-hardware",
        "boot_interface": "ipxe",
        "deploy_interface": "direct",
        "storage_interface": "cinder",
        "properties": {"capabilities": "iscsi_boot:true,boot_mode:bios"},
    }
    _, node = await call(env, "POST", "/v1/nodes", body, expect=201)
    uuid_ = str(node["uuid"])
    await call(env, "POST", "/v1/ports", {"node_uuid": uuid_, "address": mac}, expect=201)
    connector = {"node_uuid": uuid_, "type": "iqn", "connector_id": f"{INITIATOR}-{mac[-2:]}"}
    await call(env, "POST", "/v1/volume/connectors", connector, expect=201)
    target = {"node_uuid": uuid_, "volume_type": "iscsi", "boot_index": 0, "volume_id": volume_id, "properties": {}}
    _, created = await call(env, "POST", "/v1/volume/targets", target, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(env, "PUT", f"/v1/nodes/{uuid_}/states/provision", {"target": verb}, expect=202)
        await wait_state(env, uuid_, state)
    return uuid_, str(created["uuid"])


async def power(env: dict[str, Any], uuid_: str, target: str) -> None:
    await call(env, "PUT", f"/v1/nodes/{uuid_}/states/power", {"target": target}, expect=202)
    deadline = time.monotonic() + 30
    while True:
        _, node = await call(env, "GET", f"/v1/nodes/{uuid_}", expect=200)
        if node["power_state"] == target and node["target_power_state"] is None:
            assert node["last_error"] is None, node["last_error"]
            return
        assert time.monotonic() < deadline, node
        await asyncio.sleep(0.1)


async def test_rest_deploy_attaches_the_boot_volume_power_toggles_it_and_tear_down_detaches(
    env: dict[str, Any], rest: Rest
) -> None:
    volume_id = create_volume(rest, "ferrum-rest-boot")
    uuid_, target = await rest_node(env, volume_id, "52:54:00:c1:00:01")
    await call(env, "PUT", f"/v1/nodes/{uuid_}/states/provision", {"target": "active"}, expect=202)
    active = await wait_state(env, uuid_, "active")
    assert active["last_error"] is None and active["instance_info"]["boot_option"] == "netboot"
    volume = rest.volume(volume_id)
    assert volume["status"] == IN_USE and volume["attachments"][0]["host_name"] == uuid_
    # The connection Cinder handed out is in the target, and the renderer SAN-boots it.
    _, stored = await call(env, "GET", f"/v1/volume/targets/{target}", expect=200)
    props = stored["properties"]
    assert props["target_iqn"].endswith(volume_id) and props["auth_method"] == "CHAP"
    base_url = env["stack"].endpoints["ipxe HTTP"].removesuffix("/boot.ipxe")
    async with env["session"].get(f"{base_url}/ipxe?mac=52:54:00:c1:00:01") as r:
        script = await r.text()
    host, port = props["target_portal"].rsplit(":", 1)
    assert f"iscsi:{host}::{port}:1:{props['target_iqn']}" in script and "sanboot" in script

    # toggle_attachments_with_power: off detaches, on attaches again.
    await power(env, uuid_, "power off")
    assert rest.volume(volume_id)["status"] == "available"
    await power(env, uuid_, "power on")
    assert rest.volume(volume_id)["status"] == IN_USE

    await call(env, "PUT", f"/v1/nodes/{uuid_}/states/provision", {"target": "deleted"}, expect=202)
    await wait_state(env, uuid_, "available")
    assert rest.volume(volume_id)["status"] == "available" and not rest.volume(volume_id)["attachments"]


async def test_rest_deploy_refuses_an_unknown_volume_and_fails_on_one_cinder_will_not_attach(
    env: dict[str, Any], rest: Rest
) -> None:
    uuid_, _ = await rest_node(env, str(uuid.uuid4()), "52:54:00:c1:00:02")
    status, body = await call(env, "PUT", f"/v1/nodes/{uuid_}/states/provision", {"target": "active"})
    assert status == 400 and "does not know" in body["error_message"], body
    _, node = await call(env, "GET", f"/v1/nodes/{uuid_}", expect=200)
    assert node["provision_state"] == "available" and node["last_error"] is None

    broken = create_volume(rest, "ferrum-rest-broken")
    rest.action(broken, "os-reset_status", {"status": "error"})
    uuid_, _ = await rest_node(env, broken, "52:54:00:c1:00:03")
    await call(env, "PUT", f"/v1/nodes/{uuid_}/states/provision", {"target": "active"}, expect=202)
    failed = await wait_state(env, uuid_, "deploy failed")
    assert broken in failed["last_error"] and "status is error" in failed["last_error"], failed["last_error"]
