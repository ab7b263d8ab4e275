"""What the renderer answers on HTTP: ``/boot.ipxe``, ``/ipxe?mac=|uuid=`` and
``/metrics``, as ready-to-send :class:`Reply` objects.

All routes are public (iPXE cannot authenticate), plain text and never cached
by clients (``Cache-Control: no-store``): the answer depends on the node's
state at the moment of the request. A request that names no valid MAC or UUID
gets 400 with an error *script* as the body, so even a misconfigured DHCP
server leaves a readable message on the console; nothing answers 500.

Boot storms are why replies are bytes built once: with the cache on
(``FERRUM_IPXE_CACHE_TTL`` > 0) a rendered per-node reply is kept under its
exact request target and answered without a coroutine, a database read or a
template, until the :class:`~services.ipxe.reader.CachingReader` evicts that
node (a ``ferrum_boot_data`` notification) or the TTL passes. Error
scripts are never kept, so every unknown MAC still logs its warning line.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.common.config import IpxeConfig
from services.common.metrics import ServiceMetrics
from services.ipxe import safety
from services.ipxe.reader import CachingReader
from services.ipxe.render import RenderedScript, ScriptRenderer
from services.ipxe.safety import UnsafeValue

LOG = logging.getLogger(__name__)
KIND_HEADER = "X-Ferrum-Boot-Kind"
TEXT = "text/plain; charset=utf-8"
_HOST_HEADER = re.compile(r"([A-Za-z0-9\-.]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(:[0-9]{1,5})?")
_MAX_FIRST_STAGE_HOSTS = 256


@dataclass(frozen=True)
class Reply:
    """A whole HTTP response but for the Date and Connection lines the server adds per request."""

    status: int
    body: bytes
    kind: str = ""
    content_type: str = TEXT
    extra: tuple[tuple[str, str], ...] = ()
    head: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lines = [
            f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Cache-Control: no-store",
        ]
        if self.kind:
            lines.append(f"{KIND_HEADER}: {self.kind}")
        lines.extend(f"{name}: {value}" for name, value in self.extra)
        object.__setattr__(self, "head", ("\r\n".join(lines) + "\r\n").encode("latin-1"))

    @property
    def route_label(self) -> str:
        return self.kind or str(self.status)


def script_reply(rendered: RenderedScript, *, status: int = 200) -> Reply:
    return Reply(status, rendered.script.encode(), kind=rendered.kind)


def selector(mac: str | None, uuid: str | None) -> tuple[str | None, str | None]:
    """Exactly one of mac/uuid, normalised; UnsafeValue otherwise."""
    if (mac is None) == (uuid is None):
        raise UnsafeValue("give exactly one of mac= or uuid=")
    if mac is not None:
        return safety.normalize_mac(mac), None
    return None, safety.normalize_uuid(uuid)


@dataclass
class _Kept:
    expires: float
    reply: Reply
    node_uuid: str


class ScriptReplies:
    """Routes a request (method, raw target, Host) to a :class:`Reply`.

    :meth:`answer_now` answers everything that needs no database read, and
    per-node scripts from the reply cache; :meth:`render` is the slow path.
    """

    def __init__(
        self,
        renderer: ScriptRenderer,
        config: IpxeConfig,
        metrics: ServiceMetrics,
        cache: CachingReader | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._renderer = renderer
        self._config = config
        self._metrics = metrics
        self._cache = cache
        self._clock = clock
        self.bound_port = config.port
        self._kept: dict[bytes, _Kept] = {}
        self._kept_by_node: dict[str, set[bytes]] = {}
        if cache is not None:
            cache.add_eviction_listener(self._evict)
        self._first_stage: dict[bytes, Reply] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._kinds: dict[str, int] = {}
        self._scripts = metrics.counter("ferrum_ipxe_scripts_total", "Per-node boot scripts served, by kind", ("kind",))
        self.not_found = Reply(404, b"not found: this server answers /boot.ipxe, /ipxe?mac=|uuid= and /metrics\n")
        self.not_allowed = Reply(405, b"method not allowed: use GET or HEAD\n", extra=(("Allow", "GET, HEAD"),))
        self.bad_request = Reply(400, b"bad request: malformed HTTP\n")

    def _evict(self, node_uuid: str | None) -> None:
        """Follow the reader cache: one node's replies, or all of them."""
        if node_uuid is None:
            self._kept.clear()
            self._kept_by_node.clear()
            return
        for target in self._kept_by_node.pop(node_uuid, ()):
            self._kept.pop(target, None)

    def counted_render(self, rendered: RenderedScript) -> None:
        """The renderer's on_render hook (gRPC and HTTP renders alike)."""
        self._kinds[rendered.kind] = self._kinds.get(rendered.kind, 0) + 1

    def count(self, route: str, status: int) -> None:
        key = (route, str(status))
        self._counts[key] = self._counts.get(key, 0) + 1

    def flush_metrics(self) -> None:
        """Move the plain-int tallies into the Prometheus registry (cheaper than a locked inc per request)."""
        counts, self._counts = self._counts, {}
        for (route, code), n in counts.items():
            self._metrics.requests.labels(self._metrics.service, "http", route, code).inc(n)
        kinds, self._kinds = self._kinds, {}
        for kind, n in kinds.items():
            self._scripts.labels(kind).inc(n)

    def base_url(self, host: bytes) -> str:
        """The public URL iPXE reached us at: configured, else the Host header when it is plain."""
        if self._config.public_url:
            return self._config.public_url
        text = host.decode("latin-1")
        if _HOST_HEADER.fullmatch(text):
            return f"http://{text}"
        return f"http://{self._config.host}:{self.bound_port}"

    def answer_now(self, method: bytes, target: bytes, host: bytes) -> Reply | None:
        """The reply when no database read is needed; None sends the request to :meth:`render`."""
        if method != b"GET" and method != b"HEAD":
            self.count("other", 405)
            return self.not_allowed
        kept = self._kept.get(target)
        if kept is not None:
            if kept.expires > self._clock():
                self._kinds[kept.reply.kind] = self._kinds.get(kept.reply.kind, 0) + 1
                self.count("GET /ipxe", 200)
                return kept.reply
            del self._kept[target]
        path, _, _ = target.partition(b"?")
        if path == b"/ipxe":
            return None
        if path == b"/boot.ipxe":
            self.count("GET /boot.ipxe", 200)
            return self._boot_ipxe(host)
        if path == b"/metrics":
            self.count("GET /metrics", 200)
            self.flush_metrics()
            return Reply(200, generate_latest(self._metrics.registry), content_type=CONTENT_TYPE_LATEST)
        self.count("unmatched", 404)
        return self.not_found

    def _boot_ipxe(self, host: bytes) -> Reply:
        reply = self._first_stage.get(host)
        if reply is None:
            script = self._renderer.first_stage(self.base_url(host))
            reply = Reply(200, script.encode(), kind="boot")
            if len(self._first_stage) >= _MAX_FIRST_STAGE_HOSTS:
                self._first_stage.clear()
            self._first_stage[host] = reply
        return reply

    async def render(self, target: bytes) -> Reply:
        """``/ipxe?mac=|uuid=`` from the database (through the reader cache when it is on)."""
        _, _, query = target.partition(b"?")
        params = parse_qs(query.decode("utf-8", "replace"), keep_blank_values=True)
        try:
            mac, uuid = selector(
                params["mac"][0] if "mac" in params else None, params["uuid"][0] if "uuid" in params else None
            )
        except UnsafeValue as exc:
            LOG.warning("ipxe bad request query=%s reason=%s", safety.sanitize_text(query.decode("latin-1")), exc)
            self.count("GET /ipxe", 400)
            return script_reply(self._renderer.error_script(f"bad boot script request: {exc}"), status=400)
        cache = self._cache
        generation = cache.generation if cache is not None else 0
        rendered = await self._renderer.render(mac=mac, uuid=uuid)
        reply = script_reply(rendered)
        self.count("GET /ipxe", 200)
        # Keep only what was rendered from data no notification has since outdated.
        if cache is not None and cache.ttl > 0 and rendered.kind != "error" and generation == cache.generation:
            if len(self._kept) >= cache.max_entries:
                self._evict(None)
            node_uuid = rendered.node_uuid.lower()
            self._kept[target] = _Kept(self._clock() + cache.ttl, reply, node_uuid)
            self._kept_by_node.setdefault(node_uuid, set()).add(target)
        return reply
