"""The simulator hook: interpret_script on every template, and iPXE's
scripting rules it follows."""

from __future__ import annotations

import pytest

from services.ipxe.interpret import BootAction, expand, interpret_script
from services.ipxe.reader import StaticReader
from services.ipxe.render import ScriptRenderer
from tests.unit.test_ipxe_scenarios import (
    INITIATOR,
    KERNEL,
    MAC,
    MAC2,
    RAMDISK,
    SCENARIOS,
    TARGET_IQN,
    UUID,
    render,
    settings,
)

BOOT_VARS = {"mac": MAC, "net0/mac": MAC, "net1/mac": MAC2, "uuid": UUID, "ip": "10.0.2.15"}


def boot_ipxe() -> str:
    return ScriptRenderer(StaticReader([]), settings()).first_stage("http://192.0.2.1:8080")


def test_boot_ipxe_chains_the_per_node_url_with_the_mac() -> None:
    action = interpret_script(boot_ipxe(), BOOT_VARS)
    assert action == BootAction(
        kind="chain",
        chain_url=f"http://192.0.2.1:8080/ipxe?mac={MAC}",
        message=f"Ferrum: looking up this machine by MAC {MAC}",
    )
    # Without ${mac}, iPXE's current NIC is net0.
    assert interpret_script(boot_ipxe(), {"net0/mac": MAC2}).chain_url.endswith(f"?mac={MAC2}")


async def expected(name: str) -> BootAction:
    data, selector = SCENARIOS[name]
    rendered = await render(data, selector)
    return interpret_script(rendered.script, {**BOOT_VARS, "mac": selector.get("mac", MAC)})


async def test_deploy_templates() -> None:
    action = await expected("deploying-bios-by-mac")
    assert action.kind == "kernel" and action.kernel_url == KERNEL and action.initrd_urls == (RAMDISK,)
    assert action.kernel_args.startswith("selinux=0 troubleshoot=0 text nofb vga=normal")
    assert action.kernel_args.endswith(f"ipa-node-uuid={UUID} BOOTIF=01-52-54-00-12-34-56 initrd=deploy_ramdisk")
    assert "loading the deploy kernel and ramdisk (bios)" in action.message
    by_uuid = await expected("wait-call-back-uefi-by-uuid")
    assert "BOOTIF=01-52-54-00-12-34-56 " in by_uuid.kernel_args  # ${mac:hexhyp} expanded by "iPXE"
    rescue = await expected("rescuing-bios")
    assert rescue.kernel_url.endswith("rescue.kernel") and rescue.initrd_urls[0].endswith("rescue.initramfs")
    inspect = await expected("inspecting-uefi")
    assert "ipa-debug=1" in inspect.kernel_args and "BOOTIF=01-52-54-00-12-34-57" in inspect.kernel_args


async def test_local_disk_templates() -> None:
    assert (await expected("active-whole-disk-bios")).kind == "local_disk"
    uefi = await expected("active-whole-disk-uefi")
    assert uefi.kind == "exit" and "booting the local disk (uefi)" in uefi.message


async def test_ramdisk_templates() -> None:
    action = await expected("active-ramdisk-uefi")
    assert action.kind == "kernel" and action.kernel_url == "http://192.0.2.9/app.kernel"
    assert (
        action.kernel_args.startswith("root=/dev/ram0 text ") and "app.mode=edge initrd=ramdisk" in action.kernel_args
    )
    iso = await expected("active-ramdisk-iso-bios")
    assert iso.kind == "sanboot" and iso.san_target == "http://192.0.2.9/app.iso"


async def test_san_templates() -> None:
    iscsi = await expected("active-iscsi-chap-bios")
    assert iscsi.kind == "sanboot" and iscsi.san_target == f"iscsi:192.0.2.20::3260:1:{TARGET_IQN}"
    multipath = await expected("active-iscsi-multipath-uefi")
    assert multipath.san_target.split() == [
        f"iscsi:192.0.2.20::3260:2:{TARGET_IQN}",
        f"iscsi:192.0.2.21::3260:2:{TARGET_IQN}",
    ]
    assert (await expected("active-fcoe-uefi")).san_target == "fcp:20:00:00:1f:16:bc:fe:2f:0"
    nfs = await expected("active-nfs-root-bios")
    assert (
        nfs.kind == "kernel" and "root=/dev/nfs nfsroot=192.0.2.30:/exports/node1,vers=4,tcp ip=dhcp" in nfs.kernel_args
    )
    script = (await render(*SCENARIOS["active-iscsi-chap-bios"])).script
    assert f"set initiator-iqn {INITIATOR}" in script


async def test_error_templates() -> None:
    action = await expected("manageable-error")
    assert action.kind == "error"
    assert action.message.splitlines()[0] == "Ferrum: cannot network-boot this machine:"
    assert "[manageable]" in action.message and action.message.endswith("exiting to the next boot device")
    unknown = await expected("unknown-mac-error")
    assert unknown.kind == "error" and "no node has a port with MAC 52:54:00:ff:ff:ff" in unknown.message


def test_expansion_is_nested_typed_and_whole_line() -> None:
    variables = {"i": "1", "net1/mac": MAC2, "x": "a || echo b"}
    assert expand("${net${i}/mac:hexhyp}", variables) == "52-54-00-12-34-57"
    assert expand("${net1/mac:hexraw}-${missing}-", variables) == "525400123457--"
    # A value is expanded before the line is split, as iPXE does: its "||" becomes an operator.
    action = interpret_script("#!ipxe\niseq 1 ${x}\nexit 3\n", variables)
    assert action.kind == "error" and action.message == "b"


@pytest.mark.parametrize(
    ("script", "kind", "message"),
    [
        ("#!ipxe\necho one\nexit 0\n", "exit", "one"),
        ("#!ipxe\necho -n two\n", "exit", "two"),
        ("#!ipxe\nfrobnicate\necho never\n", "error", "frobnicate: command not found\n(script failed at: frobnicate)"),
        ("#!ipxe\nfrobnicate ||\necho after\nexit 1\n", "error", "frobnicate: command not found\nafter"),
        ("#!ipxe\niseq a b && echo no || echo yes ; echo always\nexit\n", "exit", "yes\nalways"),
        ("#!ipxe\nset n:int32 0\n:top\ninc n\niseq ${n} 3 || goto top\necho n=${n}\nexit\n", "exit", "n=3"),
        ("#!ipxe\nset a 1\nclear a\nisset ${a} && echo set || echo unset\nexit\n", "exit", "unset"),
        ("#!ipxe\n:spin\ngoto spin\n", "error", "(interpreter: stopped after 10000 commands, the script loops)"),
        ("#!ipxe\ngoto nowhere\n", "error", "(script failed at: goto nowhere)"),
        ("echo no shebang\n", "error", "not an iPXE script (no #!ipxe line)"),
        ("#!ipxe\nboot\n", "error", "boot: no image selected\n(script failed at: boot)"),
        ("#!ipxe\nreboot\n", "exit", ""),
    ],
)
def test_script_semantics(script: str, kind: str, message: str) -> None:
    action = interpret_script(script, {})
    assert (action.kind, action.message) == (kind, message)


def test_kernel_imgargs_chain_and_san() -> None:
    script = (
        "#!ipxe\nkernel --name k http://h/k a=1\nimgargs k b=${mac}\ninitrd -n r http://h/r\ninitrd http://h/r2\nboot\n"
    )
    action = interpret_script(script, {"mac": MAC})
    assert action == BootAction(
        kind="kernel", kernel_url="http://h/k", kernel_args=f"b={MAC}", initrd_urls=("http://h/r", "http://h/r2")
    )
    assert (
        interpret_script("#!ipxe\nchain --autofree http://h/${uuid}\n", {"uuid": UUID}).chain_url == f"http://h/{UUID}"
    )
    hooked = interpret_script("#!ipxe\nsanhook --drive 0x81 iscsi:a::::t\nsanboot --drive 0x81\n", {})
    assert hooked == BootAction(kind="sanboot", san_target="iscsi:a::::t")
    assert interpret_script("#!ipxe\nsanboot\n", {}).kind == "local_disk"
    assert interpret_script("#!ipxe\nsanboot --no-describe http://h/x.iso\n", {}).san_target == "http://h/x.iso"
