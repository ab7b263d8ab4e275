"""The ``cinder`` storage interface: boot from (and attach) Cinder volumes (seed 004).

What Ironic's ``cinder`` storage interface and ``ironic/common/cinder.py``
do, against the Cinder v3 REST API with aiohttp (asyncio-native timeouts, no
blocking client in a thread, and no new dependency: openstacksdk is only a
test extra here). Per volume target, in Ironic's order:

attach (deploy, and power-on of an active node)
    ``GET /volumes/{id}`` (skipped when already attached to this node),
    ``os-reserve``, ``os-initialize_connection`` with the node's connector,
    ``os-attach`` (``instance_uuid`` = the node's instance or the node,
    ``host_name`` = the node, ``mountpoint`` = ``ironic_mountpoint``), then
    ``POST /volumes/{id}/metadata`` with ``ironic_node_<node uuid>`` (a
    failure there is only logged, as in Ironic). The connection data
    (``target_portal``/``target_iqn``/``target_lun``/``auth_*`` for iSCSI,
    ``target_wwn``/``target_lun`` for Fibre Channel) becomes the target's
    ``properties`` through ``task.save_volume_target_properties`` and in
    ``task.volume_targets``, where the iPXE renderer reads it.
    A failure part-way undoes this target (``os-terminate_connection``,
    ``os-unreserve``) and detaches the targets already attached, then raises
    HardwareError naming the volume and Cinder's message.

detach (tear down, and power-off of an active node)
    ``GET``, ``os-begin_detaching``, ``os-terminate_connection``,
    ``os-detach`` with the attachment id, metadata; ``os-roll_detaching``
    when terminate fails after begin. The whole pass is retried
    ``cinder_retries`` times, ``cinder_retry_interval`` apart; on an
    ``active`` node (and on later attempts of an aborted attach) errors are
    logged, not raised (Ironic's ``allow_errors``).

Options (the conductor's, ``self.options``; see :data:`OPTIONS`):
``cinder_url`` (a v3 endpoint, e.g. ``http://cinder:8776/v3``; the project
id is appended unless already there), ``cinder_url_timeout`` (30 s per
request), ``cinder_retries`` (3), ``cinder_retry_interval`` (5 s),
``cinder_auth_strategy`` (``noauth``: ``X-Auth-Token: <user>:<project>``
with ``cinder_project_id``; ``keystone``: a Keystone v3 password token from
``cinder_auth_url`` with ``cinder_username``/``cinder_password``/
``cinder_user_domain_name`` and ``cinder_project_id`` or
``cinder_project_name``/``cinder_project_domain_name``, the endpoint from
``cinder_url`` or the token's catalog) and ``toggle_attachments_with_power``
(true: the power flow detaches on power-off and attaches on power-on of an
active node, as Ironic does). Other Keystone methods (application
credentials, tokens, v2) are refused by ``validate``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from services.common import errors, states
from services.common.db.records import NodeVolumeTarget
from services.conductor.drivers import base
from services.conductor.drivers.storage import VolumeStorage

LOG = logging.getLogger(__name__)

MOUNTPOINT = "ironic_mountpoint"  # what Ironic passes to os-attach
AUTH_STRATEGIES = ("noauth", "keystone")
ISCSI_CONNECTOR_TYPES = ("iqn",)
FC_CONNECTOR_TYPES = ("wwpn", "wwnn")
TARGET_TYPES = ("iscsi", "fibre_channel")
IN_USE = "in-use"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

OPTIONS: dict[str, tuple[Any, str]] = {
    "cinder_url": ("", "Cinder's v3 endpoint (http://host:8776/v3); required with noauth"),
    "cinder_url_timeout": (30.0, "seconds for one Cinder (or Keystone) request, connection included"),
    "cinder_retries": (3, "how many times a failed detach is tried again"),
    "cinder_retry_interval": (5.0, "seconds between detach attempts"),
    "cinder_auth_strategy": ("noauth", "noauth or keystone"),
    "cinder_project_id": ("", "the project of the volumes (noauth: required; keystone: scope by id)"),
    "cinder_auth_url": ("", "keystone: the identity endpoint (http://keystone:5000 or .../v3)"),
    "cinder_username": ("", "keystone: the user; noauth: the user part of the token (default ferrum)"),
    "cinder_password": ("", "keystone: the user's password"),
    "cinder_user_domain_name": ("Default", "keystone: the user's domain"),
    "cinder_project_name": ("", "keystone: scope by project name (when cinder_project_id is empty)"),
    "cinder_project_domain_name": ("Default", "keystone: the project's domain"),
    "toggle_attachments_with_power": (True, "detach on power-off and attach on power-on of an active node"),
}


class CinderUnreachable(Exception):
    """No HTTP answer from Cinder or Keystone (refused, reset, timed out)."""


class CinderHTTPError(Exception):
    """Cinder answered with an error status; ``message`` is Cinder's own text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _option(options: Mapping[str, Any], name: str) -> Any:
    value = options.get(name)
    return OPTIONS[name][0] if value is None or value == "" else value


def _float(options: Mapping[str, Any], name: str, *, minimum: float = 0.0) -> float:
    try:
        value = float(_option(options, name))
    except (TypeError, ValueError):
        raise errors.InvalidParameterValue(f"conductor option {name} must be a number") from None
    if value < minimum:
        raise errors.InvalidParameterValue(f"conductor option {name} must be at least {minimum:g}")
    return value


def _bool(options: Mapping[str, Any], name: str) -> bool:
    value = _option(options, name)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise errors.InvalidParameterValue(f"conductor option {name} must be true or false, not {value!r}")


@dataclass(frozen=True)
class CinderSettings:
    """The interface's options, checked."""

    url: str
    timeout: float
    retries: int
    retry_interval: float
    auth_strategy: str
    project_id: str
    auth_url: str
    username: str
    password: str
    user_domain_name: str
    project_name: str
    project_domain_name: str

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> CinderSettings:
        strategy = str(_option(options, "cinder_auth_strategy")).strip().lower()
        if strategy not in AUTH_STRATEGIES:
            raise errors.InvalidParameterValue(
                f"conductor option cinder_auth_strategy is {strategy!r}; the cinder storage interface "
                f"supports {', '.join(AUTH_STRATEGIES)}"
            )
        settings = cls(
            url=str(_option(options, "cinder_url")).strip().rstrip("/"),
            timeout=_float(options, "cinder_url_timeout", minimum=0.1),
            retries=int(_float(options, "cinder_retries")),
            retry_interval=_float(options, "cinder_retry_interval"),
            auth_strategy=strategy,
            project_id=str(_option(options, "cinder_project_id")).strip(),
            auth_url=str(_option(options, "cinder_auth_url")).strip().rstrip("/"),
            username=str(_option(options, "cinder_username")).strip(),
            password=str(_option(options, "cinder_password")),
            user_domain_name=str(_option(options, "cinder_user_domain_name")).strip(),
            project_name=str(_option(options, "cinder_project_name")).strip(),
            project_domain_name=str(_option(options, "cinder_project_domain_name")).strip(),
        )
        settings.check()
        return settings

    def check(self) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise errors.InvalidParameterValue(f"conductor option cinder_url {self.url!r} is not an http(s) URL")
        if self.auth_strategy == "noauth":
            if not self.url:
                raise errors.InvalidParameterValue("conductor option cinder_url is not set (Cinder's v3 endpoint)")
            if not self.project_id:
                raise errors.InvalidParameterValue(
                    "conductor option cinder_project_id is not set; Cinder's noauth needs the project of the volumes"
                )
            return
        missing = [
            name
            for name, value in (
                ("cinder_auth_url", self.auth_url),
                ("cinder_username", self.username),
                ("cinder_password", self.password),
            )
            if not value
        ]
        if not (self.project_id or self.project_name):
            missing.append("cinder_project_id or cinder_project_name")
        if missing:
            raise errors.InvalidParameterValue(
                f"cinder_auth_strategy keystone (password authentication, Keystone v3) needs {', '.join(missing)}"
            )
        if not self.auth_url.startswith(("http://", "https://")):
            raise errors.InvalidParameterValue(
                f"conductor option cinder_auth_url {self.auth_url!r} is not an http(s) URL"
            )

    @property
    def where(self) -> str:
        return self.url or f"the block-storage endpoint of {self.auth_url}"


def endpoint_for(url: str, project_id: str) -> str:
    """Cinder's base URL for one project: ``<v3 url>/<project_id>`` (kept when already there)."""
    url = url.rstrip("/").replace("%(project_id)s", project_id).replace("$(project_id)s", project_id)
    return url if url.rsplit("/", 1)[-1] == project_id else f"{url}/{project_id}"


class _KeystoneToken:
    """A project-scoped Keystone v3 password token and the block-storage endpoint, cached until near expiry."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._cached: tuple[str, str, float] | None = None  # token, endpoint, monotonic expiry

    async def get(self, session: aiohttp.ClientSession, settings: CinderSettings) -> tuple[str, str]:
        async with self._lock:
            if self._cached is not None and time.monotonic() < self._cached[2]:
                return self._cached[0], self._cached[1]
            token, endpoint, lifetime = await self._issue(session, settings)
            self._cached = (token, endpoint, time.monotonic() + max(0.0, lifetime - 60.0))
            return token, endpoint

    def forget(self) -> None:
        self._cached = None

    async def _issue(self, session: aiohttp.ClientSession, settings: CinderSettings) -> tuple[str, str, float]:
        base = settings.auth_url if settings.auth_url.endswith("/v3") else f"{settings.auth_url}/v3"
        project: dict[str, Any] = (
            {"id": settings.project_id}
            if settings.project_id
            else {"name": settings.project_name, "domain": {"name": settings.project_domain_name}}
        )
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {
                        "user": {
                            "name": settings.username,
                            "domain": {"name": settings.user_domain_name},
                            "password": settings.password,
                        }
                    },
                },
                "scope": {"project": project},
            }
        }
        try:
            async with session.post(f"{base}/auth/tokens", json=body) as resp:
                text = await resp.text()
                if resp.status != 201:
                    raise CinderHTTPError(resp.status, f"Keystone refused the token request: {_message(text)}")
                token = resp.headers.get("X-Subject-Token", "")
                data = json.loads(text)["token"]
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CinderUnreachable(f"Keystone at {base}: {_describe(exc)}") from exc
        except (ValueError, KeyError) as exc:
            raise CinderHTTPError(502, f"Keystone's token answer is not what v3 sends: {exc}") from exc
        project_id = data.get("project", {}).get("id", "")
        if not token or not project_id:
            raise CinderHTTPError(502, "Keystone's answer has no project-scoped token")
        endpoint = settings.url or _catalog_endpoint(data.get("catalog") or [])
        if not endpoint:
            raise CinderHTTPError(404, "Keystone's catalog has no block-storage (volumev3) endpoint; set cinder_url")
        lifetime = 3600.0
        expires = data.get("expires_at")
        if expires:
            try:
                at = datetime.datetime.fromisoformat(str(expires).replace("Z", "+00:00"))
                lifetime = (at - datetime.datetime.now(datetime.UTC)).total_seconds()
            except ValueError:
                pass
        return token, endpoint_for(endpoint, project_id), lifetime


def _catalog_endpoint(catalog: list[dict[str, Any]]) -> str:
    for service_type in ("block-storage", "volumev3"):
        for service in catalog:
            if service.get("type") != service_type:
                continue
            for interface in ("internal", "public"):
                for endpoint in service.get("endpoints") or []:
                    if endpoint.get("interface") == interface and endpoint.get("url"):
                        return str(endpoint["url"])
    return ""


def _message(text: str) -> str:
    """Cinder's (or Keystone's) error text from an error body: ``{"itemNotFound": {"message": ...}}``."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "(no body)"
    if isinstance(body, dict):
        for value in body.values():
            if isinstance(value, dict) and value.get("message"):
                return str(value["message"])
    return text.strip()[:500]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__


class CinderClient:
    """The few Cinder v3 calls the interface makes, over one aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, settings: CinderSettings, keystone: _KeystoneToken) -> None:
        self.session = session
        self.settings = settings
        self._keystone = keystone

    async def _auth(self) -> tuple[dict[str, str], str]:
        settings = self.settings
        if settings.auth_strategy == "noauth":
            user = settings.username or "ferrum"
            return {"X-Auth-Token": f"{user}:{settings.project_id}"}, endpoint_for(settings.url, settings.project_id)
        token, endpoint = await self._keystone.get(self.session, settings)
        return {"X-Auth-Token": token}, endpoint

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        headers, endpoint = await self._auth()
        headers = {**headers, "Accept": "application/json"}
        try:
            async with self.session.request(method, f"{endpoint}{path}", json=body, headers=headers) as resp:
                text = await resp.text()
                if resp.status == 401 and self.settings.auth_strategy == "keystone":
                    self._keystone.forget()  # an expired or revoked token: the next call gets a new one
                if resp.status >= 400:
                    raise CinderHTTPError(resp.status, _message(text))
                return json.loads(text) if text.strip() else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CinderUnreachable(f"Cinder at {endpoint}: {_describe(exc)}") from exc
        except ValueError as exc:
            raise CinderHTTPError(502, f"Cinder's answer to {method} {path} is not JSON") from exc

    async def get_volume(self, volume_id: str) -> dict[str, Any]:
        body = await self.request("GET", f"/volumes/{volume_id}")
        volume: dict[str, Any] = body["volume"]
        return volume

    async def action(self, volume_id: str, name: str, args: Any = None) -> Any:
        return await self.request("POST", f"/volumes/{volume_id}/action", {name: args})

    async def set_metadata(self, volume_id: str, metadata: Mapping[str, str]) -> None:
        await self.request("POST", f"/volumes/{volume_id}/metadata", {"metadata": dict(metadata)})


def _attachment_of(task: base.Task, volume: Mapping[str, Any]) -> dict[str, Any] | None:
    """This node's attachment of the volume (by instance uuid or node uuid), as Ironic matches it."""
    ids = {task.node["uuid"], task.node.get("instance_uuid")} - {None}
    for attachment in volume.get("attachments") or []:
        if attachment.get("server_id") in ids:
            return dict(attachment)
    return None


def _metadata(task: base.Task, action: str) -> dict[str, str]:
    """Ironic's volume metadata: one key per node, a JSON value (Cinder keeps flat strings)."""
    node = task.node
    data = {
        "instance_uuid": node.get("instance_uuid") or node["uuid"],
        "last_seen": datetime.datetime.now(datetime.UTC).replace(tzinfo=None).isoformat(),
        "last_action": action,
    }
    return {f"ironic_node_{node['uuid']}": json.dumps(data)}


def connector_for(task: base.Task) -> dict[str, Any]:
    """The connector Cinder gets for this node, from its volume connectors (Ironic's _generate_connector).

    The first ``iqn`` is the initiator, the first ``ip`` the address; every
    ``wwpn``/``wwnn`` is listed. Raises InvalidParameterValue without an iqn,
    wwpn or wwnn.
    """
    data: dict[str, Any] = {}
    valid = False
    for connector in task.volume_connectors:
        kind, value = connector.get("type"), connector.get("connector_id")
        if not value:
            continue
        if kind == "iqn" and "initiator" not in data:
            data["initiator"] = value
            valid = True
        elif kind == "ip" and "ip" not in data:
            data["ip"] = value
        elif kind == "wwpn":
            data.setdefault("wwpns", []).append(value)
            valid = True
        elif kind == "wwnn":
            data.setdefault("wwnns", []).append(value)
            valid = True
        else:
            LOG.warning(
                "node %s: volume connector %s of type %r is not used by the cinder storage interface",
                task.node["uuid"],
                connector.get("uuid"),
                kind,
            )
    if not valid:
        raise errors.InvalidParameterValue(
            f"node {task.node['uuid']} has no volume connector Cinder can use: it needs one of type "
            f"{', '.join(ISCSI_CONNECTOR_TYPES + FC_CONNECTOR_TYPES)}"
        )
    data["host"] = task.node["uuid"]
    data["multipath"] = False
    return data


class CinderStorage(VolumeStorage):
    """Volumes from OpenStack Cinder (seed 004): iSCSI or Fibre Channel targets the node boots from or uses."""

    name = "cinder"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self._keystone = _KeystoneToken()

    def get_properties(self) -> dict[str, str]:
        """None in driver_info: the conductor's options configure it (see :data:`OPTIONS`)."""
        return {}

    def power_toggles_attachments(self, task: base.Task) -> bool:
        """``toggle_attachments_with_power``: the power flow detaches on power-off and
        attaches on power-on of an active node."""
        return _bool(self.options, "toggle_attachments_with_power")

    def settings(self) -> CinderSettings:
        return CinderSettings.from_options(self.options)

    def _session(self, settings: CinderSettings) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(total=settings.timeout, connect=min(settings.timeout, 10.0))
        return aiohttp.ClientSession(timeout=timeout)

    # -- validate --------------------------------------------------------------------------------

    def _check_targets(self, task: base.Task) -> None:
        """Types, volume ids and the connectors each target type needs (Ironic's validation)."""
        kinds = [c.get("type") for c in task.volume_connectors if c.get("connector_id")]
        if kinds.count("wwpn") != kinds.count("wwnn") and "wwnn" in kinds:
            raise errors.InvalidParameterValue(
                f"node {task.node['uuid']}: Cinder needs a wwpn connector for every wwnn connector "
                f"({kinds.count('wwpn')} wwpn, {kinds.count('wwnn')} wwnn)"
            )
        for target in task.volume_targets:
            if not target.get("volume_id"):
                raise errors.InvalidParameterValue(f"volume target {target.get('uuid')} has no volume_id")
            kind = target.get("volume_type")
            if kind not in TARGET_TYPES:
                raise errors.InvalidParameterValue(
                    f"volume target {target.get('uuid')} is of type {kind!r}; the cinder storage interface "
                    f"supports {', '.join(TARGET_TYPES)}"
                )
            if kind == "iscsi" and "iqn" not in kinds:
                raise errors.InvalidParameterValue(
                    f"volume target {target.get('uuid')} is an iSCSI volume, but node {task.node['uuid']} "
                    "has no volume connector of type iqn"
                )
            if kind == "fibre_channel" and "wwpn" not in kinds:
                raise errors.InvalidParameterValue(
                    f"volume target {target.get('uuid')} is a Fibre Channel volume, but node "
                    f"{task.node['uuid']} has no volume connector of type wwpn"
                )

    async def validate(self, task: base.Task) -> None:
        """Options, targets and connectors, then that Cinder answers and knows every target's volume."""
        if not task.volume_targets:
            return
        await super().validate(task)  # the boot-from-volume rules every storage interface shares
        settings = self.settings()
        self._check_targets(task)
        async with self._session(settings) as session:
            client = CinderClient(session, settings, self._keystone)
            for target in task.volume_targets:
                volume_id = target["volume_id"]
                try:
                    await client.get_volume(volume_id)
                except CinderUnreachable as exc:
                    raise errors.InvalidParameterValue(
                        f"Cinder at {settings.where} cannot be reached to check volume {volume_id}: {exc}"
                    ) from None
                except CinderHTTPError as exc:
                    if exc.status == 404:
                        raise errors.InvalidParameterValue(
                            f"volume target {target.get('uuid')} names volume {volume_id}, which Cinder at "
                            f"{settings.where} does not know: {exc.message}"
                        ) from None
                    raise errors.InvalidParameterValue(
                        f"Cinder at {settings.where} refused to show volume {volume_id} of volume target "
                        f"{target.get('uuid')}: {exc}"
                    ) from None

    # -- attach ----------------------------------------------------------------------------------

    async def attach_volumes(self, task: base.Task) -> None:
        """Attach every target's volume to the node and record its connection data in the target."""
        if not task.volume_targets:
            return
        settings = self.settings()
        connector = connector_for(task)
        node_uuid = task.node["uuid"]
        attached_any = False
        async with self._session(settings) as session:
            client = CinderClient(session, settings, self._keystone)
            for target in task.volume_targets:
                try:
                    properties = await self._attach_one(client, task, target, connector)
                except errors.HardwareError as exc:
                    LOG.error("node %s: attaching volumes failed: %s", node_uuid, exc)
                    if attached_any:
                        try:
                            await self._detach_all(client, task, connector, aborting_attach=True)
                        except errors.FerrumError as undo:
                            LOG.error("node %s: detaching after the failed attach failed too: %s", node_uuid, undo)
                    raise
                attached_any = True
                if properties is None:  # already attached: the target keeps the data it has
                    continue
                target["properties"] = properties
                save = getattr(task, "save_volume_target_properties", None)
                if save is not None:
                    await save(target["uuid"], properties)

    async def _attach_one(
        self, client: CinderClient, task: base.Task, target: NodeVolumeTarget, connector: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        node = task.node
        volume_id = target["volume_id"]
        what = f"volume {volume_id} (volume target {target.get('uuid')}) for node {node['uuid']}"

        def fail(doing: str, exc: Exception) -> errors.HardwareError:
            return errors.HardwareError(f"Cinder at {client.settings.where}: cannot {doing} {what}: {exc}")

        try:
            volume = await client.get_volume(volume_id)
        except (CinderUnreachable, CinderHTTPError) as exc:
            raise fail("find", exc) from None
        if _attachment_of(task, volume) is not None:
            LOG.info("%s is already attached; skipping it", what)
            return None
        if volume.get("status") == IN_USE and not volume.get("multiattach"):
            # Cinder's own refusal would not say to whom; other states are left to os-reserve's message.
            holders = [a.get("server_id") for a in volume.get("attachments") or []]
            detail = f" (attached to {', '.join(map(str, holders))})" if holders else ""
            raise errors.HardwareError(
                f"Cinder at {client.settings.where}: cannot attach {what}: the volume is "
                f"{volume.get('status')!r}{detail} and not multiattach"
            )
        try:
            await client.action(volume_id, "os-reserve")
        except (CinderUnreachable, CinderHTTPError) as exc:
            raise fail("reserve", exc) from None
        initialized = False
        try:
            try:
                reply = await client.action(volume_id, "os-initialize_connection", {"connector": dict(connector)})
                connection = reply["connection_info"]
                initialized = True
            except (CinderUnreachable, CinderHTTPError, KeyError, TypeError) as exc:
                raise fail("initialize the connection of", exc) from None
            instance_uuid = node.get("instance_uuid") or node["uuid"]
            try:
                await client.action(
                    volume_id,
                    "os-attach",
                    {"instance_uuid": instance_uuid, "host_name": node["uuid"], "mountpoint": MOUNTPOINT},
                )
            except (CinderUnreachable, CinderHTTPError) as exc:
                raise fail("complete the attachment of", exc) from None
        except errors.HardwareError:
            await self._undo_reservation(client, volume_id, connector, initialized)
            raise
        try:
            await client.set_metadata(volume_id, _metadata(task, "attached"))
        except (CinderUnreachable, CinderHTTPError) as exc:
            LOG.warning("cannot update the metadata of %s: %s", what, exc)
        LOG.info("attached %s (%s)", what, connection.get("driver_volume_type"))
        data = dict(connection.get("data") or {})
        data.setdefault("volume_id", volume_id)
        data["ironic_volume_uuid"] = volume.get("id", volume_id)
        return data

    async def _undo_reservation(
        self, client: CinderClient, volume_id: str, connector: Mapping[str, Any], initialized: bool
    ) -> None:
        """Put a reserved, not attached volume back to ``available`` (Ironic leaves it ``attaching``)."""
        calls: list[tuple[str, Any]] = []
        if initialized:
            calls.append(("os-terminate_connection", {"connector": dict(connector)}))
        calls.append(("os-unreserve", None))
        for name, args in calls:
            try:
                await client.action(volume_id, name, args)
            except (CinderUnreachable, CinderHTTPError) as exc:
                LOG.warning("volume %s: %s after a failed attach failed: %s", volume_id, name, exc)

    # -- detach ----------------------------------------------------------------------------------

    async def detach_volumes(self, task: base.Task) -> None:
        """Detach every target's volume from the node, retried; errors only logged on an active node."""
        if not task.volume_targets:
            return
        settings = self.settings()
        try:
            connector = connector_for(task)
        except errors.InvalidParameterValue as exc:
            if task.node.get("provision_state") == states.ACTIVE:
                LOG.warning("node %s: not detaching volumes: %s", task.node["uuid"], exc)
                return
            raise errors.HardwareError(str(exc)) from None
        async with self._session(settings) as session:
            client = CinderClient(session, settings, self._keystone)
            await self._detach_all(client, task, connector, aborting_attach=False)

    async def _detach_all(
        self, client: CinderClient, task: base.Task, connector: Mapping[str, Any], *, aborting_attach: bool
    ) -> None:
        settings = client.settings
        attempts = settings.retries + 1
        for attempt in range(attempts):
            allow_errors = task.node.get("provision_state") == states.ACTIVE or (aborting_attach and attempt > 0)
            try:
                await self._detach_pass(client, task, connector, allow_errors=allow_errors)
                return
            except errors.HardwareError as exc:
                if attempt + 1 >= attempts:
                    LOG.error("node %s: detaching volumes failed: %s", task.node["uuid"], exc)
                    raise
                LOG.warning(
                    "node %s: detaching volumes failed (attempt %d of %d), trying again in %gs: %s",
                    task.node["uuid"],
                    attempt + 1,
                    attempts,
                    settings.retry_interval,
                    exc,
                )
                await asyncio.sleep(settings.retry_interval)

    async def _detach_pass(
        self, client: CinderClient, task: base.Task, connector: Mapping[str, Any], *, allow_errors: bool
    ) -> None:
        node_uuid = task.node["uuid"]
        where = client.settings.where

        def problem(message: str) -> None:
            if allow_errors:
                LOG.warning("node %s: %s", node_uuid, message)
                return
            raise errors.HardwareError(f"Cinder at {where}: {message}")

        for target in task.volume_targets:
            volume_id = target["volume_id"]
            what = f"volume {volume_id} (volume target {target.get('uuid')}) from node {node_uuid}"
            try:
                volume = await client.get_volume(volume_id)
            except (CinderUnreachable, CinderHTTPError) as exc:
                problem(f"cannot find {what}: {exc}")
                continue
            attachment = _attachment_of(task, volume)
            if attachment is None:
                LOG.debug("%s is not attached; nothing to detach", what)
                continue
            began = False
            if volume.get("status") == "detaching":
                # An earlier pass began it and stopped after (Cinder answered 500 to os-detach):
                # begin_detaching would be refused now, so carry on where that pass left off.
                LOG.info("%s is already detaching; finishing it", what)
            else:
                try:
                    await client.action(volume_id, "os-begin_detaching")
                    began = True
                except (CinderUnreachable, CinderHTTPError) as exc:
                    problem(f"cannot begin detaching {what}: {exc}")
            try:
                await client.action(volume_id, "os-terminate_connection", {"connector": dict(connector)})
            except (CinderUnreachable, CinderHTTPError) as exc:
                if began:  # back to in-use, so that the next attempt can begin again
                    try:
                        await client.action(volume_id, "os-roll_detaching")
                    except (CinderUnreachable, CinderHTTPError) as roll:
                        LOG.warning("cannot roll back detaching %s: %s", what, roll)
                problem(f"cannot terminate the connection of {what}: {exc}")
                continue
            try:
                await client.action(volume_id, "os-detach", {"attachment_id": attachment.get("attachment_id")})
            except (CinderUnreachable, CinderHTTPError) as exc:
                problem(f"cannot complete detaching {what}: {exc}")
                continue
            try:
                await client.set_metadata(volume_id, _metadata(task, "detached"))
            except (CinderUnreachable, CinderHTTPError) as exc:
                LOG.warning("cannot update the metadata of volume %s: %s", volume_id, exc)
            LOG.info("detached %s", what)
