"""Validation and escaping of every value that goes into an iPXE script.

iPXE has no quoting: a script line is split on whitespace, ``${...}`` is
expanded anywhere, ``||`` and ``&&`` tokens chain commands, a newline starts a
new command and ``:name`` a label. A node field (set by any API user) that
reached a script unchecked could therefore run ``goto``, ``chain`` another
URL or read other settings. So each kind of value has one checker here:

- URLs and SAN URIs must match a strict character set (no whitespace, ``$``,
  braces, pipes, quotes or backslashes) and an allowed scheme;
- kernel arguments are checked token by token;
- free text shown on the console (node names, reasons) is *sanitised*:
  anything outside a harmless set becomes ``_``
  (:func:`services.common.console_text.sanitize_text`, which the api's
  ``ipxe_config`` passthru uses for its own error scripts too).

Checkers raise :class:`UnsafeValue` with a reason a human can act on; the
renderer turns that into an error script, never into a partial script.
The jinja environment's ``finalize`` hook (:func:`guard`) re-checks every
interpolated value as a second line of defence.
"""

from __future__ import annotations

import re
import uuid as uuidlib

from services.common.console_text import sanitize_text as sanitize_text  # re-exported: callers use safety.sanitize_text

_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!()*+,;=%&]+")
_ARG_TOKEN = re.compile(r"[A-Za-z0-9\-._~:/,=@+%\[\]()]+")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_HOST = re.compile(r"[A-Za-z0-9\-.]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]")
_IQN = re.compile(r"(iqn\.\d{4}-\d{2}\.[a-z0-9\-.]+(:[A-Za-z0-9\-._:]+)?|eui\.[0-9A-Fa-f]{16}|naa\.[0-9A-Fa-f]{16,32})")
_WWN = re.compile(r"[0-9a-f]{16}")
_CHAP = re.compile(r"[A-Za-z0-9\-._~:/,=@+%!*]{1,255}")
_NFS_PATH = re.compile(r"/[A-Za-z0-9\-._~/+@%]*")
_NFS_OPTS = re.compile(r"[A-Za-z0-9\-._=,]*")
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f${}|\"'\\`]")

MAX_URL = 2048


class UnsafeValue(ValueError):
    """A node field cannot be put into an iPXE script as it is."""


def check_url(value: object, *, field: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """A URL iPXE can fetch, as one token with no special characters."""
    if not isinstance(value, str) or not value:
        raise UnsafeValue(f"{field} is missing or not a string")
    if len(value) > MAX_URL or not _URL_CHARS.fullmatch(value) or "&&" in value:
        raise UnsafeValue(f"{field} is not a plain URL (whitespace or iPXE special characters)")
    scheme = value.split(":", 1)[0].lower()
    if scheme not in schemes or not value[len(scheme) :].startswith("://") or len(value) <= len(scheme) + 3:
        raise UnsafeValue(f"{field} must be an absolute {'/'.join(schemes)} URL")
    return value


def check_kernel_args(value: object, *, field: str) -> str:
    """Kernel arguments as space-separated tokens, each of a safe character set."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise UnsafeValue(f"{field} must be a string")
    if _FORBIDDEN.search(value.replace(" ", "")) or "\t" in value:
        raise UnsafeValue(f"{field} contains characters iPXE would interpret (newline, $, braces, |, quotes)")
    tokens = value.split(" ")
    for token in tokens:
        if token and not _ARG_TOKEN.fullmatch(token):
            raise UnsafeValue(f"{field} has an argument iPXE cannot pass safely: [{sanitize_text(token)}]")
    return " ".join(t for t in tokens if t)


def normalize_mac(value: object) -> str:
    """``52:54:00:AB:CD:EF``, ``52-54-00-ab-cd-ef`` or ``525400abcdef`` → lowercase colon form."""
    if not isinstance(value, str):
        raise UnsafeValue("a MAC address must be a string")
    digits = value.strip().lower().replace(":", "").replace("-", "").replace(".", "")
    if not re.fullmatch(r"[0-9a-f]{12}", digits):
        raise UnsafeValue(f"[{sanitize_text(value, limit=40)}] is not a MAC address")
    mac = ":".join(digits[i : i + 2] for i in range(0, 12, 2))
    assert _MAC.fullmatch(mac)
    return mac


def normalize_uuid(value: object) -> str:
    """A canonical lowercase UUID string."""
    try:
        return str(uuidlib.UUID(str(value)))
    except ValueError:
        raise UnsafeValue(f"[{sanitize_text(value, limit=40)}] is not a UUID") from None


def check_host(value: object, *, field: str) -> str:
    if not isinstance(value, str) or not _HOST.fullmatch(value):
        raise UnsafeValue(f"{field} is not a host name or IP address")
    return value


def check_port(value: object, *, field: str, default: int) -> int:
    if value in (None, ""):
        return default
    try:
        port = int(str(value))
    except ValueError:
        raise UnsafeValue(f"{field} is not a port number") from None
    if not 1 <= port <= 65535:
        raise UnsafeValue(f"{field} is not a port number")
    return port


def check_lun(value: object, *, field: str) -> int:
    if value in (None, ""):
        return 0
    if isinstance(value, bool):
        raise UnsafeValue(f"{field} is not a LUN number")
    try:
        lun = int(str(value))
    except ValueError:
        raise UnsafeValue(f"{field} is not a LUN number") from None
    if not 0 <= lun < 2**64:
        raise UnsafeValue(f"{field} is out of range")
    return lun


def check_iqn(value: object, *, field: str) -> str:
    if not isinstance(value, str) or len(value) > 223 or not _IQN.fullmatch(value):
        raise UnsafeValue(f"{field} is not an iSCSI name (iqn./eui./naa.)")
    return value


def check_wwn(value: object, *, field: str) -> str:
    """A Fibre Channel WWN in iPXE's colon form (``20:00:00:1f:16:bc:fe:2f``)."""
    digits = value.lower().replace(":", "").replace("-", "") if isinstance(value, str) else ""
    if not _WWN.fullmatch(digits):
        raise UnsafeValue(f"{field} is not a 16-hex-digit WWN")
    return ":".join(digits[i : i + 2] for i in range(0, 16, 2))


def check_chap(value: object, *, field: str) -> str:
    if not isinstance(value, str) or not _CHAP.fullmatch(value):
        raise UnsafeValue(f"{field} has characters iPXE cannot take in a setting (or is empty)")
    return value


def check_nfs(server: object, path: object, options: object) -> str:
    """``server:/path[,options]`` for the kernel's ``nfsroot=``."""
    host = check_host(server, field="NFS server")
    if not isinstance(path, str) or not _NFS_PATH.fullmatch(path):
        raise UnsafeValue("NFS export path must be an absolute path of plain characters")
    opts = "" if options in (None, "") else options
    if not isinstance(opts, str) or not _NFS_OPTS.fullmatch(opts):
        raise UnsafeValue("NFS options must be comma-separated plain words")
    return f"{host}:{path}" + (f",{opts}" if opts else "")


def guard(value: object) -> object:
    """jinja ``finalize``: refuse any interpolated value that could break out.

    Values were already validated; this catches a template or code change that
    forgets to. Spaces are allowed (kernel arguments, echo text)."""
    if value is None:
        raise UnsafeValue("a template variable is None")
    text = str(value)
    if _FORBIDDEN.search(text) or "\t" in text or " && " in f" {text} ":
        raise UnsafeValue("an unchecked value reached an iPXE template")
    return value
