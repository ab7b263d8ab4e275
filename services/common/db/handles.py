"""What a repository runs its SQL on.

The pool for a statement of its own, or one connection inside a caller's
transaction: a plain connection, or the proxy ``pool.acquire()`` lends.
"""

from __future__ import annotations

from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

Database: TypeAlias = asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy
