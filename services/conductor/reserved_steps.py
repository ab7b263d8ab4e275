"""Steps the conductor runs itself, whatever interface a plan names them on
(Ironic's reserved step names, API 1.85): ``hold`` stops the flow in its hold
state (``clean hold``, ``deploy hold``, ``service hold``) until the ``unhold``
verb resumes it with the next step; ``power_on``, ``power_off`` and
``reboot`` change the power state through the node's power interface and the
flow goes on.

No interface declares these, so a plan may name them on any interface that
has steps of its kind; they take no arguments. Ironic also reserves ``wait``
(sleep, or wait for a heartbeat); Ferrum does not run it, and a plan naming it
gets the usual "no interface offers this step" 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common import errors, states
from services.common.config import ConductorConfig
from services.conductor import related_nodes
from services.conductor.drivers.base import Task

HOLD = "hold"
POWER_STEPS: Mapping[str, str] = {
    "power_on": states.POWER_ON,
    "power_off": states.POWER_OFF,
    "reboot": states.REBOOT,
}
NAMES = (HOLD, *POWER_STEPS)


def is_reserved(step: Mapping[str, Any]) -> bool:
    """Whether the conductor, not an interface, runs ``step``."""
    return step.get("step") in NAMES


def argument_problems(step: Mapping[str, Any]) -> list[str]:
    """Reserved steps take no arguments; anything else is refused up front."""
    args = step.get("args") or {}
    if not isinstance(args, Mapping):
        return ["args must be an object"]
    if args:
        return [f"unexpected arguments {', '.join(sorted(args))} (it takes: none)"]
    return []


async def run_power_step(config: ConductorConfig, task: Task, step: Mapping[str, Any]) -> None:
    """``power_on``/``power_off``/``reboot``: the power interface does it now and
    the node's power_state follows, after its parent or children where power
    couples them (``related_nodes``); a node that may not be powered off
    (``disable_power_off``, 1.95) refuses ``power_off``."""
    target = POWER_STEPS[step["step"]]
    if target == states.POWER_OFF and task.node.get("disable_power_off"):
        raise errors.InvalidParameterValue(
            f"Node {task.node['uuid']} has disable_power_off set; the power_off step cannot run"
        )
    if target == states.REBOOT:
        await task.driver.power.reboot(task, None)
        await task.save_fields({"power_state": states.POWER_ON, "target_power_state": None})
    else:
        await related_nodes.set_power(config, task, target)
