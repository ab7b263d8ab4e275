"""Structured logging with request id and node uuid taken from context.

Handlers set ``request_id`` / ``node_uuid`` in contextvars once; every log line
emitted while serving that request carries them, without passing loggers
around. Output is ``key=value`` text or one JSON object per line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
node_uuid_var: contextvars.ContextVar[str] = contextvars.ContextVar("node_uuid", default="-")


class ContextFilter(logging.Filter):
    """Copies the current request id and node uuid onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.node_uuid = node_uuid_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
            "node_uuid": getattr(record, "node_uuid", "-"),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s request_id=%(request_id)s node_uuid=%(node_uuid)s %(message)s"


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Install one stderr handler on the root logger (called by main only)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "asyncio", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
