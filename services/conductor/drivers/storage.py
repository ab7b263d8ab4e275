"""Storage interfaces that know about volumes (seed 004): ``external``.

The ``noop`` storage (noop.py) means "no volumes"; a node that has a boot
volume needs one of these. ``external`` is for storage the operator manages
outside Ferrum (a SAN with its own tooling, an NFS server): the volume
targets are used as they are given, nothing is attached or detached, and the
deploy writes no image when the node boots from its volume. The ``cinder``
interface builds on the same rules and asks Cinder to attach the volumes.
"""

from __future__ import annotations

from services.conductor.drivers import base, volumes


class VolumeStorage(base.StorageInterface):
    """The boot-from-volume rules every volume-aware storage interface shares."""

    async def validate(self, task: base.Task) -> None:
        volumes.validate(task)

    def should_write_image(self, task: base.Task) -> bool:
        return not volumes.without_image(task)


class ExternalStorage(VolumeStorage):
    """Volumes managed outside Ferrum: the targets are used as given."""

    name = "external"
