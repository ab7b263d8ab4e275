"""Checking a node's ``network_data`` (REST 1.66) the way Ironic does.

Ironic accepts null, an empty object, or a document in the OpenStack
``network_data.json`` format (what config drives and metadata services
carry): ``links`` (physical, bond or VLAN interfaces), ``networks`` (IPv4 or
IPv6, static or DHCP/SLAAC, with routes) and ``services`` (DNS servers).
Anything else is a 400 before the node changes. Extra keys are allowed, as
the format's schema allows them.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from services.common import errors

_MAC = re.compile(r"^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$")
PHYSICAL_TYPES = frozenset(("bridge", "dvs", "hw_veb", "hyperv", "ovs", "tap", "vhostuser", "vif", "phy"))
BOND_MODES = frozenset(
    ("802.1ad", "balance-rr", "active-backup", "balance-xor", "broadcast", "balance-tlb", "balance-alb")
)
IPV4_TYPES = frozenset(("ipv4", "ipv4_dhcp"))
IPV6_TYPES = frozenset(("ipv6", "ipv6_dhcp", "ipv6_slaac"))


def _fail(where: str, why: str) -> errors.InvalidParameterValue:
    return errors.InvalidParameterValue(f"Invalid network_data: {where}: {why}")


def _string(item: dict[str, Any], key: str, where: str, *, required: bool = True) -> None:
    if key not in item:
        if required:
            raise _fail(where, f"'{key}' is a required property")
        return
    if not isinstance(item[key], str):
        raise _fail(where, f"'{key}' must be a string")


def _mac(item: dict[str, Any], key: str, where: str) -> None:
    _string(item, key, where)
    if not _MAC.match(item[key]):
        raise _fail(where, f"'{key}' {item[key]!r} is not a MAC address")


def _link(link: Any, where: str) -> None:
    if not isinstance(link, dict):
        raise _fail(where, "a link must be an object")
    _string(link, "id", where)
    _string(link, "type", where)
    _string(link, "vif_id", where, required=False)
    mtu = link.get("mtu")
    if mtu is not None and (isinstance(mtu, bool) or not isinstance(mtu, (int, float)) or not 1 <= mtu <= 65535):
        raise _fail(where, "'mtu' must be a number from 1 to 65535 or null")
    kind = link["type"]
    if kind == "vlan":
        _mac(link, "vlan_mac_address", where)
        _string(link, "vlan_link", where)
        if isinstance(link.get("vlan_id"), bool) or not isinstance(link.get("vlan_id"), int):
            raise _fail(where, "'vlan_id' must be an integer")
        return
    _mac(link, "ethernet_mac_address", where)
    if kind == "bond":
        if link.get("bond_mode") not in BOND_MODES:
            raise _fail(where, f"'bond_mode' must be one of {', '.join(sorted(BOND_MODES))}")
        links = link.get("bond_links")
        if not isinstance(links, list) or not all(isinstance(x, str) for x in links):
            raise _fail(where, "'bond_links' must be a list of link ids")
    elif kind not in PHYSICAL_TYPES:
        raise _fail(where, f"unknown link type {kind!r}")


def _address(value: Any, version: int | None, where: str, key: str, *, prefix: bool = False) -> None:
    """An IPv4 or IPv6 address (``version`` None: either); IPv6 hosts may carry a /prefix."""
    kind = f"IPv{version}" if version else "IP"
    if not isinstance(value, str):
        raise _fail(where, f"'{key}' must be a string")
    text = value.split("/", 1)[0] if prefix and version == 6 else value
    try:
        parsed = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        raise _fail(where, f"'{key}' {value!r} is not an {kind} address") from None
    if version is not None and parsed.version != version:
        raise _fail(where, f"'{key}' {value!r} is not an {kind} address")


def _netmask(value: Any, version: int, where: str, key: str = "netmask") -> None:
    _address(value, version, where, key)
    if version == 4:
        bits = int(ipaddress.IPv4Address(value))
        inverted = ~bits & 0xFFFFFFFF
        if inverted & (inverted + 1):
            raise _fail(where, f"'{key}' {value!r} is not a contiguous network mask")


def _services(value: Any, version: int | None, where: str) -> None:
    if not isinstance(value, list):
        raise _fail(where, "'services' must be a list")
    for i, service in enumerate(value):
        here = f"{where}.services[{i}]"
        if not isinstance(service, dict) or service.get("type") != "dns" or "address" not in service:
            raise _fail(here, 'a service is {"type": "dns", "address": IP address}')
        _address(service["address"], version, here, "address")


def _network(net: Any, where: str) -> None:
    if not isinstance(net, dict):
        raise _fail(where, "a network must be an object")
    for key in ("id", "link", "network_id", "type"):
        _string(net, key, where)
    if net["type"] in IPV4_TYPES:
        version = 4
    elif net["type"] in IPV6_TYPES:
        version = 6
    else:
        raise _fail(where, f"unknown network type {net['type']!r}")
    if "ip_address" in net:
        _address(net["ip_address"], version, where, "ip_address", prefix=True)
    if "netmask" in net:
        _netmask(net["netmask"], version, where)
    routes = net.get("routes", [])
    if not isinstance(routes, list):
        raise _fail(where, "'routes' must be a list")
    for i, route in enumerate(routes):
        here = f"{where}.routes[{i}]"
        if not isinstance(route, dict):
            raise _fail(here, "a route must be an object")
        for key in ("network", "netmask", "gateway"):
            if key not in route:
                raise _fail(here, f"'{key}' is a required property")
        _address(route["network"], version, here, "network")
        _netmask(route["netmask"], version, here)
        _address(route["gateway"], version, here, "gateway")
        if "services" in route:
            _services(route["services"], version, here)


def validate_network_data(value: Any) -> None:
    """Raise InvalidParameterValue (400) unless ``value`` is null, {} or valid network_data."""
    if value is None or value == {}:
        return
    if not isinstance(value, dict):
        raise errors.InvalidParameterValue("Invalid network_data: it must be an object")
    for key in ("links", "networks", "services"):
        if key not in value:
            raise _fail("network_data", f"'{key}' is a required property")
        if not isinstance(value[key], list):
            raise _fail("network_data", f"'{key}' must be a list")
    for i, link in enumerate(value["links"]):
        _link(link, f"links[{i}]")
    for i, net in enumerate(value["networks"]):
        _network(net, f"networks[{i}]")
    _services(value["services"], None, "network_data")
