"""What the conductor does to nodes: the synchronous half of every RPC.

Each public method takes the node lock (``async with tasks.acquire(...)``),
checks everything that can be checked without touching hardware, records
the first state change and returns, so the api can answer at once. The
hardware half is a flow (services/conductor/flows/) that the lock is handed
to with ``task.spawn``. Vendor passthru, indicators, boot settings, VIFs,
agent callbacks and take-over live in their own modules; this class wires
them together for the gRPC servicer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import asyncpg

from services.common import errors, states
from services.common.config import ConductorConfig
from services.common.db.advisory import AdvisoryLocks
from services.common.db.events import EventEntry, EventRepository
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import NodeRepository
from services.common.db.outage import is_unavailable
from services.common.db.ports import PortRepository
from services.common.db.records import NodeInventoryRecord, NodeRecord
from services.common.db.vifs import VifRepository
from services.common.inspection_rules.built_in import load_built_in_rules
from services.common.password_hash import hash_password
from services.conductor import deploy_steps as steps
from services.conductor import step_plan, vifs
from services.conductor.agent_callbacks import AgentCallbacks
from services.conductor.boot_settings import BootSettings
from services.conductor.configdrive_store import ConfigDriveStore
from services.conductor.console_proxy import ConsoleProxies
from services.conductor.consoles import Consoles
from services.conductor.drivers import capabilities
from services.conductor.drivers.base import INTERFACE_KINDS, Task
from services.conductor.drivers.direct import AGENT_KEYS
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.flows import clean, deploy, inspect, power, rescue, resume, service, teardown, verify
from services.conductor.flows.context import FlowContext
from services.conductor.image_cache import ImageCache
from services.conductor.indicators import Indicators
from services.conductor.inspection import InventoryProcessing
from services.conductor.node_states import NodeStates
from services.conductor.raid_settings import RaidSettings
from services.conductor.takeover import TakeOver
from services.conductor.taskmanager import TaskManager
from services.conductor.vendor_passthru import VendorPassthru
from services.conductor.virtual_media import VirtualMedia
from services.conductor.vmedia_store import VirtualMediaStore

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
        "shard",
        "parent_node",
        "disable_power_off",
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
# Every node field naming an interface; each is resolved to the hardware type's
# default when unset and checked against what the type supports when set.
COMPOSED_INTERFACE_FIELDS = tuple(f"{k}_interface" for k in INTERFACE_KINDS)
# The interfaces a verb needs: each is validated (a ``no-*`` one refuses with a
# 400) before the verb changes anything. Deploys also check capabilities.
VERB_INTERFACES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        # storage first: a volume set-up decides what boot and deploy need (seed 004)
        "deploy": ("power", "management", "storage", "boot", "deploy"),
        "rebuild": ("power", "management", "storage", "boot", "deploy"),
        "inspect": ("inspect",),
        "rescue": ("rescue",),
        "unrescue": ("rescue",),
        "clean": ("power",),
        "service": ("power",),
    }
)

# Verbs whose checks before their first transition only read: their lock is taken by
# that transition (TaskManager.acquire_at_first_write), one commit fewer. ``abort``
# may record ``abort_after`` first, and the rest are rare; they lock first.
FIRST_WRITE_LOCKS = frozenset(("manage", "provide", "deploy", "rebuild", "delete", "inspect", "clean"))

Flow = Callable[[FlowContext, Task], Awaitable[None]]

# The flow that continues each state a verb moves a node into.
FLOW_OF_STATE: Mapping[str, Flow] = {
    states.DEPLOYING: deploy.start,
    states.DELETING: teardown.start,
    states.VERIFYING: verify.start,
    states.CLEANING: clean.start,
    states.INSPECTING: inspect.start,
    states.ADOPTING: rescue.start,
    states.RESCUING: rescue.start,
    states.UNRESCUING: rescue.start,
    states.SERVICING: service.start,
}
# What ``abort`` leaves to do, by the state it was asked in: stop the ramdisk
# that was booted for the operation (the table already moved the node).
ABORT_FLOWS: Mapping[str, Flow] = {
    states.DEPLOYWAIT: deploy.abort,  # REST 1.110
    states.CLEANWAIT: clean.abort,
    states.CLEANHOLD: clean.abort,
    states.SERVICEHOLD: service.abort,
    states.RESCUEWAIT: rescue.abort,
    states.INSPECTWAIT: inspect.abort,
    states.SERVICEWAIT: service.abort,
    states.SERVICEFAIL: service.abort_failed,
}
# What ``unhold`` resumes, by the hold state it was asked in (1.85): the steps
# after the hold step (the table moved the node to the flow's wait state).
UNHOLD_FLOWS: Mapping[str, Flow] = {
    states.CLEANHOLD: clean.unhold,
    states.DEPLOYHOLD: deploy.unhold,
    states.SERVICEHOLD: service.unhold,
}


class ConductorManager:
    def __init__(
        self,
        pool: asyncpg.Pool,
        registry: DriverRegistry,
        config: ConductorConfig,
        *,
        hostname: str,
        secrets: NodeSecrets,
        objectstore: Any | None = None,
        vmedia_work_dir: Path | None = None,
        image_cache_dir: Path | None = None,
        api_url: Callable[[], str] = lambda: "",
        console_ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.pool = pool
        self.secrets = secrets
        self.registry = registry
        self.config = config
        self.hostname = hostname
        self.nodes = NodeRepository(pool, secrets=secrets)
        self.tasks = TaskManager(
            pool, registry, hostname=hostname, lease=config.lock_lease, workers=config.workers, secrets=secrets
        )
        self.configdrives = ConfigDriveStore(
            objectstore=objectstore if config.configdrive_use_object_store else None,
            container=config.configdrive_container,
            lifetime=int(config.deploy_callback_timeout) + 120,
            inline_limit=config.configdrive_inline_limit,
            upload_threshold=config.configdrive_upload_threshold,
        )
        self.tasks.publish_configdrive = self.configdrives.publish
        self.tasks.read_configdrive = self.configdrives.read_iso
        self.vmedia = VirtualMediaStore(
            objectstore=objectstore,
            locks=AdvisoryLocks(pool),
            configdrives=self.configdrives,
            container=config.vmedia_container,
            ttl=config.deploy_helper_images_ttl,
            work_dir=vmedia_work_dir or Path(config.vmedia_work_dir or "vmedia") / hostname,
            api_url=lambda: config.vmedia_api_url or api_url(),
            download_timeout=config.vmedia_download_timeout,
            max_download=config.vmedia_max_download,
        )
        self.tasks.media = self.vmedia
        self.image_cache = ImageCache(
            image_cache_dir or Path(config.image_cache_dir or "image-cache") / hostname,
            max_bytes=config.image_cache_max_bytes,
            download_timeout=config.vmedia_download_timeout,
        )
        self.tasks.image_cache = self.image_cache
        self.tasks.on_database_lost = self._resume_after_outage
        self.inspection = InventoryProcessing(
            pool,
            built_in_rules=load_built_in_rules(config.inspection_rules_file),
            mask_secrets=config.inspection_rules_mask_secrets,
        )
        self.states = NodeStates(
            pool,
            hostname=hostname,
            config=config,
            configdrives=self.configdrives,
            secrets=secrets,
            inspection=self.inspection,
        )
        self.takeover = TakeOver(self.tasks, self.states, config=config)
        self.console_proxies = ConsoleProxies(config, ssl_context=console_ssl_context)
        self.tasks.consoles = self.console_proxies
        self.consoles = Consoles(self.tasks, self.states, self.console_proxies, self.takeover)
        self.takeover.on_adopted = self.consoles.reconcile
        self.agents = AgentCallbacks(self.tasks, self.states, alive_conductors=self.takeover.alive)
        self.vendor = VendorPassthru(self.tasks, self.states, registry)
        self.indicators = Indicators(self.tasks, self.states)
        self.boot_settings = BootSettings(self.tasks, self.states)
        self.raid_settings = RaidSettings(self.tasks, self.states)
        self.virtual_media = VirtualMedia(self.tasks, self.states)
        self._vifs = VifRepository(pool)
        self._ports = PortRepository(pool)

    # -- node records ----------------------------------------------------------

    async def create_node(self, values: Mapping[str, Any]) -> NodeRecord:
        unknown = set(values) - NODE_CREATE_FIELDS
        if unknown:
            raise errors.InvalidParameterValue(f"unknown node fields: {', '.join(sorted(unknown))}")
        record = dict(values)
        record.setdefault("uuid", str(uuidlib.uuid4()))
        record.setdefault("provision_state", states.ENROLL)
        record.update(self.registry.resolve_interfaces(record["driver"], record))
        # The node, its event and its history row in one statement.
        entry = EventEntry(event="create", message="Node created", conductor=self.hostname)
        return await self.nodes.create(record, event=entry)

    async def update_node(
        self, node_uuid: str, changes: Mapping[str, Any], *, reset_interfaces: bool = False
    ) -> NodeRecord:
        """Apply a validated patch under the node's lock (a node busy elsewhere is
        NodeLocked at once, and no operation can start half-way through the
        write); re-resolve interfaces when driver/interfaces change."""
        async with self.tasks.reserved(node_uuid) as node:
            _refuse_second_instance(node, changes)
            saved = await self.nodes.update(
                node_uuid, self._resolved_changes(node, changes, reset_interfaces), expect_reservation=self.hostname
            )
        return {**saved, "reservation": None, "reservation_expires_at": None}  # released on the way out

    def _resolved_changes(self, node: NodeRecord, changes: Mapping[str, Any], reset_interfaces: bool) -> dict[str, Any]:
        changed = dict(changes)
        touches_driver = "driver" in changed or any(f in changed for f in COMPOSED_INTERFACE_FIELDS)
        if node.get("console_enabled") and any(
            f in changed and changed[f] != node.get(f) for f in ("driver", "console_interface")
        ):
            raise errors.InvalidState(
                f"The console of node {node['uuid']} is enabled: disable it (PUT /v1/nodes/{node['uuid']}"
                "/states/console) before changing its driver or console_interface"
            )
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
        async with self.tasks.acquire(node_uuid, "node deletion") as task:
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
            await self.consoles.stop_for_deletion(task)
            await self.nodes.delete(node_uuid)
            await EventRepository(self.pool).record(
                node, event="delete", message="Node deleted", conductor=self.hostname, history=False
            )

    # -- provisioning --------------------------------------------------------------

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
        service_steps: list[Any] | None = None,
    ) -> None:
        self.tasks.check_capacity()
        inline_drive = configdrive if event in ("deploy", "rebuild") else None
        async with self.configdrives.checking(inline_drive) as drive:
            verb = functools.partial(
                self._provision,
                event=event,
                drive=drive,
                configdrive=configdrive,
                clean_steps=clean_steps,
                rescue_password=rescue_password,
                deploy_steps=deploy_steps,
                disable_ramdisk=disable_ramdisk,
                service_steps=service_steps,
            )
            if event in FIRST_WRITE_LOCKS:
                try:
                    async with self.tasks.acquire_at_first_write(node_uuid, event) as task:
                        await verb(task)
                    return
                except errors.NodeChangedMeanwhile:
                    LOG.info("node changed before its lock was taken, trying again node_uuid=%s", node_uuid)
            async with self.tasks.acquire(node_uuid, event) as task:
                await verb(task)

    async def _provision(
        self,
        task: Task,
        *,
        event: str,
        drive: asyncio.Future[bytes] | None,
        configdrive: Any,
        clean_steps: list[Any] | None,
        rescue_password: str | None,
        deploy_steps: list[Any] | None,
        disable_ramdisk: bool,
        service_steps: list[Any] | None,
    ) -> None:
        """The verb's checks, its first transition and its flow, on a task from either acquire."""
        node_uuid = task.node["uuid"]
        node = task.node
        if event in ("deploy", "rebuild") and node["maintenance"]:
            raise errors.NodeInMaintenance(
                f"The {event} action can not be performed on node {node_uuid} while it is in maintenance mode."
            )
        if event in ("rebuild", "delete") and node["protected"]:
            raise errors.NodeProtected(f"Node {node_uuid} is protected and cannot be undeployed, rebuilt or deleted")
        if event == "provide" and node["retired"]:
            raise errors.InvalidParameterValue(f"Node {node_uuid} is retired and cannot be provided")
        try:
            move = states.next_state(node["provision_state"], event)
        except states.InvalidTransition:
            raise errors.InvalidStateRequested(
                f'The requested action "{event}" can not be performed on node "{node_uuid}" while it '
                f'is in state "{node["provision_state"]}".'
            ) from None
        await self._validate_for(task, event)
        if deploy_steps and event not in ("deploy", "rebuild"):
            raise errors.InvalidParameterValue(
                '"deploy_steps" is only valid when setting target provision state to active or rebuild'
            )
        if disable_ramdisk and event not in ("clean", "service"):
            raise errors.InvalidParameterValue("disable_ramdisk is supported only with manual cleaning or servicing")
        changes: dict[str, Any] = {}
        if event in ("deploy", "rebuild"):
            if drive is not None:  # a bad drive is a 400 here, before anything is written
                task.configdrive_image = await drive
            planned = steps.plan(task, deploy_steps or [], await steps.template_steps(self.pool, task))
            # A new deploy starts a new agent: forget the last one's token and URL.
            instance_info = {k: v for k, v in node["instance_info"].items() if k != "configdrive"}
            if configdrive is not None:
                instance_info["configdrive"] = configdrive
            changes["instance_info"] = instance_info
            info = {k: v for k, v in node["driver_internal_info"].items() if k not in (*AGENT_KEYS, "finish_step")}
            info["deploy_steps"] = planned
            if deploy_steps:
                info["user_deploy_steps"] = deploy_steps
            else:
                info.pop("user_deploy_steps", None)
            changes["driver_internal_info"] = info
        if event == "abort" and node["provision_state"] == states.SERVICEFAIL and node["maintenance"]:
            raise errors.InvalidState(
                f'Can not abort service on node "{node["uuid"]}" while it is in maintenance mode. Please '
                "remove the node from maintenance prior to issuing the request to abort the service operation."
            )
        if event == "abort" and self._abort_after_step(node):
            # A step that cannot be interrupted finishes first (Ironic's abort_after).
            await task.save_fields({"clean_step": {**node["clean_step"], "abort_after": True}})
            return
        if event in ("clean", "provide"):
            changes["driver_internal_info"] = self._cleaning_info(task, event, clean_steps, disable_ramdisk)
            if event == "clean":
                await step_plan.check_arguments(task, "clean", changes["driver_internal_info"][clean.PLAN])
        if event == "service":
            plan = step_plan.requested(
                task,
                "service",
                service_steps or [],
                disable_ramdisk=disable_ramdisk,
                other_kinds={**self._other_steps(task), "clean": step_plan.offered(task, "clean")},
            )
            await step_plan.check_arguments(task, "service", plan)
            info = {k: v for k, v in node["driver_internal_info"].items() if k not in service.SERVICE_KEYS}
            info[service.PLAN] = plan
            if disable_ramdisk:
                info[service.DISABLE_RAMDISK] = True  # REST 1.108: no step of the plan may need the ramdisk
            changes["driver_internal_info"] = info
        if event == "rescue":
            if not (isinstance(rescue_password, str) and rescue_password.strip()):
                raise errors.InvalidParameterValue(
                    'A non-empty "rescue_password" is required when setting target provision state to rescue'
                )
            # Only the hash is kept (Ironic's hashed_rescue_password): the agent
            # writes it where the rescue login reads it, never the clear text.
            hashed = hash_password(rescue_password or "", self.config.rescue_password_hash_algorithm)
            changes["instance_info"] = {
                **{k: v for k, v in node["instance_info"].items() if k != "rescue_password"},
                "hashed_rescue_password": hashed,
            }
            # A new rescue boots a new ramdisk: forget the last agent's token and URL.
            changes["driver_internal_info"] = {
                k: v for k, v in node["driver_internal_info"].items() if k not in AGENT_KEYS
            }
        await self.states.transition(task, event, changes=changes)
        if event == "abort":
            flow = ABORT_FLOWS.get(move.source)
        elif event == "unhold":
            flow = UNHOLD_FLOWS.get(move.source)
        else:
            flow = FLOW_OF_STATE.get(move.target)
        if flow is not None:  # manage from available...: nothing more to do
            task.spawn(lambda t: flow(self.states, t), name=event)

    async def continue_inspection(self, node_uuid: str, data: Mapping[str, Any]) -> None:
        """The agent posted its inventory (``/v1/continue_inspection``): store it
        and finish the inspection in the background. A node not waiting for
        one is NotFound, the api's generic answer to a ramdisk."""
        async with self.tasks.acquire(node_uuid, "continue inspection") as task:
            if task.node["provision_state"] != states.INSPECTWAIT:
                raise errors.NotFound(f"Node {node_uuid} is not waiting for inspection data")
            await self.inspection.store(task, data)
            await task.save_internal_info({inspect.RECEIVED: True})
            await self.states.transition(task, "resume", note="the agent posted its inventory")
            task.spawn(lambda t: inspect.process(self.states, t), name="inspection")

    async def get_inventory(self, node_uuid: str) -> NodeInventoryRecord:
        """What the last inspection stored: ``{"inventory", "plugin_data"}`` (API 1.81)."""
        node = await self.nodes.get(node_uuid)
        return await self.inspection.inventories.get(node["id"], node["uuid"])

    @staticmethod
    def _abort_after_step(node: NodeRecord) -> bool:
        step = node.get("clean_step") or {}
        return node["provision_state"] == states.CLEANWAIT and bool(step) and not step.get("abortable")

    def _other_steps(self, task: Task) -> dict[str, list[dict[str, Any]]]:
        """Steps of the other kinds, so a misplaced one is named as what it is."""
        return {"deploy": steps.offered(task)}

    def _cleaning_info(
        self, task: Task, event: str, clean_steps: list[Any] | None, disable_ramdisk: bool
    ) -> dict[str, Any]:
        """driver_internal_info for a new cleaning: the checked manual plan (400
        for any step the node does not offer), nothing left of the last one."""
        info = {k: v for k, v in task.node["driver_internal_info"].items() if k not in clean.CLEANING_KEYS}
        if event == "clean":
            info[clean.PLAN] = step_plan.requested(
                task,
                "clean",
                clean_steps or [],
                disable_ramdisk=disable_ramdisk,
                other_kinds={**self._other_steps(task), "service": step_plan.offered(task, "service")},
            )
            if disable_ramdisk:
                info[clean.DISABLE_RAMDISK] = True
        return info

    async def _validate_for(self, task: Task, event: str) -> None:
        """Refuse the verb (400) when an interface it needs cannot do it."""
        kinds = VERB_INTERFACES.get(event, ())
        for kind in kinds:
            try:
                await getattr(task.driver, kind).validate(task)
            except errors.FerrumError as exc:
                refusal = (
                    errors.UnsupportedDriverExtension
                    if isinstance(exc, errors.UnsupportedDriverExtension)
                    else errors.InvalidParameterValue
                )
                raise refusal(
                    f"Failed to validate {kind} interface for node {task.node['uuid']}: {exc.message}"
                ) from None
        if kinds:
            self._check_capabilities(task, kinds)

    def _check_capabilities(self, task: Task, kinds: tuple[str, ...]) -> None:
        capabilities.check(
            task,
            kinds=kinds,
            alternatives=lambda kind, capability: self.registry.offering(task.node["driver"], kind, capability),
        )

    async def _resume_after_outage(self, task: Task) -> None:
        """Background work lost the database: wait for it, then resume the node's
        flow from its recorded step (the lock was kept all along)."""
        node_uuid = task.node["uuid"]
        delay = 0.5
        while True:
            try:
                node = await self.nodes.get(node_uuid)
                if node["reservation"] != self.hostname:
                    LOG.warning(
                        "lock lost during the database outage node_uuid=%s; its new holder resumes it", node_uuid
                    )
                    return
                task.node = node
                await resume.resume(self.states, task, reason="the database connection was lost")
                return
            except errors.NodeNotFound:
                return
            except Exception as exc:
                if not is_unavailable(exc):
                    LOG.exception("resuming after a database outage failed node_uuid=%s", node_uuid)
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # -- power, maintenance, management -------------------------------------------

    async def change_power_state(self, node_uuid: str, target: str, timeout: int | None = None) -> None:
        self.tasks.check_capacity()
        async with self.tasks.acquire(node_uuid, f"power {target}") as task:
            node = task.node
            if node["provision_state"] in (states.CLEANING, states.CLEANWAIT):
                raise errors.InvalidStateRequested(
                    f'The requested action "{target}" can not be performed on node "{node_uuid}" '
                    f'while it is in state "{node["provision_state"]}".'
                )
            if target in (states.POWER_OFF, states.SOFT_POWER_OFF) and node.get("disable_power_off"):
                # API 1.95: this machine is never powered off (Ironic's PowerStateFailure, 409).
                raise errors.InvalidState(f"Failed to set node power state to {target}.")
            supported = task.driver.power.get_supported_power_states()
            if target not in supported:
                raise errors.InvalidParameterValue(
                    f"The requested power state {target} is not supported by the power interface; "
                    f"supported: {supported}"
                )
            await task.driver.power.validate(task)
            await task.save_fields({"target_power_state": power.final_state(target), "last_error": None})
            task.spawn(lambda t: power.change(self.states, t, target, timeout), name="power")

    async def set_maintenance(self, node_uuid: str, maintenance: bool, reason: str | None) -> None:
        node = await self.nodes.get(node_uuid)
        changes: dict[str, Any] = {"maintenance": maintenance, "maintenance_reason": reason if maintenance else None}
        if not maintenance:
            changes["fault"] = None
        saved = await self.nodes.update(node["uuid"], changes)
        await self.states.record_event(
            saved,
            "maintenance",
            f"maintenance {'on' if maintenance else 'off'}" + (f": {reason}" if maintenance and reason else ""),
            event_type="maintenance",
        )

    async def set_boot_device(self, node_uuid: str, device: str, persistent: bool) -> None:
        async with self.tasks.acquire(node_uuid, "set boot device") as task:
            await task.driver.management.validate(task)
            await task.driver.management.set_boot_device(task, device, persistent)

    async def get_boot_device(self, node_uuid: str) -> dict[str, Any]:
        task = await self.tasks.shared(node_uuid)
        return await task.driver.management.get_boot_device(task)

    async def get_supported_boot_devices(self, node_uuid: str) -> list[str]:
        task = await self.tasks.shared(node_uuid)
        return task.driver.management.get_supported_boot_devices(task)

    async def validate_interfaces(self, node_uuid: str) -> list[tuple[str, bool, str]]:
        """Ironic's /validate: every interface, shared access (no lock)."""
        task = await self.tasks.shared(node_uuid)
        results = []
        for kind in sorted(k for k in INTERFACE_KINDS if k != "vendor"):  # Ironic's non-vendor interfaces
            try:
                await getattr(task.driver, kind).validate(task)
                self._check_capabilities(task, (kind,))
                results.append((kind, True, ""))
            except errors.FerrumError as exc:
                results.append((kind, False, exc.message))
        return results

    # -- VIFs (services/conductor/vifs.py) -------------------------------------------

    async def vif_attach(self, node_uuid: str, vif_id: str, *, port_uuid: str = "", portgroup_uuid: str = "") -> None:
        async with self.tasks.acquire(node_uuid, "VIF attach") as task:
            await vifs.attach(
                task, vif_id, port_uuid=port_uuid, portgroup_uuid=portgroup_uuid, vifs=self._vifs, ports=self._ports
            )
            await self.states.record_event(task.node, "vif-attach", f"VIF {vif_id} attached", event_type="network")

    async def vif_detach(self, node_uuid: str, vif_id: str) -> None:
        async with self.tasks.acquire(node_uuid, "VIF detach") as task:
            await vifs.detach(task, vif_id, vifs=self._vifs, ports=self._ports)
            await self.states.record_event(task.node, "vif-detach", f"VIF {vif_id} detached", event_type="network")


def _refuse_second_instance(node: NodeRecord, changes: Mapping[str, Any]) -> None:
    """An instance_uuid is never overwritten by another one, as on Ironic (NodeAssociated, 409):
    two Nova computes racing for one node both PATCH it (``prepare_for_spawn``), and the
    loser must learn that it lost rather than take the node from the winner."""
    new = changes.get("instance_uuid")
    current = node.get("instance_uuid")
    if new and current and str(new) != str(current):
        raise errors.NodeAssociated(f"Node {node['uuid']} is associated with instance {current}.")
