"""Rendering boot scripts: node state in, an iPXE script out, never an exception.

:class:`ScriptRenderer` is what the HTTP and gRPC front ends call. It reads
boot data through the one-method ``BootDataReader``, asks
:mod:`services.ipxe.plan` what to boot and fills a jinja2 template from
``services/ipxe/templates/``. Whatever goes wrong (unknown MAC, a state that
does not boot, a field that is unsafe to put into a script, the database
being down) becomes an error script that says why on the machine's console,
plus a warning log line with the same reason.
"""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jinja2

from services.common.config import Settings
from services.common.logs import node_uuid_var
from services.ipxe import safety
from services.ipxe.plan import PlanOptions, Refusal, plan_boot
from services.ipxe.reader import BootDataReader
from services.ipxe.safety import UnsafeValue

LOG = logging.getLogger(__name__)
TEMPLATES = Path(__file__).parent / "templates"
MESSAGE_WIDTH = 70


@dataclass(frozen=True)
class RenderedScript:
    script: str
    kind: str  # deploy | local_disk | ramdisk | san | error
    node_uuid: str = ""
    reason: str = ""


def template_environment() -> jinja2.Environment:
    """Templates render only checked values: ``finalize`` re-checks each one."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=safety.guard,
    )


def api_url_for(settings: Settings) -> str:
    """The api URL the agent calls back: ipxe.api_url, the api's public endpoint, else its host:port
    ('' when the api port is 0: then the renderer asks for the api started in its process)."""
    if settings.ipxe.api_url:
        return settings.ipxe.api_url.rstrip("/")
    if settings.api.public_endpoint:
        return settings.api.public_endpoint.rstrip("/")
    if not settings.api.port:
        return ""  # an ephemeral api port is unknown here
    host = settings.api.host if settings.api.host not in ("0.0.0.0", "::") else "127.0.0.1"
    scheme = "https" if settings.security.tls_cert_file else "http"  # the api serves TLS (services/common/tls.py)
    return f"{scheme}://{host}:{settings.api.port}"


class ScriptRenderer:
    def __init__(
        self,
        reader: BootDataReader,
        settings: Settings,
        *,
        on_render: Callable[[RenderedScript], None] | None = None,
        local_api_url: Callable[[], str] = lambda: "",
    ) -> None:
        config = settings.ipxe
        self._reader = reader
        self._config = config
        self._settings = settings
        self._on_render = on_render
        self._local_api_url = local_api_url
        self._env = template_environment()
        self._options = PlanOptions(
            api_url=api_url_for(settings),
            kernel_append_params=config.kernel_append_params,
            default_boot_mode=config.default_boot_mode,
            timeout_ms=int(config.boot_timeout * 1000),
            retries=config.boot_retries,
            agent_ca_file=config.agent_ca_file,
        )

    def _plan_options(self) -> PlanOptions:
        """The options, with the api of this process when configuration cannot say the api URL."""
        if self._options.api_url:
            return self._options
        local = self._local_api_url()
        return dataclasses.replace(self._options, api_url=local) if local else self._options

    def first_stage(self, base_url: str) -> str:
        """boot.ipxe, chaining ``<base_url>/ipxe?mac=..``; ``base_url`` must be checked by the caller."""
        script_url = safety.check_url(f"{base_url.rstrip('/')}/ipxe", field="the renderer URL")
        return self._env.get_template("boot.ipxe.j2").render(
            script_url=script_url,
            timeout_ms=int(self._config.boot_timeout * 1000),
            retries=self._config.boot_retries,
            retry_delay=self._config.retry_delay,
            max_nics=self._config.max_nics,
        )

    def error_script(self, reason: str, *, node_uuid: str = "") -> RenderedScript:
        text = safety.sanitize_text(reason, limit=400)
        # Firmware consoles cut lines at 80 columns: wrap the reason to fit after "echo Ferrum: ".
        lines = textwrap.wrap(text, width=MESSAGE_WIDTH, break_on_hyphens=False) or ["(no reason given)"]
        script = self._env.get_template("error.ipxe.j2").render(reason=text, reason_lines=lines, uuid=node_uuid)
        return RenderedScript(script=script, kind="error", node_uuid=node_uuid, reason=text)

    async def render(self, *, mac: str | None = None, uuid: str | None = None) -> RenderedScript:
        """The per-node script. ``mac``/``uuid`` must already be normalised (see safety)."""
        rendered = await self._render(mac=mac, uuid=uuid)
        if self._on_render is not None:
            self._on_render(rendered)
        return rendered

    async def _render(self, *, mac: str | None, uuid: str | None) -> RenderedScript:
        selector = f"mac={mac}" if mac is not None else f"uuid={uuid}"
        try:
            data = await self._reader.read(mac=mac, uuid=uuid)
        except Exception as exc:  # noqa: BLE001 -- the database is down or overloaded: say so, do not 500
            LOG.warning("ipxe render failed %s reason=boot data unavailable error=%s", selector, type(exc).__name__)
            return self.error_script("boot data is unavailable right now (database error), try again later")
        if data is None:
            what = f"no node has a port with MAC {mac}" if mac is not None else f"no node has UUID {uuid}"
            LOG.warning("ipxe error script %s reason=%s", selector, what)
            return self.error_script(what)
        node_uuid = str(data.node["uuid"])
        node_uuid_var.set(node_uuid)
        options = self._plan_options()
        try:
            plan = plan_boot(data, mac=mac, options=options)
            script = self._env.get_template(plan.template).render(**plan.values)
        except (Refusal, UnsafeValue) as exc:
            reason = exc.reason if isinstance(exc, Refusal) else str(exc)
            LOG.warning(
                "ipxe error script %s node_uuid=%s state=%s reason=%s",
                selector,
                node_uuid,
                data.node.get("provision_state"),
                safety.sanitize_text(reason, limit=400),
            )
            return self.error_script(reason, node_uuid=node_uuid)
        except Exception:
            LOG.exception("ipxe render failed %s node_uuid=%s", selector, node_uuid)
            return self.error_script("the boot script could not be rendered (internal error)", node_uuid=node_uuid)
        LOG.debug("ipxe rendered %s node_uuid=%s kind=%s", selector, node_uuid, plan.kind)
        rendered = RenderedScript(script=script, kind=plan.kind, node_uuid=node_uuid)
        return rendered
