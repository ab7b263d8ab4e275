"""Node queries. The only place that writes SQL for the nodes table.

Locking follows ARCHITECTURE.md: the exclusive lock is the ``reservation``
column, taken with a conditional UPDATE and held under a lease that the
holder refreshes; an expired lease (a dead conductor) may be taken over.

Secrets (BMC passwords, agent tokens, config drives) are sealed on every
write and opened on every read here (``node_secrets``), so callers see
plaintext and PostgreSQL holds ciphertext when a key is configured.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import datetime
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast, overload

import asyncpg

from services.common import errors
from services.common.db.events import EventEntry, inserts_from
from services.common.db.handles import Database
from services.common.db.node_secrets import SEALED_FIELDS, NodeSecrets
from services.common.db.records import ConsoleNodeRecord, NodeRecord
from services.common.db.rows import row_to_dict

INTERFACE_FIELDS = (
    "boot_interface",
    "deploy_interface",
    "power_interface",
    "management_interface",
    "storage_interface",
    "network_interface",
    "vendor_interface",
    "inspect_interface",
    "console_interface",
    "raid_interface",
    "rescue_interface",
    "bios_interface",
    "firmware_interface",
)
JSON_FIELDS = (
    "driver_info",
    "driver_internal_info",
    "instance_info",
    "properties",
    "extra",
    "network_data",
    "raid_config",
    "target_raid_config",
    "clean_step",
    "deploy_step",
    "service_step",
)
# Columns a caller may write through create/update; everything else is managed.
WRITABLE_FIELDS = frozenset(
    (
        "uuid",
        "name",
        "driver",
        *INTERFACE_FIELDS,
        *JSON_FIELDS,
        "traits",
        "provision_state",
        "target_provision_state",
        "provision_updated_at",
        "power_state",
        "target_power_state",
        "boot_mode",
        "secure_boot",
        "maintenance",
        "maintenance_reason",
        "fault",
        "last_error",
        "conductor_group",
        "resource_class",
        "instance_uuid",
        "chassis_uuid",
        "owner",
        "lessee",
        "automated_clean",
        "protected",
        "protected_reason",
        "retired",
        "retired_reason",
        "description",
        "inspection_started_at",
        "inspection_finished_at",
        "console_enabled",
        "shard",
        "parent_node",
        "instance_name",
        "health",
        "disable_power_off",
    )
)
SORT_KEYS = frozenset(
    (
        "id",
        "uuid",
        "name",
        "driver",
        "created_at",
        "updated_at",
        "provision_state",
        "provision_updated_at",
        "power_state",
        "maintenance",
        "resource_class",
        "conductor_group",
        "owner",
        "lessee",
        "instance_uuid",
        "provision_state",
    )
)
# Filter name -> SQL predicate on parameter $n (n filled in by _filters).
_FILTERS = {
    "provision_state": "provision_state = ${}",
    "driver": "driver = ${}",
    "maintenance": "maintenance = ${}",
    "resource_class": "resource_class = ${}",
    "conductor_group": "lower(conductor_group) = lower(${})",
    "owner": "owner = ${}",
    "lessee": "lessee = ${}",
    "project": "(owner = ${0} OR lessee = ${0})",  # REST 1.65: owned or leased by the project
    "instance_uuid": "instance_uuid = ${}::uuid",
    "chassis_uuid": "chassis_uuid = ${}::uuid",
    "fault": "fault = ${}",
    "retired": "retired = ${}",
    "description_contains": "description LIKE '%' || ${} || '%'",
    "reservation": "reservation = ${}",
    "shard_in": "shard = ANY(${}::text[])",  # REST 1.82: ?shard=a,b
    "sharded": "(shard IS NOT NULL) = ${}",  # REST 1.82: ?sharded=true|false
    "parent_node": "parent_node = ${}",  # REST 1.83: the children of one node (its UUID, as stored)
    "is_child": "(parent_node IS NOT NULL) = ${}",  # REST 1.83: the node list hides children
    "instance_name": "instance_name = ${}",  # REST 1.104
}


def is_uuid(value: str) -> bool:
    try:
        uuidlib.UUID(value)
    except (ValueError, AttributeError, TypeError):
        return False
    return True


class NodeVersion(TypedDict):
    """One listed node by its row version (:meth:`NodeRepository.list_versions`)."""

    id: int
    uuid: str
    version: int
    instance_uuid: str | None
    driver: str
    conductor_group: str


_VERSION_COLUMNS = "id, uuid, xmin::text::bigint AS row_version_, instance_uuid, driver, conductor_group"
_VERSIONED_COLUMNS = "xmin::text::bigint AS row_version_, *"


def _by_ident(columns: str, ident: str) -> str:
    """The query for one node by UUID or logical name, as the REST API addresses nodes."""
    return f"SELECT {columns} FROM nodes WHERE " + ("uuid = $1::uuid" if is_uuid(ident) else "name = $1")


def _version(record: asyncpg.Record) -> NodeVersion:
    instance = record["instance_uuid"]
    return {
        "id": record["id"],
        "uuid": str(record["uuid"]),
        "version": record["row_version_"],
        "instance_uuid": None if instance is None else str(instance),
        "driver": record["driver"],
        "conductor_group": record["conductor_group"],
    }


@dataclasses.dataclass(frozen=True)
class NodePage:
    """Which page of nodes a list asks for: the REST and gRPC lists build one,
    and every way of reading the page (whole rows, versions first) takes it."""

    filters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    associated: bool | None = None
    limit: int = 1000
    marker: str | None = None
    sort_key: str = "id"
    sort_dir: str = "asc"


class NodeRepository:
    """Named node queries over a pool (or one connection inside a transaction).

    ``secrets`` is required, not defaulted: a repository built without the
    keyring would write secrets in the clear and hand out ciphertext."""

    def __init__(self, db: Database, *, secrets: NodeSecrets) -> None:
        self._db = db
        self._secrets = secrets

    @overload
    def _node(self, record: asyncpg.Record) -> NodeRecord: ...
    @overload
    def _node(self, record: asyncpg.Record | None) -> NodeRecord | None: ...
    def _node(self, record: asyncpg.Record | None) -> NodeRecord | None:
        """A whole row (``SELECT *`` / ``RETURNING *``) as its record, secrets opened."""
        row = row_to_dict(record)
        return None if row is None else self._secrets.open(row)

    async def create(self, values: Mapping[str, Any], *, event: EventEntry | None = None) -> NodeRecord:
        """Insert the node; with ``event``, the same statement records it and its
        history row (one round trip and one commit, as a state change's)."""
        unknown = set(values) - WRITABLE_FIELDS
        if unknown:
            raise errors.InvalidParameterValue(f"unknown node fields: {', '.join(sorted(unknown))}")
        if "uuid" not in values and any(f in values for f in SEALED_FIELDS):
            values = {**values, "uuid": str(uuidlib.uuid4())}  # the sealed values are bound to it
        values = self._secrets.seal(str(values.get("uuid")), values)
        columns = list(values)
        placeholders = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
        sql = f"INSERT INTO nodes ({', '.join(columns)}, updated_at) VALUES ({placeholders}, NULL) RETURNING *"
        args = [values[c] for c in columns]
        if event is not None:
            recorded, event_args = inserts_from("saved", event, len(args) + 1)
            sql = f"WITH saved AS ({sql}), {recorded} SELECT * FROM saved"
            args += event_args
        try:
            created = self._node(await self._db.fetchrow(sql, *args))
        except asyncpg.UniqueViolationError as exc:
            raise _unique_error(exc, values) from None
        except asyncpg.ForeignKeyViolationError:  # the only foreign key: chassis_uuid
            raise _no_chassis(values) from None
        assert created is not None  # INSERT ... RETURNING always returns the row
        return created

    async def get(self, node_uuid: str) -> NodeRecord:
        node = self._node(await self._db.fetchrow("SELECT * FROM nodes WHERE uuid = $1::uuid", node_uuid))
        if node is None:
            raise errors.NodeNotFound(f"Node {node_uuid} could not be found.")
        return node

    async def get_versioned(self, node_uuid: str) -> tuple[int, NodeRecord]:
        """The node with its row version (see :meth:`list_versions`), for a write that must
        find the row unchanged (``update(..., claim=...)``)."""
        found = await self.versioned_by_ident(node_uuid)
        if not found:
            raise errors.NodeNotFound(f"Node {node_uuid} could not be found.")
        return found[0]

    async def get_by_ident(self, ident: str) -> NodeRecord:
        """By UUID or logical name, as the REST API addresses nodes."""
        node = self._node(await self._db.fetchrow(_by_ident("*", ident), ident))
        if node is None:
            raise errors.NodeNotFound(f"Node {ident} could not be found.")
        return node

    async def get_by_id(self, node_id: int) -> NodeRecord:
        node = self._node(await self._db.fetchrow("SELECT * FROM nodes WHERE id = $1", node_id))
        if node is None:
            raise errors.NodeNotFound(f"Node id {node_id} could not be found.")
        return node

    async def get_by_port_address(self, addresses: Sequence[str]) -> NodeRecord | None:
        row = await self._db.fetchrow(
            "SELECT n.* FROM nodes n JOIN ports p ON p.node_id = n.id "
            "WHERE p.address = ANY($1::text[]) ORDER BY n.id LIMIT 1",
            list(addresses),
        )
        return self._node(row)

    async def list(self, page: NodePage) -> builtins.list[NodeRecord]:
        """One page of nodes. Keyset pagination on (sort_key, id), so a page of
        10,000 never scans or holds more than ``limit`` rows."""
        return [self._node(r) for r in await self._page("*", page)]

    async def list_versions(self, page: NodePage) -> builtins.list[NodeVersion]:
        """The page :meth:`list` returns, as each row's version and what routes it only.

        The version is the row's ``xmin``: PostgreSQL writes every UPDATE, of
        any column, as a new row version with the writing transaction's id, and
        a reader only ever sees committed versions, so an unchanged ``xmin``
        means an unchanged row. The api's list reuses a document rendered
        from a row of the same version (services/api/node_documents.py)
        instead of decoding and rendering all ~75 columns again."""
        return [_version(r) for r in await self._page(_VERSION_COLUMNS, page)]

    async def list_versioned(self, page: NodePage) -> builtins.list[tuple[int, NodeRecord]]:
        """The page :meth:`list` returns, each row with its version (see :meth:`list_versions`)."""
        return [self._versioned(r) for r in await self._page(_VERSIONED_COLUMNS, page)]

    async def version_by_ident(self, ident: str) -> builtins.list[NodeVersion]:
        """The node a UUID or name addresses as :meth:`list_versions` gives it: a
        page of one, or none. The api's GET of a node reuses its document with it."""
        return [_version(r) for r in await self._db.fetch(_by_ident(_VERSION_COLUMNS, ident), ident)]

    async def versioned_by_ident(self, ident: str) -> builtins.list[tuple[int, NodeRecord]]:
        """The node a UUID or name addresses, whole with its version (:meth:`list_versions`), or none."""
        return [self._versioned(r) for r in await self._db.fetch(_by_ident(_VERSIONED_COLUMNS, ident), ident)]

    async def get_many_versioned(self, node_ids: Sequence[int]) -> dict[int, tuple[int, NodeRecord]]:
        """Whole rows by id, each with its version (see :meth:`list_versions`); a
        node deleted meanwhile is absent."""
        rows = await self._db.fetch(
            f"SELECT {_VERSIONED_COLUMNS} FROM nodes WHERE id = ANY($1::bigint[])", list(node_ids)
        )
        found: dict[int, tuple[int, NodeRecord]] = {}
        for record in rows:
            version, node = self._versioned(record)
            found[node["id"]] = (version, node)
        return found

    def _versioned(self, record: asyncpg.Record) -> tuple[int, NodeRecord]:
        row: dict[str, Any] = self._node(record)  # type: ignore[assignment]  # a NodeRecord plus the version column
        version = row.pop("row_version_")
        return int(version), cast(NodeRecord, row)

    async def _page(self, columns: str, page: NodePage) -> builtins.list[asyncpg.Record]:
        filters, associated, limit, marker = page.filters, page.associated, page.limit, page.marker
        sort_key, sort_dir = page.sort_key, page.sort_dir
        if sort_key not in SORT_KEYS:
            raise errors.InvalidParameterValue(f"The sort_key value {sort_key!r} is an invalid field for sorting")
        if sort_dir not in ("asc", "desc"):
            raise errors.InvalidParameterValue(
                f"Invalid sort direction: {sort_dir}. Acceptable values are 'asc' or 'desc'"
            )
        where: list[str] = []
        args: list[Any] = []
        for name, value in filters.items():
            if name not in _FILTERS:
                raise errors.InvalidParameterValue(f"unknown filter {name}")
            args.append(value)
            where.append(_FILTERS[name].format(len(args)))
        if associated is not None:
            where.append("instance_uuid IS NOT NULL" if associated else "instance_uuid IS NULL")
        op = ">" if sort_dir == "asc" else "<"
        if marker:
            marker_row = (
                await self._db.fetchrow(f"SELECT id, {sort_key} AS k FROM nodes WHERE uuid = $1::uuid", marker)
                if is_uuid(marker)
                else None
            )
            if marker_row is None:
                raise errors.InvalidParameterValue(f"Marker {marker} could not be found.")
            if sort_key == "id":
                args.append(marker_row["id"])
                where.append(f"id {op} ${len(args)}")
            elif marker_row["k"] is None:
                # NULLS LAST in both directions: after a NULL only NULLs follow.
                args.append(marker_row["id"])
                where.append(f"({sort_key} IS NULL AND id {op} ${len(args)})")
            else:
                args.extend([marker_row["k"], marker_row["id"]])
                k, i = len(args) - 1, len(args)
                where.append(f"({sort_key} {op} ${k} OR ({sort_key} = ${k} AND id {op} ${i}) OR {sort_key} IS NULL)")
        args.append(limit)
        sql = (
            f"SELECT {columns} FROM nodes"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY {sort_key} {sort_dir.upper()} NULLS LAST, id {sort_dir.upper()} LIMIT ${len(args)}"
        )
        return await self._db.fetch(sql, *args)

    async def children(self, parent_uuid: str) -> builtins.list[str]:
        """The UUIDs of the nodes whose parent is ``parent_uuid`` (REST 1.83), oldest first."""
        rows = await self._db.fetch("SELECT uuid FROM nodes WHERE parent_node = $1 ORDER BY id", parent_uuid)
        return [str(r["uuid"]) for r in rows]

    async def shard_counts(self) -> builtins.list[tuple[str | None, int]]:
        """(shard, number of nodes) for every shard value, NULL included, largest first."""
        rows = await self._db.fetch(
            "SELECT shard, count(*) AS n FROM nodes GROUP BY shard ORDER BY n DESC, shard NULLS LAST"
        )
        return [(r["shard"], r["n"]) for r in rows]

    async def count(self) -> int:
        return int(await self._db.fetchval("SELECT count(*) FROM nodes"))

    async def update(
        self,
        node_uuid: str,
        changes: Mapping[str, Any],
        *,
        expect_reservation: str | None = None,
        remove_internal_info: Sequence[str] = (),
        event: EventEntry | None = None,
        release: bool = False,
        claim: tuple[int, float] | None = None,
    ) -> NodeRecord:
        """Write changed fields; with ``expect_reservation`` only while that
        holder still owns the lock (a conductor that lost its lease must not write).

        ``remove_internal_info`` drops those driver_internal_info keys in the
        database, as :meth:`merge_internal_info` does (keys an agent added
        meanwhile stay), unless ``changes`` replaces driver_internal_info. With
        ``event``, the same statement records it and its history row from the
        row written: a state change and its event commit together in one round
        trip, where a transaction took four (BEGIN, UPDATE, INSERT, COMMIT).
        ``release`` (only with ``expect_reservation``) clears the lock in the
        same write, as :meth:`release` would after it: the last change of an
        operation and its release are one statement, not two.

        ``claim`` (row version, lease; with ``expect_reservation``): the write takes the
        lock for that holder as :meth:`reserve` would, and only while the node is free
        and its row still that version, so the first change of an operation and the
        lock are one commit, not two (NodeChangedMeanwhile otherwise)."""
        if release and expect_reservation is None:
            raise ValueError("only the lock's holder can release it with an update")
        if claim is not None and (expect_reservation is None or release):
            raise ValueError("a claiming update takes the lock for its holder and keeps it")
        unknown = set(changes) - WRITABLE_FIELDS
        if unknown:
            raise errors.InvalidParameterValue(f"unknown node fields: {', '.join(sorted(unknown))}")
        changes = self._secrets.seal(node_uuid, changes)
        columns = [c for c in changes if c != "uuid"]
        sets = [f"{c} = ${i}" for i, c in enumerate(columns, start=2)] + ["updated_at = now()"]
        args: list[Any] = [node_uuid, *[changes[c] for c in columns]]
        if remove_internal_info and "driver_internal_info" not in changes:
            args.append(list(remove_internal_info))
            sets.append(f"driver_internal_info = driver_internal_info - ${len(args)}::text[]")
        if release:
            sets += ["reservation = NULL", "reservation_expires_at = NULL"]
        if claim is not None:
            assert expect_reservation is not None
            args += [expect_reservation, claim[1], claim[0]]
            holder, lease, version = len(args) - 2, len(args) - 1, len(args)
            sets += [f"reservation = ${holder}", f"reservation_expires_at = now() + make_interval(secs => ${lease})"]
            where = f" AND reservation IS NULL AND xmin::text::bigint = ${version}"
        elif expect_reservation is not None:
            args.append(expect_reservation)
            where = f" AND reservation = ${len(args)}"
        else:
            where = ""
        sql = f"UPDATE nodes SET {', '.join(sets)} WHERE uuid = $1::uuid{where} RETURNING *"
        if event is not None:
            recorded, event_args = inserts_from("saved", event, len(args) + 1)
            sql = f"WITH saved AS ({sql}), {recorded} SELECT * FROM saved"
            args += event_args
        try:
            node = self._node(await self._db.fetchrow(sql, *args))
        except asyncpg.UniqueViolationError as exc:
            raise _unique_error(exc, changes) from None
        except asyncpg.CheckViolationError as exc:
            raise errors.InvalidParameterValue(f"invalid node value: {exc.constraint_name}") from None
        except asyncpg.ForeignKeyViolationError as exc:
            if (exc.constraint_name or "").startswith("node_history"):  # deleted by a concurrent request
                raise errors.NodeNotFound(f"Node {node_uuid} could not be found.") from None
            raise _no_chassis(changes) from None  # the node's only foreign key: chassis_uuid
        if node is None:
            await self.get(node_uuid)  # raises NodeNotFound
            if claim is not None:
                raise errors.NodeChangedMeanwhile(f"Node {node_uuid} was locked or changed before its lock was taken.")
            raise errors.NodeLocked(f"Node {node_uuid} lock was lost before the update.")
        return node

    async def merge_internal_info(
        self,
        node_uuid: str,
        values: Mapping[str, Any],
        *,
        remove: Sequence[str] = (),
        touch_provisioning: bool = False,
    ) -> NodeRecord:
        """Merge keys into driver_internal_info in one statement, without the lock.

        Agent bookkeeping (token, callback URL, progress) arrives on public
        endpoints while a conductor may hold the node's lock; a server-side
        merge keeps both writers' keys instead of one overwriting the other.
        ``touch_provisioning`` bumps provision_updated_at, which is what the
        call-back timeout measures, as Ironic's heartbeat does.
        """
        touch = ", provision_updated_at = now()" if touch_provisioning else ""
        row = await self._db.fetchrow(
            "UPDATE nodes SET driver_internal_info = (driver_internal_info || $2::jsonb) - $3::text[], "
            f"updated_at = now(){touch} WHERE uuid = $1::uuid RETURNING *",
            node_uuid,
            self._secrets.seal(node_uuid, {"driver_internal_info": dict(values)})["driver_internal_info"],
            list(remove),
        )
        node = self._node(row)
        if node is None:
            raise errors.NodeNotFound(f"Node {node_uuid} could not be found.")
        return node

    async def set_agent_token_once(self, node_uuid: str, token: str, *, issuer: str) -> tuple[NodeRecord, bool]:
        """Store the one-time agent token unless one exists; returns (node, created).

        The token is sealed here, before the statement: the "only if none
        yet" test stays in SQL, so two lookups racing still issue one token.
        ``issuer`` (the conductor's hostname) is kept beside it for
        :meth:`reissue_stranded_agent_token`."""
        stored = self._secrets.seal(node_uuid, {"driver_internal_info": {"agent_secret_token": token}})
        token = stored["driver_internal_info"]["agent_secret_token"]
        row = await self._db.fetchrow(
            "UPDATE nodes SET driver_internal_info = driver_internal_info || "
            "jsonb_build_object('agent_secret_token', $2::text, 'agent_token_issuer', $3::text), updated_at = now() "
            "WHERE uuid = $1::uuid AND NOT (driver_internal_info ? 'agent_secret_token') RETURNING *",
            node_uuid,
            token,
            issuer,
        )
        if row is not None:
            return self._node(row), True
        return await self.get(node_uuid), False

    async def reissue_stranded_agent_token(
        self, node_uuid: str, token: str, *, issuer: str, dead_issuer: str
    ) -> NodeRecord | None:
        """Replace a token that ``dead_issuer`` stored but no agent ever used (no heartbeat
        yet); None when the node changed meanwhile (a heartbeat came, or another
        conductor re-issued first): then the stored token stands."""
        stored = self._secrets.seal(node_uuid, {"driver_internal_info": {"agent_secret_token": token}})
        token = stored["driver_internal_info"]["agent_secret_token"]
        row = await self._db.fetchrow(
            "UPDATE nodes SET driver_internal_info = driver_internal_info || "
            "jsonb_build_object('agent_secret_token', $2::text, 'agent_token_issuer', $3::text), updated_at = now() "
            "WHERE uuid = $1::uuid AND driver_internal_info->>'agent_token_issuer' = $4::text "
            "AND NOT (driver_internal_info ? 'agent_url') RETURNING *",
            node_uuid,
            token,
            issuer,
            dead_issuer,
        )
        return self._node(row) if row is not None else None

    async def reseal_batch(self, *, after_id: int, limit: int) -> tuple[int | None, int]:
        """Re-encrypt, under the current key, the secrets of the next ``limit``
        nodes by id after ``after_id`` that hold any in the clear or under
        another key (``ferrum db rotate-key``). Returns (the last id looked at,
        None when no node is left; how many rows were rewritten).

        One transaction per batch with the rows locked, so a conductor writing
        a node meanwhile waits a moment instead of being overwritten. Only the
        encryption changes (same plaintext, no ``updated_at``), so running it
        again, or after an interruption, is safe.
        """
        async with contextlib.AsyncExitStack() as stack:
            conn: Any = self._db
            if isinstance(self._db, asyncpg.Pool):
                conn = await stack.enter_async_context(self._db.acquire())
            await stack.enter_async_context(conn.transaction())
            rows = await conn.fetch(
                "SELECT id, uuid, driver_info, driver_internal_info, instance_info FROM nodes "
                "WHERE id > $1 ORDER BY id LIMIT $2 FOR UPDATE",
                after_id,
                limit,
            )
            rewritten = 0
            for record in rows:
                row = row_to_dict(record)
                assert row is not None
                if not self._secrets.needs_reseal(row):
                    continue
                sealed = self._secrets.reseal(row)
                await conn.execute(
                    "UPDATE nodes SET driver_info = $2, driver_internal_info = $3, instance_info = $4 WHERE id = $1",
                    row["id"],
                    sealed["driver_info"],
                    sealed["driver_internal_info"],
                    sealed["instance_info"],
                )
                rewritten += 1
        return (int(rows[-1]["id"]) if rows else None), rewritten

    async def delete(self, node_uuid: str) -> None:
        result = await self._db.execute("DELETE FROM nodes WHERE uuid = $1::uuid", node_uuid)
        if result.endswith(" 0"):
            raise errors.NodeNotFound(f"Node {node_uuid} could not be found.")

    # -- locks ---------------------------------------------------------------

    async def reserve(self, node_uuid: str, holder: str, lease: float) -> NodeRecord:
        """Take the exclusive lock or raise NodeLocked at once (never waits).

        An expired lease is treated as free: its holder stopped refreshing it,
        so it is dead or partitioned and must not write any more.
        """
        node = await self._reserve(node_uuid, holder, lease, None)
        assert node is not None  # without states, only NodeLocked or NodeNotFound stop it
        return node

    async def reserve_in_states(
        self, node_uuid: str, holder: str, lease: float, provision_states: Sequence[str]
    ) -> NodeRecord | None:
        """:meth:`reserve`, only while the node is in one of ``provision_states``,
        checked by the statement that takes the lock: None, and nothing locked,
        for a free node in another state. A heartbeat that arrives just as the
        operation it would continue ends must not lock the finished node: the
        client that saw it settled and unlocked would get a 409 for nothing."""
        return await self._reserve(node_uuid, holder, lease, provision_states)

    async def _reserve(
        self, node_uuid: str, holder: str, lease: float, provision_states: Sequence[str] | None
    ) -> NodeRecord | None:
        args: list[Any] = [node_uuid, holder, lease]
        in_states = ""
        if provision_states is not None:
            args.append(list(provision_states))
            in_states = " AND provision_state = ANY($4::text[])"
        row = await self._db.fetchrow(
            "UPDATE nodes SET reservation = $2, "
            "reservation_expires_at = now() + make_interval(secs => $3) "
            "WHERE uuid = $1::uuid AND (reservation IS NULL OR reservation = $2 "
            f"OR reservation_expires_at < now()){in_states} RETURNING *",
            *args,
        )
        if row is not None:
            return self._node(row)
        current = await self._db.fetchrow(
            "SELECT reservation, reservation_expires_at < now() AS expired FROM nodes WHERE uuid = $1::uuid",
            node_uuid,
        )
        if current is None:
            raise errors.NodeNotFound(f"Node {node_uuid} could not be found.")
        free = current["reservation"] in (None, holder) or bool(current["expired"])
        if provision_states is not None and free:
            return None  # not locked: the state is what kept the row out
        raise errors.NodeLocked(
            f"Node {node_uuid} is locked by host {current['reservation']}, please retry "
            "after the current operation is completed."
        )

    async def holder(self, node_uuid: str) -> str | None:
        """Who holds the node's lock in the database, None when nobody does."""
        current = await self._db.fetchrow("SELECT reservation FROM nodes WHERE uuid = $1::uuid", node_uuid)
        if current is None:
            raise errors.NodeNotFound(f"Node {node_uuid} could not be found.")
        return current["reservation"]  # type: ignore[no-any-return]

    async def take_over(self, node_uuid: str, *, dead_holder: str, holder: str, lease: float) -> NodeRecord | None:
        """Move a dead conductor's lock to ``holder`` (a conditional UPDATE: of
        several conductors trying at once, exactly one gets the node)."""
        row = await self._db.fetchrow(
            "UPDATE nodes SET reservation = $3, reservation_expires_at = now() + make_interval(secs => $4) "
            "WHERE uuid = $1::uuid AND reservation = $2 RETURNING *",
            node_uuid,
            dead_holder,
            holder,
            lease,
        )
        return self._node(row)

    async def release(self, node_uuid: str, holder: str) -> bool:
        result = await self._db.execute(
            "UPDATE nodes SET reservation = NULL, reservation_expires_at = NULL "
            "WHERE uuid = $1::uuid AND reservation = $2",
            node_uuid,
            holder,
        )
        return not result.endswith(" 0")

    async def refresh_leases(self, holder: str, node_uuids: Sequence[str], lease: float) -> builtins.list[str]:
        """Extend the leases still held; returns the uuids actually refreshed."""
        rows = await self._db.fetch(
            "UPDATE nodes SET reservation_expires_at = now() + make_interval(secs => $3) "
            "WHERE reservation = $1 AND uuid = ANY($2::uuid[]) RETURNING uuid",
            holder,
            list(node_uuids),
            lease,
        )
        return [str(r["uuid"]) for r in rows]

    async def release_all(self, holder: str) -> int:
        """Drop every lock of a holder (its own graceful shutdown, or a dead conductor)."""
        result = await self._db.execute(
            "UPDATE nodes SET reservation = NULL, reservation_expires_at = NULL WHERE reservation = $1",
            holder,
        )
        return int(result.split()[-1])

    async def list_reserved_by(self, holders: Sequence[str]) -> builtins.list[NodeRecord]:
        rows = await self._db.fetch("SELECT * FROM nodes WHERE reservation = ANY($1::text[])", list(holders))
        return [self._node(r) for r in rows]

    async def list_expired_reservations(self) -> builtins.list[NodeRecord]:
        rows = await self._db.fetch(
            "SELECT * FROM nodes WHERE reservation IS NOT NULL AND reservation_expires_at < now()"
        )
        return [self._node(r) for r in rows]

    async def list_in_states(
        self, states: Sequence[str], *, updated_before: datetime.datetime | None = None
    ) -> builtins.list[NodeRecord]:
        if updated_before is None:
            rows = await self._db.fetch("SELECT * FROM nodes WHERE provision_state = ANY($1::text[])", list(states))
        else:
            rows = await self._db.fetch(
                "SELECT * FROM nodes WHERE provision_state = ANY($1::text[]) AND provision_updated_at < $2",
                list(states),
                updated_before,
            )
        return [self._node(r) for r in rows]

    async def list_console_enabled(self) -> builtins.list[ConsoleNodeRecord]:
        """uuid, driver and conductor group of every node whose console is wanted (a partial index)."""
        rows = await self._db.fetch(
            "SELECT id, uuid, driver, conductor_group FROM nodes WHERE console_enabled ORDER BY id"
        )
        return [cast(ConsoleNodeRecord, row_to_dict(r)) for r in rows]  # no secret among these columns

    async def list_for_sync(self, *, after_id: int, limit: int) -> builtins.list[NodeRecord]:
        """Nodes whose power state the sync reads (not in maintenance, unless for a power
        failure; not locked), whole, by id after ``after_id``: one query for a batch."""
        rows = await self._db.fetch(
            "SELECT * FROM nodes WHERE id > $1 "
            "AND (NOT maintenance OR fault = 'power failure') AND reservation IS NULL ORDER BY id LIMIT $2",
            after_id,
            limit,
        )
        return [self._node(r) for r in rows]


def _no_chassis(values: Mapping[str, Any]) -> errors.FerrumError:
    """Ironic answers a node naming a missing chassis with 400 (the request is about the node)."""
    return errors.InvalidParameterValue(f"Chassis {values.get('chassis_uuid')} could not be found.")


def _unique_error(exc: asyncpg.UniqueViolationError, values: Mapping[str, Any]) -> errors.FerrumError:
    constraint = exc.constraint_name or ""
    if "name" in constraint:
        return errors.DuplicateName(f"A node with name {values.get('name')} already exists.")
    if "instance_uuid" in constraint:
        return errors.InstanceAssociated(f"Instance {values.get('instance_uuid')} is already associated with a node.")
    if "uuid" in constraint:
        return errors.Conflict(f"A node with UUID {values.get('uuid')} already exists.")
    return errors.Conflict(str(exc))
