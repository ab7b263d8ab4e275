"""Ports for a server that must be told its port before it starts (tgtd, QEMU, a guest's view of the api).

Binding port 0 and closing the probe is the usual trick, but the port it returns lies in the
kernel's ephemeral range, and every outgoing connection on the machine draws its source port
from that same range: between the probe and the server's own bind, a client elsewhere can take
it (CI saw the api fail with "address already in use" that way). Ports are picked *below* the
ephemeral range instead, where only servers that choose their port themselves ever land.
Where a server can bind port 0 itself and report what it got, prefer that.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000
#: well-known servers that may run here below the ephemeral range (NFS, iSCSI, PostgreSQL)
AVOID = frozenset({2049, 3260, 5432})


def ephemeral_floor(range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The first port the kernel hands out for outgoing connections (32768 when unknown)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def unused_tcp_ports(count: int = 1, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free on ``host`` now and outside the ephemeral range.

    The probes stay bound until all are chosen, so the ports differ from each other.
    """
    ceiling = ephemeral_floor()
    if ceiling - LOWEST < count * 4:
        raise RuntimeError(f"no room below the ephemeral range (it starts at {ceiling})")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = "" if host in ("*", "0.0.0.0", "::") else host
    chooser = random.SystemRandom()
    probes: list[socket.socket] = []
    try:
        for _ in range(200 * count):
            if len(probes) == count:
                break
            port = chooser.randrange(LOWEST, ceiling)
            if port in AVOID or any(p.getsockname()[1] == port for p in probes):
                continue
            probe = socket.socket(family, socket.SOCK_STREAM)
            try:
                probe.bind((bind_host, port))
            except OSError:
                probe.close()
                continue
            probes.append(probe)
        if len(probes) < count:
            raise RuntimeError(f"found only {len(probes)} of {count} free ports on {host}")
        return [int(p.getsockname()[1]) for p in probes]
    finally:
        for probe in probes:
            probe.close()


def unused_tcp_port(host: str = "127.0.0.1") -> int:
    """One port as :func:`unused_tcp_ports` picks them."""
    return unused_tcp_ports(1, host)[0]
