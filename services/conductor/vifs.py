"""Where a VIF goes when the attach names no port: Ironic's flat-network choice.

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

VIF_KEY = "tenant_vif_port_id"


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
