"""Node lists from documents already rendered, for rows that have not changed since.

A list of 200 nodes spent most of its time in decoding ~75 columns a row and
rendering each document (about 55 us a node, issue 22), although polling
clients (Nova's resource tracker, dashboards, scripts waiting for a state)
list the same nodes again and again and most rows have not changed between
two lists. So the list first reads each row's version only
(``NodeRepository.list_versions``: the row's ``xmin``, which every UPDATE
replaces), takes the JSON of each node whose version and rendering inputs
are those of a document rendered before, and reads, renders and remembers
only the others, in one more query.

A document depends on the row, on the request's API version, base URL,
``fields`` and detail, on the conductor the ring gives the node now and on
its allocation: all are in the key, so a reused document is byte for byte
the one a fresh rendering would give. The rows of one list may come from
two snapshots (versions first, changed rows a moment later); each document
is still one committed version of its row, as when a client lists the same
nodes in two pages.

Bounded: at most ``size`` documents (``[api]node_document_cache``, about
2.3 KiB each at 1.78), least recently used first out; 0 turns it off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from services.common.db.nodes import NodeVersion
from services.common.db.records import NodeRecord

# (API version, base URL, fields, full): how the request renders every node of the list.
Variant = tuple[tuple[int, int], str, tuple[str, ...] | None, bool]
# (row version, conductor, allocation UUID): what else a node's document depends on.
Inputs = tuple[int, str | None, str | None]


class NodeDocumentCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._docs: OrderedDict[tuple[str, Variant], tuple[Inputs, bytes]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._docs)

    def get(self, node_uuid: str, variant: Variant, inputs: Inputs) -> bytes | None:
        entry = self._docs.get((node_uuid, variant))
        if entry is None or entry[0] != inputs:
            self.misses += 1
            return None
        self._docs.move_to_end((node_uuid, variant))
        self.hits += 1
        return entry[1]

    def put(self, node_uuid: str, variant: Variant, inputs: Inputs, document: bytes) -> None:
        if self.size <= 0:
            return
        key = (node_uuid, variant)
        self._docs[key] = (inputs, document)
        self._docs.move_to_end(key)
        while len(self._docs) > self.size:
            self._docs.popitem(last=False)


async def documents(
    cache: NodeDocumentCache,
    page: Sequence[NodeVersion],
    variant: Variant,
    *,
    conductor: Callable[[NodeVersion], str | None],
    allocations: dict[int | None, str],
    read: Callable[[list[int]], Awaitable[dict[int, tuple[int, NodeRecord]]]],
    render: Callable[[dict[str, Any], str | None], bytes],
) -> list[bytes]:
    """The JSON of each node of ``page``, in order: reused where its inputs are
    unchanged, else read (``read``: whole rows by id, with versions) and
    rendered (``render``: a row with its ``allocation_uuid`` and the conductor).
    A node deleted between the two reads is left out."""
    found: list[bytes | None] = []
    missing: list[int] = []
    for node in page:
        inputs = (node["version"], conductor(node), allocations.get(node["id"]))
        document = cache.get(node["uuid"], variant, inputs)
        found.append(document)
        if document is None:
            missing.append(node["id"])
    if missing:
        rows = await read(missing)
        for index, node in enumerate(page):
            if found[index] is not None or node["id"] not in rows:
                continue
            version, row = rows[node["id"]]
            owner = conductor(node)
            allocation = allocations.get(node["id"])
            document = render({**row, "allocation_uuid": allocation}, owner)
            cache.put(node["uuid"], variant, (version, owner, allocation), document)
            found[index] = document
    return [document for document in found if document is not None]
