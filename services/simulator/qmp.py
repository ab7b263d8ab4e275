"""A minimal QMP client: the QEMU Machine Protocol over a unix socket.

QMP is line-delimited JSON: QEMU greets, the client sends
``qmp_capabilities``, then each ``{"execute": ...}`` gets one ``return`` or
``error`` reply, with asynchronous ``event`` lines interleaved (skipped
here). One command at a time per connection (a lock), every read bounded
by a timeout, so a wedged QEMU gives an error instead of a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

MAX_LINE = 1024 * 1024


class QmpError(RuntimeError):
    """QEMU refused a command, or the monitor could not be reached in time."""


class QmpClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, timeout: float) -> None:
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, path: str, *, timeout: float = 10.0, poll: float = 0.05) -> QmpClient:
        """Connect (QEMU creates the socket a moment after it starts: retried until ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(path, limit=MAX_LINE)
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if time.monotonic() >= deadline:
                    raise QmpError(f"QEMU's monitor socket {path} did not answer within {timeout:.0f} s") from exc
                await asyncio.sleep(poll)
        client = cls(reader, writer, timeout=timeout)
        try:
            greeting = await client._read()
            if "QMP" not in greeting:
                raise QmpError(f"not a QMP greeting: {greeting}")
            await client.execute("qmp_capabilities")
        except BaseException:
            await client.close()
            raise
        return client

    async def _read(self) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(self._reader.readline(), self._timeout)
        except TimeoutError:
            raise QmpError(f"QEMU's monitor did not answer within {self._timeout:.0f} s") from None
        if not line:
            raise QmpError("QEMU closed its monitor (the VM has stopped)")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise QmpError(f"unexpected QMP message {line[:200]!r}")
        return message

    async def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run one command; its ``return`` value, or QmpError with QEMU's description."""
        request: dict[str, Any] = {"execute": command}
        if arguments:
            request["arguments"] = arguments
        async with self._lock:
            self._writer.write(json.dumps(request).encode() + b"\n")
            await self._writer.drain()
            while True:
                message = await self._read()
                if "return" in message:
                    return message["return"]
                if "error" in message:
                    error = message["error"]
                    raise QmpError(f"{command}: {error.get('desc', error)}")

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()
