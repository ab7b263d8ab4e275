"""What an in-band inspection does with the inventory the agent posted
(Ironic's ``continue_inspection`` and its default hooks).

- ``receive``: the agent's post, for a node in ``inspect wait``: the
  inventory and the rest of the post (plugin_data) are stored, replacing the
  last inspection's, and the node moves on to ``inspecting``.
- ``apply``: the stored inventory becomes ``properties`` (``cpus``,
  ``cpu_arch``, ``memory_mb``, ``local_gb``, ``capabilities`` ``boot_mode``)
  and ports: one for every NIC that has a link and no port yet, and
  ``pxe_enabled`` only on the NIC the machine booted from.
- then the inspection rules run (``_apply_rules``): the stored rules of phase
  ``main`` and the conductor's built-in ones, highest priority first, on the
  node as it now is. What their actions changed is saved: node fields a rule
  may set (RULE_NODE_FIELDS; anything else fails the inspection with the
  field named), traits, the node's ports, and plugin_data. A ``fail`` action
  or an action that cannot run fails the inspection.
"""

from __future__ import annotations

import copy
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from services.common import errors, node_capabilities
from services.common.db.inspection_rules import InspectionRuleRepository
from services.common.db.inventory import InventoryRepository
from services.common.db.nodes import INTERFACE_FIELDS
from services.common.db.ports import WRITABLE_FIELDS as PORT_FIELDS
from services.common.db.ports import PortRepository
from services.common.inspection_rules import InspectionRuleFailure, RuleTarget, apply_rules
from services.conductor.drivers.base import Task

GiB = 1024**3
PHASE = "main"
# What an inspection rule may change on a node: what an operator may PATCH, not
# the state machine's fields, identity or ownership of the node's lock.
RULE_NODE_FIELDS = frozenset(
    (
        "name",
        "driver",
        *INTERFACE_FIELDS,
        "driver_info",
        "properties",
        "extra",
        "instance_info",
        "resource_class",
        "conductor_group",
        "owner",
        "lessee",
        "description",
        "automated_clean",
        "traits",
    )
)
RULE_PORT_FIELDS = PORT_FIELDS - {"uuid", "node_id", "internal_info"}


class InventoryProcessing:
    """Stores and applies inspection data for one conductor."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        built_in_rules: Sequence[Mapping[str, Any]] = (),
        mask_secrets: str = "always",
    ) -> None:
        self.inventories = InventoryRepository(pool)
        self.ports = PortRepository(pool)
        self.rules = InspectionRuleRepository(pool)
        self.built_in_rules = list(built_in_rules)
        self.mask_secrets = mask_secrets

    async def store(self, task: Task, data: Mapping[str, Any]) -> None:
        """Keep the inventory and plugin_data (everything else the agent posted but its logs)."""
        inventory = data.get("inventory")
        if not isinstance(inventory, dict):
            raise errors.InvalidParameterValue("The inspection data needs an 'inventory' object")
        plugin_data = {k: v for k, v in data.items() if k not in ("inventory", "logs")}
        await self.inventories.save(task.node["id"], inventory, plugin_data)

    async def apply(self, task: Task) -> str:
        stored = await self.inventories.get(task.node["id"], task.node["uuid"])
        inventory, plugin_data = stored["inventory"], stored["plugin_data"]
        found = properties_from(inventory, plugin_data)
        properties = {**(task.node.get("properties") or {}), **found}
        if "capabilities" in found:  # boot_mode joins the capabilities already set
            properties["capabilities"] = merged_capabilities(task.node.get("properties") or {}, found["capabilities"])
        await task.save_fields({"properties": properties})
        created = await self._ports(task, inventory, plugin_data)
        summary = ", ".join(f"{k}={v}" for k, v in sorted(found.items()))
        applied = await self._apply_rules(task, inventory, plugin_data)
        rules = f"; inspection rules applied: {', '.join(applied)}" if applied else ""
        return f"inspected: {summary}; ports created: {', '.join(created) or 'none'}{rules}"

    async def _apply_rules(self, task: Task, inventory: Mapping[str, Any], plugin_data: dict[str, Any]) -> list[str]:
        """Run the rules and save what they changed; returns the uuids of those that applied."""
        rules = [*await self.rules.for_phase(PHASE), *self.built_in_rules]
        if not rules:
            return []
        ports = {str(p["uuid"]): p for p in await self.ports.list_for_node_ids([task.node["id"]])}
        # The rules' working copy: paths may name any key, and what they change is checked below.
        node = copy.deepcopy(dict[str, Any](task.node))
        node["traits"] = list(node.get("traits") or [])
        target = RuleTarget(
            node=node,
            inventory=inventory,
            plugin_data=copy.deepcopy(plugin_data),
            ports={uuid: copy.deepcopy(dict(port)) for uuid, port in ports.items()},  # documents rules edit by path
            traits=node["traits"],
        )
        applied = await apply_rules(rules, target, mask_secrets=self.mask_secrets)
        target.node["traits"] = target.traits
        changes = {k: v for k, v in target.node.items() if task.node.get(k) != v and k != "traits"}
        if sorted(target.traits) != sorted(task.node.get("traits") or []):
            changes["traits"] = target.traits
        refused = sorted(set(changes) - RULE_NODE_FIELDS)
        if refused:
            raise InspectionRuleFailure(f"Inspection rules cannot change the node's {', '.join(refused)}")
        port_changes = {}
        for port_uuid, port in target.ports.items():
            before = ports[port_uuid]
            changed = {k: v for k, v in port.items() if before.get(k) != v}
            if set(changed) - RULE_PORT_FIELDS:
                fields = ", ".join(sorted(set(changed) - RULE_PORT_FIELDS))
                raise InspectionRuleFailure(f"Inspection rules cannot change the {fields} of port {port_uuid}")
            if changed:
                port_changes[port_uuid] = changed
        for port_uuid, changed in port_changes.items():
            await self.ports.update(port_uuid, changed)
        if changes:
            await task.save_fields(changes)
        if target.plugin_data != plugin_data:
            await self.inventories.save(task.node["id"], dict(inventory), target.plugin_data)
        return applied

    async def _ports(self, task: Task, inventory: Mapping[str, Any], plugin_data: Mapping[str, Any]) -> list[str]:
        booted = boot_mac(inventory, plugin_data)
        existing = {p["address"].lower(): p for p in task.ports}
        created = []
        for nic in inventory.get("interfaces") or []:
            mac = str(nic.get("mac_address") or "").lower()
            if not mac or not nic.get("has_carrier", True):
                continue
            pxe = mac == booted if booted else True
            port = existing.get(mac)
            if port is None:
                await self.ports.create(
                    {"uuid": str(uuidlib.uuid4()), "node_id": task.node["id"], "address": mac, "pxe_enabled": pxe}
                )
                created.append(mac)
            elif bool(port.get("pxe_enabled")) != pxe and booted:
                await self.ports.update(port["uuid"], {"pxe_enabled": pxe})
        return created


def boot_mac(inventory: Mapping[str, Any], plugin_data: Mapping[str, Any]) -> str:
    """The NIC the ramdisk booted from: IPA's ``boot_interface`` (``01-aa-bb-..`` or a MAC)."""
    value = str(plugin_data.get("boot_interface") or (inventory.get("boot") or {}).get("pxe_interface") or "")
    value = value.lower().replace("-", ":")
    if value.startswith("01:") and value.count(":") == 6:
        value = value[3:]
    return value


def properties_from(inventory: Mapping[str, Any], plugin_data: Mapping[str, Any]) -> dict[str, Any]:
    """Ironic's defaults: cpus, cpu_arch, memory_mb, local_gb (root disk minus 1 GiB), boot_mode capability."""
    found: dict[str, Any] = {}
    cpu = inventory.get("cpu") or {}
    if cpu.get("count"):
        found["cpus"] = int(cpu["count"])
    if cpu.get("architecture"):
        found["cpu_arch"] = str(cpu["architecture"])
    memory = inventory.get("memory") or {}
    if memory.get("physical_mb"):
        found["memory_mb"] = int(memory["physical_mb"])
    disks = [d for d in inventory.get("disks") or [] if isinstance(d.get("size"), int)]
    root = plugin_data.get("root_disk") or (disks[0] if disks else None)
    if isinstance(root, Mapping) and isinstance(root.get("size"), int):
        found["local_gb"] = max(0, root["size"] // GiB - 1)
    mode = (inventory.get("boot") or {}).get("current_boot_mode")
    if mode in ("bios", "uefi"):
        found["capabilities"] = f"boot_mode:{mode}"
    return found


def merged_capabilities(properties: Mapping[str, Any], found: str) -> str:
    """``key:value,...`` with the found pairs replacing those of the same key."""
    return node_capabilities.merged(properties.get("capabilities"), found)
