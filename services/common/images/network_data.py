"""``network_data.json`` generated from a node's ports, as Nova/Ironic write it for DHCP.

When a config drive arrives without network data, Ironic replaces it with
data generated from the node's ports (CONTRACT 3.2): one physical link per
port carrying its MAC, and one ``ipv4_dhcp`` network on it. cloud-init turns
that into "DHCP on the NIC with this MAC", which is what a flat network needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_MTU = 1500


def generate_network_data(ports: Sequence[Mapping[str, Any]], *, mtu: int = DEFAULT_MTU) -> dict[str, Any]:
    """Links and DHCP networks for ``ports`` (rows with ``uuid`` and ``address``).

    Ports are ordered by MAC so that the output does not depend on the order
    the database returned them in. A port's ``extra.mtu``, when numeric,
    overrides the default MTU; Ironic refuses a null MTU, so one is always set.
    """
    links: list[dict[str, Any]] = []
    networks: list[dict[str, Any]] = []
    for index, port in enumerate(sorted(ports, key=lambda p: str(p.get("address", "")).lower())):
        mac = str(port["address"]).lower()
        port_id = str(port.get("uuid") or f"port{index}")
        extra = port.get("extra") or {}
        link_mtu = extra.get("mtu") if isinstance(extra.get("mtu"), int) else mtu
        link: dict[str, Any] = {
            "id": port_id,
            "type": "phy",
            "ethernet_mac_address": mac,
            "mtu": link_mtu,
        }
        vif = (port.get("internal_info") or {}).get("tenant_vif_port_id")
        if vif:
            link["vif_id"] = str(vif)
        links.append(link)
        networks.append(
            {
                "id": f"network{index}",
                "type": "ipv4_dhcp",
                "link": port_id,
                "network_id": str(vif or port_id),
            }
        )
    return {"links": links, "networks": networks, "services": []}
