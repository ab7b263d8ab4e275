"""What the conductor does to nodes: provisioning flows, power, maintenance.

Each public method is the synchronous half of an RPC: it takes the node lock,
checks everything that can be checked without touching hardware, records the
first state change and returns. The hardware half runs in the background
under the same lock (TaskManager.spawn), moving the node through the state
machine table in services.common.states and never by hand-coded targets.
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

import asyncpg

from services.common import errors, states
from services.common.config import ConductorConfig
from services.common.db.events import EventRepository
from services.common.db.nodes import NodeRepository
from services.common.db.ports import PortRepository
from services.conductor import deploy_steps as steps
from services.conductor.agent_callbacks import AgentCallbacks
from services.conductor.configdrive_store import ConfigDriveStore
from services.conductor.drivers.base import Task
from services.conductor.drivers.direct import AGENT_KEYS
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.node_extras import NodeExtras
from services.conductor.taskmanager import TaskManager
from services.conductor.vifs import free_port_like

LOG = logging.getLogger(__name__)

NODE_CREATE_FIELDS = frozenset(
    (
        "uuid",
        "name",
        "driver",
        "driver_info",
        "properties",
        "instance_info",
        "extra",
        "resource_class",
        "conductor_group",
        "owner",
        "lessee",
        "description",
        "automated_clean",
        "network_data",
        "chassis_uuid",
        "instance_uuid",
        "protected",
        "protected_reason",
        "retired",
        "retired_reason",
        "maintenance",
        "maintenance_reason",
        "provision_state",
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
        "traits",
    )
)
# Interfaces Ferrum composes; the other Ironic interface fields are stored as given.
COMPOSED_INTERFACE_FIELDS = tuple(
    f"{k}_interface" for k in ("power", "management", "boot", "deploy", "storage", "network", "vendor", "inspect")
)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class ConductorManager:
    def __init__(
        self,
        pool: asyncpg.Pool,
        registry: DriverRegistry,
        config: ConductorConfig,
        *,
        hostname: str,
        objectstore: Any | None = None,
    ) -> None:
        self.pool = pool
        self.registry = registry
        self.config = config
        self.hostname = hostname
        self.nodes = NodeRepository(pool)
        self.tasks = TaskManager(pool, registry, hostname=hostname, lease=config.lock_lease, workers=config.workers)
        self.configdrives = ConfigDriveStore(
            objectstore=objectstore if config.configdrive_use_object_store else None,
            container=config.configdrive_container,
            lifetime=int(config.deploy_callback_timeout) + 120,
            inline_limit=config.configdrive_inline_limit,
        )
        self.tasks.publish_configdrive = self.configdrives.publish
        self.agents = AgentCallbacks(self)
        self.extras = NodeExtras(self)

    async def record_event(self, node: dict[str, Any], event: str, message: str, *, severity: str = "INFO") -> None:
        await EventRepository(self.pool).record(
            node, event=event, message=message, conductor=self.hostname, severity=severity
        )

    # -- node records ----------------------------------------------------------

    async def create_node(self, values: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(values) - NODE_CREATE_FIELDS
        if unknown:
            raise errors.InvalidParameterValue(f"unknown node fields: {', '.join(sorted(unknown))}")
        record = {k: v for k, v in values.items() if k != "chassis_uuid"}
        record.setdefault("uuid", str(uuidlib.uuid4()))
        record.setdefault("provision_state", states.ENROLL)
        record.update(self.registry.resolve_interfaces(record["driver"], record))
        async with self.pool.acquire() as conn, conn.transaction():
            node = await NodeRepository(conn).create(record)
            await EventRepository(conn).record(node, event="create", message="Node created", conductor=self.hostname)
        return node

    async def update_node(
        self, node_uuid: str, changes: Mapping[str, Any], *, reset_interfaces: bool = False
    ) -> dict[str, Any]:
        """Apply a validated patch under the node's lock (a node busy elsewhere is
        NodeLocked at once, and no operation can start half-way through the
        write); re-resolve interfaces when driver/interfaces change."""
        async with self.tasks.reserved(node_uuid) as node:
            saved = await self.nodes.update(
                node_uuid, self._resolved_changes(node, changes, reset_interfaces), expect_reservation=self.hostname
            )
        return {**saved, "reservation": None, "reservation_expires_at": None}  # released on the way out

    def _resolved_changes(
        self, node: Mapping[str, Any], changes: Mapping[str, Any], reset_interfaces: bool
    ) -> dict[str, Any]:
        changed = dict(changes)
        touches_driver = "driver" in changed or any(f in changed for f in COMPOSED_INTERFACE_FIELDS)
        if touches_driver:
            merged = {**node, **changed}
            if reset_interfaces:
                for field in COMPOSED_INTERFACE_FIELDS:
                    if field not in changes:
                        merged[field] = None
            else:
                # Interfaces the new driver does not support are reset to its defaults.
                for field in COMPOSED_INTERFACE_FIELDS:
                    kind = field.removesuffix("_interface")
                    if field not in changes and merged.get(field) not in self.registry.supported(
                        merged["driver"], kind
                    ):
                        merged[field] = None
            changed.update(self.registry.resolve_interfaces(merged["driver"], merged))
        return changed

    async def destroy_node(self, node_uuid: str) -> None:
        task = await self.tasks.acquire(node_uuid)
        try:
            node = task.node
            if node["protected"]:
                raise errors.NodeProtected(
                    f"Node {node_uuid} is protected and cannot be undeployed, rebuilt or deleted"
                )
            if not node["maintenance"]:
                if node["instance_uuid"]:
                    raise errors.NodeAssociated(
                        f"Node {node_uuid} is associated with instance {node['instance_uuid']}."
                    )
                if not states.delete_allowed(node["provision_state"]):
                    raise errors.InvalidState(
                        f"Can not delete node {node_uuid} while it is in provision state "
                        f'"{node["provision_state"]}". Valid provision states to perform deletion are: '
                        f"{sorted(s for s in (*states.DELETE_ALLOWED_STATES, states.AVAILABLE) if s)}, or set "
                        "the node into maintenance mode"
                    )
            await self.nodes.delete(node_uuid)
            await EventRepository(self.pool).record(
                {**node, "id": None}, event="delete", message="Node deleted", conductor=self.hostname, history=False
            )
        finally:
            await self.tasks.release(node_uuid)

    # -- state changes -----------------------------------------------------------

    async def transition(
        self,
        task: Task,
        event: str,
        *,
        last_error: str | None = None,
        changes: Mapping[str, Any] | None = None,
        severity: str = "INFO",
        note: str = "",
    ) -> dict[str, Any]:
        """Move the locked node by ``event`` through the table and record it
        (``note`` is appended to the history message)."""
        node = task.node
        move = states.next_state(node["provision_state"], event)
        update: dict[str, Any] = {
            "provision_state": move.target,
            "target_provision_state": states.next_target(node["target_provision_state"], move),
            "provision_updated_at": _now(),
        }
        if last_error is not None or event in ("deploy", "rebuild", "manage", "provide", "clean", "inspect"):
            update["last_error"] = last_error
        update.update(changes or {})
        message = last_error or f"{node['provision_state']} -> {move.target} ({event})" + (f": {note}" if note else "")
        async with self.pool.acquire() as conn, conn.transaction():
            saved = await NodeRepository(conn).update(node["uuid"], update, expect_reservation=self.hostname)
            await EventRepository(conn).record(
                saved,
                event=event,
                message=message,
                conductor=self.hostname,
                severity="ERROR" if last_error else severity,
            )
        task.node = saved
        return saved

    async def fail(self, task: Task, message: str) -> None:
        LOG.warning(
            "operation failed node_uuid=%s state=%s reason=%s", task.node["uuid"], task.node["provision_state"], message
        )
        try:
            await self.transition(task, "fail", last_error=message)
        except states.InvalidTransition:
            await self.nodes.update(task.node["uuid"], {"last_error": message})

    async def do_provision_action(
        self,
        node_uuid: str,
        event: str,
        *,
        configdrive: Any = None,
        clean_steps: list[Any] | None = None,
        rescue_password: str | None = None,
        deploy_steps: list[Any] | None = None,
        disable_ramdisk: bool = False,
    ) -> None:
        self.tasks.check_capacity()
        task = await self.tasks.acquire(node_uuid)
        try:
            node = task.node
            if event in ("deploy", "rebuild") and node["maintenance"]:
                raise errors.NodeInMaintenance(
                    f"The {event} action can not be performed on node {node_uuid} while it is in maintenance mode."
                )
            if event in ("rebuild", "delete") and node["protected"]:
                raise errors.NodeProtected(
                    f"Node {node_uuid} is protected and cannot be undeployed, rebuilt or deleted"
                )
            if event == "provide" and node["retired"]:
                raise errors.InvalidParameterValue(f"Node {node_uuid} is retired and cannot be provided")
            try:
                move = states.next_state(node["provision_state"], event)
            except states.InvalidTransition:
                raise errors.InvalidStateRequested(
                    f'The requested action "{event}" can not be performed on node "{node_uuid}" while it '
                    f'is in state "{node["provision_state"]}".'
                ) from None
            if event in ("deploy", "rebuild"):
                await self._validate_for_deploy(task)
            if deploy_steps and event not in ("deploy", "rebuild"):
                raise errors.InvalidParameterValue(
                    '"deploy_steps" is only valid when setting target provision state to active or rebuild'
                )
            if disable_ramdisk and event != "clean":
                raise errors.InvalidParameterValue("disable_ramdisk is supported only with manual cleaning")
            planned = (
                steps.plan(task, deploy_steps or [], await steps.template_steps(self.pool, task))
                if event in ("deploy", "rebuild")
                else None
            )
            changes: dict[str, Any] = {}
            if event in ("deploy", "rebuild"):
                # A new deploy starts a new agent: forget the last one's token and URL.
                instance_info = {k: v for k, v in node["instance_info"].items() if k != "configdrive"}
                if configdrive is not None:
                    instance_info["configdrive"] = configdrive
                changes["instance_info"] = instance_info
                changes["driver_internal_info"] = {
                    k: v for k, v in node["driver_internal_info"].items() if k not in AGENT_KEYS
                }
                changes["driver_internal_info"]["deploy_steps"] = planned
                if deploy_steps:
                    changes["driver_internal_info"]["user_deploy_steps"] = deploy_steps
                else:
                    changes["driver_internal_info"].pop("user_deploy_steps", None)
            if clean_steps is not None:
                changes["driver_internal_info"] = {**node["driver_internal_info"], "clean_steps": clean_steps}
                if disable_ramdisk:
                    changes["driver_internal_info"]["cleaning_disable_ramdisk"] = True
            await self.transition(task, event, changes=changes)
        except BaseException:
            await self.tasks.release(node_uuid)
            raise
        work = {
            states.DEPLOYING: self._deploy_flow,
            states.DELETING: self._tear_down_flow,
            states.VERIFYING: self._verify_flow,
            states.CLEANING: self._clean_flow,
            states.INSPECTING: self._inspect_flow,
            states.ADOPTING: self._done_flow,
            states.RESCUING: self._done_flow,
            states.UNRESCUING: self._done_flow,
            states.SERVICING: self._done_flow,
        }.get(move.target)
        if work is None:  # abort, unhold, manage from available...: nothing more to do
            await self.tasks.release(node_uuid)
            return
        self.tasks.spawn(task, work, name=event)

    async def _validate_for_deploy(self, task: Task) -> None:
        for kind in ("power", "management", "boot", "deploy", "storage"):
            try:
                await getattr(task.driver, kind).validate(task)
            except errors.FerrumError as exc:
                raise errors.InvalidParameterValue(
                    f"Failed to validate {kind} interface for node {task.node['uuid']}: {exc.message}"
                ) from None

    async def guard(self, task: Task, what: str, coro: Any) -> bool:
        """Run one hardware step; on error fail the node with a clear last_error."""
        try:
            await coro
            return True
        except Exception as exc:  # noqa: BLE001 - a driver error must never leave the node in an *ing state
            message = exc.message if isinstance(exc, errors.FerrumError) else f"{type(exc).__name__}: {exc}"
            await self.fail(task, f"{what} failed for node {task.node['uuid']}: {message}")
            return False

    async def _deploy_flow(self, task: Task) -> None:
        async def run() -> None:
            stored = await self.configdrives.store(task)
            if stored is not None and stored != task.node["instance_info"].get("configdrive"):
                task.node = await self.nodes.update(
                    task.node["uuid"],
                    {"instance_info": {**task.node["instance_info"], "configdrive": stored}},
                    expect_reservation=self.hostname,
                )
            await task.driver.storage.attach_volumes(task)
            await task.driver.deploy.prepare(task)
            planned = task.node["driver_internal_info"].get("deploy_steps") or steps.plan(task, [])
            before, core, after = steps.split_at_deploy(planned)
            for step in before:
                await steps.run_step(self, task, step)
            await steps.mark(self, task, core)
            result = await task.driver.deploy.deploy(task)
            if result == states.DEPLOYWAIT:
                # The agent's heartbeats run the steps after deploy.deploy.
                await steps.clear(task)
                await self.transition(task, "wait")
                if task.node["driver_internal_info"].get("agent_url"):
                    # The agent already heartbeated while we were still deploying
                    # (a fast boot); take the first step now instead of waiting a
                    # whole heartbeat interval for the next one.
                    await self.agents.continue_deploy(task)
                return
            for step in after:
                await steps.run_step(self, task, step)
            await task.driver.boot.prepare_instance(task)
            await self.transition(task, "done", changes={"deploy_step": {}})

        await self.guard(task, "Deploy", run())

    async def _tear_down_flow(self, task: Task) -> None:
        async def run() -> None:
            await task.driver.deploy.tear_down(task)
            await task.driver.boot.clean_up_instance(task)
            await self.configdrives.remove(task)
            await task.driver.storage.detach_volumes(task)
            await self.transition(task, "clean", changes={"instance_info": {}, "instance_uuid": None})
            await self._run_cleaning(task)

        await self.guard(task, "Tear down", run())

    async def _clean_flow(self, task: Task) -> None:
        await self.guard(task, "Cleaning", self._run_cleaning(task))

    async def _run_cleaning(self, task: Task) -> None:
        node = task.node
        manual = node["target_provision_state"] == states.MANAGEABLE
        automated = node["automated_clean"] if node["automated_clean"] is not None else self.config.automated_clean
        if manual or automated:
            # Fake and no-op interfaces have no real steps; the vendor "log" step
            # of fake-hardware is the one trivial automated step (as in Ironic).
            await task.driver.power.validate(task)
        # The history says whether cleaning ran and, if not, which setting skipped it (Ironic logs the same).
        if manual or automated:
            note = f"{'manual' if manual else 'automated'} cleaning finished"
        else:
            note = f"automated cleaning skipped: disabled via {'the API' if node['automated_clean'] is False else 'configuration'}"
        if node["driver_internal_info"].get("cleaning_disable_ramdisk"):
            note += " (ramdisk disabled)"
        info = {
            k: v
            for k, v in node["driver_internal_info"].items()
            if k not in ("clean_steps", "cleaning_disable_ramdisk")
        }
        # A retired node never becomes available again: its cleaning ends in
        # manageable (API 1.61, as Ironic does).
        if node.get("retired") and not manual:
            note += "; the node is retired, so it stays manageable"
        event = "manage" if manual or node.get("retired") else "done"
        await self.transition(task, event, changes={"driver_internal_info": info}, note=note)

    async def _verify_flow(self, task: Task) -> None:
        async def run() -> None:
            await task.driver.power.validate(task)
            await task.driver.management.validate(task)
            power = await task.driver.power.get_power_state(task)
            await self.transition(task, "done", changes={"power_state": power})

        await self.guard(task, "Verification", run())

    async def _inspect_flow(self, task: Task) -> None:
        async def run() -> None:
            await task.driver.inspect.inspect_hardware(task)
            await self.transition(task, "done", changes={"inspection_finished_at": _now()})

        await self.guard(task, "Inspection", run())

    async def _done_flow(self, task: Task) -> None:
        await self.guard(task, task.node["provision_state"], self.transition(task, "done"))

    # -- power, maintenance, management -------------------------------------------

    async def change_power_state(self, node_uuid: str, target: str, timeout: int | None = None) -> None:
        self.tasks.check_capacity()
        task = await self.tasks.acquire(node_uuid)
        try:
            node = task.node
            if node["provision_state"] in (states.CLEANING, states.CLEANWAIT):
                raise errors.InvalidStateRequested(
                    f'The requested action "{target}" can not be performed on node "{node_uuid}" '
                    f'while it is in state "{node["provision_state"]}".'
                )
            supported = task.driver.power.get_supported_power_states()
            if target not in supported:
                raise errors.InvalidParameterValue(
                    f"The requested power state {target} is not supported by the power interface; "
                    f"supported: {supported}"
                )
            await task.driver.power.validate(task)
            final = (
                states.POWER_ON if target in (states.POWER_ON, states.REBOOT, states.SOFT_REBOOT) else states.POWER_OFF
            )
            task.node = await self.nodes.update(
                node_uuid, {"target_power_state": final, "last_error": None}, expect_reservation=self.hostname
            )
        except BaseException:
            await self.tasks.release(node_uuid)
            raise

        async def work(task: Task) -> None:
            try:
                if target in (states.REBOOT,):
                    await task.driver.power.reboot(task, timeout)
                else:
                    await task.driver.power.set_power_state(task, target, timeout)
                changes = {"power_state": final, "target_power_state": None}
                message = f"power state changed to {final}"
                severity = "INFO"
            except Exception as exc:  # noqa: BLE001 - any driver failure is recorded as the node's last_error
                text = exc.message if isinstance(exc, errors.FerrumError) else str(exc)
                message = f"Failed to change power state to '{target}' by '{target}': {text}"
                changes = {"target_power_state": None, "last_error": message}
                severity = "ERROR"
            async with self.pool.acquire() as conn, conn.transaction():
                saved = await NodeRepository(conn).update(node_uuid, changes, expect_reservation=self.hostname)
                await EventRepository(conn).record(
                    saved,
                    event="power",
                    message=message,
                    severity=severity,
                    conductor=self.hostname,
                    event_type="power",
                )

        self.tasks.spawn(task, work, name="power")

    async def set_maintenance(self, node_uuid: str, maintenance: bool, reason: str | None) -> None:
        node = await self.nodes.get(node_uuid)
        changes: dict[str, Any] = {"maintenance": maintenance, "maintenance_reason": reason if maintenance else None}
        if not maintenance:
            changes["fault"] = None
        saved = await self.nodes.update(node["uuid"], changes)
        await EventRepository(self.pool).record(
            saved,
            event="maintenance",
            message=f"maintenance {'on' if maintenance else 'off'}" + (f": {reason}" if maintenance and reason else ""),
            conductor=self.hostname,
            event_type="maintenance",
        )

    async def set_boot_device(self, node_uuid: str, device: str, persistent: bool) -> None:
        task = await self.tasks.acquire(node_uuid)
        try:
            await task.driver.management.validate(task)
            await task.driver.management.set_boot_device(task, device, persistent)
        finally:
            await self.tasks.release(node_uuid)

    async def get_boot_device(self, node_uuid: str) -> dict[str, Any]:
        node = await self.nodes.get(node_uuid)
        task = await self.tasks.build_task(node)
        return await task.driver.management.get_boot_device(task)

    async def get_supported_boot_devices(self, node_uuid: str) -> list[str]:
        node = await self.nodes.get(node_uuid)
        task = await self.tasks.build_task(node)
        return task.driver.management.get_supported_boot_devices(task)

    async def validate_interfaces(self, node_uuid: str) -> list[tuple[str, bool, str]]:
        """Ironic's /validate: every interface, shared access (no lock)."""
        node = await self.nodes.get(node_uuid)
        task = await self.tasks.build_task(node)
        results = []
        for kind in (
            "bios",
            "boot",
            "console",
            "deploy",
            "firmware",
            "inspect",
            "management",
            "network",
            "power",
            "raid",
            "rescue",
            "storage",
        ):
            impl = getattr(task.driver, kind, None)
            if impl is None:
                results.append((kind, False, "not supported"))
                continue
            try:
                await impl.validate(task)
                results.append((kind, True, ""))
            except errors.FerrumError as exc:
                results.append((kind, False, exc.message))
        return results

    async def vif_attach(self, node_uuid: str, vif_id: str, *, port_uuid: str = "", portgroup_uuid: str = "") -> None:
        """Record a VIF on the port or port group Ironic's flat networks would pick
        (services/conductor/vifs.py), or on the one the caller names (REST 1.67)."""
        task = await self.tasks.acquire(node_uuid)
        try:
            other = await self.pool.fetchval(
                "SELECT n.uuid FROM ports p JOIN nodes n ON n.id = p.node_id "
                "WHERE p.internal_info->>'tenant_vif_port_id' = $1 UNION ALL "
                "SELECT n.uuid FROM portgroups g JOIN nodes n ON n.id = g.node_id "
                "WHERE g.internal_info->>'tenant_vif_port_id' = $1 LIMIT 1",
                vif_id,
            )
            if other is not None:
                raise errors.Conflict(f"Unable to set VIF {vif_id}: it is already attached to node {other}")
            if portgroup_uuid:
                await self._vif_to_portgroup(task, vif_id, portgroup_uuid)
            else:
                if port_uuid:
                    port: Mapping[str, Any] | None = next((p for p in task.ports if p["uuid"] == port_uuid), None)
                    if port is None:
                        raise errors.InvalidParameterValue(
                            f"Unable to attach VIF {vif_id}: port {port_uuid} does not belong to node {node_uuid}."
                        )
                    if port["internal_info"].get("tenant_vif_port_id"):
                        raise errors.Conflict(
                            f"Unable to attach VIF {vif_id}: port {port_uuid} already has VIF "
                            f"{port['internal_info']['tenant_vif_port_id']} attached."
                        )
                else:
                    groups = await self.pool.fetch(
                        "SELECT id, uuid, internal_info FROM portgroups WHERE node_id = $1 ORDER BY id", task.node["id"]
                    )
                    free = free_port_like(task.ports, [dict(g) for g in groups])
                    if not free:
                        raise errors.InvalidParameterValue(
                            f"Unable to attach VIF {vif_id}, not enough free physical ports on node {node_uuid}."
                        )
                    if free[0].kind == "portgroup":
                        await self._vif_to_portgroup(task, vif_id, str(free[0].row["uuid"]))
                        port = None
                    else:
                        port = free[0].row
                if port is not None:
                    await PortRepository(self.pool).update(
                        port["uuid"], {"internal_info": {**port["internal_info"], "tenant_vif_port_id": vif_id}}
                    )
            await EventRepository(self.pool).record(
                task.node,
                event="vif-attach",
                message=f"VIF {vif_id} attached",
                conductor=self.hostname,
                event_type="network",
            )
        finally:
            await self.tasks.release(node_uuid)

    async def _vif_to_portgroup(self, task: Task, vif_id: str, portgroup_uuid: str) -> None:
        """Ironic keeps a port group's VIF in the group's own internal_info."""
        group = await self.pool.fetchrow(
            "SELECT id, node_id, internal_info FROM portgroups WHERE uuid = $1::uuid", portgroup_uuid
        )
        if group is None or group["node_id"] != task.node["id"]:
            raise errors.InvalidParameterValue(
                f"Unable to attach VIF {vif_id}: port group {portgroup_uuid} does not belong to node {task.node['uuid']}."
            )
        info = (
            group["internal_info"] if isinstance(group["internal_info"], dict) else json.loads(group["internal_info"])
        )
        if info.get("tenant_vif_port_id"):
            raise errors.Conflict(
                f"Unable to attach VIF {vif_id}: port group {portgroup_uuid} already has VIF "
                f"{info['tenant_vif_port_id']} attached."
            )
        await self.pool.execute(
            "UPDATE portgroups SET internal_info = $2, updated_at = now() WHERE id = $1",
            group["id"],
            {**info, "tenant_vif_port_id": vif_id},
        )

    async def vif_detach(self, node_uuid: str, vif_id: str) -> None:
        task = await self.tasks.acquire(node_uuid)
        try:
            for port in task.ports:
                if port["internal_info"].get("tenant_vif_port_id") == vif_id:
                    info = {k: v for k, v in port["internal_info"].items() if k != "tenant_vif_port_id"}
                    await PortRepository(self.pool).update(port["uuid"], {"internal_info": info})
                    break
            else:
                group = await self.pool.fetchval(
                    "UPDATE portgroups SET internal_info = internal_info - 'tenant_vif_port_id', updated_at = now() "
                    "WHERE node_id = $1 AND internal_info->>'tenant_vif_port_id' = $2 RETURNING uuid",
                    task.node["id"],
                    vif_id,
                )
                if group is None:
                    raise errors.NotFound(
                        f"Unable to detach VIF {vif_id} from node {node_uuid} because it is not attached to it."
                    )
            await EventRepository(self.pool).record(
                task.node,
                event="vif-detach",
                message=f"VIF {vif_id} detached",
                conductor=self.hostname,
                event_type="network",
            )
        finally:
            await self.tasks.release(node_uuid)

    def new_agent_token(self) -> str:
        return secrets.token_urlsafe(32)
