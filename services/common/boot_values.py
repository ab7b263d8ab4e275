"""The rules a value must pass to go into an iPXE script, shared by the
renderer (which applies them when it renders), the api (which refuses a bad
value when it is set, 400 naming the field and the character) and the
conductor's ``ipxe`` boot interface (which fails a deploy before it powers the
machine on, when a bad value got in anyway, with direct SQL say).

Before they were shared, a ``kernel_append_params`` holding a newline was
stored with a 201; the deploy went on to ``wait call-back``; the renderer
refused the script, so the machine never booted and the node waited for the
call-back timeout with no ``last_error``.

iPXE has no quoting: a script line is split on whitespace, ``${...}`` is
expanded anywhere, ``||`` and ``&&`` chain commands, a newline starts a new
command and ``:name`` a label. So each kind of value has one checker here:

- URLs and SAN URIs must match a strict character set (no whitespace, ``$``,
  braces, pipes, quotes or backslashes) and an allowed scheme;
- kernel arguments are checked token by token;
- iSCSI names, portals, LUNs, WWNs, CHAP credentials and NFS exports each
  have their own form.

Checkers raise :class:`UnsafeValue` with a reason a human can act on that
names the field and, for a refused character, the character.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from services.common.console_text import sanitize_text

_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!()*+,;=%&]+")
_URL_CHAR = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!()*+,;=%&]")
_ARG_TOKEN = re.compile(r"[A-Za-z0-9\-._~:/,=@+%\[\]()]+")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_HOST = re.compile(r"[A-Za-z0-9\-.]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]")
_IQN = re.compile(r"(iqn\.\d{4}-\d{2}\.[a-z0-9\-.]+(:[A-Za-z0-9\-._:]+)?|eui\.[0-9A-Fa-f]{16}|naa\.[0-9A-Fa-f]{16,32})")
_WWN = re.compile(r"[0-9a-f]{16}")
_CHAP = re.compile(r"[A-Za-z0-9\-._~:/,=@+%!*]{1,255}")
_NFS_PATH = re.compile(r"/[A-Za-z0-9\-._~/+@%]*")
_NFS_OPTS = re.compile(r"[A-Za-z0-9\-._=,]*")
FORBIDDEN = re.compile(r"[\x00-\x1f\x7f${}|\"'\\`]")

MAX_URL = 2048
DEFAULT_PLACEHOLDER = "%default%"  # in kernel_append_params: the renderer's default arguments
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL", " ": "a space"}

# Node fields the renderer puts into a script, by where they live.
DRIVER_INFO_URLS: tuple[str, ...] = ("deploy_kernel", "deploy_ramdisk", "rescue_kernel", "rescue_ramdisk")
INSTANCE_INFO_URLS: tuple[str, ...] = ("kernel", "ramdisk", "boot_iso")
KERNEL_ARGUMENT_FIELDS = {
    "driver_info": ("kernel_append_params",),
    "instance_info": ("kernel_append_params", "ramdisk_kernel_arguments"),
}


class UnsafeValue(ValueError):
    """A node field cannot be put into an iPXE script as it is."""


def describe_character(char: str) -> str:
    """``a newline (\\n)``, ``'$'``: how a refused character is named in a message."""
    if char in _CHARACTER_NAMES:
        return f"{_CHARACTER_NAMES[char]} ({char!r})"
    if not char.isprintable():
        return f"the control character U+{ord(char):04X}"
    return repr(char)


def check_url(value: object, *, field: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """A URL iPXE can fetch, as one token with no special characters."""
    if not isinstance(value, str) or not value:
        raise UnsafeValue(f"{field} is missing or not a string")
    if len(value) > MAX_URL:
        raise UnsafeValue(f"{field} is longer than {MAX_URL} characters")
    if not _URL_CHARS.fullmatch(value):
        bad = next(c for c in value if not _URL_CHAR.fullmatch(c))
        raise UnsafeValue(
            f"{field} contains {describe_character(bad)}, which cannot be in a URL iPXE fetches "
            "(whitespace and iPXE special characters)"
        )
    if "&&" in value:
        raise UnsafeValue(f"{field} contains '&&', which iPXE would read as a second command")
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
    bad = FORBIDDEN.search(value.replace(" ", ""))
    if bad is not None:
        raise UnsafeValue(
            f"{field} contains {describe_character(bad.group())}, which iPXE would interpret "
            "(newlines, tabs, $, braces, |, quotes and backslashes are refused)"
        )
    tokens = value.split(" ")
    for token in tokens:
        if token and not _ARG_TOKEN.fullmatch(token):
            raise UnsafeValue(f"{field} has an argument iPXE cannot pass safely: [{sanitize_text(token)}]")
    return " ".join(t for t in tokens if t)


def check_append_params(configured: Any, default: str, *, field: str) -> str:
    """Per-node kernel_append_params replace the default; ``%default%`` splices it in."""
    if configured in (None, ""):
        return default
    if not isinstance(configured, str):
        raise UnsafeValue(f"{field} must be a string")
    return check_kernel_args(configured.replace(DEFAULT_PLACEHOLDER, default), field=field)


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


def check_portal(value: object, *, field: str, default_port: int = 3260) -> tuple[str, int]:
    """``host[:port]`` or ``[v6]:port`` of an iSCSI portal."""
    if not isinstance(value, str) or not value:
        raise UnsafeValue(f"{field} is not host:port")
    host, _, port_text = value.rpartition(":") if not value.endswith("]") else (value, "", "")
    if not host:
        host, port_text = value, ""
    return (
        check_host(host, field=f"{field} host"),
        check_port(port_text, field=f"{field} port", default=default_port),
    )


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


def check_nfs_root(value: object) -> str:
    """instance_info ``nfs_root`` (seed 004): ``server:/path[,options]``, checked as its parts are."""
    if not isinstance(value, str) or ":" not in value:
        raise UnsafeValue("nfs_root must be server:/path[,options]")
    location, _, options = value.partition(",")
    server, _, path = location.rpartition(":")
    if server.startswith("[") and server.endswith("]"):
        server = server[1:-1]  # an IPv6 address in brackets
    return check_nfs(server, path, options)


def check_node_boot_values(driver_info: Mapping[str, Any] | None, instance_info: Mapping[str, Any] | None) -> None:
    """Every value of a node the renderer would put into a script, when set.

    Only the form is checked, never presence: a node may be enrolled before it
    has a deploy kernel, and the renderer says so when it has to boot one."""
    where = {"driver_info": driver_info or {}, "instance_info": instance_info or {}}
    for section, names in (("driver_info", DRIVER_INFO_URLS), ("instance_info", INSTANCE_INFO_URLS)):
        for name in names:
            if where[section].get(name) not in (None, ""):
                check_url(where[section][name], field=f"{section} {name}")
    for section, names in KERNEL_ARGUMENT_FIELDS.items():
        for name in names:
            value = where[section].get(name)
            if value not in (None, ""):
                if not isinstance(value, str):
                    raise UnsafeValue(f"{section} {name} must be a string")
                check_kernel_args(value.replace(DEFAULT_PLACEHOLDER, ""), field=f"{section} {name}")
    if where["instance_info"].get("nfs_root") not in (None, ""):
        try:
            check_nfs_root(where["instance_info"]["nfs_root"])
        except UnsafeValue as exc:
            raise UnsafeValue(f"instance_info nfs_root: {exc}") from None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def check_volume_target_values(volume_type: Any, properties: Mapping[str, Any] | None, *, field: str) -> None:
    """The properties of a boot volume the renderer would put into a script, when set."""
    props = properties or {}
    if volume_type == "iscsi":
        for key in ("target_portal", "target_portals"):
            for portal in _as_list(props.get(key)) if props.get(key) not in (None, "", []) else []:
                check_portal(portal, field=f"{field} {key}")
        for key in ("target_iqn", "target_iqns"):
            for iqn in _as_list(props.get(key)) if props.get(key) not in (None, "", []) else []:
                check_iqn(iqn, field=f"{field} {key}")
        for key in ("target_lun", "target_luns"):
            for lun in _as_list(props.get(key)) if props.get(key) is not None else []:
                check_lun(lun, field=f"{field} {key}")
        if str(props.get("auth_method") or "").upper() == "CHAP":
            for key in ("auth_username", "auth_password"):
                if props.get(key) is not None:
                    check_chap(props[key], field=f"{field} {key}")
    elif volume_type == "fibre_channel":
        if props.get("target_wwn") not in (None, "", []):
            for wwn in _as_list(props["target_wwn"]):
                check_wwn(wwn, field=f"{field} target_wwn")
        if props.get("target_lun") is not None:
            check_lun(props["target_lun"], field=f"{field} target_lun")
    elif volume_type == "nfs":
        # The parts check_nfs joins, each when set.
        if props.get("nfs_server") not in (None, ""):
            check_host(props["nfs_server"], field=f"{field} nfs_server")
        if props.get("nfs_path") not in (None, "") or props.get("nfs_options") not in (None, ""):
            check_nfs("localhost", props.get("nfs_path") or "/", props.get("nfs_options"))


def check_volume_connector_values(connector_type: Any, connector_id: Any, *, field: str) -> None:
    """An ``iqn`` connector is the initiator name the renderer sets."""
    if connector_type == "iqn":
        check_iqn(connector_id, field=f"{field} connector_id")
