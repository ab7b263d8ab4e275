"""Telling "the database is unreachable" apart from every other failure.

A PostgreSQL restart or fail-over must not turn into 500s or failed deploys:
the api answers 503 with ``Retry-After`` (agents and clients retry), gRPC
answers UNAVAILABLE, and a conductor flow waits for the database and resumes
from its recorded step. All of them need the same test for "connection
lost", which asyncpg spreads over several exception families.
"""

from __future__ import annotations

import errno

import asyncpg

from services.common import errors

# A refused or reset TCP connection (server down), a server shutting down or
# still starting, a connection closed under a running query, no free slots.
_UNAVAILABLE = (
    ConnectionError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
)


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the database could not be reached, not that a query was wrong."""
    if isinstance(exc, (errors.DatabaseUnavailable, *_UNAVAILABLE)):
        return True
    if isinstance(exc, asyncpg.InterfaceError):
        # asyncpg's "connection is closed" / "connection was closed in the middle of operation".
        return "closed" in str(exc) and "pool is closing" not in str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH)
    return False


def unavailable(exc: BaseException) -> errors.DatabaseUnavailable:
    """The error the api and gRPC layers answer with (no internals in the message)."""
    if isinstance(exc, errors.DatabaseUnavailable):
        return exc
    return errors.DatabaseUnavailable(
        "The database is temporarily unavailable (restarting or unreachable); nothing was changed. "
        f"Retry in a few seconds. ({type(exc).__name__})"
    )
