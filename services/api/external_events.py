"""External events (microversion 1.54): ``POST /v1/events``.

networking-baremetal posts Neutron port events here. Ironic validates them and
only logs them (it takes no action yet); Ferrum does the same, so a valid
batch gets 204 and anything malformed gets 400. Below 1.54 the endpoint does
not exist (404; the routes table gates it).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from services.api.context import ApiContext
from services.api.validators import MAC_RE
from services.common import errors
from services.common.db.nodes import is_uuid

LOG = logging.getLogger(__name__)
SINCE = (1, 54)
NETWORK_EVENTS = ("network.bind_port", "network.unbind_port", "network.delete_port")
REQUIRED = ("event", "port_id", "mac_address", "status")
OPTIONAL = ("device_id", "binding:host_id", "binding:vnic_type")


def validate_event(event: Any) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise errors.InvalidParameterValue(f"An event must be an object, not {event!r}")
    missing = [k for k in REQUIRED if k not in event]
    if missing:
        raise errors.InvalidParameterValue(f"Event is missing {', '.join(missing)}")
    unknown = set(event) - set(REQUIRED) - set(OPTIONAL)
    if unknown:
        raise errors.InvalidParameterValue(
            f"Additional properties are not allowed ({', '.join(sorted(unknown))} unexpected)"
        )
    if event["event"] not in NETWORK_EVENTS:
        raise errors.InvalidParameterValue(f"Unknown event {event['event']!r}: one of {', '.join(NETWORK_EVENTS)}")
    if not isinstance(event["port_id"], str) or not is_uuid(event["port_id"]):
        raise errors.InvalidParameterValue(f"Expected a UUID for port_id but received {event['port_id']}.")
    if not isinstance(event["mac_address"], str) or not MAC_RE.match(event["mac_address"].lower()):
        raise errors.InvalidParameterValue(f"Expected a MAC address but received {event['mac_address']}.")
    if not isinstance(event["status"], str):
        raise errors.InvalidParameterValue("status must be a string")
    for key in ("device_id", "binding:host_id"):
        if event.get(key) is not None and (not isinstance(event[key], str) or not is_uuid(event[key])):
            raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {event[key]}.")
    if event.get("binding:vnic_type") is not None and not isinstance(event["binding:vnic_type"], str):
        raise errors.InvalidParameterValue("binding:vnic_type must be a string")
    return event


class ExternalEventsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def post_events(self, request: web.Request) -> web.Response:
        body = await self.ctx.body(request)
        if not isinstance(body, dict) or set(body) != {"events"} or not isinstance(body["events"], list):
            raise errors.InvalidParameterValue('The body must be {"events": [...]}')
        events = [validate_event(e) for e in body["events"]]
        for event in events:
            LOG.info(
                "external event event=%s port_id=%s mac=%s status=%s",
                event["event"],
                event["port_id"],
                event["mac_address"].lower(),
                event["status"],
            )
        return web.Response(status=204)
