"""Where a renderer's gRPC address is recorded for an api in the same state dir.

``ferrum stack`` starts the renderer before the api, both usually on port 0.
The renderer writes its bound address to ``<state_dir>/run/ipxe-grpc-address``
(and removes it on stop); an api without ``FERRUM_API_RENDERER_ADDRESS``
reads it. Across machines, set the address explicitly.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.common.config import Settings


def address_file(settings: Settings) -> Path:
    return Path(settings.state_dir) / "run" / "ipxe-grpc-address"


def record_address(settings: Settings, address: str) -> Path:
    """Atomically write ``address`` (host:port) for local apis to find."""
    path = address_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(address + "\n")
    os.replace(tmp, path)
    return path


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
    try:
        recorded = address_file(settings).read_text().strip()
    except (FileNotFoundError, OSError):
        recorded = ""
    if recorded:
        return recorded
    if settings.ipxe.grpc_port:
        return f"{settings.ipxe.host}:{settings.ipxe.grpc_port}"
    return ""
