"""Lifting the process's soft open-files limit (RLIMIT_NOFILE).

Why: every client connection costs a descriptor, and the usual soft limit
(1,024) is far below what the listeners' connection caps allow (10,000 for
the renderer alone). Running out turns every accept, database connection
and file open into EMFILE. The soft limit may be raised up to the hard limit
without privileges, so each ``ferrum`` process does that at start and keeps
its caps below the result (``services/common/connection_guard.py`` warns
when a cap is above it).
"""

from __future__ import annotations

import logging
import resource

LOG = logging.getLogger(__name__)
# Linux refuses RLIM_INFINITY for RLIMIT_NOFILE; fs.nr_open defaults to 2**20.
UNLIMITED_TARGET = 1 << 20


def raise_open_files_limit(wanted: int | None = None) -> int:
    """Raise the soft limit to ``wanted`` (None: the hard limit), never lower it; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    target = ceiling if wanted is None else min(wanted, ceiling)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        LOG.warning("cannot raise the open-files limit from=%d wanted=%d error=%s", soft, target, exc)
        return soft
    LOG.info("raised the open-files limit from=%d to=%d", soft, target)
    return target
