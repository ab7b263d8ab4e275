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

Reading versions first costs a second query when rows did change: a list
that reused fewer than half its documents last time (or the first list of
its kind) reads whole rows with their versions in one query instead, as the
list did before, and still reuses the documents it can and remembers the
rest; whether the next list of that kind reads versions first follows from
how many it could reuse.

The GET of one node goes the same way, as a page of one: a client
polling a node that is not moving (a script waiting for a state, Nova's
power sync) gets the bytes of the last GET after reading the row's version
only, or without any query when the api knows the row unchanged since it
read it (services/api/fresh_nodes.py, told of each node a read returns
through ``seen``). It shares documents with the detailed list of the same
rendering, and keeps its own record of whether the last GET reused one.

Bounded: at most ``size`` documents (``[api]node_document_cache``, about
2.3 KiB each at 1.78), least recently used first out; with 0 nothing is
kept and every list reads whole rows and renders them all, as lists did
before the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, cast

from services.common.db.nodes import NodeVersion
from services.common.db.records import NodeRecord

# (API version, base URL, fields, full): how the request renders every node of the list.
Variant = tuple[tuple[int, int], str, tuple[str, ...] | None, bool]
# (row version, conductor, allocation UUID): what else a node's document depends on.
Inputs = tuple[int, str | None, str | None]
# Told of each node a list or GET returns: its row (or what routes it), version and allocation.
Seen = Callable[[Mapping[str, Any], int, str | None], None]
# How many kinds of list remember whether their last one reused its documents.
MAX_VARIANTS = 256


class NodeDocumentCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._docs: OrderedDict[tuple[str, Variant], tuple[Inputs, bytes]] = OrderedDict()
        self._reused: dict[Hashable, bool] = {}  # did the last list of this kind reuse at least half?
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._docs)

    def get(self, node_uuid: str, variant: Variant, inputs: Inputs) -> bytes | None:
        document = self.peek(node_uuid, variant, inputs)
        if document is None:
            self.misses += 1
        else:
            self.hits += 1
        return document

    def put(self, node_uuid: str, variant: Variant, inputs: Inputs, document: bytes) -> None:
        if self.size <= 0:
            return
        key = (node_uuid, variant)
        self._docs[key] = (inputs, document)
        self._docs.move_to_end(key)
        while len(self._docs) > self.size:
            self._docs.popitem(last=False)

    def peek(self, node_uuid: str, variant: Variant, inputs: Inputs) -> bytes | None:
        """:meth:`get` without counting: a GET answered without the database (services/api/fresh_nodes.py)."""
        entry = self._docs.get((node_uuid, variant))
        if entry is None or entry[0] != inputs:
            return None
        self._docs.move_to_end((node_uuid, variant))
        return entry[1]

    def holds(self, node_uuid: str, variant: Variant) -> bool:
        """Whether a document of the node in this rendering is kept (of any version)."""
        return (node_uuid, variant) in self._docs

    def expects_reuse(self, kind: Hashable) -> bool:
        return self._reused.get(kind, False)

    def note_reuse(self, kind: Hashable, reused: int, listed: int) -> None:
        if len(self._reused) >= MAX_VARIANTS and kind not in self._reused:
            self._reused.clear()
        self._reused[kind] = listed > 0 and 2 * reused >= listed


class ListSource:
    """Where a list's rows come from: its page by versions, the same page whole, rows by id."""

    def __init__(
        self,
        *,
        versions: Callable[[], Awaitable[Sequence[NodeVersion]]],
        whole: Callable[[], Awaitable[Sequence[tuple[int, NodeRecord]]]],
        by_id: Callable[[list[int]], Awaitable[dict[int, tuple[int, NodeRecord]]]],
        allocations: Callable[[list[int]], Awaitable[Mapping[int | None, str]]],
    ) -> None:
        self.versions = versions
        self.whole = whole
        self.by_id = by_id
        self.allocations = allocations


async def documents(
    cache: NodeDocumentCache,
    variant: Variant,
    source: ListSource,
    *,
    conductor: Callable[[Mapping[str, Any]], str | None],
    render: Callable[[dict[str, Any], str | None], bytes],
    kind: Hashable = None,
    whole: bool | None = None,
    seen: Seen | None = None,
) -> tuple[list[bytes], list[str]]:
    """The JSON of each listed node, in order, and the UUIDs of the page (for its
    ``next`` link). ``render`` gets a row with its ``allocation_uuid`` and the
    conductor. A node deleted between the two reads is left out. ``kind`` names
    the requests whose last reuse decides whether this one reads versions first
    (the variant when None): a GET of one node shares its documents with the
    detailed list but not how often they changed. ``whole`` reads the rows whole
    without asking that (a GET of a node the cache holds nothing of: reading its
    version first could only cost a second query), and without counting as one
    of them. ``seen`` gets each returned node's row (or what routes it), the
    version its document is of and its allocation (services/api/fresh_nodes.py)."""
    kind = variant if kind is None else kind
    counted = whole is None
    if whole is None:
        whole = not cache.expects_reuse(kind)
    # Each entry: the row's version and a mapping with what routes it (a whole row, or only that).
    page: Sequence[tuple[int, Mapping[str, Any]]]
    if whole:
        page = await source.whole()
    else:
        page = [(node["version"], node) for node in await source.versions()]
    allocations = await source.allocations([node["id"] for _, node in page if node["instance_uuid"]])
    found = [
        cache.get(str(node["uuid"]), variant, (version, conductor(node), allocations.get(node["id"])))
        for version, node in page
    ]
    missing = [node["id"] for (_, node), document in zip(page, found, strict=True) if document is None]
    if counted:
        cache.note_reuse(kind, len(page) - len(missing), len(page))
    rows: Mapping[int, tuple[int, Mapping[str, Any]]] = {}
    if missing:
        rows = {node["id"]: (version, node) for version, node in page} if whole else await source.by_id(missing)
        for index, (_, node) in enumerate(page):
            if found[index] is None and node["id"] in rows:
                version, row = rows[node["id"]]
                found[index] = _rendered(cache, variant, version, cast(NodeRecord, row), allocations, conductor, render)
    if seen is not None:
        for (version, node), document in zip(page, found, strict=True):
            if document is not None:
                version, node = rows.get(node["id"], (version, node))
                seen(node, version, allocations.get(node["id"]))
    return [document for document in found if document is not None], [str(node["uuid"]) for _, node in page]


def _rendered(
    cache: NodeDocumentCache,
    variant: Variant,
    version: int,
    row: NodeRecord,
    allocations: Mapping[int | None, str],
    conductor: Callable[[Mapping[str, Any]], str | None],
    render: Callable[[dict[str, Any], str | None], bytes],
) -> bytes:
    owner = conductor(row)
    allocation = allocations.get(row["id"])
    document = render({**row, "allocation_uuid": allocation}, owner)
    cache.put(str(row["uuid"]), variant, (version, owner, allocation), document)
    return document
