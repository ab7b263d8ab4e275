"""The project a request acts for, carried from the api to the conductors.

Ferrum has no Keystone: every REST caller is a system-scoped administrator.
A client may still name the project it acts for in ``X-Project-Id`` (the
header keystonemiddleware sets in an OpenStack deployment). That can only
narrow what the caller may do: a runbook that is neither public nor owned by
that project cannot be used, and a runbook created under it belongs to it
(REST 1.92). The project is also what the node history records as the
``project`` of an entry written while serving the request (REST 1.113), so
the api passes it to the conductor in gRPC metadata, next to the request id,
and the conductor's flows inherit it through this context variable.
"""

from __future__ import annotations

import contextvars

from services.common import errors

HEADER = "X-Project-Id"
METADATA_KEY = "x-project-id"
MAX_LENGTH = 255  # Ironic's project columns (owner, lessee, node_history.project)

project_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("project", default=None)


def parse_project(value: str | None) -> str | None:
    """The header's project, or None (system scope) when absent or blank; 400 when too long."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if len(value) > MAX_LENGTH:
        raise errors.InvalidParameterValue(f"{HEADER} is longer than {MAX_LENGTH} characters")
    return value


def metadata() -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that carries the current project to a conductor (none for system scope)."""
    project = project_var.get()
    return () if project is None else ((METADATA_KEY, project),)
