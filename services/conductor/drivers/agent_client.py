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
        raise errors.AgentError(f"Agent at {self.base} is unreachable: {type(last).__name__}: {last}")

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
        if result.get("command_status") == "FAILED":
            error = result.get("command_error")
            text = error.get("message") or error if isinstance(error, dict) else error
            raise errors.AgentError(f"Agent command {name} failed: {text}")
        return result.get("command_result")


def _fault(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("faultstring") or data.get("description") or data)
    return str(data)
