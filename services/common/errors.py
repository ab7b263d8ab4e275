"""Ferrum's one exception tree.

Each class carries its REST status, gRPC code, Ironic faultcode and whether a
client may retry, so the api and gRPC layers map errors mechanically::

    FerrumError (500, INTERNAL)
    ├── Invalid (400, INVALID_ARGUMENT)
    │   ├── InvalidParameterValue ── UnsupportedDriverExtension
    │   ├── MissingParameter, PatchError
    │   ├── InvalidStateRequested, NodeInMaintenance, DriverNotFound
    │   ├── NoValidHost
    │   └── ConfigDriveInvalid
    ├── Unauthorized (401, UNAUTHENTICATED)
    ├── Forbidden (403, PERMISSION_DENIED) ── NodeProtected
    ├── NotFound (404, NOT_FOUND) ── NodeNotFound, PortNotFound, VolumeNotFound, ObjectNotFound
    ├── NotAcceptable (406, FAILED_PRECONDITION)
    ├── SecretUnreadable (500, INTERNAL)
    ├── Conflict (409, ALREADY_EXISTS)
    │   ├── NodeLocked (ABORTED, retryable), InvalidState (FAILED_PRECONDITION)
    │   ├── TooManyConsoles (RESOURCE_EXHAUSTED): a conductor's console bound is reached
    │   ├── DuplicateName, MACAlreadyExists, NodeAssociated, InstanceAssociated
    │   └── VolumeConnectorExists, VolumeTargetBootIndexExists
    ├── PayloadTooLarge (413, INVALID_ARGUMENT)
    ├── ServiceUnavailable (503, UNAVAILABLE, retryable)
    │   ├── NoFreeConductorWorker, NoConductorAvailable, DatabaseUnavailable
    │   └── AuthenticationBusy
    ├── DriverLoadError (500): a hardware type or implementation that cannot load
    └── HardwareError (500) ── BMCError, ImageError ── ChecksumMismatch, ConfigDriveError, ImageFormatError
        └── AgentError ── AgentBusy (retryable), AgentUnreachable
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

ERROR_METADATA_KEY = "ferrum-error"


class FerrumError(Exception):
    http_status = 500
    grpc_status = "INTERNAL"
    faultcode = "Server"
    retryable = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__

    @property
    def grpc_code(self) -> grpc.StatusCode:
        """``grpc_status`` as grpc's enum. gRPC is imported only here: the deploy
        agent shares this tree in a ramdisk that has no grpc."""
        import grpc

        return grpc.StatusCode[self.grpc_status]


class Invalid(FerrumError):
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"
    faultcode = "Client"


class InvalidParameterValue(Invalid):
    pass


class UnsupportedDriverExtension(InvalidParameterValue):
    """The node's interface cannot do that verb (a ``no-*`` implementation, or a
    feature the implementation lacks); Ironic's exception of the same name."""


class MissingParameter(Invalid):
    pass


class PatchError(Invalid):
    pass


class InvalidStateRequested(Invalid):
    grpc_status = "FAILED_PRECONDITION"


class NodeInMaintenance(Invalid):
    grpc_status = "FAILED_PRECONDITION"


class DriverNotFound(Invalid):
    pass


class NoValidHost(Invalid):
    """No live conductor serves the node's driver in its conductor group, so the
    node could never be routed: refused on create and patch (Ironic turns its
    404 NoValidHost into a 400 there too)."""


class ConfigDriveInvalid(Invalid):
    pass


class Unauthorized(FerrumError):
    http_status = 401
    grpc_status = "UNAUTHENTICATED"
    faultcode = "Client"


class Forbidden(FerrumError):
    http_status = 403
    grpc_status = "PERMISSION_DENIED"
    faultcode = "Client"


class NodeProtected(Forbidden):
    pass


class NotFound(FerrumError):
    http_status = 404
    grpc_status = "NOT_FOUND"
    faultcode = "Client"


class NodeNotFound(NotFound):
    pass


class PortNotFound(NotFound):
    pass


class VolumeNotFound(NotFound):
    pass


class ObjectNotFound(NotFound):
    pass


class NotAcceptable(FerrumError):
    http_status = 406
    grpc_status = "FAILED_PRECONDITION"
    faultcode = "Client"


class Conflict(FerrumError):
    http_status = 409
    grpc_status = "ALREADY_EXISTS"
    faultcode = "Client"


class NodeLocked(Conflict):
    grpc_status = "ABORTED"
    retryable = True


class NodeChangedMeanwhile(NodeLocked):
    """A write that was to take a free node's lock found the row changed since it was read
    (services/conductor/taskmanager.py, ``acquire_at_first_write``): the conductor runs the
    operation again the usual way; a client only sees it as a 409 if it escapes."""


class InvalidState(Conflict):
    grpc_status = "FAILED_PRECONDITION"


class TooManyConsoles(Conflict):
    """The conductor already runs its ``max_consoles`` console proxies (docs/console.md)."""

    grpc_status = "RESOURCE_EXHAUSTED"


class DuplicateName(Conflict):
    pass


class MACAlreadyExists(Conflict):
    pass


class NodeAssociated(Conflict):
    grpc_status = "FAILED_PRECONDITION"


class InstanceAssociated(Conflict):
    pass


class VolumeConnectorExists(Conflict):
    pass


class VolumeTargetBootIndexExists(Conflict):
    pass


class PayloadTooLarge(FerrumError):
    http_status = 413
    grpc_status = "INVALID_ARGUMENT"
    faultcode = "Client"


class ServiceUnavailable(FerrumError):
    http_status = 503
    grpc_status = "UNAVAILABLE"
    retryable = True
    retry_after = 1  # seconds, sent as Retry-After on REST


class NoFreeConductorWorker(ServiceUnavailable):
    pass


class NoConductorAvailable(ServiceUnavailable):
    pass


class DatabaseUnavailable(ServiceUnavailable):
    """PostgreSQL cannot be reached (restarting, failing over). Nothing was
    changed; the client retries after ``retry_after`` seconds."""

    retry_after = 2


class AuthenticationBusy(ServiceUnavailable):
    """Too many password checks are already running or waiting (bcrypt is slow
    on purpose); the client retries after ``retry_after`` seconds."""


class DriverLoadError(FerrumError):
    """Driver composition is broken at conductor start: a hardware type names an
    implementation nothing provides, or a kind has no enabled implementation."""


class HardwareError(FerrumError):
    pass


class BMCError(HardwareError):
    pass


class ImageError(HardwareError):
    pass


class ChecksumMismatch(ImageError):
    pass


class ConfigDriveError(ImageError):
    """The config drive could not be placed on the disk (no slot, no room, two config-2)."""


class ImageFormatError(ImageError):
    """Bytes read from a disk or an image do not hold the format they claim (partition table, ISO9660, FAT)."""


class AgentError(HardwareError):
    """The deploy agent on the machine failed a command or cannot be reached."""


class AgentBusy(AgentError):
    retryable = True


class AgentUnreachable(AgentError):
    """No answer at the agent's callback URL (after the client's retries): the
    ramdisk may be rebooting or dead; the wait state's timeout decides which."""


class SecretUnreadable(FerrumError):
    """A secret stored encrypted cannot be decrypted with the configured keys
    (docs/security.md, "Secrets at rest"): its key is missing, or it was
    altered or moved. Refused rather than answered with anything else."""


def _all_subclasses(cls: type[FerrumError]) -> dict[str, type[FerrumError]]:
    found = {cls.__name__: cls}
    for sub in cls.__subclasses__():
        found.update(_all_subclasses(sub))
    return found


def error_class(name: str) -> type[FerrumError]:
    """The FerrumError subclass of that name; FerrumError when unknown."""
    return _all_subclasses(FerrumError).get(name, FerrumError)


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: FerrumError) -> None:
    """End a gRPC call with the error's status code and its class as metadata.

    The class name travels in trailing metadata so that the api can re-raise
    the very same error (and answer the same REST status) as the conductor.
    """
    context.set_trailing_metadata(((ERROR_METADATA_KEY, type(exc).__name__),))
    await context.abort(exc.grpc_code, exc.message)


def from_rpc_error(error: grpc.aio.AioRpcError) -> FerrumError:
    """Turn a failed gRPC call back into the FerrumError the server raised."""
    name = ""
    for key, value in error.trailing_metadata() or ():
        if key == ERROR_METADATA_KEY:
            name = value if isinstance(value, str) else value.decode()
    if name:
        return error_class(name)(error.details() or name)
    code = error.code()
    if code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return NoConductorAvailable(f"conductor unreachable: {error.details()}")
    # An unexpected failure's details may name the server's internals (exception
    # classes, SQL): they are for its log, not for the api's client.
    return FerrumError(f"conductor call failed: {code.name}")
