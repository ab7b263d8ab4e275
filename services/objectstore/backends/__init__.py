"""Object store backends: ``filesystem`` (default) and ``s3``."""

from __future__ import annotations

from pathlib import Path

from services.common.config import ObjectStoreConfig
from services.objectstore.backends.base import Backend, Upload


def make_backend(config: ObjectStoreConfig, state_dir: str) -> Backend:
    """The configured backend, not started yet."""
    if config.backend == "s3":
        from services.objectstore.backends.s3 import S3Backend

        return S3Backend(config)
    from services.objectstore.backends.filesystem import FilesystemBackend

    return FilesystemBackend(Path(config.root or Path(state_dir) / "objects"), direct_io=config.direct_io)


__all__ = ["Backend", "Upload", "make_backend"]
