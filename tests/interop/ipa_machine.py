"""The "machine" the real ironic-python-agent runs on in the interop test.

This file runs in IPA's own virtualenv (``tests/support/ipa_agent.py`` starts
it as ``python ipa_machine.py --config-file ...``), never in Ferrum's.

IPA reaches hardware only through hardware managers (its documented plugin
point). Its ``GenericHardwareManager`` probes the host it runs on: at start it
runs ``mdadm --assemble --scan``, loads the IPMI and dm-multipath kernel modules
and lists the host's disks with ``lsblk``; its clean steps erase what it
listed. On a shared test machine none of that may run, so this launcher gives
IPA exactly one manager, :class:`FileDiskHardwareManager`: a subclass of
the generic one (so every step, the deploy steps' ``write_image`` included,
is IPA's own code) that describes a machine with one NIC (the node's port
MAC) and one disk, a sparse file. Everything else (lookup, token,
heartbeats, the command API, image download and checksum, the disk write,
partition checks, power off) is unmodified IPA 13.

Environment (set by the starter): ``FERRUM_IPA_MAC``, ``FERRUM_IPA_DISK``,
``FERRUM_IPA_SHIMS`` (the directory whose ``poweroff`` and ``reboot`` stand in
for the machine going down; the launcher refuses to start if ``poweroff`` on
PATH is anything else, since IPA falls back to ``/proc/sysrq-trigger``).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from typing import Any

import stevedore
from ironic_python_agent import (
    config,  # noqa: F401  # registers IPA's options before its modules read them
    hardware,
)
from ironic_python_agent.cmd import agent as agent_cmd


class FileDiskHardwareManager(hardware.GenericHardwareManager):
    """One NIC, one file-backed disk; IPA's generic steps on top."""

    HARDWARE_MANAGER_NAME = "ferrum_file_disk"
    HARDWARE_MANAGER_VERSION = "1.0"

    def __init__(self) -> None:
        super().__init__()
        self.mac = os.environ["FERRUM_IPA_MAC"]
        self.disk = os.environ["FERRUM_IPA_DISK"]

    def evaluate_hardware_support(self) -> int:
        return int(hardware.HardwareSupport.SERVICE_PROVIDER)

    def initialize(self) -> None:
        """No host probing (mdadm, modprobe, multipath, waiting for disks)."""

    def wait_for_disks(self) -> None:
        """The file disk is there from the start."""

    def list_network_interfaces(self) -> list[Any]:
        return [hardware.NetworkInterface("eth0", self.mac, ipv4_address="127.0.0.1", has_carrier=True)]

    def list_block_devices(self, include_partitions: bool = False, all_serial_and_wwn: bool = False) -> list[Any]:
        size = os.path.getsize(self.disk)
        return [hardware.BlockDevice(self.disk, "ferrum file disk", size, False, serial="FERRUM-IPA-1")]

    def get_os_install_device(self, permit_refresh: bool = False) -> str:
        return self.disk

    def list_hardware_info(self) -> dict[str, Any]:
        """The inventory sent with the lookup: only what this machine has."""
        return {
            "interfaces": self.list_network_interfaces(),
            "disks": self.list_block_devices(),
            "cpu": hardware.CPU("ferrum test cpu", "2000", 1, "x86_64"),
            "memory": hardware.Memory(total=2 * 1024**3, physical_mb=2048),
            "bmc_address": "0.0.0.0",
            "bmc_v6address": "::/0",
            "system_vendor": hardware.SystemVendorInfo("ferrum-ipa", "FERRUM-IPA-1", "ferrum", {}),
            "boot": hardware.BootInfo("bios"),
            "hostname": "ferrum-ipa",
        }


def _only_this_machine() -> stevedore.ExtensionManager:
    manager = FileDiskHardwareManager()
    entry_point = importlib.metadata.EntryPoint(
        "ferrum_file_disk", f"{__name__}:FileDiskHardwareManager", "ironic_python_agent.hardware_managers"
    )
    extension = stevedore.extension.Extension("ferrum_file_disk", entry_point, FileDiskHardwareManager, manager)
    return stevedore.ExtensionManager.make_test_instance([extension], namespace="ironic_python_agent.hardware_managers")


def main() -> None:
    shims = os.path.realpath(os.environ["FERRUM_IPA_SHIMS"])
    found = shutil.which("poweroff")
    if found is None or os.path.dirname(os.path.realpath(found)) != shims:
        sys.exit(f"refusing to start IPA: poweroff on PATH is {found}, not the test's shim in {shims}")
    hardware._get_extensions = _only_this_machine
    agent_cmd.run()


if __name__ == "__main__":
    main()
