"""Reading the agent's settings from a kernel command line, as IPA does.

The iPXE script passes ``ipa-api-url=<url>`` (a comma-separated list; the
first is used), ``BOOTIF=${mac}`` (iPXE gives ``52:54:00:..``, PXELINUX
``01-52-54-00-..``) and ``ipa-global-request-id``; IPA's other options are
``ipa-<option-with-dashes>``. Pure functions: the caller reads /proc/cmdline.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from services.common import errors

_MAC = re.compile(r"^([0-9a-f]{2}[:-]){5}[0-9a-f]{2}$")
_TRUE = ("1", "true", "yes", "on")


def split(cmdline: str) -> dict[str, str]:
    """``key=value`` words of a kernel command line (bare words map to ``""``); the last one wins."""
    try:
        words = shlex.split(cmdline)
    except ValueError:
        words = cmdline.split()
    found: dict[str, str] = {}
    for word in words:
        key, _, value = word.partition("=")
        found[key] = value
    return found


def with_parameters(cmdline: str, parameters: Mapping[str, str]) -> str:
    """The command line with ``parameters`` appended as words, so they win over it (``split`` keeps
    the last value of a repeated key): how the virtual floppy's values take precedence."""
    words = [f"{key}={shlex.quote(value)}" for key, value in parameters.items()]
    return " ".join([cmdline.strip(), *words]).strip()


def normalize_mac(value: str) -> str:
    """``01-AA-BB-..`` / ``aa:bb:..`` / ``aa-bb-..`` to ``aa:bb:cc:dd:ee:ff``."""
    text = value.strip().lower()
    if re.match(r"^01-([0-9a-f]{2}-){5}[0-9a-f]{2}$", text):
        text = text[3:]
    if not _MAC.match(text):
        raise errors.InvalidParameterValue(f"{value!r} is not a MAC address")
    return text.replace("-", ":")


def option_values(cmdline: str) -> dict[str, Any]:
    """AgentOptions field values found on the command line (only those present)."""
    args = split(cmdline)
    values: dict[str, Any] = {}

    def get(*names: str) -> str | None:
        for name in names:
            if name in args and args[name] != "":
                return args[name]
        return None

    if (url := get("ipa-api-url", "ipa_api_url")) is not None:
        values["api_url"] = url.split(",")[0].strip().rstrip("/")
    if (bootif := get("BOOTIF", "ipa-bootif")) is not None:
        values["macs"] = (normalize_mac(bootif),)
    for field, names in (
        ("node_uuid", ("ipa-node-uuid", "ipa_node_uuid")),
        ("agent_token", ("ipa-agent-token", "ipa_agent_token")),
        ("global_request_id", ("ipa-global-request-id", "ipa_global_request_id")),
        ("listen_host", ("ipa-listen-host",)),
        ("ca_file", ("ipa-cafile", "ipa-ca-file")),
        ("advertise_host", ("ipa-advertise-host",)),
        ("inspection_callback_url", ("ipa-inspection-callback-url",)),
        ("tls_cert_file", ("ipa-cert-file",)),
        ("tls_key_file", ("ipa-key-file",)),
    ):
        if (value := get(*names)) is not None:
            values[field] = value
    for field, names, kind in (
        ("listen_port", ("ipa-listen-port",), int),
        ("advertise_port", ("ipa-advertise-port",), int),
        ("iscsi_portal_port", ("ipa-iscsi-portal-port",), int),
        ("iscsi_advertise_port", ("ipa-iscsi-advertise-port",), int),
        ("lookup_timeout", ("ipa-lookup-timeout",), float),
        ("lookup_interval", ("ipa-lookup-interval",), float),
        ("heartbeat_interval", ("ipa-heartbeat-interval",), float),
    ):
        if (value := get(*names)) is not None:
            try:
                values[field] = kind(value)
            except ValueError:
                raise errors.InvalidParameterValue(f"kernel argument {names[0]}={value!r} is not a number") from None
    if (md5 := get("ipa-md5-checksum-enable", "ipa-allow-md5")) is not None:
        values["allow_md5"] = md5.lower() in _TRUE
    if (insecure := get("ipa-insecure")) is not None:
        values["insecure"] = insecure.lower() in _TRUE
    if (auto := get("ipa-enable-auto-tls")) is not None:
        values["auto_tls"] = auto.lower() in _TRUE
    return values
