"""The simulated machine's serial console: its boot log as text lines.

The simulated firmware and agent have no serial port, yet an operator (and
Serial-over-LAN, and the conductor's console proxy) expects a console that
shows the machine booting and the agent working. Each boot-log event becomes
one line, the way a firmware or kernel would print it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any


def console_line(entry: Mapping[str, Any]) -> str:
    """``[hh:mm:ss] event key=value ...`` with a CRLF, as a serial terminal expects."""
    stamp = time.strftime("%H:%M:%S", time.gmtime(float(entry.get("at", 0))))
    details = " ".join(
        f"{key}={value}"
        for key, value in entry.items()
        if key not in ("at", "boot", "event") and value not in ("", None)
    )
    return f"[{stamp}] {entry.get('event', '?')}{' ' + details if details else ''}\r\n"
