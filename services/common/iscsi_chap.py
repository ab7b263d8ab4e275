"""The per-deploy CHAP credentials of the iSCSI deploy (seed 002).

The conductor derives them from the deploy key and sends them to the agent
with ``iscsi.start_iscsi_target``; it logs in with the same pair. Derived,
so nothing but the key is stored, and useless once the key is forgotten at
the end of the deploy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid

from services.common import errors

CHAP_PASSWORD_LENGTH = 16


def chap_credentials(deploy_key: str, node_uuid: str) -> tuple[str, str]:
    """The CHAP user name and secret of one deploy, derived from its deploy key.

    Pure and deterministic: HMAC-SHA256 keyed by the deploy key over
    the node's canonical UUID, the secret being the first 16 characters of
    its URL-safe base64 (96 bits, only ``A-Z a-z 0-9 - _``: nothing tgtadm,
    libiscsi or qemu's option parser would alter). The user name is not
    secret: ``ferrum-`` and the UUID's first 8 hex digits, for logs.
    """
    if not deploy_key:
        raise errors.InvalidParameterValue("a deploy key is needed to derive the iSCSI CHAP secret")
    try:
        node = uuid.UUID(node_uuid.strip())
    except ValueError:
        raise errors.InvalidParameterValue(f"node UUID {node_uuid!r} is not a UUID") from None
    digest = hmac.new(deploy_key.encode(), b"ferrum-iscsi-chap\0" + str(node).encode(), hashlib.sha256).digest()
    password = base64.urlsafe_b64encode(digest).decode()[:CHAP_PASSWORD_LENGTH]
    return f"ferrum-{node.hex[:8]}", password
