"""The conductor's side of the agent's command API (CONTRACT.md 5.3).

The agent runs on the machine being deployed and serves
``POST /v1/commands/?agent_token=..&wait=..``; the conductor sends commands
and polls their status. Every call carries the node's one-time token, and
agent failures surface as ``errors.AgentError`` so a deploy fails with a
last_error that says which command broke and why.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp

from services.common import errors
from services.common.db.records import NodeRecord, PortRecord
from services.common.secret_keys import is_secret_key
from services.conductor.drivers import volumes

LOG = logging.getLogger(__name__)


class AgentClient:
    """Talks to one node's agent at its callback URL."""

    def __init__(
        self, callback_url: str, token: str, *, timeout: float = 60.0, attempts: int = 3, verify_ca: str = ""
    ) -> None:
        self.base = callback_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.attempts = attempts
        # An https agent is verified against the certificate it announced in its
        # heartbeat (API 1.68), else against the system's trust store. The announced
        # certificate is trusted by itself (partial chain), so a CA-issued one the
        # agent was given pins exactly as a self-signed one does.
        self.ssl: ssl.SSLContext | bool = True
        if verify_ca:
            self.ssl = ssl.create_default_context(cadata=verify_ca)
            self.ssl.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN

    async def _request(
        self, method: str, path: str, *, body: Any = None, query: Mapping[str, str] | None = None
    ) -> Any:
        params = {"agent_token": self.token, **(query or {})}
        last: Exception | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                timeout = aiohttp.ClientTimeout(total=self.timeout)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.request(method, self.base + path, json=body, params=params, ssl=self.ssl) as response,
                ):
                    data = await response.json(content_type=None)
                    if response.status == 409:
                        raise errors.AgentBusy(f"Agent at {self.base} is busy: {_fault(data)}")
                    if response.status >= 400:
                        raise errors.AgentError(
                            f"Agent at {self.base} answered {response.status} to {method} {path}: {_fault(data)}"
                        )
                    return data
            except (TimeoutError, aiohttp.ClientError) as exc:
                last = exc
                LOG.info("agent call failed url=%s attempt=%d reason=%s", self.base + path, attempt, exc)
                await asyncio.sleep(min(0.5 * attempt, 2.0))
        raise errors.AgentUnreachable(f"Agent at {self.base} is unreachable: {type(last).__name__}: {last}")

    async def execute(self, name: str, params: Mapping[str, Any], *, wait: bool = False) -> dict[str, Any]:
        """Start ``extension.command``; with ``wait`` the agent answers when it is done."""
        return await self._request(
            "POST",
            "/v1/commands/",
            body={"name": name, "params": dict(params)},
            query={"wait": "true" if wait else "false"},
        )

    async def commands(self) -> list[dict[str, Any]]:
        data = await self._request("GET", "/v1/commands/")
        return list(data.get("commands") or [])

    async def command(self, command_id: str) -> dict[str, Any]:
        return await self._request("GET", f"/v1/commands/{command_id}")

    async def run_sync(self, name: str, params: Mapping[str, Any]) -> Any:
        """A command whose answer is needed now; FAILED raises AgentError."""
        result = await self.execute(name, params, wait=True)
        failure = command_failure(result)
        if failure is not None:
            raise errors.AgentError(f"Agent command {name} failed: {failure}")
        return result.get("command_result")


def _fault(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("faultstring") or data.get("description") or data)
    return str(data)


def agent_node(node: NodeRecord) -> dict[str, Any]:
    """The node fields the agent reads (secrets left out, as Ironic masks them)."""
    properties = dict(node.get("properties") or {})
    hint = (node.get("driver_internal_info") or {}).get(volumes.ROOT_DEVICE_HINT)
    if hint:  # the LUN an image is written onto (boot from volume, force_deployment)
        properties["root_device"] = hint
    return {
        "uuid": node["uuid"],
        "name": node.get("name"),
        "properties": properties,
        # What a RAID step builds: the target less what its arguments left out (agent_raid.py).
        "target_raid_config": (node.get("driver_internal_info") or {}).get("target_raid_config")
        or node.get("target_raid_config")
        or {},
        "instance_info": {k: v for k, v in (node.get("instance_info") or {}).items() if not is_secret_key(k)},
        "driver_internal_info": {
            k: v for k, v in (node.get("driver_internal_info") or {}).items() if not is_secret_key(k)
        },
    }


def agent_port(port: PortRecord) -> dict[str, Any]:
    return {"uuid": port["uuid"], "address": port["address"], "pxe_enabled": port.get("pxe_enabled", True)}


def command_error_text(error: Any) -> str:
    """IPA reports ``{type, code, message, details}``; the node shows the message."""
    if isinstance(error, dict):
        message = str(error.get("message") or "")
        details = str(error.get("details") or "")
        if message and details and details not in message:
            # IPA's CommandExecutionError says only "Command execution failed";
            # what failed (the command line, its stderr) is in details.
            return f"{message}: {details}"[:2000]
        return message or details or str(error)
    return str(error)


def command_failure(result: Mapping[str, Any]) -> str | None:
    """Why a command result is a failure, or None while it runs or once it succeeded.

    IPA ends a step command with ``CLEAN_VERSION_MISMATCH`` (not ``FAILED``)
    when the ``clean_version``/``deploy_version`` sent with it differs from
    its hardware managers' versions: that is a failure too, not "still running".
    """
    status = result.get("command_status")
    if status == "FAILED":
        return command_error_text(result.get("command_error"))
    if status == "CLEAN_VERSION_MISMATCH":
        return (
            "the agent's hardware manager versions differ from the ones its steps were read with: "
            + command_error_text(result.get("command_error"))
        )
    return None


def client_for(node: NodeRecord, options: Mapping[str, Any]) -> AgentClient:
    """The client for the agent that last called back for ``node``."""
    info = node["driver_internal_info"]
    if not info.get("agent_url"):
        raise errors.AgentError(f"The agent of node {node['uuid']} has not called back yet")
    return AgentClient(
        info["agent_url"],
        info.get("agent_secret_token") or "",
        timeout=float(options.get("agent_command_timeout", 60.0)),
        verify_ca=info.get("agent_verify_ca") or "",
    )
