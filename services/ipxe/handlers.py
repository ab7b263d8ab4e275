"""The renderer's HTTP routes: ``/boot.ipxe`` and ``/ipxe?mac=|uuid=``.

Both are public (iPXE cannot authenticate), plain text and never cached
(``Cache-Control: no-store``): the answer depends on the node's state at the
moment of the request. A request that names no valid MAC or UUID gets 400
with an error *script* as the body, so even a misconfigured DHCP server
leaves a readable message on the console; nothing answers 500.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web

from services.common.config import IpxeConfig
from services.ipxe import safety
from services.ipxe.render import RenderedScript, ScriptRenderer
from services.ipxe.safety import UnsafeValue

LOG = logging.getLogger(__name__)
HEADERS = {"Cache-Control": "no-store"}
KIND_HEADER = "X-Ferrum-Boot-Kind"
_HOST_HEADER = re.compile(r"([A-Za-z0-9\-.]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(:[0-9]{1,5})?")


def script_response(rendered: RenderedScript, *, status: int = 200) -> web.Response:
    return web.Response(text=rendered.script, status=status, content_type="text/plain",
                        headers={**HEADERS, KIND_HEADER: rendered.kind})


def selector(mac: str | None, uuid: str | None) -> tuple[str | None, str | None]:
    """Exactly one of mac/uuid, normalised; UnsafeValue otherwise."""
    if (mac is None) == (uuid is None):
        raise UnsafeValue("give exactly one of mac= or uuid=")
    if mac is not None:
        return safety.normalize_mac(mac), None
    return None, safety.normalize_uuid(uuid)


class ScriptRoutes:
    def __init__(self, renderer: ScriptRenderer, config: IpxeConfig) -> None:
        self._renderer = renderer
        self._config = config
        self.bound_port = config.port

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/boot.ipxe", self.boot_ipxe)
        app.router.add_get("/ipxe", self.node_script)

    def base_url(self, request: web.Request) -> str:
        """The public URL iPXE reached us at: configured, else the Host header when it is plain."""
        if self._config.public_url:
            return self._config.public_url
        host = request.headers.get("Host", "")
        if _HOST_HEADER.fullmatch(host):
            return f"http://{host}"
        return f"http://{self._config.host}:{self.bound_port}"

    async def boot_ipxe(self, request: web.Request) -> web.Response:
        script = self._renderer.first_stage(self.base_url(request))
        return web.Response(text=script, content_type="text/plain", headers={**HEADERS, KIND_HEADER: "boot"})

    async def node_script(self, request: web.Request) -> web.Response:
        try:
            mac, uuid = selector(request.query.get("mac"), request.query.get("uuid"))
        except UnsafeValue as exc:
            LOG.warning("ipxe bad request query=%s reason=%s", safety.sanitize_text(request.query_string), exc)
            return script_response(self._renderer.error_script(f"bad boot script request: {exc}"), status=400)
        return script_response(await self._renderer.render(mac=mac, uuid=uuid))
