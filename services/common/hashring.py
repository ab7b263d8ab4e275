"""Consistent hash ring mapping nodes to conductors.

Each conductor owns many points on a 64-bit ring; a node belongs to the first
point clockwise from its hash. When a conductor joins or leaves only about
1/N of the nodes move, so take-over work stays proportional.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence

from services.common.db.records import ConductorRecord

POINTS_PER_MEMBER = 64


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, members: Iterable[str], *, points: int = POINTS_PER_MEMBER) -> None:
        self.members = tuple(sorted(set(members)))
        ring = sorted((_hash(f"{m}#{i}"), m) for m in self.members for i in range(points))
        self._keys = [k for k, _ in ring]
        self._owners = [m for _, m in ring]

    def owner(self, key: str) -> str | None:
        if not self._keys:
            return None
        if len(self.members) == 1:  # every key lands on it: no hash (a node list asks once a node)
            return self.members[0]
        index = bisect.bisect(self._keys, _hash(key)) % len(self._keys)
        return self._owners[index]


class ConductorRings:
    """One ring per (hardware type, conductor group), built from registry rows."""

    def __init__(self, conductors: Sequence[ConductorRecord]) -> None:
        self.conductors = {c["hostname"]: c for c in conductors}
        self._rings: dict[tuple[str, str], HashRing] = {}

    def owner(self, node_uuid: str, driver: str, conductor_group: str = "") -> ConductorRecord | None:
        key = (driver, (conductor_group or "").lower())
        ring = self._rings.get(key)
        if ring is None:
            members = [
                name
                for name, c in self.conductors.items()
                if driver in c["hardware_types"] and (c["conductor_group"] or "").lower() == key[1]
            ]
            ring = self._rings[key] = HashRing(members)
        name = ring.owner(node_uuid)
        return self.conductors[name] if name else None

    def drivers(self) -> dict[str, list[str]]:
        """Hardware type -> conductor hostnames that run it."""
        found: dict[str, list[str]] = {}
        for name, c in self.conductors.items():
            for hw in c["hardware_types"]:
                found.setdefault(hw, []).append(name)
        return found
