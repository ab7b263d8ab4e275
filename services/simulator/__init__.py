"""Ferrum's machine simulator: N machines behind one Redfish service, with
sparse-file disks, iPXE-like network boot and embedded deploy agents."""

from services.simulator.disk import inspect_disk, read_config_drive, read_partitions
from services.simulator.machine import Machine
from services.simulator.options import SimulatorOptions, parse_size
from services.simulator.service import Simulator

__all__ = [
    "Machine",
    "Simulator",
    "SimulatorOptions",
    "inspect_disk",
    "parse_size",
    "read_config_drive",
    "read_partitions",
]
