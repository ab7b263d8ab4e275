"""Validation and escaping of every value that goes into an iPXE script.

The value rules themselves live in :mod:`services.common.boot_values`, so
that the api refuses a bad value when it is set and the conductor fails a
deploy before power-on by the very same rules; they are re-exported here for
the renderer. What stays here is the renderer's own second line of defence:
the jinja environment's ``finalize`` hook (:func:`guard`) re-checks every
interpolated value. Free text shown on the console (node names, reasons) is
*sanitised* (:func:`services.common.console_text.sanitize_text`), not refused.

Checkers raise :class:`UnsafeValue` with a reason a human can act on; the
renderer turns that into an error script, never into a partial script.
"""

from __future__ import annotations

from services.common.boot_values import (
    FORBIDDEN,
    MAX_URL,
    UnsafeValue,
    check_chap,
    check_host,
    check_iqn,
    check_kernel_args,
    check_lun,
    check_nfs,
    check_nfs_root,
    check_port,
    check_portal,
    check_url,
    check_wwn,
    normalize_mac,
    normalize_uuid,
)
from services.common.console_text import sanitize_text

__all__ = [
    "MAX_URL",
    "UnsafeValue",
    "check_chap",
    "check_host",
    "check_iqn",
    "check_kernel_args",
    "check_lun",
    "check_nfs",
    "check_nfs_root",
    "check_port",
    "check_portal",
    "check_url",
    "check_wwn",
    "guard",
    "normalize_mac",
    "normalize_uuid",
    "sanitize_text",
]


def guard(value: object) -> object:
    """jinja ``finalize``: refuse any interpolated value that could break out.

    Values were already validated; this catches a template or code change that
    forgets to. Spaces are allowed (kernel arguments, echo text)."""
    if value is None:
        raise UnsafeValue("a template variable is None")
    text = str(value)
    if FORBIDDEN.search(text) or "\t" in text or " && " in f" {text} ":
        raise UnsafeValue("an unchecked value reached an iPXE template")
    return value
