"""The ``redfish-graphical`` console interface: the BMC's VNC console, relayed (docs/console.md).

Ironic's ``redfish-graphical`` starts a container with a browser that logs
in to the BMC's vendor HTML5 console and shows it over VNC behind
``ironic-novncproxy``. Ferrum does not drive vendor web pages. What it can
do honestly is the part that is standard: a BMC whose Redfish
ComputerSystem advertises a ``GraphicalConsole`` (``ServiceEnabled``, a
``Port``) that speaks VNC (the RFB protocol) gets a relay on the conductor,
one BMC connection per viewer (services/conductor/console_relay.py), and
``console_info`` ``{"type": "vnc", "url": "vnc://HOST:PORT", "websocket_url":
...}`` for a VNC viewer or noVNC. Enabling checks all of it first, and a
BMC without a graphical console, with it switched off, or whose port does
not speak RFB (a vendor KVM-over-IP protocol) is refused with the reason.

The VNC endpoint is the BMC's host (``redfish_address``) at the advertised
port; ``MaxConcurrentSessions`` lowers ``console_max_clients`` for the node.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from services.common import errors
from services.conductor.console_proxy import ConsoleProxies
from services.conductor.console_relay import RelaySession
from services.conductor.drivers import base
from services.conductor.drivers.redfish_client import (
    DRIVER_INFO_PROPERTIES,
    ConnectionCache,
    RedfishInfo,
    parse_driver_info,
)

LOG = logging.getLogger(__name__)

RFB_BANNER = re.compile(rb"^RFB \d{3}\.\d{3}\n$")
PROBE_TIMEOUT = 5.0  # seconds for the BMC's console port to show its RFB banner


class RedfishGraphicalConsole(base.ConsoleInterface):
    """A BMC's VNC graphical console, found through Redfish and relayed per viewer."""

    name = "redfish-graphical"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.cache = ConnectionCache(request_timeout=float(self.options.get("redfish_request_timeout") or 30.0))
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="console-graphical")

    def get_properties(self) -> dict[str, str]:
        return dict(DRIVER_INFO_PROPERTIES)

    async def validate(self, task: base.Task) -> None:
        parse_driver_info(task.node)

    def _proxies(self, task: base.Task) -> ConsoleProxies:
        if task.consoles is None:
            raise errors.FerrumError("this process runs no console proxies")
        return task.consoles

    # ---- what the BMC offers ----------------------------------------------------------------

    def _read_graphical(self, info: RedfishInfo) -> Any:
        """The ComputerSystem's GraphicalConsole (None when absent). Blocking: in the pool."""
        return self.cache.call(
            info, "read the graphical console", lambda system: (system.json or {}).get("GraphicalConsole")
        )

    async def target(self, info: RedfishInfo, node_uuid: str) -> tuple[str, int, int | None]:
        """(host, port, MaxConcurrentSessions) of the BMC's graphical console, or a clear refusal."""
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(self._executor, functools.partial(self._read_graphical, info))
        where = f"the Redfish BMC at {info.address}"
        if not isinstance(found, dict):
            raise errors.InvalidParameterValue(
                f"Node {node_uuid}: {where} advertises no graphical console (its ComputerSystem has no "
                "GraphicalConsole); use a serial console interface instead"
            )
        if not found.get("ServiceEnabled"):
            raise errors.InvalidParameterValue(
                f"Node {node_uuid}: the graphical console of {where} is not enabled (GraphicalConsole "
                "ServiceEnabled is false; a BMC may offer it only while the machine is powered on)"
            )
        port = found.get("Port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise errors.InvalidParameterValue(
                f"Node {node_uuid}: the graphical console of {where} names no TCP port (GraphicalConsole "
                f"Port is {port!r}), so there is nothing to connect to"
            )
        host = urlsplit(info.address).hostname or ""
        sessions = found.get("MaxConcurrentSessions")
        return host, port, sessions if isinstance(sessions, int) and sessions > 0 else None

    async def _probe(self, host: str, port: int, node_uuid: str) -> None:
        """The port must speak VNC: an RFB server sends its version banner first."""
        where = f"{host}:{port}"
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            raise errors.BMCError(
                f"Node {node_uuid}: cannot connect to the graphical console at {where}: {exc or 'timed out'}"
            ) from None
        try:
            banner = await asyncio.wait_for(reader.read(12), PROBE_TIMEOUT)
        except (OSError, TimeoutError):
            banner = b""
        finally:
            writer.close()
        if not RFB_BANNER.match(banner):
            raise errors.InvalidParameterValue(
                f"Node {node_uuid}: the graphical console at {where} does not speak VNC (no RFB version banner, "
                f"got {banner[:12]!r}); a vendor KVM-over-IP console needs the vendor's viewer"
            )

    # ---- the console interface ------------------------------------------------------------

    async def start_console(self, task: base.Task) -> None:
        info = parse_driver_info(task.node)
        node_uuid = str(task.node["uuid"])
        host, port, sessions = await self.target(info, node_uuid)
        await self._probe(host, port, node_uuid)

        async def resolve() -> tuple[str, int]:
            found_host, found_port, _ = await self.target(info, node_uuid)
            return found_host, found_port

        proxies = self._proxies(task)
        description = f"graphical console of {info.address}"
        await proxies.start_session(
            node_uuid,
            lambda: RelaySession(proxies, node_uuid, resolve, description, max_sessions=sessions),
            description=description,
        )

    async def stop_console(self, task: base.Task) -> None:
        await self._proxies(task).stop(task.node["uuid"])

    async def get_console(self, task: base.Task) -> dict[str, Any]:
        return self._proxies(task).info(task.node["uuid"])

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, functools.partial(self.cache.close))
        self._executor.shutdown(wait=False, cancel_futures=True)
