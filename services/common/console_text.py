"""Free text that goes onto a machine's firmware console inside an iPXE script.

iPXE has no quoting (see :mod:`services.ipxe.safety`), so a reason or a node
name is made harmless rather than escaped: anything outside a small set of
characters becomes ``_``. The renderer and the api's ``ipxe_config``
passthru both write error scripts, so both use this one function.
"""

from __future__ import annotations

import re

TEXT_UNSAFE = re.compile(r"[^A-Za-z0-9 \-._:/,=@+()\[\]]")
MAX_TEXT = 200


def sanitize_text(value: object, *, limit: int = MAX_TEXT) -> str:
    """Console text: anything outside a harmless character set becomes ``_``."""
    text = "" if value is None else str(value)
    return TEXT_UNSAFE.sub("_", text[:limit])
