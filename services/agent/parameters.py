"""Where the agent in a booted ramdisk finds its parameters.

Today that is the kernel command line the boot script wrote (``ipa-api-url``,
``BOOTIF``, ``ipa-agent-token`` ...). A virtual-media boot adds a second
source, the floppy's ``parameters.txt`` (CONTRACT.md 6.1), whose values win.
Every source is read here and nowhere else, so adding one changes no caller:
the result is one command-line-shaped string in which a later source's words
come last, and :func:`services.agent.cmdline.split` keeps the last value of a
repeated key.
"""

from __future__ import annotations

from pathlib import Path

from services.common import errors

MAX_SOURCE_BYTES = 64 * 1024  # a kernel command line is at most a few KiB


def read_parameters(*, kernel_cmdline: Path | None) -> str:
    """The parameters of every source, later sources winning (see the module docstring)."""
    parts: list[str] = []
    if kernel_cmdline is not None:
        parts.append(_read_bounded(kernel_cmdline))
    return " ".join(part for part in parts if part)


def _read_bounded(path: Path) -> str:
    try:
        with open(path, "rb") as source:
            data = source.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise errors.InvalidParameterValue(f"cannot read agent parameters from {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise errors.InvalidParameterValue(f"agent parameters in {path} exceed {MAX_SOURCE_BYTES} bytes")
    return data.decode("utf-8", "replace").replace("\x00", " ").strip()
