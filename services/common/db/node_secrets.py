"""Node secrets encrypted on their way into PostgreSQL and decrypted on their way out.

``NodeRepository`` is the only way node rows are read and written, so it
calls :meth:`NodeSecrets.seal` on every value it writes and
:meth:`NodeSecrets.open` on every row it returns: the api, the conductor and
the drivers see plaintext and never know.

What is sealed, in ``driver_info``, ``driver_internal_info`` and
``instance_info``: the value of every key that looks secret
(``services/common/secret_keys.py``), at any depth of nested objects. That
covers BMC passwords, ``agent_secret_token`` and ``instance_info.configdrive``
(a config drive carries user data and passwords; it also matches ``configdrive``).
A secret key's whole value is sealed as one, whatever its JSON type.

Each value is bound to its node and path (``sealed_values`` context), so it
decrypts nowhere else. Values that are not sealed are read as they are: a
key added to a running deployment, and rotation half done, both leave
plaintext or old-key values that must stay readable until
``ferrum db rotate-key`` has rewritten them.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from typing import Any, TypedDict, cast

from services.common import errors
from services.common.db.records import NodeRecord
from services.common.keyring import Keyring
from services.common.sealed_values import looks_sealed, open_sealed, seal, sealed_key_id
from services.common.secret_keys import is_secret_key

SEALED_FIELDS = ("driver_info", "driver_internal_info", "instance_info")
Path = tuple[str | int, ...]


def _context(node_uuid: str, path: Path) -> str:
    """The associated data binding a value to its node and path. NUL separates
    the parts (PostgreSQL's jsonb cannot hold one in a key), and each part says
    whether it is an object key or a list index, so no two paths share one."""
    return "\x00".join(("node", node_uuid, *(f"k{p}" if isinstance(p, str) else f"i{p}" for p in path)))


def _canonical(node_uuid: str) -> str:
    """The uuid as PostgreSQL gives it back (lower case, hyphens), whatever form a caller wrote."""
    try:
        return str(uuidlib.UUID(str(node_uuid)))
    except ValueError:
        return str(node_uuid)


def _where(node_uuid: str, path: Path) -> str:
    return f"node {node_uuid} {'.'.join(str(p) for p in path)}"


class NodeSecrets:
    """Seals and opens the secret values of node rows with one keyring."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    # -- writes ---------------------------------------------------------------------------------

    def seal(self, node_uuid: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` (node columns about to be written) with every secret sealed.

        A secret that already looks sealed is refused, with or without a key:
        only Ferrum writes ciphertext, and a planted one would make the node
        unreadable for everybody (every read tries to open it).
        """
        out = dict(values)
        node_uuid = _canonical(node_uuid)
        for field in SEALED_FIELDS:
            if isinstance(out.get(field), dict):
                out[field] = self._seal_tree(node_uuid, out[field], (field,))
        return out

    def _seal_tree(self, node_uuid: str, value: Any, path: Path) -> Any:
        if isinstance(value, dict):
            return {k: self._seal_entry(node_uuid, k, v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self._seal_tree(node_uuid, v, (*path, i)) for i, v in enumerate(value)]
        return value

    def _seal_entry(self, node_uuid: str, key: str, value: Any, path: Path) -> Any:
        if not is_secret_key(key):
            return self._seal_tree(node_uuid, value, path)
        if looks_sealed(value):
            raise errors.InvalidParameterValue(
                f"{'.'.join(str(p) for p in path)} may not start with 'ferrum-aead:' (the form of stored ciphertext)"
            )
        if value is None or not self.keyring.enabled:
            return value
        return seal(self.keyring, value, context=_context(node_uuid, path))

    # -- reads ----------------------------------------------------------------------------------

    def open(self, row: dict[str, Any]) -> NodeRecord:
        """A whole row of ``nodes`` as read (``SELECT *``), changed in place and
        returned as the record it is, with every sealed secret decrypted.

        Only values under secret-looking keys are ever opened, so a user who
        stores a ciphertext-shaped string anywhere else gets it back as is.
        Raises :class:`errors.SecretUnreadable` for a value the keyring cannot open.
        """
        self._open_in_place(row)
        return cast(NodeRecord, row)

    def _open_in_place(self, row: dict[str, Any]) -> None:
        """Decrypt the sealed fields of ``row``, whole or only some of its columns."""
        node_uuid = row.get("uuid")
        canonical = None  # parsed once per row, not once per field (a list opens 200 rows)
        for field in SEALED_FIELDS:
            value = row.get(field)
            if isinstance(value, dict):
                if node_uuid is None:
                    if _has_sealed(value):
                        raise errors.SecretUnreadable(f"{field} holds encrypted values but the row has no uuid")
                    continue
                if not value:
                    continue
                if canonical is None:
                    canonical = _canonical(node_uuid)
                row[field] = self._open_tree(canonical, value, (field,))

    def _open_tree(self, node_uuid: str, value: Any, path: Path) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if isinstance(v, str):
                    if looks_sealed(v) and is_secret_key(k):
                        child = (*path, k)
                        v = open_sealed(
                            self.keyring, v, context=_context(node_uuid, child), where=_where(node_uuid, child)
                        )
                elif isinstance(v, (dict, list)):
                    v = self._open_tree(node_uuid, v, (*path, k))
                out[k] = v
            return out
        if isinstance(value, list):
            return [self._open_tree(node_uuid, v, (*path, i)) for i, v in enumerate(value)]
        return value

    # -- rotation -------------------------------------------------------------------------------

    def needs_reseal(self, row: Mapping[str, Any]) -> bool:
        """Whether a stored row (as read, not opened) holds a secret that is in
        the clear or sealed under a key other than the current one."""
        current = self.keyring.current_id
        return any(_stale(row.get(field), current) for field in SEALED_FIELDS if isinstance(row.get(field), dict))

    def reseal(self, row: Mapping[str, Any]) -> SealedColumns:
        """The sealed fields of a stored row, opened and sealed again under the current key."""
        opened = {"uuid": row["uuid"], **{f: row.get(f) for f in SEALED_FIELDS}}
        self._open_in_place(opened)
        resealed = self.seal(str(row["uuid"]), opened)
        return SealedColumns(
            driver_info=resealed["driver_info"],
            driver_internal_info=resealed["driver_internal_info"],
            instance_info=resealed["instance_info"],
        )


class SealedColumns(TypedDict):
    """The three node columns whose secret values are sealed (``SEALED_FIELDS``)."""

    driver_info: dict[str, Any]
    driver_internal_info: dict[str, Any]
    instance_info: dict[str, Any]


def _has_sealed(value: Any) -> bool:
    if isinstance(value, dict):
        return any((looks_sealed(v) and is_secret_key(k)) or _has_sealed(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_sealed(v) for v in value)
    return False


def _stale(value: Any, current: str) -> bool:
    """A secret in the clear, or sealed under another key, anywhere in ``value``."""
    if isinstance(value, dict):
        for k, v in value.items():
            if is_secret_key(k):
                if v is None:
                    continue
                if not looks_sealed(v) or sealed_key_id(v) != current:
                    return True
            elif _stale(v, current):
                return True
        return False
    if isinstance(value, list):
        return any(_stale(v, current) for v in value)
    return False
