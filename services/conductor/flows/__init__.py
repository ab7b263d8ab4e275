"""The conductor's flows: the hardware half of each operation, one module each.

A flow runs under the node's lock (TaskManager.acquire, then task.spawn) and
depends on a narrow ``FlowContext`` (transition, fail, record_event, the
config drive store), never on the whole manager. Every flow is resumable: a
conductor that adopts a node from a dead one, or gets its database back
after an outage, calls ``resume.resume`` and the flow continues from the
step it recorded, each step safe to repeat (power on again, boot again,
continue the deploy). See docs/conductor.md, "Liveness and resume".

- deploy.py: deploying -> wait call-back -> (agent) -> active
- teardown.py: deleting -> cleaning
- clean.py: cleaning (manual and automated)
- verify.py, inspect.py: verifying, inspecting
- rescue.py: adopting, rescuing, unrescuing, servicing
- power.py: a power change in the background
- resume.py: which flow continues a node found in which state
"""
