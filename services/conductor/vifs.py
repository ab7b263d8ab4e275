"""VIF attach and detach, and where a VIF goes when the attach names no port:
Ironic's flat-network choice.

The network interface is ``noop``, which on Ironic accepts every attach and
detach and keeps nothing. Ferrum keeps a VIF on a free port (Nova reads the
VIF list back), and where there is none, it does as Ironic's noop does: the
attach succeeds and nothing is kept; detaching a VIF that is not kept is a
no-op too.

Nova attaches VIFs without naming a port, so the conductor must pick the same
port-like object Ironic would (``get_free_port_like_object``):
- a port that already carries a VIF is taken; a port group with such a member
  is not offered whole, its free members are offered one by one instead;
- a port group that carries a VIF, or has no ports, is not offered;
- preference: a physical network set, then port groups over ports, then PXE
  enabled ports, then the oldest.

Physical networks are never filtered here: Ferrum has no Neutron segments to
say which ones a VIF may use (Ironic's empty set: "ignore physnets").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.common import errors
from services.common.db.ports import PortRepository
from services.common.db.vifs import VIF_KEY, VifRepository
from services.conductor.drivers.base import Task


@dataclass(frozen=True)
class Candidate:
    kind: str  # port | portgroup
    row: Mapping[str, Any]
    physnet: str | None
    pxe_enabled: bool

    def preference(self) -> tuple[bool, bool, bool, int]:
        """Smaller is better (sorted ascending)."""
        return (self.physnet is None, self.kind != "portgroup", not self.pxe_enabled, int(self.row["id"]))


def free_port_like(ports: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]]) -> list[Candidate]:
    """Every port or port group a new VIF may go to, best first."""
    busy_groups: set[int] = set()
    members: dict[int, list[Mapping[str, Any]]] = {}
    found: list[Candidate] = []
    for port in ports:
        group_id = port.get("portgroup_id")
        if (port.get("internal_info") or {}).get(VIF_KEY):
            if group_id is not None:
                busy_groups.add(group_id)
            continue
        if group_id is None:
            found.append(Candidate("port", port, port.get("physical_network"), bool(port.get("pxe_enabled"))))
        else:
            members.setdefault(group_id, []).append(port)
    for group in groups:
        if (group.get("internal_info") or {}).get(VIF_KEY):
            continue
        ports_of_group = members.get(group["id"], [])
        if group["id"] in busy_groups:
            found.extend(
                Candidate("port", p, p.get("physical_network"), bool(p.get("pxe_enabled"))) for p in ports_of_group
            )
        elif ports_of_group:
            physnet = next((p["physical_network"] for p in ports_of_group if p.get("physical_network")), None)
            found.append(Candidate("portgroup", group, physnet, True))
    return sorted(found, key=Candidate.preference)


async def attach(
    task: Task, vif_id: str, *, port_uuid: str, portgroup_uuid: str, vifs: VifRepository, ports: PortRepository
) -> None:
    """Record a VIF on the port or port group Ironic's flat networks would pick,
    or on the one the caller names (REST 1.67). The node is locked by the caller."""
    node_uuid = task.node["uuid"]
    other = await vifs.node_holding(vif_id)
    if other is not None:
        raise errors.Conflict(f"Unable to set VIF {vif_id}: it is already attached to node {other}")
    if portgroup_uuid:
        await _attach_to_portgroup(task, vif_id, portgroup_uuid, vifs)
        return
    port: Mapping[str, Any] | None
    if port_uuid:
        port = next((p for p in task.ports if p["uuid"] == port_uuid), None)
        if port is None:
            raise errors.InvalidParameterValue(
                f"Unable to attach VIF {vif_id}: port {port_uuid} does not belong to node {node_uuid}."
            )
        if port["internal_info"].get(VIF_KEY):
            raise errors.Conflict(
                f"Unable to attach VIF {vif_id}: port {port_uuid} already has VIF "
                f"{port['internal_info'][VIF_KEY]} attached."
            )
    else:
        free = free_port_like(task.ports, await vifs.portgroups_of(task.node["id"]))
        if not free:
            # Ironic's noop network interface accepts any VIF and keeps nothing;
            # with no free port left there is nowhere to keep it, so do the same.
            return
        if free[0].kind == "portgroup":
            await _attach_to_portgroup(task, vif_id, str(free[0].row["uuid"]), vifs)
            return
        port = free[0].row
    await ports.update(port["uuid"], {"internal_info": {**port["internal_info"], VIF_KEY: vif_id}})


async def _attach_to_portgroup(task: Task, vif_id: str, portgroup_uuid: str, vifs: VifRepository) -> None:
    """Ironic keeps a port group's VIF in the group's own internal_info."""
    group = await vifs.portgroup(portgroup_uuid)
    if group is None or group["node_id"] != task.node["id"]:
        raise errors.InvalidParameterValue(
            f"Unable to attach VIF {vif_id}: port group {portgroup_uuid} does not belong to node {task.node['uuid']}."
        )
    if group["internal_info"].get(VIF_KEY):
        raise errors.Conflict(
            f"Unable to attach VIF {vif_id}: port group {portgroup_uuid} already has VIF "
            f"{group['internal_info'][VIF_KEY]} attached."
        )
    await vifs.set_on_portgroup(group["id"], vif_id)


async def detach(task: Task, vif_id: str, *, vifs: VifRepository, ports: PortRepository) -> None:
    for port in task.ports:
        if port["internal_info"].get(VIF_KEY) == vif_id:
            info = {k: v for k, v in port["internal_info"].items() if k != VIF_KEY}
            await ports.update(port["uuid"], {"internal_info": info})
            return
    # A VIF that is not kept anywhere (an unknown one, or one the noop network
    # accepted without a free port) detaches as a no-op, as on Ironic's noop interface.
    await vifs.remove_from_portgroups(task.node["id"], vif_id)
