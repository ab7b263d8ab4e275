"""Typed, frozen configuration for every Ferrum service.

Settings come from three layers, later ones winning: dataclass defaults, an
optional TOML file (``FERRUM_CONFIG`` or ``--config``), then ``FERRUM_*``
environment variables. Only ``main`` (the CLI) reads the environment; services
receive a frozen ``Settings`` and never look anything up globally.

Every option has exactly one environment name: ``FERRUM_<SECTION>_<KEY>`` for
section options (``FERRUM_API_PORT``) and ``FERRUM_<KEY>`` for top-level ones
(``FERRUM_STATE_DIR``). Unknown names in the file or the environment are
errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.common.db.credentials import mask_password
from services.common.keyring import KeyringError, decode_key


class ConfigError(Exception):
    """A configuration value is missing, malformed or unknown."""


@dataclasses.dataclass(frozen=True)
class DatabaseConfig:
    """Where node state lives. An empty url means the embedded PostgreSQL."""

    url: str = ""
    pool_min: int = 1
    pool_max: int = 10
    embedded_port: int = 0
    embedded_fsync: bool = True


@dataclasses.dataclass(frozen=True)
class ApiConfig:
    host: str = "127.0.0.1"
    port: int = 6385
    grpc_port: int = 6386
    auth_strategy: str = "noauth"
    htpasswd_file: str = ""
    # http_basic's bcrypt checks (services/common/basic_auth.py): threads, how
    # many may be running or waiting before 503, how long a success is reused.
    auth_workers: int = 2
    auth_max_pending: int = 64
    auth_cache_ttl: float = 30.0
    public_endpoint: str = ""
    max_json_body_size: int = 1024 * 1024
    max_json_body_size_provision: int = 64 * 1024 * 1024
    max_json_body_depth: int = 25
    max_limit: int = 1000
    # Rendered node documents a list reuses while their rows are unchanged
    # (services/api/node_documents.py); 0 renders every listed node again.
    node_document_cache: int = 4096
    conductor_timeout: float = 30.0
    node_locked_retry_attempts: int = 30
    node_locked_retry_interval: float = 0.1
    ring_refresh_interval: float = 2.0
    ready_timeout: float = 30.0
    renderer_address: str = ""
    ramdisk_heartbeat_timeout: int = 300
    http_max_connections: int = 4096
    http_header_timeout: float = 10.0


@dataclasses.dataclass(frozen=True)
class ConductorConfig:
    host: str = "127.0.0.1"
    grpc_port: int = 6387
    metrics_port: int = 6388
    hostname: str = ""
    conductor_group: str = ""
    enabled_hardware_types: tuple[str, ...] = ("fake-hardware", "redfish", "ipmi")
    enabled_boot_interfaces: tuple[str, ...] = ("fake", "ipxe")
    enabled_deploy_interfaces: tuple[str, ...] = ("fake", "direct", "iscsi")
    enabled_power_interfaces: tuple[str, ...] = ("fake", "redfish", "ipmitool")
    enabled_management_interfaces: tuple[str, ...] = ("fake", "redfish", "ipmitool")
    enabled_storage_interfaces: tuple[str, ...] = ("noop", "external", "fake")
    enabled_network_interfaces: tuple[str, ...] = ("noop",)
    enabled_vendor_interfaces: tuple[str, ...] = ("no-vendor", "fake")
    enabled_inspect_interfaces: tuple[str, ...] = ("no-inspect", "fake", "agent")
    enabled_console_interfaces: tuple[str, ...] = ("no-console",)
    enabled_raid_interfaces: tuple[str, ...] = ("no-raid", "agent")
    enabled_bios_interfaces: tuple[str, ...] = ("no-bios", "redfish")
    enabled_rescue_interfaces: tuple[str, ...] = ("no-rescue", "fake", "agent")
    enabled_firmware_interfaces: tuple[str, ...] = ("no-firmware", "fake", "redfish")
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 30.0
    liveness_check_interval: float = 1.0
    liveness_restart_grace: float = 10.0
    lock_lease: float = 60.0
    workers: int = 200
    automated_clean: bool = True
    deploy_callback_timeout: float = 1800.0
    clean_callback_timeout: float = 1800.0
    # How long a ramdisk may go without calling back in the other wait states
    # (Ironic's rescue_callback_timeout, inspect_wait_timeout and service wait).
    rescue_callback_timeout: float = 1800.0
    inspect_wait_timeout: float = 1800.0
    service_callback_timeout: float = 1800.0
    # Clean and service steps run on child nodes (``execute_on_child_nodes``, docs/cleaning.md):
    # a locked child is tried this many times, this many seconds apart (Ironic's
    # node_locked_retry_attempts/_interval), and a child step that answers "wait" fails the
    # parent's step unless permitted (Ironic's permit_child_node_step_async_result).
    child_node_locked_retry_attempts: int = 3
    child_node_locked_retry_interval: float = 1.0
    permit_child_node_step_async_result: bool = False
    # Priorities of the agent's disk erase steps in automated cleaning (Ironic's
    # [deploy] options); 0 keeps a step for manual cleaning only.
    erase_devices_metadata_priority: int = 99
    erase_devices_priority: int = 0
    # crypt(3) method for rescue passwords: sha256 ($5$) or sha512 ($6$), as Ironic.
    rescue_password_hash_algorithm: str = "sha256"
    timeout_check_interval: float = 60.0
    power_sync_interval: float = 120.0
    # How many BMCs one power sync asks at once, and after how many failed reads in a row a
    # node goes into maintenance with fault "power failure" (Ironic's
    # power_state_sync_max_retries); a later good read takes it out again.
    power_sync_workers: int = 64
    power_state_sync_max_retries: int = 3
    fake_power_delay: str = "0"
    fake_boot_delay: str = "0"
    fake_deploy_delay: str = "0"
    fake_management_delay: str = "0"
    fake_storage_delay: str = "0"
    fake_vendor_delay: str = "0"
    fake_inspect_delay: str = "0"
    # Inspection rules (docs/cleaning.md): a YAML list of built-in rules run after every
    # in-band inspection with the stored ones, and whether rules read the inventory's
    # passwords as "***" (always, never, or only for rules not marked sensitive).
    inspection_rules_file: str = ""
    inspection_rules_mask_secrets: str = "always"
    fake_rescue_delay: str = "0"
    # The cinder storage interface (services/conductor/drivers/cinder.py, docs/boot-from-volume.md):
    # Ironic's [cinder] options, here in the conductor's section with a cinder_ prefix.
    cinder_url: str = ""
    cinder_url_timeout: float = 30.0
    cinder_retries: int = 3
    cinder_retry_interval: float = 5.0
    cinder_auth_strategy: str = "noauth"
    cinder_project_id: str = ""
    cinder_auth_url: str = ""
    cinder_username: str = ""
    cinder_password: str = ""
    cinder_user_domain_name: str = "Default"
    cinder_project_name: str = ""
    cinder_project_domain_name: str = "Default"
    toggle_attachments_with_power: bool = True
    redfish_power_timeout: float = 60.0
    redfish_poll_interval: float = 1.0
    redfish_request_timeout: float = 30.0
    redfish_workers: int = 16
    redfish_bios_apply_timeout: float = 600.0
    # The ipmitool power and management interfaces (services/conductor/drivers/ipmi.py, docs/ipmi.md):
    # how long a power change may take to show (polled every ipmi_poll_interval), the deadline of
    # one IPMI request including its retries with a fresh session (ipmi_retries attempts at most),
    # the worker threads pyghmi's blocking calls run in, how many BMC sessions are kept open (least
    # recently used logged out first) and after how long idle a session gets a keep-alive (0: none).
    ipmi_power_timeout: float = 60.0
    ipmi_poll_interval: float = 1.0
    ipmi_timeout: float = 10.0
    ipmi_retries: int = 3
    ipmi_workers: int = 16
    ipmi_max_sessions: int = 10_000
    ipmi_keepalive_interval: float = 30.0
    objectstore_address: str = ""
    configdrive_use_object_store: bool = True
    configdrive_container: str = "ironic_configdrive_container"
    configdrive_inline_limit: int = 4 * 1024 * 1024
    # With the object store: gzip+base64 drive strings up to this many bytes stay in
    # instance_info as sent (Ironic's default for every drive); longer ones, plain base64
    # and drives built from a dict are uploaded. 0 uploads every drive.
    configdrive_upload_threshold: int = 64 * 1024
    agent_command_timeout: float = 60.0
    agent_power_off_timeout: float = 30.0
    # Virtual-media boot (docs/virtual-media.md): the floppy and per-node ISOs live this
    # many seconds in the object store, and their temp URLs as long (seed 002: 10 minutes).
    deploy_helper_images_ttl: int = 600
    vmedia_container: str = "ironic_vmedia_container"
    vmedia_kernel_append_params: str = "nofb vga=normal console=tty0 console=ttyS0,115200n8"
    vmedia_api_url: str = ""  # what the floppy tells the agent; empty = the api's public endpoint or this process's api
    vmedia_work_dir: str = ""  # kernels, ramdisks and ISOs while they are built; empty = <state_dir>/vmedia/<hostname>
    vmedia_download_timeout: float = 60.0  # connect and per-read timeout of kernel, ramdisk and ESP downloads
    vmedia_max_download: int = 2 * 1024**3
    # iSCSI deploy (docs/deploy.md): the conductor's image cache (empty = <state_dir>/image-cache/<hostname>)
    # and its bound, the initiator name the ramdisk's target admits (empty = Ferrum's, one for all conductors), and
    # how the ramdisk reports its exposed disk by default (pass_deploy_info or heartbeat).
    image_cache_dir: str = ""
    image_cache_max_bytes: int = 20 * 1024**3
    iscsi_initiator_iqn: str = ""
    iscsi_callback: str = "pass_deploy_info"
    iscsi_stall_timeout: float = 60.0  # seconds an iSCSI write may move no data before it fails
    # Serial consoles (docs/console.md): each enabled console is a proxy in the conductor that
    # owns the node, listening on console_host (raw TCP, one port per console: from
    # console_port_range "LOW:HIGH", or ephemeral when empty) and reachable as a WebSocket
    # on one port per conductor (console_websocket_port, 0 = ephemeral). At most
    # max_consoles run per conductor and console_max_clients clients per console; a new
    # client first gets the last console_scrollback bytes. The ``simulator`` console polls
    # the BMC's console log every console_poll_interval seconds; console_check_interval is
    # how often a conductor starts the consoles of nodes it took over (and stops the ones
    # it no longer owns).
    console_host: str = "127.0.0.1"
    console_port_range: str = ""
    console_websocket_port: int = 0
    max_consoles: int = 100
    console_max_clients: int = 4
    console_scrollback: int = 16 * 1024
    console_poll_interval: float = 1.0
    console_check_interval: float = 10.0


@dataclasses.dataclass(frozen=True)
class IpxeConfig:
    """The boot-script renderer. ``api_url`` goes into the agent's kernel
    arguments (empty: the api's public endpoint, else its host and port);
    ``public_url`` is the renderer's own base URL for boot.ipxe's chain lines
    (empty: taken from the request's Host header). ``cache_ttl`` > 0 keeps
    boot data and rendered replies in memory for at most that long, evicted
    per node as soon as its boot data changes (NOTIFY ferrum_boot_data);
    ``cache_max_entries`` bounds each layer (about 2.6 KB per cached node).
    ``http_max_connections`` is high because a boot storm opens one
    connection per machine at once. ``agent_ca_file`` is the path, inside
    the deploy ramdisk, of the CA bundle the agent verifies an https api
    with; rendered as ``ipa-cafile=`` (``ferrum stack --tls`` sets it to its
    local CA, which in-process simulated machines read from this host)."""

    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int = 8081
    api_url: str = ""
    public_url: str = ""
    kernel_append_params: str = "nofb vga=normal console=tty0 console=ttyS0,115200n8"
    default_boot_mode: str = "uefi"
    boot_timeout: float = 60.0
    boot_retries: int = 10
    retry_delay: int = 10
    max_nics: int = 8
    cache_ttl: float = 30.0
    cache_max_entries: int = 100_000
    http_max_connections: int = 10_000
    http_header_timeout: float = 10.0
    agent_ca_file: str = ""


@dataclasses.dataclass(frozen=True)
class ObjectStoreConfig:
    host: str = "127.0.0.1"
    grpc_port: int = 6390
    http_port: int = 6391
    backend: str = "filesystem"
    root: str = ""
    public_url: str = ""
    temp_url_secret: str = ""
    temp_url_default_lifetime: int = 900
    temp_url_max_lifetime: int = 7 * 86400
    max_object_size: int = 16 * 1024**3
    max_container_size: int = 256 * 1024**3
    sweep_interval: float = 30.0
    orphan_grace: float = 3600.0
    download_mode: str = "proxy"
    s3_endpoint_url: str = ""
    s3_bucket: str = "ferrum-objects"
    s3_prefix: str = ""
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    s3_part_size: int = 16 * 1024**2
    s3_presign_version: str = "s3v4"
    http_max_connections: int = 4096
    http_header_timeout: float = 10.0
    direct_io: bool = True  # filesystem backend: uploads bypass the page cache (O_DIRECT) where possible


@dataclasses.dataclass(frozen=True)
class SecurityConfig:
    """Credentials between Ferrum's own services (docs/security.md).

    ``internal_token``: what api, conductors and renderers present to each
    other's gRPC services (and the conductor to the object store). Empty means
    one generated at first start and kept in PostgreSQL, which every Ferrum
    process shares, so nothing needs configuring for one host, compose or
    Kubernetes. Set it (at least 32 characters) to choose your own.

    ``secret_key`` / ``secret_key_file``: the keys that encrypt BMC passwords,
    agent tokens and config drives at rest (services/common/keyring.py). A
    single base64 key, or a file of keys, the first current; neither means no
    encryption at rest.

    ``tls_cert_file`` / ``tls_key_file``: PEM certificate (chain) and key that
    the REST and every internal gRPC listener serve TLS with; set both or
    neither. When set, internal clients also call over TLS and verify servers
    against ``tls_ca_file`` (empty: the system trust store). One section for
    all services because they share one certificate and must agree on TLS,
    like the internal token (services/common/tls.py)."""

    internal_token: str = ""
    secret_key: str = ""
    secret_key_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a Ferrum process may need; each service reads its section."""

    state_dir: str = ".ferrum"
    log_level: str = "INFO"
    log_format: str = "text"
    database: DatabaseConfig = DatabaseConfig()
    api: ApiConfig = ApiConfig()
    conductor: ConductorConfig = ConductorConfig()
    ipxe: IpxeConfig = IpxeConfig()
    objectstore: ObjectStoreConfig = ObjectStoreConfig()
    security: SecurityConfig = SecurityConfig()

    def conductor_hostname(self) -> str:
        """The name a conductor holds locks under: configured, else host:pid."""
        return self.conductor.hostname or f"{socket.gethostname()}-{os.getpid()}"


SECTIONS = ("database", "api", "conductor", "ipxe", "objectstore", "security")
CONFIG_FILE_ENV = "FERRUM_CONFIG"
# Ironic's ``[cinder]`` options (seed 004) may be written as a section of their own in the
# config file; they are the conductor's ``cinder_*`` options (and its toggle_attachments_with_power).
CINDER_SECTION_KEYS = (
    "url",
    "url_timeout",
    "retries",
    "retry_interval",
    "auth_strategy",
    "project_id",
    "auth_url",
    "username",
    "password",
    "user_domain_name",
    "project_name",
    "project_domain_name",
)
_PORT_KEYS = ("port", "grpc_port", "metrics_port", "http_port", "embedded_port")


def env_name(section: str | None, key: str) -> str:
    """The single environment variable name of an option."""
    return f"FERRUM_{section.upper()}_{key.upper()}" if section else f"FERRUM_{key.upper()}"


def option_env_names() -> dict[str, tuple[str | None, str]]:
    """Every environment name Ferrum reads, mapped to (section, key)."""
    names: dict[str, tuple[str | None, str]] = {CONFIG_FILE_ENV: (None, "__config__")}
    for field in dataclasses.fields(Settings):
        if field.name in SECTIONS:
            for sub in dataclasses.fields(_section_type(field.name)):
                names[env_name(field.name, sub.name)] = (field.name, sub.name)
        else:
            names[env_name(None, field.name)] = (None, field.name)
    return names


def _section_type(name: str) -> type:
    return type(getattr(Settings(), name))


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a raw TOML or environment value to the option's declared type."""
    origin = typing.get_origin(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected a boolean, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if hint is float:
        try:
            return float(str(value).strip())
        except ValueError:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if origin is tuple:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{where}: expected a list of names, got {value!r}")
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported option type {hint!r}")  # pragma: no cover


def _apply(raw: dict[str | None, dict[str, Any]], source: str) -> dict[str | None, dict[str, Any]]:
    """Type-check raw values per section; unknown keys are errors."""
    result: dict[str | None, dict[str, Any]] = {}
    top_hints = _field_types(Settings)
    for section, values in raw.items():
        cls = _section_type(section) if section else Settings
        hints = _field_types(cls)
        for key, value in values.items():
            if key not in hints or (section is None and key in SECTIONS):
                where = f"[{section}] {key}" if section else key
                raise ConfigError(f"unknown option {where} in {source}")
            hint = hints[key] if section else top_hints[key]
            label = (
                env_name(section, key)
                if source == "environment"
                else f"{source}: {section + '.' if section else ''}{key}"
            )
            result.setdefault(section, {})[key] = _coerce(value, hint, label)
    return result


def _read_toml(path: Path) -> dict[str | None, dict[str, Any]]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    raw: dict[str | None, dict[str, Any]] = {}
    for key, value in data.items():
        if key == "cinder" and isinstance(value, dict):
            conductor = raw.setdefault("conductor", {})
            for option, setting in value.items():
                if option in CINDER_SECTION_KEYS:
                    conductor[f"cinder_{option}"] = setting
                elif option == "toggle_attachments_with_power":
                    conductor[option] = setting
                else:
                    raise ConfigError(f"unknown option [cinder] {option} in {path}")
        elif key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: [{key}] must be a table")
            raw.setdefault(key, {}).update(value)
        elif isinstance(value, dict):
            raise ConfigError(f"unknown section [{key}] in {path}")
        else:
            raw.setdefault(None, {})[key] = value
    return raw


def _read_env(env: Mapping[str, str]) -> dict[str | None, dict[str, Any]]:
    known = option_env_names()
    raw: dict[str | None, dict[str, Any]] = {}
    for name, value in env.items():
        if not name.startswith("FERRUM_") or name == CONFIG_FILE_ENV:
            continue
        if name not in known:
            raise ConfigError(f"unknown environment variable {name}")
        section, key = known[name]
        raw.setdefault(section, {})[key] = value
    return raw


def _merge(*layers: dict[str | None, dict[str, Any]]) -> Settings:
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for layer in layers:
        for section, values in layer.items():
            (sections[section] if section else top).update(values)
    built = {name: dataclasses.replace(_section_type(name)(), **values) for name, values in sections.items()}
    return Settings(**top, **built)


def validate(settings: Settings) -> Settings:
    """Reject values that are well-typed but cannot work."""
    url = settings.database.url
    if url:
        shown = mask_password(url)  # error messages reach terminals and logs
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres") or (not parts.hostname and "host=" not in parts.query):
            raise ConfigError(
                f"FERRUM_DATABASE_URL {shown!r} is not a PostgreSQL URL "
                "(expected postgresql://user[:password]@host[:port]/dbname)"
            )
        try:
            _ = parts.port  # urlsplit validates the port lazily
        except ValueError:
            raise ConfigError(f"FERRUM_DATABASE_URL {shown!r} has an invalid port") from None
    for section in SECTIONS:
        values = getattr(settings, section)
        for key in _PORT_KEYS:
            if hasattr(values, key) and not 0 <= getattr(values, key) <= 65535:
                raise ConfigError(f"{env_name(section, key)} must be between 0 and 65535")
    if settings.conductor.inspection_rules_mask_secrets not in ("always", "never", "sensitive"):
        raise ConfigError("FERRUM_CONDUCTOR_INSPECTION_RULES_MASK_SECRETS must be always, never or sensitive")
    if settings.api.auth_strategy not in ("noauth", "http_basic"):
        raise ConfigError("FERRUM_API_AUTH_STRATEGY must be noauth or http_basic")
    if settings.api.auth_strategy == "http_basic" and not settings.api.htpasswd_file:
        raise ConfigError("FERRUM_API_AUTH_STRATEGY=http_basic needs FERRUM_API_HTPASSWD_FILE")
    if settings.api.auth_workers < 1 or settings.api.auth_max_pending < 1:
        raise ConfigError("FERRUM_API_AUTH_WORKERS and FERRUM_API_AUTH_MAX_PENDING must be at least 1")
    if not 0 <= settings.api.auth_cache_ttl <= 60:
        raise ConfigError("FERRUM_API_AUTH_CACHE_TTL must be between 0 (no cache) and 60 seconds")
    if settings.objectstore.backend not in ("filesystem", "s3"):
        raise ConfigError("FERRUM_OBJECTSTORE_BACKEND must be filesystem or s3")
    _validate_objectstore(settings.objectstore)
    _validate_ipxe(settings.ipxe)
    _validate_security(settings.security)
    _validate_conductor(settings.conductor)
    if settings.log_format not in ("text", "json"):
        raise ConfigError("FERRUM_LOG_FORMAT must be text or json")
    if settings.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError("FERRUM_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR")
    if settings.database.pool_min < 1 or settings.database.pool_max < settings.database.pool_min:
        raise ConfigError("database pool sizes need 1 <= pool_min <= pool_max")
    for section in ("api", "ipxe", "objectstore"):
        _validate_listener(section, getattr(settings, section))
    return settings


def _validate_listener(section: str, values: ApiConfig | IpxeConfig | ObjectStoreConfig) -> None:
    """The HTTP listener's connection bounds (services/common/connection_guard.py)."""
    if values.http_max_connections < 1:
        raise ConfigError(f"{env_name(section, 'http_max_connections')} must be at least 1")
    if values.http_header_timeout <= 0:
        raise ConfigError(f"{env_name(section, 'http_header_timeout')} must be positive (seconds)")


def console_port_range(value: str) -> tuple[int, int] | None:
    """``"LOW:HIGH"`` (inclusive) as two ports; None when empty (ephemeral ports)."""
    text = value.strip()
    if not text:
        return None
    low, sep, high = text.partition(":")
    try:
        first, last = int(low), int(high)
    except ValueError:
        first, last = 0, -1
    if not sep or not 1 <= first <= last <= 65535:
        raise ConfigError(f"{env_name('conductor', 'console_port_range')} must be LOW:HIGH ports, got {value!r}")
    return first, last


def _validate_conductor(c: ConductorConfig) -> None:
    console_port_range(c.console_port_range)
    if c.max_consoles < 0 or c.console_max_clients < 1 or c.console_scrollback < 0:
        raise ConfigError("conductor max_consoles must be >= 0, console_max_clients >= 1, console_scrollback >= 0")
    if c.console_poll_interval <= 0 or c.console_check_interval <= 0:
        raise ConfigError("conductor console_poll_interval and console_check_interval must be > 0")
    if not 0 <= c.console_websocket_port <= 65535:
        raise ConfigError(f"{env_name('conductor', 'console_websocket_port')} must be a port (0 = ephemeral)")
    if c.cinder_auth_strategy not in ("noauth", "keystone"):
        raise ConfigError(f"conductor cinder_auth_strategy must be noauth or keystone, not {c.cinder_auth_strategy!r}")
    if c.cinder_url_timeout <= 0 or c.cinder_retries < 0 or c.cinder_retry_interval < 0:
        raise ConfigError("conductor cinder_url_timeout must be > 0, cinder_retries and cinder_retry_interval >= 0")
    if c.power_sync_workers < 1 or c.power_state_sync_max_retries < 1:
        raise ConfigError("conductor power_sync_workers and power_state_sync_max_retries must be at least 1")
    if c.rescue_password_hash_algorithm not in ("sha256", "sha512"):
        raise ConfigError("FERRUM_CONDUCTOR_RESCUE_PASSWORD_HASH_ALGORITHM must be sha256 or sha512")
    if c.iscsi_callback not in ("pass_deploy_info", "heartbeat"):
        raise ConfigError(f"{env_name('conductor', 'iscsi_callback')} must be pass_deploy_info or heartbeat")
    if c.image_cache_max_bytes <= 0:
        raise ConfigError(f"{env_name('conductor', 'image_cache_max_bytes')} must be a positive number of bytes")
    if c.iscsi_stall_timeout <= 0:
        raise ConfigError(f"{env_name('conductor', 'iscsi_stall_timeout')} must be a positive number of seconds")
    for key in ("erase_devices_metadata_priority", "erase_devices_priority"):
        if getattr(c, key) < 0:
            raise ConfigError(f"{env_name('conductor', key)} must be 0 (manual only) or a positive priority")


def _validate_objectstore(c: ObjectStoreConfig) -> None:
    if c.download_mode not in ("proxy", "presigned"):
        raise ConfigError("FERRUM_OBJECTSTORE_DOWNLOAD_MODE must be proxy or presigned")
    if c.download_mode == "presigned" and c.backend != "s3":
        raise ConfigError("FERRUM_OBJECTSTORE_DOWNLOAD_MODE=presigned needs FERRUM_OBJECTSTORE_BACKEND=s3")
    if c.backend == "s3" and not c.s3_bucket:
        raise ConfigError("FERRUM_OBJECTSTORE_BACKEND=s3 needs FERRUM_OBJECTSTORE_S3_BUCKET")
    if c.s3_presign_version not in ("s3v4", "s3"):
        raise ConfigError("FERRUM_OBJECTSTORE_S3_PRESIGN_VERSION must be s3v4 or s3 (V2 query signatures)")
    if c.s3_part_size < 5 * 1024**2:
        raise ConfigError("FERRUM_OBJECTSTORE_S3_PART_SIZE must be at least 5 MiB (S3's minimum part size)")
    if c.max_object_size < 1 or c.max_container_size < 1:
        raise ConfigError("FERRUM_OBJECTSTORE_MAX_OBJECT_SIZE and _MAX_CONTAINER_SIZE must be positive")
    if not 1 <= c.temp_url_default_lifetime <= c.temp_url_max_lifetime:
        raise ConfigError("objectstore temp URL lifetimes need 1 <= temp_url_default_lifetime <= temp_url_max_lifetime")
    if c.sweep_interval <= 0 or c.orphan_grace < 0:
        raise ConfigError("FERRUM_OBJECTSTORE_SWEEP_INTERVAL must be positive and _ORPHAN_GRACE not negative")
    if c.temp_url_secret and len(c.temp_url_secret) < 16:
        raise ConfigError("FERRUM_OBJECTSTORE_TEMP_URL_SECRET must be at least 16 characters")


def _validate_security(c: SecurityConfig) -> None:
    if c.internal_token and len(c.internal_token) < 32:
        raise ConfigError("FERRUM_SECURITY_INTERNAL_TOKEN must be at least 32 characters")
    if c.secret_key and c.secret_key_file:
        raise ConfigError(
            "set FERRUM_SECURITY_SECRET_KEY or FERRUM_SECURITY_SECRET_KEY_FILE, not both "
            "(to rotate, put both keys in the file, the new one first)"
        )
    if c.secret_key:
        try:
            decode_key(c.secret_key, where="FERRUM_SECURITY_SECRET_KEY")
        except KeyringError as exc:
            raise ConfigError(str(exc)) from None
    if bool(c.tls_cert_file) != bool(c.tls_key_file):
        raise ConfigError("set both FERRUM_SECURITY_TLS_CERT_FILE and FERRUM_SECURITY_TLS_KEY_FILE, or neither")
    if c.tls_ca_file and not c.tls_cert_file:
        raise ConfigError("FERRUM_SECURITY_TLS_CA_FILE needs FERRUM_SECURITY_TLS_CERT_FILE and _KEY_FILE (TLS is off)")


def _validate_ipxe(c: IpxeConfig) -> None:
    for key in ("api_url", "public_url"):
        value = getattr(c, key)
        if value and not re.fullmatch(r"https?://[A-Za-z0-9.\-_~:/\[\]@%+,;=]+", value):
            raise ConfigError(f"{env_name('ipxe', key)} must be an http(s) URL without spaces or iPXE specials")
    if c.agent_ca_file and not re.fullmatch(r"/[A-Za-z0-9._\-/+]+", c.agent_ca_file):
        raise ConfigError("FERRUM_IPXE_AGENT_CA_FILE must be an absolute path of letters, digits and ._-/+")
    if c.default_boot_mode not in ("bios", "uefi"):
        raise ConfigError("FERRUM_IPXE_DEFAULT_BOOT_MODE must be bios or uefi")
    if c.boot_timeout <= 0 or c.boot_retries < 1 or c.retry_delay < 1 or not 1 <= c.max_nics <= 32:
        raise ConfigError("ipxe needs boot_timeout > 0, boot_retries >= 1, retry_delay >= 1, 1 <= max_nics <= 32")
    if c.cache_ttl < 0:
        raise ConfigError("FERRUM_IPXE_CACHE_TTL must be >= 0 (0 disables the cache)")
    if c.cache_max_entries < 1:
        raise ConfigError("FERRUM_IPXE_CACHE_MAX_ENTRIES must be >= 1 (about 2.6 KB per cached node)")


def load_settings(
    env: Mapping[str, str],
    *,
    config_file: str | None = None,
    overrides: Mapping[str | None, Mapping[str, Any]] | None = None,
) -> Settings:
    """Build the frozen settings from file, environment and CLI overrides.

    ``overrides`` are already-typed values from command-line flags; they win
    over everything because the operator typed them last.
    """
    path = config_file or env.get(CONFIG_FILE_ENV)
    layers = []
    if path:
        layers.append(_apply(_read_toml(Path(path)), str(path)))
    layers.append(_apply(_read_env(env), "environment"))
    if overrides:
        layers.append({section: dict(values) for section, values in overrides.items()})
    return validate(_merge(*layers))


def describe_options() -> str:
    """A listing of every option with its environment name and default, for docs and --help."""
    lines = []
    defaults = Settings()
    for name, (section, key) in sorted(option_env_names().items()):
        if key == "__config__":
            lines.append(f"{name}  path of a TOML config file")
            continue
        value = getattr(getattr(defaults, section), key) if section else getattr(defaults, key)
        if isinstance(value, tuple):
            value = ",".join(value)
        lines.append(f"{name}  (default: {value!r})")
    return "\n".join(lines)


def frozen_copy(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only view, for handing configuration pieces to plugins."""
    return types.MappingProxyType(dict(mapping))
