"""Addresses that services sharing one state dir record for each other.

``ferrum stack --ephemeral`` (and ``ferrum demo``) bind every port to 0, and
the renderer starts before the api, so neither can know the other's port
from the configuration:

- the renderer writes its bound gRPC address to
  ``<state_dir>/run/ipxe-grpc-address`` (removed on stop); an api without
  ``FERRUM_API_RENDERER_ADDRESS`` reads it for the ipxe_config passthru;
- the api writes its bound REST URL to ``<state_dir>/run/api-url``; a
  renderer that cannot derive ``ipa-api-url`` from its configuration (no
  ``FERRUM_IPXE_API_URL``, no public endpoint, api port 0) reads it per render.

Across machines, set the addresses explicitly.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.common.config import Settings


def address_file(settings: Settings) -> Path:
    return Path(settings.state_dir) / "run" / "ipxe-grpc-address"


def api_url_file(settings: Settings) -> Path:
    return Path(settings.state_dir) / "run" / "api-url"


def _write(path: Path, value: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)
    return path


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def record_address(settings: Settings, address: str) -> Path:
    """Atomically write ``address`` (host:port) for local apis to find."""
    return _write(address_file(settings), address)


def record_api_url(settings: Settings, url: str) -> Path:
    """Atomically write the api's bound REST URL for a local renderer to find."""
    return _write(api_url_file(settings), url)


def recorded_api_url(settings: Settings) -> str:
    return _read(api_url_file(settings))


def forget_address(settings: Settings, address: str) -> None:
    """Remove the record if it is still ours (another replica may have replaced it)."""
    path = address_file(settings)
    try:
        if path.read_text().strip() == address:
            path.unlink()
    except FileNotFoundError:
        pass


def renderer_address(settings: Settings) -> str:
    """The api's renderer: configured, else recorded, else the configured ipxe host:grpc_port."""
    if settings.api.renderer_address:
        return settings.api.renderer_address
    recorded = _read(address_file(settings))
    if recorded:
        return recorded
    if settings.ipxe.grpc_port:
        return f"{settings.ipxe.host}:{settings.ipxe.grpc_port}"
    return ""
