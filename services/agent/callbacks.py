"""The agent's two calls to the api: lookup and heartbeat (CONTRACT 5.1, 5.2).

Both are public endpoints; the heartbeat carries the one-time token that the
first lookup handed out. The microversion is negotiated once, like IPA:
``min(server maximum, 1.68)``.
"""

from __future__ import annotations

import json
import logging
import ssl
from typing import Any

import aiohttp

LOG = logging.getLogger(__name__)
WANTED_VERSION = (1, 68)
VERSION_HEADER = "X-OpenStack-Ironic-API-Version"
TIMEOUT = aiohttp.ClientTimeout(total=30)


class CallbackError(Exception):
    """A lookup or heartbeat the api refused or could not answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _parse_version(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.strip().split(".")
        return int(major), int(minor)
    except ValueError:
        return None


async def negotiate_version(session: aiohttp.ClientSession, api_url: str, *, tls: ssl.SSLContext | bool = True) -> str:
    """``min(server max, 1.68)``; 1.68 when the root document cannot be read."""
    wanted = WANTED_VERSION
    try:
        async with session.get(f"{api_url}/", timeout=TIMEOUT, ssl=tls) as resp:
            best = _parse_version(resp.headers.get("X-OpenStack-Ironic-API-Maximum-Version", ""))
            if best is None and resp.status == 200:
                body = await resp.json(content_type=None)
                best = _parse_version(str((body.get("default_version") or {}).get("version", "")))
            if best is not None:
                wanted = min(wanted, best)
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
        LOG.info("api version discovery failed api=%s reason=%s; using %d.%d", api_url, exc, *wanted)
    return f"{wanted[0]}.{wanted[1]}"


async def lookup(
    session: aiohttp.ClientSession,
    api_url: str,
    macs: tuple[str, ...],
    node_uuid: str,
    headers: dict[str, str],
    *,
    tls: ssl.SSLContext | bool = True,
) -> dict[str, Any] | None:
    """The lookup document, or None while the api does not know us yet (404)."""
    params = {"addresses": ",".join(macs)}
    if node_uuid:
        params["node_uuid"] = node_uuid
    async with session.get(f"{api_url}/v1/lookup", params=params, headers=headers, timeout=TIMEOUT, ssl=tls) as resp:
        text = await resp.text()
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise CallbackError(f"lookup answered HTTP {resp.status}: {text[:300]}", resp.status)
        try:
            body = await resp.json(content_type=None)
        except ValueError:
            raise CallbackError("lookup answered with a body that is not JSON", resp.status) from None
        if not isinstance(body, dict) or not isinstance(body.get("node"), dict) or not body["node"].get("uuid"):
            raise CallbackError("lookup answer has no node uuid", resp.status)
        return body


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    what: str,
    body: dict[str, Any],
    headers: dict[str, str],
    tls: ssl.SSLContext | bool,
) -> None:
    async with session.post(url, json=body, headers=headers, timeout=TIMEOUT, ssl=tls) as resp:
        if resp.status not in (200, 202, 204):
            raise CallbackError(f"{what} answered HTTP {resp.status}: {(await resp.text())[:300]}", resp.status)


async def heartbeat(
    session: aiohttp.ClientSession,
    api_url: str,
    node_uuid: str,
    body: dict[str, Any],
    headers: dict[str, str],
    *,
    tls: ssl.SSLContext | bool = True,
) -> None:
    await _post(session, f"{api_url}/v1/heartbeat/{node_uuid}", "heartbeat", body, headers, tls)


async def pass_deploy_info(
    session: aiohttp.ClientSession,
    api_url: str,
    node_uuid: str,
    body: dict[str, Any],
    headers: dict[str, str],
    *,
    tls: ssl.SSLContext | bool = True,
) -> None:
    """Seed 002's report of an iSCSI deploy ramdisk: its disk is exposed (or why not)."""
    url = f"{api_url}/v1/nodes/{node_uuid}/vendor_passthru/pass_deploy_info"
    await _post(session, url, "pass_deploy_info", body, headers, tls)


async def continue_inspection(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], *, tls: ssl.SSLContext | bool = True
) -> str:
    """Post the inspection data (no version header: API 1.1, as IPA's inspector does); the node's uuid."""
    async with session.post(url, json=body, timeout=TIMEOUT, ssl=tls) as resp:
        text = await resp.text()
        if resp.status not in (200, 202):
            raise CallbackError(f"continue_inspection answered HTTP {resp.status}: {text[:300]}", resp.status)
        try:
            answer = json.loads(text) if text else {}
        except ValueError:
            answer = {}
        return str(answer.get("uuid") or (answer.get("node") or {}).get("uuid") or "")
