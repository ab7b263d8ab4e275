"""Node history (the audit trail) and node events (the WatchNodes change feed)."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.records import NodeEventRecord, NodeHistoryRecord, NodeRecord
from services.common.db.rows import row_to_dict
from services.common.request_project import project_var

NOTIFY_CHANNEL = "ferrum_node_events"


def seconds_since(moment: Any) -> int | None:
    """Whole seconds from ``moment`` (an aware datetime) to now; None when unknown."""
    if not isinstance(moment, datetime.datetime) or moment.tzinfo is None:
        return None
    return int((datetime.datetime.now(datetime.UTC) - moment).total_seconds())


@dataclass(frozen=True)
class EventEntry:
    """An event and its history row, to be written by the statement that changes
    the node (:meth:`NodeRepository.update`'s ``event``), from the row it writes."""

    event: str
    message: str = ""
    severity: str = "INFO"
    conductor: str | None = None
    event_type: str = "provisioning"


def inserts_from(source: str, entry: EventEntry, first: int) -> tuple[str, list[Any]]:
    """Two data-modifying CTEs (``event``, ``history``) that write ``entry`` for
    the node row the CTE ``source`` returns, and their arguments, numbered from
    ``$first``. The rows are what :meth:`EventRepository.record` writes for that
    row: its states as saved, the seconds from its provision_updated_at to now,
    the project behind the request. A ``source`` that returns no row (the lock
    was lost) writes neither."""
    e, severity, message, conductor, history_uuid, event_type, text, project, moment = (
        f"${i}" for i in range(first, first + 9)
    )
    sql = (
        "event AS (INSERT INTO node_events (node_uuid, event, provision_state, target_provision_state, "
        f"power_state, severity, message, conductor) SELECT uuid, {e}, provision_state, target_provision_state, "
        f"power_state, {severity}, {message}, {conductor} FROM {source}), "
        "history AS (INSERT INTO node_history (uuid, node_id, conductor, event_type, event, severity, project, "
        f"state, target_provision_state, duration_seconds) SELECT {history_uuid}::uuid, id, {conductor}, "
        f"{event_type}, {text}, {severity}, {project}, provision_state, target_provision_state, "
        f"trunc(extract(epoch FROM {moment}::timestamptz - provision_updated_at))::integer FROM {source})"
    )
    args = [
        entry.event,
        entry.severity,
        entry.message,
        entry.conductor,
        uuid.uuid4(),
        entry.event_type,
        entry.message or entry.event,
        project_var.get(),
        datetime.datetime.now(datetime.UTC),
    ]
    return sql, args


class EventRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(
        self,
        node: NodeRecord,
        *,
        event: str,
        message: str = "",
        severity: str = "INFO",
        conductor: str | None = None,
        event_type: str = "provisioning",
        history: bool = True,
    ) -> int:
        """Append to the change feed (and the history unless ``history`` is off).

        Both rows are written in the caller's transaction when it passes a
        connection, so a state change and its event commit together.
        """
        insert_event = (
            "INSERT INTO node_events (node_uuid, event, provision_state, target_provision_state, "
            "power_state, severity, message, conductor) VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8) "
            "RETURNING sequence"
        )
        event_values = (
            node["uuid"],
            event,
            node.get("provision_state"),
            node.get("target_provision_state"),
            node.get("power_state"),
            severity,
            message,
            conductor,
        )
        if not history or node.get("id") is None:
            return int(await self._db.fetchval(insert_event, *event_values))
        try:
            # Both rows in one statement (one round trip; every state change and step writes
            # one). As Ironic's node_history_record: the node's states as they are now, the
            # seconds since its last provision change, and the project behind the request.
            sequence = await self._db.fetchval(
                f"WITH event AS ({insert_event}), history AS ("
                "INSERT INTO node_history (uuid, node_id, conductor, event_type, event, severity, project, "
                "state, target_provision_state, duration_seconds) "
                "VALUES ($9, $10, $8, $11, $12, $6, $13, $3, $4, $14)) "
                "SELECT sequence FROM event",
                *event_values,
                uuid.uuid4(),
                node["id"],
                event_type,
                message or event,
                project_var.get(),
                seconds_since(node.get("provision_updated_at")),
            )
        except asyncpg.ForeignKeyViolationError:
            # The node was deleted by a concurrent request: say so, not 500.
            raise errors.NodeNotFound(f"Node {node['uuid']} could not be found.") from None
        return int(sequence)

    async def events_after(
        self, sequence: int, *, node_uuid: str | None = None, limit: int = 1000
    ) -> list[NodeEventRecord]:
        if node_uuid:
            rows = await self._db.fetch(
                "SELECT * FROM node_events WHERE sequence > $1 AND node_uuid = $2::uuid ORDER BY sequence LIMIT $3",
                sequence,
                node_uuid,
                limit,
            )
        else:
            rows = await self._db.fetch(
                "SELECT * FROM node_events WHERE sequence > $1 ORDER BY sequence LIMIT $2", sequence, limit
            )
        return [cast(NodeEventRecord, row_to_dict(r)) for r in rows]

    async def latest_sequence(self) -> int:
        return int(await self._db.fetchval("SELECT coalesce(max(sequence), 0) FROM node_events"))

    async def history(self, node_id: int, *, limit: int = 1000, marker: str | None = None) -> list[NodeHistoryRecord]:
        if marker:
            rows = await self._db.fetch(
                "SELECT * FROM node_history WHERE node_id = $1 AND id > "
                "(SELECT id FROM node_history WHERE uuid = $2::uuid) ORDER BY id LIMIT $3",
                node_id,
                marker,
                limit,
            )
        else:
            rows = await self._db.fetch(
                "SELECT * FROM node_history WHERE node_id = $1 ORDER BY id LIMIT $2", node_id, limit
            )
        return [cast(NodeHistoryRecord, row_to_dict(r)) for r in rows]

    async def history_entry(self, node_id: int, entry_uuid: str) -> NodeHistoryRecord | None:
        row = await self._db.fetchrow(
            "SELECT * FROM node_history WHERE node_id = $1 AND uuid = $2::uuid", node_id, entry_uuid
        )
        return cast(NodeHistoryRecord | None, row_to_dict(row))
