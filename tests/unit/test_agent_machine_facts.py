"""What the agent reports about a real machine (no simulator facts): installed
memory from the kernel's memory blocks, MemTotal, and the firmware's boot mode,
read from sysfs and procfs trees laid out as the kernel lays them out."""

from __future__ import annotations

from pathlib import Path

from services.agent.hardware import current_boot_mode, inventory, physical_memory_mb, total_memory_bytes


def memory_blocks(root: Path, block_hex: str, states: list[str]) -> str:
    base = root / "devices" / "system" / "memory"
    base.mkdir(parents=True)
    (base / "block_size_bytes").write_text(block_hex + "\n")
    for index, state in enumerate(states):
        (base / f"memory{index}").mkdir()
        (base / f"memory{index}" / "online").write_text(state + "\n")
    (base / "auto_online_blocks").write_text("online\n")  # not a block: ignored
    return str(root)


def test_installed_memory_counts_the_online_blocks(tmp_path: Path) -> None:
    # a VM given 1 GiB: eight 128 MiB blocks, all online; one offline block does not count
    assert physical_memory_mb(memory_blocks(tmp_path / "a", "8000000", ["1"] * 8)) == 1024
    assert physical_memory_mb(memory_blocks(tmp_path / "b", "8000000", ["1"] * 8 + ["0"])) == 1024


def test_without_memory_blocks_memtotal_is_used(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        1004412 kB\nMemFree:          500000 kB\n")
    assert total_memory_bytes(str(meminfo)) == 1004412 * 1024
    assert total_memory_bytes(str(tmp_path / "absent")) is None
    host_total = total_memory_bytes()  # this machine's real /proc/meminfo
    assert host_total and physical_memory_mb(str(tmp_path / "no-sysfs")) == host_total // (1024 * 1024)


def test_boot_mode_follows_the_efi_directory(tmp_path: Path) -> None:
    assert current_boot_mode(str(tmp_path)) == "bios"
    (tmp_path / "firmware" / "efi").mkdir(parents=True)
    assert current_boot_mode(str(tmp_path)) == "uefi"


def test_the_inventory_of_a_real_machine_carries_its_memory() -> None:
    found = inventory([], ["52:54:00:AA:BB:CC"])
    assert found["memory"]["physical_mb"] == physical_memory_mb()
    assert found["memory"]["total"] == total_memory_bytes()
    assert found["memory"]["physical_mb"] and found["memory"]["total"]  # this test machine has both
    assert found["boot"]["current_boot_mode"] in ("bios", "uefi")
    assert found["interfaces"][0]["mac_address"] == "52:54:00:aa:bb:cc"
