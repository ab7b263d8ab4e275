"""The virtual floppy that carries a deploy agent's parameters (seed 002: ``create_vfat_image``).

A virtual-media boot attaches two things: a boot ISO, whose kernel command
line is the same for every node that boots that kernel and ramdisk, and this
1440 KiB vfat image, which holds what belongs to one node: the api URL, its
UUID, its one-time agent token, BOOTIF. So the command line carries no
secret (the seed's point), and one ISO serves every node.

The format is Ironic's, byte for byte what IPA reads: label ``ir-vfd-dev``
(lower case: IPA finds the device by that label), one file
``parameters.txt`` of ``key=value`` lines joined by ``\\n``, no quoting. IPA
reads it only when ``boot_method=vmedia`` is on the kernel command line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from services.common import errors
from services.common.images import fat

LABEL = "ir-vfd-dev"
PARAMETERS_FILE = "parameters.txt"
FLOPPY_KIB = 1440
MAX_PARAMETERS_BYTES = 64 * 1024  # a parameters file is a few hundred bytes; anything bigger is not ours
_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def format_parameters(parameters: Mapping[str, str]) -> str:
    """``key=value`` lines, refused when a key or value would change the meaning of the file.

    A value may hold any printable character but a line break (which would
    start another key); keys are what a kernel command line allows.
    """
    lines = []
    for key, value in parameters.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise errors.InvalidParameterValue(f"invalid virtual floppy parameter name {key!r}")
        text = str(value)
        if not text.isprintable():
            raise errors.InvalidParameterValue(f"virtual floppy parameter {key} has a non-printable value")
        lines.append(f"{key}={text}")
    body = "\n".join(lines)
    if len(body.encode()) > MAX_PARAMETERS_BYTES:
        raise errors.InvalidParameterValue(f"virtual floppy parameters exceed {MAX_PARAMETERS_BYTES} bytes")
    return body


def parse_parameters(text: str) -> dict[str, str]:
    """The pairs of a ``parameters.txt`` (blank and malformed lines skipped, later keys win), as IPA reads it."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and _KEY.fullmatch(key.strip()):
            found[key.strip()] = value.strip()
    return found


def create_vfat_image(parameters: Mapping[str, str], *, work_dir: str | None = None) -> bytes:
    """A 1440 KiB vfat floppy labelled ``ir-vfd-dev`` holding ``parameters.txt``.

    Formatted with ``mkfs.vfat`` (so the label keeps its case) and filled
    with ``mcopy``: about 20 ms, see docs/virtual-media.md.
    """
    body = format_parameters(parameters).encode()
    return fat.write_image(
        {PARAMETERS_FILE: body}, label=LABEL, size=FLOPPY_KIB * 1024, work_dir=work_dir, keep_label_case=True
    )
