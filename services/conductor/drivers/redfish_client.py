"""Redfish plumbing for the ``redfish`` interfaces: driver_info parsing, a
per-interface cache of sushy connections, and sushy errors mapped onto
Ferrum's error tree.

sushy is synchronous (requests underneath), so everything here that touches
the network is meant to run in ``asyncio.to_thread``; the cache is guarded by
a thread lock for that reason. Parsing is pure and fast: ``validate`` uses it
without any network traffic.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import sushy
from sushy import auth as sushy_auth
from sushy import exceptions as sushy_exc

from services.common import errors

LOG = logging.getLogger(__name__)
T = TypeVar("T")

AUTH_TYPES = ("basic", "session", "auto")
SYSTEMS_PREFIX = "/redfish/v1/Systems/"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

DRIVER_INFO_PROPERTIES = {
    "redfish_address": "URL of the Redfish service (http or https; https when no scheme is given). Required.",
    "redfish_system_id": "Path of the ComputerSystem (e.g. /redfish/v1/Systems/1) or its Id. Optional when "
    "the service has exactly one system.",
    "redfish_username": "User name for the BMC. Optional.",
    "redfish_password": "Password for the BMC (masked on reads). Optional.",
    "redfish_verify_ca": "true/false, or the path of a CA bundle file or directory. Default true.",
    "redfish_auth_type": "basic, session or auto (session, falling back to basic). Default auto.",
}


@dataclass(frozen=True)
class RedfishInfo:
    """The validated Redfish settings of one node."""

    address: str
    system_id: str | None
    username: str | None
    password: str | None
    verify_ca: bool | str
    auth_type: str

    def cache_key(self) -> tuple[str, ...]:
        """Connections are shared per BMC and credentials; the password is only
        hashed so a changed password gets a fresh connection."""
        digest = hashlib.sha256((self.password or "").encode()).hexdigest()
        return (self.address, self.username or "", digest, str(self.verify_ca), self.auth_type)

    def describe(self) -> str:
        return f"{self.username + '@' if self.username else ''}{self.address}"


def _bool_or_path(value: Any, node_uuid: str) -> bool | str:
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    if not text or not os.path.exists(text):
        raise errors.InvalidParameterValue(
            f"Node {node_uuid}: redfish_verify_ca must be a boolean or the path of an existing "
            f"CA bundle file or directory, got {value!r}"
        )
    return text


def parse_driver_info(node: Mapping[str, Any]) -> RedfishInfo:
    """Check the node's Redfish driver_info without touching the network."""
    uuid = node.get("uuid", "?")
    info = node.get("driver_info") or {}
    address = info.get("redfish_address")
    if not address or not isinstance(address, str):
        raise errors.MissingParameter(f"Node {uuid} is missing driver_info: redfish_address")
    address = address.strip()
    if "://" not in address:
        address = "https://" + address
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https"):
        raise errors.InvalidParameterValue(
            f"Node {uuid}: redfish_address {info['redfish_address']!r} must be an http or https URL"
        )
    try:
        _ = parts.port
    except ValueError:
        raise errors.InvalidParameterValue(f"Node {uuid}: redfish_address {address!r} has an invalid port") from None
    if not parts.hostname or parts.query or parts.fragment or parts.username or parts.password:
        raise errors.InvalidParameterValue(
            f"Node {uuid}: redfish_address {info['redfish_address']!r} must be scheme://host[:port][/path] "
            "with no credentials, query or fragment"
        )
    address = address.rstrip("/")

    system_id = info.get("redfish_system_id")
    if system_id is not None and system_id != "":
        if not isinstance(system_id, str) or not system_id.strip() or any(c.isspace() for c in system_id.strip()):
            raise errors.InvalidParameterValue(
                f"Node {uuid}: redfish_system_id must be a path like /redfish/v1/Systems/1, got {system_id!r}"
            )
        system_id = system_id.strip()
        if not system_id.startswith("/"):
            system_id = SYSTEMS_PREFIX + system_id
        system_id = system_id.rstrip("/")
    else:
        system_id = None

    username = info.get("redfish_username")
    password = info.get("redfish_password")
    for key, value in (("redfish_username", username), ("redfish_password", password)):
        if value is not None and not isinstance(value, str):
            raise errors.InvalidParameterValue(f"Node {uuid}: {key} must be a string")

    auth_type = str(info.get("redfish_auth_type") or "auto").strip().lower()
    if auth_type not in AUTH_TYPES:
        raise errors.InvalidParameterValue(
            f"Node {uuid}: redfish_auth_type {info.get('redfish_auth_type')!r} must be one of {', '.join(AUTH_TYPES)}"
        )
    verify = _bool_or_path(info.get("redfish_verify_ca", True), uuid)
    return RedfishInfo(
        address=address,
        system_id=system_id,
        username=username or None,
        password=password or None,
        verify_ca=verify,
        auth_type=auth_type,
    )


@contextlib.contextmanager
def bmc_errors(info: RedfishInfo, action: str) -> Iterator[None]:
    """Turn sushy's exceptions into clear Ferrum errors naming the BMC."""
    where = info.describe()
    try:
        yield
    except sushy_exc.ConnectionError as exc:
        raise errors.BMCError(
            f"Redfish BMC at {info.address} is unreachable while trying to {action}: {_short(exc)}"
        ) from exc
    except sushy_exc.AccessError as exc:
        raise errors.BMCError(
            f"Redfish authentication failed for {where} while trying to {action} "
            f"(HTTP {getattr(exc, 'status_code', '401')}): check redfish_username and "
            "redfish_password"
        ) from exc
    except sushy_exc.ResourceNotFoundError as exc:
        raise errors.BMCError(f"Redfish resource not found at {where} while trying to {action}: {_short(exc)}") from exc
    except sushy_exc.UnknownDefaultError as exc:
        raise errors.InvalidParameterValue(
            f"Redfish service at {info.address} does not have exactly one system: set driver_info redfish_system_id"
        ) from exc
    except sushy_exc.InvalidParameterValueError as exc:
        raise errors.InvalidParameterValue(f"Redfish BMC at {where} cannot {action}: {_short(exc)}") from exc
    except sushy_exc.SushyError as exc:
        raise errors.BMCError(f"Redfish BMC at {where} failed to {action}: {_short(exc)}") from exc


def _short(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def close_root(root: Any) -> None:
    """Log out and close a sushy root *here*, in the calling worker thread.

    sushy's ``Sushy.__del__`` deletes its Redfish session with a blocking
    request; left to the garbage collector that request can run on the event
    loop thread, stalling it, or deadlocking when the BMC is served by the
    same loop (the embedded simulator). Closing explicitly and clearing the
    auth object makes ``__del__`` a no-op.
    """
    auth = getattr(root, "_auth", None)
    root._auth = None
    try:
        if auth is not None:
            auth.close()
    except Exception as exc:  # noqa: BLE001 - best-effort cleanup: the BMC may be gone; the session expires on its own
        LOG.debug("redfish session close failed: %s", exc)
    try:
        root._conn.close()
    except Exception as exc:  # noqa: BLE001 - best-effort cleanup, as above
        LOG.debug("redfish connector close failed: %s", exc)


def _close_roots(roots: list[Any]) -> None:
    for root in roots:
        close_root(root)


class ConnectionCache:
    """sushy root objects per BMC and credentials, owned by one interface instance.

    A connection that failed with a connection or authentication error is
    dropped, so the next call starts over (the BMC may have rebooted or its
    password changed).
    """

    def __init__(self, *, request_timeout: float = 30.0, connect_timeout: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._roots: dict[tuple[str, ...], sushy.Sushy] = {}
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout

    def _auth(self, info: RedfishInfo) -> Any:
        cls = {"basic": sushy_auth.BasicAuth, "session": sushy_auth.SessionAuth, "auto": sushy_auth.SessionOrBasicAuth}[
            info.auth_type
        ]
        return cls(username=info.username, password=info.password)

    def root(self, info: RedfishInfo) -> sushy.Sushy:
        """The cached (or a new) sushy root for ``info``. Blocking: call in a thread."""
        key = info.cache_key()
        with self._lock:
            found = self._roots.get(key)
        if found is not None:
            return found
        LOG.debug("redfish connect address=%s user=%s auth=%s", info.address, info.username, info.auth_type)
        root = sushy.Sushy(
            info.address,
            auth=self._auth(info),
            verify=info.verify_ca,
            read_timeout=max(1, int(self._request_timeout)),
            connect_timeout=max(1, int(self._connect_timeout)),
            server_side_retries=2,
            server_side_retries_delay=1,
        )
        with self._lock:
            kept = self._roots.setdefault(key, root)
        if kept is not root:  # another thread connected first: keep one, close ours here
            close_root(root)
        return kept

    def forget(self, info: RedfishInfo) -> None:
        """Drop (and close) the connection for ``info``. Blocking: call in a thread."""
        with self._lock:
            root = self._roots.pop(info.cache_key(), None)
        if root is not None:
            close_root(root)

    def close(self) -> None:
        """Close every cached connection (logs out of sessions). Blocking: call in a thread."""
        with self._lock:
            roots, self._roots = list(self._roots.values()), {}
        for root in roots:
            close_root(root)

    def call(self, info: RedfishInfo, action: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(system)`` on the node's freshly read ComputerSystem, with
        errors mapped. Blocking: call it in a thread."""
        with bmc_errors(info, action):
            try:
                return fn(self.root(info).get_system(info.system_id))
            except (sushy_exc.ConnectionError, sushy_exc.AccessError):
                self.forget(info)
                raise

    def __del__(self) -> None:
        # Garbage collection may run on the event loop thread: log out of the
        # BMCs from a short-lived thread instead (see close_root).
        roots = list(getattr(self, "_roots", {}).values())
        if roots:
            self._roots = {}
            with contextlib.suppress(RuntimeError):  # interpreter shutdown: nothing can wait on a BMC any more
                threading.Thread(target=_close_roots, args=(roots,), name="redfish-close", daemon=True).start()

    def __len__(self) -> int:
        with self._lock:
            return len(self._roots)
