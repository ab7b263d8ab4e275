"""The typed shape of every row a repository returns.

Repositories hand these out instead of ``dict[str, Any]`` so that mypy checks
every key a caller reads. They are ``TypedDict``s, not dataclasses, on
purpose: a record is still the plain dict that views render, callers copy
and JSON encodes, so typing them changed no behaviour.

Each record lists exactly the columns its repository's SELECT returns (joined
columns such as a port's ``node_uuid`` included); ``tests/integration/
test_db_records.py`` reads one real row of each from PostgreSQL and fails when
a column is added or dropped without its record following. Free-form JSON
columns (``extra``, ``driver_info``, ``properties`` ...) stay
``dict[str, Any]``: their shape belongs to the user or the driver.
"""

from __future__ import annotations
