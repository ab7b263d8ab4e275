"""REST volume connectors and targets (CONTRACT.md 7.1, microversion 1.32):
``/v1/volume``, ``/v1/volume/connectors|targets[/{ident}]`` and a node's
``/v1/nodes/{node}/volume[/connectors|targets]``.

These are records, not hardware actions, so the api writes them itself; it
still refuses while the node is locked (409) and applies Ironic's power-state
rules for updates and deletes. Connectors and targets differ only in their
fields, so one class serves both and a subclass names the kind. Below 1.32
every route is 404 (the routes table gates them)."""

from __future__ import annotations

import asyncio
import json
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.common import errors, states
from services.common.boot_values import UnsafeValue, check_volume_connector_values, check_volume_target_values
from services.common.db.nodes import is_uuid
from services.common.db.records import NodeRecord
from services.common.db.rows import iso
from services.common.db.volumes import VolumeRecord, VolumeRepository
from services.common.jsonutil import dumps
from services.common.secret_masking import mask_value

SINCE = (1, 32)
FIELDS = {
    "connector": {
        "uuid": SINCE,
        "node_uuid": SINCE,
        "type": SINCE,
        "connector_id": SINCE,
        "extra": SINCE,
        "created_at": SINCE,
        "updated_at": SINCE,
        "links": SINCE,
    },
    "target": {
        "uuid": SINCE,
        "node_uuid": SINCE,
        "volume_type": SINCE,
        "boot_index": SINCE,
        "volume_id": SINCE,
        "properties": SINCE,
        "extra": SINCE,
        "created_at": SINCE,
        "updated_at": SINCE,
        "links": SINCE,
    },
}
LIST_FIELDS = {
    "connector": ("uuid", "node_uuid", "type", "connector_id"),
    "target": ("uuid", "node_uuid", "volume_type", "boot_index", "volume_id"),
}
REQUIRED = {
    "connector": ("node_uuid", "type", "connector_id"),
    "target": ("node_uuid", "volume_type", "boot_index", "volume_id"),
}
FREE_STATES = (states.MANAGEABLE, states.ENROLL, states.ADOPTFAIL)


class VolumeApi:
    """``/v1/volume`` and ``/v1/nodes/{node}/volume``: links to the two kinds."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def volume_root(self, request: web.Request) -> web.Response:
        base = self.ctx.base(request)
        return web.json_response(
            {
                "links": views.links(base, "volume", "").copy(),
                "connectors": views.links(base, "volume", "connectors"),
                "targets": views.links(base, "volume", "targets"),
            }
        )


class VolumeRecordsApi:
    """One kind of volume record; :class:`VolumeConnectorsApi` and
    :class:`VolumeTargetsApi` name the kind."""

    KIND = ""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.kind = self.KIND
        self.repo: VolumeRepository[VolumeRecord] = VolumeRepository(ctx.pool, self.kind)

    def doc(self, request: web.Request, row: Mapping[str, Any], fields: Any = None) -> dict[str, Any]:
        """Either kind's record (the kind's FIELDS pick its keys) as Ironic renders it."""
        base = self.ctx.base(request)
        doc = {
            k: (iso(row.get(k)) if k in ("created_at", "updated_at") else row.get(k))
            for k in FIELDS[self.kind]
            if k != "links"
        }
        if "properties" in doc:  # CHAP secrets, as Ironic masks them
            doc["properties"] = mask_value(doc["properties"] or {})
        doc["links"] = views.links(base, f"volume/{self.kind}s", row["uuid"])
        if fields is not None:
            doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
        return doc

    async def list_records(self, request: web.Request) -> web.Response:
        kind = self.kind
        q = request.query
        fields = params.requested_fields(request, FIELDS[kind])
        node_ident = request.match_info.get("node") or q.get("node")
        node_id = (await self.ctx.nodes.get_by_ident(node_ident))["id"] if node_ident else None
        detail = params.flag(request, "detail")
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(
            node_id=node_id, limit=limit, marker=q.get("marker"), sort_dir=q.get("sort_dir", "asc")
        )
        docs = [self.doc(request, r, None if detail else (fields or LIST_FIELDS[kind])) for r in rows]
        body: dict[str, Any] = {f"{kind}s": docs}
        following = next_link(request, rows, base=self.ctx.base(request), limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_record(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS[self.kind])
        return web.json_response(self.doc(request, await self._by_path(request), fields), dumps=dumps)

    async def refuse_node_post(self, request: web.Request) -> web.Response:
        raise errors.InvalidParameterValue(
            f"Creating volume {self.kind}s through a node is not allowed; POST /v1/volume/{self.kind}s"
        )

    def _validate(self, kind: str, values: dict[str, Any]) -> dict[str, Any]:
        for key in ("uuid", "node_uuid"):
            if key in values and (not isinstance(values[key], str) or not is_uuid(values[key])):
                raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {values[key]}.")
        strings = ("type", "connector_id") if kind == "connector" else ("volume_type", "volume_id")
        for key in strings:
            if key in values and (not isinstance(values[key], str) or not values[key]):
                raise errors.InvalidParameterValue(f"{key} must be a non-empty string")
        if kind == "target":
            if "boot_index" in values and (
                not isinstance(values["boot_index"], int)
                or isinstance(values["boot_index"], bool)
                or not 0 <= values["boot_index"] <= 2**31 - 1
            ):
                raise errors.InvalidParameterValue("boot_index must be a non-negative 32-bit integer")
            if "properties" in values and not isinstance(values["properties"], dict):
                raise errors.InvalidParameterValue("properties must be a JSON object")
        if "extra" in values and not isinstance(values["extra"], dict):
            raise errors.InvalidParameterValue("extra must be a JSON object")
        return values

    def _check_boot_values(self, record: dict[str, Any]) -> None:
        """What the iPXE renderer would refuse when it boots from this volume, refused now."""
        try:
            if self.kind == "target":
                check_volume_target_values(record.get("volume_type"), record.get("properties"), field="properties")
            else:
                check_volume_connector_values(record.get("type"), record.get("connector_id"), field="connector")
        except UnsafeValue as exc:
            raise errors.InvalidParameterValue(str(exc)) from None

    async def _node_for_change(self, node_uuid: str, *, action: str) -> NodeRecord:
        """The node, once it is unlocked and may have its volumes changed.

        Ironic's conductor takes the node lock for a volume change and retries
        a lock that is held (``node_locked_retry_attempts``), so a change sent
        right after a power request waits for it rather than failing; here the
        api polls the lock the same way (``[api]node_locked_retry_*``). Then
        the node must be powered off, unless it is in a state where volumes
        are free to change.
        """
        config = self.ctx.config
        node = await self.ctx.nodes.get(node_uuid)
        for _ in range(max(1, config.node_locked_retry_attempts) - 1):
            if not node["reservation"]:
                break
            await asyncio.sleep(config.node_locked_retry_interval)
            node = await self.ctx.nodes.get(node_uuid)
        if node["reservation"]:
            raise errors.NodeLocked(
                f"Node {node['uuid']} is locked by host {node['reservation']}, please retry after the current operation is completed."
            )
        if node["power_state"] != states.POWER_OFF and node["provision_state"] not in FREE_STATES:
            raise errors.InvalidStateRequested(
                f'The requested action "{action}" can not be performed on node "{node["uuid"]}" while it is in state "{node["power_state"]}".'
            )
        return node

    async def _by_path(self, request: web.Request) -> VolumeRecord:
        """The record the path names: a UUID, else a 400 (Ironic's ``args.uuid``), never a 404."""
        ident = request.match_info["ident"]
        if not is_uuid(ident):
            raise errors.InvalidParameterValue(f"Expected a UUID for {self.kind}_uuid: {ident}")
        return await self.repo.get(ident)

    async def create_record(self, request: web.Request) -> web.Response:
        kind = self.kind
        body = await self.ctx.body(request)
        if not isinstance(body, dict):
            raise errors.Invalid(f"A volume {kind} must be a JSON object")
        unknown = set(body) - set(FIELDS[kind]) - {"uuid"} | (set(body) & {"created_at", "updated_at", "links"})
        if unknown:
            raise errors.InvalidParameterValue(
                f"Additional properties are not allowed ({', '.join(sorted(unknown))} unexpected)"
            )
        missing = [k for k in REQUIRED[kind] if body.get(k) is None]
        if missing:
            raise errors.InvalidParameterValue(f"Missing mandatory field(s): {', '.join(missing)}")
        if not isinstance(body["node_uuid"], str) or not is_uuid(body["node_uuid"]):
            raise errors.InvalidParameterValue(f"Expected a UUID for node_uuid but received {body['node_uuid']}.")
        values = self._validate(kind, dict(body))
        self._check_boot_values(values)
        node = await self.ctx.nodes.get(values.pop("node_uuid"))
        values.update(node_id=node["id"])
        values.setdefault("uuid", str(uuidlib.uuid4()))
        row = await self.repo.create(values)
        doc = self.doc(request, row)
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_record(self, request: web.Request) -> web.Response:
        kind = self.kind
        row = await self._by_path(request)
        patch = await self.ctx.body(request)
        columns: Mapping[str, Any] = row
        current = json.loads(dumps({k: columns.get(k) for k in FIELDS[kind] if k in columns}))
        changes = apply_patch(
            current, patch, {"uuid", "created_at", "updated_at", "links"}, FIELDS[kind], request["version"]
        )
        for key in ("extra", "properties"):  # Ironic: removing an object field resets it to {}
            if key in changes and changes[key] is None:
                changes[key] = {}
        changes = self._validate(kind, changes)
        if {"volume_type", "properties", "type", "connector_id"} & set(changes):
            self._check_boot_values({**current, **changes})
        node = await self._node_for_change(row["node_uuid"], action=f"volume {kind} update")
        if "node_uuid" in changes:
            node = await self.ctx.nodes.get(changes.pop("node_uuid"))
            changes["node_id"] = node["id"]
        if changes:
            row = await self.repo.update(row["uuid"], changes)
        return web.json_response(self.doc(request, row), dumps=dumps)

    async def delete_record(self, request: web.Request) -> web.Response:
        kind = self.kind
        row = await self._by_path(request)
        await self._node_for_change(row["node_uuid"], action=f"volume {kind} deletion")
        await self.repo.delete(row["uuid"])
        return web.Response(status=204)


class VolumeConnectorsApi(VolumeRecordsApi):
    KIND = "connector"


class VolumeTargetsApi(VolumeRecordsApi):
    KIND = "target"
