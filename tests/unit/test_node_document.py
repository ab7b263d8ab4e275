"""Node documents, byte for byte, at the microversions where fields appear or change
shape, with and without ``fields=``, against a golden file written by the rendering
before issue 22's list-detail rework (``node_documents.golden.json``): the list
detail renders every node through :func:`views.node_document`, so a faster
rendering must not move a byte. A field added on purpose updates the file."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from services.api import views
from services.common import states
from services.common.db.records import NodeRecord
from services.common.jsonutil import dumps
from tests.support.node_records import node_record

GOLDEN = Path(__file__).with_name("node_documents.golden.json")
BASE = "http://127.0.0.1:6385"
_AT = datetime.datetime(2026, 11, 28, 8, 0, 1, 250000, tzinfo=datetime.UTC)

# 1.1 and 1.2 (available shown as None), 1.38/1.39 (inspect wait), 1.52 (allocation_uuid), 1.78, the maximum.
VERSIONS = ((1, 1), (1, 2), (1, 38), (1, 39), (1, 52), (1, 78), (1, 115))
FIELD_SETS: dict[str, list[str] | None] = {
    "all": None,
    "list": list(views.NODE_LIST_FIELDS),
    "rendered": ["created_at", "driver_info", "instance_info", "last_error", "clean_step", "conductor", "health"],
}


def _rows() -> dict[str, dict[str, Any]]:
    enrolled = {**node_record(), "allocation_uuid": None}
    busy = {
        **node_record(
            uuid="00000000-0000-4000-8000-000000000002",
            name="busy",
            provision_state=states.INSPECTWAIT,
            updated_at=_AT,
            provision_updated_at=_AT,
            driver_info={"ipmi_password": "s3cret", "proxy": "http://bob:pw@proxy:3128", "nested": {"token": "t"}},
            driver_internal_info={"agent_url": "http://10.0.0.1:9999", "keys": ["a"]},
            instance_info={"configdrive": "H4sI...", "image_url": "http://x/i.qcow2", "root_gb": 10},
            last_error="login failed: password=hunter2",
            clean_step={"step": "erase", "args": {"password": "p"}},
            deploy_step=None,
            console_enabled=None,
            properties={"cpus": 4, "memory_mb": 2048},
            traits=["CUSTOM_GPU"],
            instance_uuid="00000000-0000-4000-8000-0000000000aa",
        ),
        "allocation_uuid": "00000000-0000-4000-8000-0000000000bb",
    }
    available = {**node_record(uuid="00000000-0000-4000-8000-000000000003", provision_state=states.AVAILABLE)}
    return {"enrolled": enrolled, "busy": busy, "available": available}


CASES = [
    (row, version, fields, full)
    for row in ("enrolled", "busy", "available")
    for version in VERSIONS
    for fields in FIELD_SETS
    for full in (True, False)
]


def _case_id(row: str, version: tuple[int, int], fields: str, full: bool) -> str:
    return f"{row}-{version[0]}.{version[1]}-{fields}-{'full' if full else 'short'}"


def render_all(node_document: Callable[..., dict[str, Any]]) -> dict[str, str]:
    """Every case's document as the REST API serialises it."""
    rows = _rows()
    out = {}
    for row, version, fields, full in CASES:
        wanted = FIELD_SETS[fields]
        shown = None if wanted is None else [f for f in wanted if views.NODE_FIELD_VERSIONS[f] <= version]
        doc = node_document(rows[row], base=BASE, version=version, fields=shown, conductor="c-1", full=full)
        out[_case_id(row, version, fields, full)] = dumps(doc)
    return out


def test_documents_match_the_golden_file_byte_for_byte() -> None:
    golden = json.loads(GOLDEN.read_text())
    rendered = render_all(views.node_document)
    assert sorted(rendered) == sorted(golden)
    different = [name for name in golden if rendered[name] != golden[name]]
    assert not different, f"{len(different)} documents changed, first {different[0]}: {rendered[different[0]]}"


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"{v[0]}.{v[1]}")
def test_secrets_stay_masked_and_rows_unchanged(version: tuple[int, int]) -> None:
    """The golden file shows the masking; this checks it directly, and that rendering leaves the row alone."""
    row = _rows()["busy"]
    before = json.loads(dumps(row))
    doc = views.node_document(cast(NodeRecord, row), base=BASE, version=version, conductor="c-1")
    text = dumps(doc)
    for secret in ("s3cret", "bob:pw", "hunter2", "H4sI", "i.qcow2", '"p"', '"t"'):
        assert secret not in text
    assert json.loads(dumps(row)) == before
    assert doc["provision_state"] == (states.INSPECTING if version < (1, 39) else states.INSPECTWAIT)
