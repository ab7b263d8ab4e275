"""A node row across the api <-> conductor wire: JSON text (what conductor.proto
carries in ``node_json``) against a typed message with one field per column.

The row is a real one: a migrated embedded PostgreSQL, one node inserted with
realistic driver_info, properties, instance_info and driver_internal_info, read
back with ``SELECT *`` as the repositories do. The typed message is built from
the live ``information_schema`` (integers as int64, booleans, timestamps as
int64 microseconds, jsonb as JSON text since those columns are free-form, the
rest strings; every field ``optional`` so NULL survives), so it mirrors the
table as a hand-written ``NodeRow`` would.

One round trip is what the api pays per create, patch or agent lookup:
JSON is ``dumps`` + ``json.loads`` + ``parse_datetimes``; typed is dict ->
message -> bytes -> message -> dict. Both run interleaved ``--rounds`` times
(the machine may be shared); min and median per row are printed. Figures only.

    PYTHONPATH=$PWD .venv/bin/python bench/node_row_wire.py
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import tempfile
import timeit
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import asyncpg
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from services.api.node_values import NODE_TIMESTAMPS
from services.common.db import migrate
from services.common.db.embedded import EmbeddedPostgres
from services.common.db.rows import row_to_dict
from services.common.jsonutil import dumps, parse_datetimes

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
NODE = {
    "driver_info": {
        "redfish_address": "https://10.0.0.5:8000",
        "redfish_system_id": "/redfish/v1/Systems/1",
        "redfish_username": "admin",
        "redfish_password": "s3cret",
        "redfish_verify_ca": False,
        "deploy_kernel": "http://images/ipa.kernel",
        "deploy_ramdisk": "http://images/ipa.initramfs",
    },
    "properties": {
        "cpus": 16,
        "memory_mb": 65536,
        "local_gb": 400,
        "cpu_arch": "x86_64",
        "capabilities": "boot_mode:uefi",
    },
    "instance_info": {
        "image_source": "http://images/os.qcow2",
        "image_checksum": "sha256:" + "a" * 64,
        "root_gb": 40,
        "traits": ["CUSTOM_RAID"],
    },
    "extra": {"rack": "r12", "slot": 7},
    "driver_internal_info": {
        "deploy_steps": [{"interface": "deploy", "step": "deploy", "priority": 100, "args": {}}],
        "agent_url": "https://10.0.1.9:9999",
        "agent_version": "9.0.0",
        "last_power_state_change": "2026-11-28T04:00:00",
    },
}


async def real_row(url: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """One node row as ``SELECT *`` returns it, and the table's (column, type) list."""
    await migrate.upgrade(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
        await conn.execute(
            "INSERT INTO nodes (uuid, name, driver, driver_info, properties, instance_info, extra,"
            " driver_internal_info, provision_state, power_state)"
            " VALUES ($1, 'node-0', 'redfish', $2, $3, $4, $5, $6, 'active', 'power on')",
            "1be26c0b-03f2-4d2b-ae87-c02d7f33c781",
            *(NODE[k] for k in ("driver_info", "properties", "instance_info", "extra", "driver_internal_info")),
        )
        columns = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = 'nodes' ORDER BY ordinal_position"
        )
        record = await conn.fetchrow("SELECT * FROM nodes")
        assert record is not None
        row = row_to_dict(record)
    finally:
        await conn.close()
    return row, [(c["column_name"], c["data_type"]) for c in columns]


def typed_row_class(columns: list[tuple[str, str]]) -> tuple[type[Message], dict[str, str]]:
    """A NodeRow message with one optional field per column, and each column's kind."""
    kinds: dict[str, str] = {}
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="bench_node_row.proto", package="bench", syntax="proto3")
    message = proto.message_type.add(name="NodeRow")
    for number, (name, data_type) in enumerate(columns, 1):
        if data_type in ("integer", "bigint", "smallint"):
            kind, wire = "int", field.TYPE_INT64
        elif data_type == "boolean":
            kind, wire = "bool", field.TYPE_BOOL
        elif data_type.startswith("timestamp"):
            kind, wire = "time", field.TYPE_INT64
        elif data_type in ("jsonb", "json", "ARRAY"):
            kind, wire = "json", field.TYPE_STRING
        else:
            kind, wire = "str", field.TYPE_STRING
        message.oneof_decl.add(name=f"_{name}")
        message.field.add(
            name=name,
            number=number,
            type=wire,
            label=field.LABEL_OPTIONAL,
            proto3_optional=True,
            oneof_index=len(message.oneof_decl) - 1,
        )
        kinds[name] = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.NodeRow")), kinds


def to_message(cls: type[Message], kinds: Mapping[str, str], row: Mapping[str, Any]) -> Message:
    values: dict[str, Any] = {}
    for name, value in row.items():
        if value is None:
            continue
        kind = kinds[name]
        if kind == "json":
            values[name] = json.dumps(value, separators=(",", ":"))
        elif kind == "time":
            values[name] = (value - EPOCH) // datetime.timedelta(microseconds=1)
        else:
            values[name] = value
    return cls(**values)


def from_message(kinds: Mapping[str, str], message: Any) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name, kind in kinds.items():
        if not message.HasField(name):
            row[name] = None
            continue
        value = getattr(message, name)
        if kind == "json":
            value = json.loads(value)
        elif kind == "time":
            value = EPOCH + datetime.timedelta(microseconds=value)
        row[name] = value
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--number", type=int, default=3000, help="round trips per timed round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-noderow-") as tmp:
        os.chmod(tmp, 0o755)
        server = EmbeddedPostgres(Path(tmp), fsync=False)
        server.start()
        try:
            server.create_database("bench")
            row, columns = asyncio.run(real_row(server.database_url("bench")))
        finally:
            server.stop()
    cls, kinds = typed_row_class(columns)
    encoded = to_message(cls, kinds, row).SerializeToString()
    assert from_message(kinds, cls.FromString(encoded)) == row, "the typed row must round-trip exactly"
    json_kinds = sum(1 for k in kinds.values() if k == "json")
    print(f"columns {len(columns)} ({json_kinds} jsonb); JSON {len(dumps(row))} bytes, typed {len(encoded)} bytes")

    def json_trip() -> None:
        parse_datetimes(json.loads(dumps(row)), NODE_TIMESTAMPS)

    def typed_trip() -> None:
        from_message(kinds, cls.FromString(to_message(cls, kinds, row).SerializeToString()))

    trips: dict[str, Callable[[], None]] = {"json": json_trip, "typed": typed_trip}
    times: dict[str, list[float]] = {name: [] for name in trips}
    for _ in range(args.rounds):
        for name, trip in trips.items():
            times[name].append(timeit.timeit(trip, number=args.number) / args.number * 1e6)
    for name, values in times.items():
        values.sort()
        print(f"{name}: min {values[0]:.1f} us, median {values[len(values) // 2]:.1f} us per row round trip")


if __name__ == "__main__":
    main()
