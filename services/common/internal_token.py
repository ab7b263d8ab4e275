"""The token Ferrum's services present to each other (services/common/grpc_auth.py)."""

from __future__ import annotations

import asyncpg

from services.common.config import Settings
from services.common.db.service_secrets import SecretRepository

SECRET_NAME = "internal-grpc-token"


async def internal_token(settings: Settings, pool: asyncpg.Pool) -> str:
    """The configured token, else the one generated once and shared through PostgreSQL."""
    if settings.security.internal_token:
        return settings.security.internal_token
    return await SecretRepository(pool).get_or_create(SECRET_NAME)
