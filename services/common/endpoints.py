"""Where the services of one process listen: one object the runtime fills in.

``ferrum stack --ephemeral``, the demo and the tests bind every port to 0, so
a service cannot know from the configuration where another one of the same
process listens. Each service writes its bound addresses here when it
starts, and a service that needs another's address reads it here when it
needs it (not at its own start: the renderer starts before the api). An
address set in the configuration always wins; across processes and machines
the configuration is the only source.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.local_rpc import LocalServicer


@dataclasses.dataclass
class Endpoints:
    api_url: str = ""  # the api's bound REST URL, what deploy ramdisks call back
    renderer_grpc: str = ""  # the iPXE renderer's gRPC address (the api's ipxe_config passthru)
    objectstore_grpc: str = ""  # the object store's gRPC address (conductors store config drives there)
    # gRPC servicers of this process by the address they serve, while they serve it:
    # a caller of that address makes its unary calls directly (services/common/local_rpc.py).
    servicers: dict[str, LocalServicer] = dataclasses.field(default_factory=dict)

    def local(self, address: str, method: str) -> LocalServicer | None:
        """The servicer of this process at ``address`` when it serves ``method`` in-process."""
        servicer = self.servicers.get(address)
        return servicer if servicer is not None and servicer.serves(method) else None

    def local_api_url(self) -> str:
        """The api URL as a machine on this host reaches it (a wildcard bind means loopback)."""
        return self.api_url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")
