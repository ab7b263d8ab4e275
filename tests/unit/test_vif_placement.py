"""Which port or port group a VIF goes to when the attach names none (Ironic's order)."""

from __future__ import annotations

from typing import Any

from services.conductor.vifs import free_port_like


def port(
    id: int, *, group: int | None = None, pxe: bool = True, vif: str = "", physnet: str | None = None
) -> dict[str, Any]:
    return {
        "id": id,
        "uuid": f"p{id}",
        "portgroup_id": group,
        "pxe_enabled": pxe,
        "physical_network": physnet,
        "internal_info": {"tenant_vif_port_id": vif} if vif else {},
    }


def group(id: int, *, vif: str = "") -> dict[str, Any]:
    return {"id": id, "uuid": f"g{id}", "internal_info": {"tenant_vif_port_id": vif} if vif else {}}


def picks(ports: list[dict[str, Any]], groups: list[dict[str, Any]]) -> list[str]:
    return [c.row["uuid"] for c in free_port_like(ports, groups)]


def test_port_groups_before_ports_and_pxe_ports_first() -> None:
    ports = [port(1, pxe=False), port(2), port(3, group=10), port(4, group=10)]
    assert picks(ports, [group(10)]) == ["g10", "p2", "p1"]


def test_a_group_with_a_busy_member_offers_its_free_members() -> None:
    ports = [port(1, group=10, vif="taken"), port(2, group=10, pxe=False), port(3, group=10)]
    assert picks(ports, [group(10)]) == ["p3", "p2"]


def test_busy_or_empty_groups_and_busy_ports_are_not_offered() -> None:
    ports = [port(1, vif="a"), port(2, group=10), port(3)]
    assert picks(ports, [group(10, vif="b"), group(11)]) == ["p3"]
    assert picks([port(1, vif="a")], []) == []


def test_a_physical_network_wins_over_everything() -> None:
    ports = [port(1), port(2, pxe=False, physnet="physnet1"), port(3, group=10)]
    assert picks(ports, [group(10)]) == ["p2", "g10", "p1"]
    grouped = [port(1, physnet="physnet1"), port(2, group=10, physnet="physnet1")]
    assert picks(grouped, [group(10)]) == ["g10", "p1"]
