"""Prometheus metrics, one registry per service instance (no global registry).

A process that runs several services (``ferrum stack``) keeps their counters
apart, and tests can start many instances without collisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest


@dataclass
class ServiceMetrics:
    service: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "ferrum_requests_total",
            "Requests served",
            ["service", "protocol", "method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ferrum_request_seconds",
            "Request latency",
            ["service", "protocol", "method"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )

    def observe(self, protocol: str, method: str, code: str, seconds: float) -> None:
        self.requests.labels(self.service, protocol, method, code).inc()
        self.latency.labels(self.service, protocol, method).observe(seconds)

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        """The /metrics endpoint in Prometheus text format."""
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
