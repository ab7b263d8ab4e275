"""What an in-band inspection does with the inventory the agent posted
(Ironic's ``continue_inspection`` and its default hooks).

- ``receive``: the agent's post, for a node in ``inspect wait``: the
  inventory and the rest of the post (plugin_data) are stored, replacing the
  last inspection's, and the node moves on to ``inspecting``.
- ``apply``: the stored inventory becomes ``properties`` (``cpus``,
  ``cpu_arch``, ``memory_mb``, ``local_gb``, ``capabilities`` ``boot_mode``)
  and ports: one for every NIC that has a link and no port yet, and
  ``pxe_enabled`` only on the NIC the machine booted from. The inspection
  rules run after that (none are stored yet: issue 22 adds the API).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

import asyncpg

from services.common import errors
from services.common.db.inventory import InventoryRepository
from services.common.db.ports import PortRepository
from services.conductor.drivers.base import Task

GiB = 1024**3


class InventoryProcessing:
    """Stores and applies inspection data for one conductor."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.inventories = InventoryRepository(pool)
        self.ports = PortRepository(pool)

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
        return f"inspected: {summary}; ports created: {', '.join(created) or 'none'}"

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
    current = properties.get("capabilities") or ""
    if isinstance(current, Mapping):
        pairs = {str(k): str(v) for k, v in current.items()}
    else:
        pairs = dict(item.split(":", 1) for item in str(current).split(",") if ":" in item)
    for item in found.split(","):
        key, sep, value = item.partition(":")
        if sep:
            pairs[key] = value
    return ",".join(f"{k}:{v}" for k, v in pairs.items())
