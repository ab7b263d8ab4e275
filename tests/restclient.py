"""The few REST calls the end-to-end tests make, against a live api."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

V = {"X-OpenStack-Ironic-API-Version": "1.56"}


async def call(env: dict[str, Any], method: str, path: str, body: Any = None, expect: int | None = None) -> Any:
    """``env`` holds an aiohttp ``session`` and the ``api`` base URL; returns (status, JSON or None)."""
    async with env["session"].request(method, env["api"] + path, json=body, headers=V) as r:
        text = await r.text()
        if expect is not None:
            assert r.status == expect, f"{method} {path}: {r.status} {text}"
        return r.status, (json.loads(text) if text else None)


async def wait_state(env: dict[str, Any], ident: str, wanted: str, timeout: float = 120.0) -> dict[str, Any]:
    """Poll until the node is in ``wanted`` and unlocked; fail with its last_error otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        _, node = await call(env, "GET", f"/v1/nodes/{ident}", expect=200)
        if node["provision_state"] == wanted and node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, f"{ident}: {node['provision_state']} ({node['last_error']})"
        await asyncio.sleep(0.1)
