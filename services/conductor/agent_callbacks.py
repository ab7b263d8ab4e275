"""What a conductor does when a deploy agent looks a node up or heartbeats.

Both arrive through the api's public ramdisk endpoints (CONTRACT.md 5.1, 5.2)
and are routed to the node's owner. The synchronous half checks the token and
records the agent's URL and progress; the rest (the next deploy step) runs
under the node lock in the background, so the api answers 202 at once. A
heartbeat that finds the node locked is only recorded: the agent heartbeats
again and the step is taken then.
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from services.common import errors, states
from services.common.db.nodes import NodeRepository
from services.common.db.outage import is_unavailable
from services.common.db.records import ConductorRecord, NodeRecord
from services.conductor.drivers import iscsi
from services.conductor.drivers.base import Task
from services.conductor.flows import clean, deploy, rescue
from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager

LOG = logging.getLogger(__name__)
MASK = "******"
# A heartbeat in a wait state continues that state's flow; the flow's busy
# state (the conductor still working before it waits) means "try again shortly".
CONTINUATIONS: Mapping[str, tuple[str, Callable[[NodeStates, Task], Awaitable[None]]]] = {
    states.DEPLOYWAIT: (states.DEPLOYING, deploy.continue_after_callback),
    states.CLEANWAIT: (states.CLEANING, clean.continue_after_callback),
    states.RESCUEWAIT: (states.RESCUING, rescue.continue_after_callback),
}
BUSY_STATES = frozenset(busy for busy, _ in CONTINUATIONS.values())


def _awaits_deploy_info(node: NodeRecord) -> bool:
    info = node["driver_internal_info"]
    return (
        node["provision_state"] == states.DEPLOYWAIT
        and bool(info.get(iscsi.KEY))
        and not (info.get(iscsi.PORTAL) or info.get(iscsi.ERROR))
    )


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class AgentCallbacks:
    """Lookup and heartbeat handling for one conductor."""

    def __init__(
        self,
        tasks: TaskManager,
        node_states: NodeStates,
        *,
        alive_conductors: Callable[[], Awaitable[list[ConductorRecord]]] | None = None,
    ) -> None:
        self.tasks = tasks
        self.states = node_states
        # Who is alive now (TakeOver.alive): decides whether a token nobody used can be re-issued.
        self.alive_conductors = alive_conductors
        self.nodes = NodeRepository(node_states.pool, secrets=node_states.secrets)
        self._retries: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def lookup_token(self, node_uuid: str) -> tuple[str, NodeRecord]:
        """The one-time token on the first lookup, ``******`` afterwards (CONTRACT 5.1)."""
        node = await self.nodes.get(node_uuid)
        if node["provision_state"] not in states.LOOKUP_ALLOWED_STATES:
            raise errors.NotFound("Node could not be found.")
        if node["driver_internal_info"].get("agent_secret_token"):
            return await self._reissue_if_stranded(node)
        node, created = await self.nodes.set_agent_token_once(
            node_uuid, secrets.token_urlsafe(32), issuer=self.tasks.hostname
        )
        if not created:
            return await self._reissue_if_stranded(node)
        await self.states.record_event(node, "agent-lookup", "Agent looked the node up; token issued")
        return node["driver_internal_info"]["agent_secret_token"], node

    async def _reissue_if_stranded(self, node: NodeRecord) -> tuple[str, NodeRecord]:
        """``******`` for a token already issued, as Ironic, unless it is stranded: stored by a
        conductor that died before its reply reached the agent (the api then retries the lookup
        here), and never used by a heartbeat. Masking that one would lock the ramdisk out until
        the call-back timeout. A token a live conductor issued, or one an agent already used,
        stays masked, so a second lookup can never take over a working agent."""
        info = node["driver_internal_info"]
        issuer = info.get("agent_token_issuer")
        if info.get("agent_url") or not issuer or issuer == self.tasks.hostname or self.alive_conductors is None:
            return MASK, node
        if any(row["hostname"] == issuer for row in await self.alive_conductors()):
            return MASK, node
        renewed = await self.nodes.reissue_stranded_agent_token(
            node["uuid"], secrets.token_urlsafe(32), issuer=self.tasks.hostname, dead_issuer=issuer
        )
        if renewed is None:
            return MASK, node
        await self.states.record_event(
            renewed,
            "agent-lookup",
            f"Agent looked the node up again; token re-issued: conductor {issuer}, which issued the first, "
            "died before the agent used it",
            severity="WARNING",
        )
        return renewed["driver_internal_info"]["agent_secret_token"], renewed

    async def heartbeat(
        self,
        node_uuid: str,
        *,
        callback_url: str,
        agent_version: str,
        agent_token: str,
        agent_status: str = "",
        progress: Mapping[str, Any] | None = None,
        agent_verify_ca: str = "",
        deploy_info: Mapping[str, Any] | None = None,
    ) -> None:
        node = await self.nodes.get(node_uuid)
        info = node["driver_internal_info"]
        if not agent_version and not agent_status:
            raise errors.InvalidParameterValue("Agent version must be provided in the heartbeat")
        stored = info.get("agent_secret_token") or ""
        if not stored or not agent_token or not hmac.compare_digest(stored, agent_token):
            raise errors.InvalidParameterValue("Invalid or missing agent token received.")
        if info.get("agent_url") and info["agent_url"] != callback_url:
            raise errors.InvalidParameterValue('Detected change in ramdisk provided "callback_url"')
        if agent_verify_ca and info.get("agent_verify_ca") and info["agent_verify_ca"] != agent_verify_ca:
            raise errors.InvalidParameterValue('Detected change in ramdisk provided "agent_verify_ca"')
        expires = node["reservation_expires_at"]  # set whenever reservation is (a CHECK in the schema)
        locked = bool(node["reservation"]) and expires is not None and expires > datetime.datetime.now(datetime.UTC)
        if not info.get("agent_url") and locked and node["provision_state"] not in (*CONTINUATIONS, *BUSY_STATES):
            raise errors.NodeLocked(f"Node {node_uuid} is locked by host {node['reservation']}, please retry later.")
        values: dict[str, Any] = {
            "agent_url": callback_url,
            "agent_version": agent_version,
            "agent_last_heartbeat": _now_iso(),
        }
        if progress:
            values["deploy_progress"] = dict(progress)
        if agent_verify_ca:
            values["agent_verify_ca"] = agent_verify_ca
        if deploy_info is not None and _awaits_deploy_info(node):
            # An agent repeats its report in every heartbeat until the target is
            # stopped: only the first one, while the deploy still waits for it, counts.
            values.update(self._accepted_deploy_info(node, deploy_info))
        waiting = node["provision_state"] in (
            states.DEPLOYWAIT,
            states.CLEANWAIT,
            states.SERVICEWAIT,
            states.RESCUEWAIT,
            states.INSPECTWAIT,
        )
        node = await self.nodes.merge_internal_info(node_uuid, values, touch_provisioning=waiting)
        if node["provision_state"] not in (*CONTINUATIONS, *BUSY_STATES):
            return
        # The flow still holds the lock (the agent booted fast), or a
        # step is running: try again shortly rather than a whole heartbeat
        # interval later. Retries belong to this agent: once the node has
        # forgotten it (the operation ended, the next one boots a new
        # ramdisk), they stop, so a late retry never drives the next operation.
        await self._continue_soon(node_uuid, callback_url)

    async def pass_deploy_info(self, node_uuid: str, report: Mapping[str, Any]) -> None:
        """Seed 002's ``pass_deploy_info``: the iSCSI deploy ramdisk exposed its
        disk (or says why it could not). The per-deploy key authenticates the
        report; the image write then starts as after a heartbeat."""
        node = await self.nodes.get(node_uuid)
        values = self._accepted_deploy_info(node, report)
        node = await self.nodes.merge_internal_info(node_uuid, values, touch_provisioning=True)
        await self.states.record_event(
            node,
            "pass-deploy-info",
            "The deploy ramdisk reported an error" if iscsi.ERROR in values else "The deploy ramdisk exposed its disk",
            severity="ERROR" if iscsi.ERROR in values else "INFO",
        )
        callback_url = node["driver_internal_info"].get("agent_url")
        if callback_url:
            await self._continue_soon(node_uuid, callback_url)
        elif iscsi.ERROR in values:
            # A ramdisk that never heartbeated (seed 002's own ramdisk reports only
            # here): no heartbeat will continue the deploy, so fail it now.
            async with self.tasks.acquire(node_uuid, "pass_deploy_info") as task:
                if task.node["provision_state"] == states.DEPLOYWAIT:
                    await task.save_internal_info({}, remove=iscsi.ISCSI_KEYS)
                    await self.states.fail(
                        task, f"Deploy failed for node {node_uuid}: {iscsi.ramdisk_error(values[iscsi.ERROR])}"
                    )

    @staticmethod
    def _accepted_deploy_info(node: NodeRecord, report: Mapping[str, Any]) -> dict[str, Any]:
        """The driver_internal_info a valid report sets; 400 for a bad or
        unauthenticated one, 409 when the node is not waiting for it."""
        uuid = node["uuid"]
        if node["provision_state"] != states.DEPLOYWAIT:
            raise errors.InvalidState(
                f"Node {uuid} is not waiting for deploy information: its provision state is {node['provision_state']}"
            )
        if node.get("deploy_interface") != iscsi.IscsiDeploy.name:
            raise errors.InvalidParameterValue(
                f"Node {uuid} is not deployed over iSCSI (deploy interface {node.get('deploy_interface')!r})"
            )
        info = node["driver_internal_info"]
        key = report.get("key")
        if not isinstance(key, str) or not key:
            raise errors.MissingParameter("Deploy info needs the deploy key ('key')")
        stored = info.get(iscsi.KEY) or ""
        if not stored or not hmac.compare_digest(stored.encode(), key.encode()):
            raise errors.InvalidParameterValue(f"Deploy key does not match for node {uuid}")
        if info.get(iscsi.PORTAL) or info.get(iscsi.ERROR):
            raise errors.InvalidState(f"Node {uuid} already received its deploy information")
        error = report.get("error")
        if error:
            return {iscsi.ERROR: str(error)[:1000]}
        address, iqn, port = report.get("address"), report.get("iqn"), report.get("port")
        missing = [name for name, value in (("address", address), ("iqn", iqn)) if not value]
        if missing:
            raise errors.MissingParameter(f"Deploy info for node {uuid} lacks {', '.join(missing)}")
        if not isinstance(address, str) or not isinstance(iqn, str) or len(address) > 255:
            raise errors.InvalidParameterValue("Deploy info 'address' and 'iqn' must be strings")
        if iqn != info.get(iscsi.IQN):
            raise errors.InvalidParameterValue(f"Deploy info names iqn {iqn[:230]!r}, not the target of this deploy")
        if port in (None, "", 0):
            port = 3260
        if isinstance(port, bool) or not isinstance(port, (int, str)) or not str(port).isdigit():
            raise errors.InvalidParameterValue("Deploy info 'port' must be a TCP port number")
        if not 0 < int(port) < 65536:
            raise errors.InvalidParameterValue("Deploy info 'port' must be a TCP port number")
        return {iscsi.PORTAL: {"address": address, "port": int(port)}}

    async def _continue_soon(self, node_uuid: str, callback_url: str) -> None:
        """Take the next step now, or retry shortly while the node is busy."""
        key = (node_uuid, callback_url)
        if not await self._try_continue(node_uuid, callback_url) and key not in self._retries:
            retry = asyncio.create_task(
                self._retry_continue(node_uuid, callback_url), name=f"heartbeat-retry:{node_uuid}"
            )
            self._retries[key] = retry
            retry.add_done_callback(lambda _t: self._retries.pop(key, None))

    async def _try_continue(self, node_uuid: str, callback_url: str) -> bool:
        """Take the lock and run the next step; False when the node is busy.

        The state is read before the lock is taken: a heartbeat that arrives
        after the operation finished must not lock an ``active`` node (an
        operator's next call would get a 409 for nothing)."""
        node = await self.nodes.get(node_uuid)
        if node["driver_internal_info"].get("agent_url") != callback_url:
            return True  # not (or no longer) the node's agent: nothing for it to continue
        state = node["provision_state"]
        if state in BUSY_STATES:
            return False  # the flow still holds the node: try again shortly
        if state not in CONTINUATIONS:
            return True  # nothing left for a heartbeat to do
        try:
            async with self.tasks.acquire_in_states(node_uuid, "agent heartbeat", (state,)) as task:
                if task is None:
                    return True  # the operation ended meanwhile: the node was not locked for it
                if task.node["driver_internal_info"].get("agent_url") != callback_url:
                    return True
                flow = CONTINUATIONS[state][1]
                task.spawn(lambda t: flow(self.states, t), name="heartbeat")
                return True
        except errors.NodeLocked:
            return False

    async def _retry_continue(
        self, node_uuid: str, callback_url: str, *, attempts: int = 20, delay: float = 0.5
    ) -> None:
        for _ in range(attempts):
            await asyncio.sleep(delay)
            try:
                if await self._try_continue(node_uuid, callback_url):
                    return
            except errors.NodeNotFound:
                return
            except Exception as exc:  # the next heartbeat tries again; a retry must not crash
                if is_unavailable(exc):
                    continue  # PostgreSQL is restarting: keep trying, with the same budget
                LOG.exception("continuing after a heartbeat failed node_uuid=%s", node_uuid)
                return

    async def stop(self) -> None:
        """Drop pending heartbeat retries (the agent heartbeats again to the next owner)."""
        pending = list(self._retries.values())
        for retry in pending:
            retry.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
