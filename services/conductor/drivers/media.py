"""What a virtual-media boot interface needs from its conductor: images behind temp URLs.

Boot interfaces are composed from options alone and hold no connection to
the object store, so the conductor hands each task an implementation of
:class:`MediaImages` (``Task.media``, ``services/conductor/vmedia_store.py``).
The interface decides what to attach and when; this surface builds,
uploads, counts and deletes the images (docs/virtual-media.md, "Objects").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class IsoRecipe:
    """What a boot ISO is made of. Equal recipes make equal ISOs, so the recipe names the shared one."""

    kernel: str  # URL of the kernel
    ramdisk: str  # URL of the ramdisk
    kernel_params: str  # the command line, the same for every node that shares the ISO
    bootloader: str = ""  # URL of an EFI system partition image; "" = Ferrum's GRUB
    image: str = ""  # the instance image this ISO boots (seed 002: the hash covers image, kernel, ramdisk)

    def cache_name(self) -> str:
        """``boot-<sha256 of the recipe>.iso``: the object every node with this recipe shares."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return f"boot-{digest[:40]}.iso"


class MediaImages(Protocol):
    """Images for virtual media, in the conductor's object store (see the module docstring)."""

    ttl: int  # seconds the node's helper images and every temp URL live (deploy_helper_images_ttl)

    def api_url(self) -> str:
        """The api URL the agent calls back (what goes on the floppy); raises when unknown."""
        ...

    async def publish_floppy(self, node_uuid: str, parameters: Mapping[str, str]) -> str:
        """Build the parameters floppy, store it as ``image-<node uuid>`` with the TTL; its temp URL."""
        ...

    async def remove_floppy(self, node_uuid: str) -> None: ...

    async def acquire_shared_iso(self, recipe: IsoRecipe) -> str:
        """The shared ISO's name, its usage count raised by one; built (once, whoever asks) when absent."""
        ...

    async def shared_iso_url(self, name: str) -> str | None:
        """A fresh temp URL of a shared ISO, None when it no longer exists."""
        ...

    async def release_shared_iso(self, name: str) -> None:
        """Lower the usage count; the ISO is deleted when it reaches zero."""
        ...

    async def publish_node_iso(
        self, node_uuid: str, recipe: IsoRecipe, *, inject: Mapping[str, bytes] | None = None, expires: bool = True
    ) -> str:
        """Build this node's own ISO (``boot-<node uuid>.iso``: parameters on its command line, or a config
        drive folded in), with the TTL when ``expires``; its temp URL."""
        ...

    async def node_iso_url(self, node_uuid: str) -> str | None: ...

    async def remove_node_iso(self, node_uuid: str) -> None: ...

    async def check_reachable(self, url: str, what: str) -> None:
        """Raise ImageError naming ``what`` and ``url`` when the URL does not answer (bounded in time)."""
        ...

    async def configdrive(self, task: Any) -> tuple[str, dict[str, bytes]] | None:
        """The node's config drive for its instance's life: (temp URL of its ISO, its files), or None
        when it has none. Kept as ``configdrive-<node uuid>.iso`` until ``remove_configdrive``."""
        ...

    async def remove_configdrive(self, node_uuid: str) -> None: ...
