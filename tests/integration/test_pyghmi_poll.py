"""pyghmi's I/O thread on ``poll`` (services/common/pyghmi_poll.py): IPMI still works
when its sockets are numbered 1024 or above, where ``select`` gives up.

A conductor reaches such numbers through its other descriptors (database
pool, Redfish connections, console proxies); here 1,100 open files push the
simulated BMCs' sockets there, and the ipmitool power interface reads them."""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Iterator

import pytest

from services.common.open_files import raise_open_files_limit
from services.common.pyghmi_poll import PollSelect, install
from services.conductor.drivers import base
from services.conductor.drivers.ipmi import IpmiPower
from services.simulator import Simulator, SimulatorOptions

pytestmark = pytest.mark.timeout(60)
FILLER = 1100


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """Hold ``FILLER`` descriptors so that the next sockets get numbers above 1024."""
    if raise_open_files_limit(FILLER + 1024) < FILLER + 256:
        pytest.skip("the open-files limit cannot be raised far enough")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(FILLER)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)


def test_poll_select_reports_a_socket_select_cannot_watch(high_descriptors: None) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        assert a.fileno() >= 1024
        with pytest.raises(ValueError):
            select.select([a], [], [], 0)
        poll = PollSelect()
        assert poll.select([a], (), (), 0) == ([], [], [])
        b.send(b"ping")
        assert poll.select([a], (), (), 1.0)[0] == [a]
        assert poll.take_ready() == [a] and poll.take_ready() is None
    finally:
        a.close()
        b.close()


async def test_ipmi_power_reads_bmcs_on_descriptors_above_1024(high_descriptors: None, tmp_path: os.PathLike) -> None:
    install()
    sim = Simulator(
        SimulatorOptions(machines=2, state_dir=str(tmp_path), disk_size=1024**2, username="u", password="p", ipmi=True)
    )
    await sim.start()
    power = IpmiPower({"ipmi_timeout": 5})
    try:
        assert sim.ipmi is not None
        assert all(bmc.serversocket.fileno() >= 1024 for bmc in sim.ipmi.bmcs.values())
        for machine in sim.machines:
            node = {"uuid": machine.uuid, "driver_info": sim.ipmi_driver_info(machine)}
            task = base.Task(node=node, ports=[], driver=None, conductor="t")  # type: ignore[arg-type]
            assert await power.get_power_state(task) == "power off"
        await sim.machines[1].power_on()
        node = {"uuid": sim.machines[1].uuid, "driver_info": sim.ipmi_driver_info(sim.machines[1])}
        task = base.Task(node=node, ports=[], driver=None, conductor="t")  # type: ignore[arg-type]
        assert await power.get_power_state(task) == "power on"
    finally:
        await power.close()
        await sim.stop()
