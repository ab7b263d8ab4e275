"""The last line a machine's console showed, for an error message that says why.

A deploy that times out waiting for its ramdisk is easier to diagnose when
``last_error`` quotes what the machine printed last ("no network interface
matches BOOTIF", a kernel panic, iPXE's "Connection timed out"). The
conductor cannot read a serial port itself; it asks the node's management
interface (the BMC's console log), bounded in time, and cleans the text:
a console carries escape sequences and anything else the machine printed.
"""

from __future__ import annotations

import asyncio
import logging
import re

from services.conductor.drivers.base import Task

LOG = logging.getLogger(__name__)
MAX_LINE = 200
_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][A-Za-z0-9]|[A-Za-z=>])")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def clean(line: str) -> str:
    """Printable ASCII only, escapes dropped, whitespace collapsed, at most MAX_LINE characters."""
    text = _UNPRINTABLE.sub(" ", _ESCAPES.sub("", line))
    return " ".join(text.split())[:MAX_LINE]


async def last_console_line(task: Task, *, timeout: float = 10.0) -> str:
    """The last non-blank console line, or "" when the BMC has none (or does not answer in time)."""
    try:
        lines = await asyncio.wait_for(task.driver.management.get_console_tail(task, 5), timeout)
    except TimeoutError:
        LOG.info("console log read timed out node_uuid=%s", task.node.get("uuid"))
        return ""
    for line in reversed(lines):
        text = clean(line)
        if text:
            return text
    return ""
