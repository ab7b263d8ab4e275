"""A machine's serial console as text lines (what its BMC's log service shows).

QEMU appends the serial port to a file; SeaBIOS and iPXE write terminal
escape sequences and carriage returns into it. Only the end of the file is
read (bounded), escapes and control characters are dropped, and blank lines
are skipped, so the last line is the last thing a person would have seen.
"""

from __future__ import annotations

import os
import re

TAIL_BYTES = 64 * 1024
MAX_LINE = 300
_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][A-Za-z0-9]|[A-Za-z=>])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_line(raw: str) -> str:
    """One console line as plain text (escape sequences and control characters removed, bounded)."""
    text = raw.rstrip("\r").rsplit("\r", 1)[-1]  # a carriage return means the rest was overwritten
    text = _CONTROL.sub("", _ESCAPES.sub("", text))
    return text.strip()[:MAX_LINE]


def tail_lines(path: str | os.PathLike[str], count: int) -> list[str]:
    """The last ``count`` non-blank lines of a console log; [] when there is none yet."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - TAIL_BYTES))
            data = log.read()
    except FileNotFoundError:
        return []
    lines = [clean_line(line) for line in data.decode("utf-8", "replace").split("\n")]
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # the first one is probably cut
    return [line for line in lines if line][-count:]


def tail_entries(path: str | os.PathLike[str], count: int) -> list[tuple[int, str]]:
    """The last ``count`` complete non-blank lines, each numbered by the file offset just past
    it: numbers only grow while the log does, so a reader polling it sees which lines are new.
    A line still being written (no newline yet) waits until it is complete."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES)
            log.seek(start)
            data = log.read()
    except FileNotFoundError:
        return []
    entries: list[tuple[int, str]] = []
    offset = start
    pieces = data.split(b"\n")
    for index, raw in enumerate(pieces[:-1]):  # the last piece has no newline yet
        offset += len(raw) + 1
        if index == 0 and start > 0:
            continue  # probably cut
        line = clean_line(raw.decode("utf-8", "replace"))
        if line:
            entries.append((offset, line))
    return entries[-count:] if count > 0 else []
