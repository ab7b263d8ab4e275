"""Golden iPXE scripts: one per provision-state family and boot mode.

A change to a template or to the plan shows up here as a readable diff.
Regenerate deliberately (render the scenario and paste) after checking the
new script by eye; scenarios are in test_ipxe_scenarios.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common import states
from services.common.config import load_settings
from services.common.endpoints import Endpoints
from services.ipxe.plan import RAMDISK_STATES
from services.ipxe.reader import StaticReader
from services.ipxe.render import ScriptRenderer
from tests.unit.test_ipxe_scenarios import MAC, SCENARIOS, UUID, node, render, settings

GOLDEN: dict[str, tuple[str, str]] = {
    "deploying-bios-by-mac": (
        "deploy",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is deploying: boot the deploy ramdisk (bios)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_deploy
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state deploying
echo Ferrum: loading the deploy kernel and ramdisk (bios)
kernel --timeout 60000 http://192.0.2.9/ipa.kernel selinux=0 troubleshoot=0 text nofb vga=normal console=tty0 console=ttyS0,115200n8 ipa-api-url=http://192.0.2.1:6385 ipa-node-uuid=1be26c0e-7a3c-4b5d-9e8f-0123456789ab BOOTIF=01-52-54-00-12-34-56 initrd=deploy_ramdisk || goto ferrum_retry
initrd --timeout 60000 --name deploy_ramdisk http://192.0.2.9/ipa.initramfs || goto ferrum_retry
boot || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_deploy
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "wait-call-back-uefi-by-uuid": (
        "deploy",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is wait call-back: boot the deploy ramdisk (uefi)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_deploy
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state wait call-back
echo Ferrum: loading the deploy kernel and ramdisk (uefi)
kernel --timeout 60000 http://192.0.2.9/ipa.kernel selinux=0 troubleshoot=0 text nofb vga=normal console=tty0 console=ttyS0,115200n8 ipa-api-url=http://192.0.2.1:6385 ipa-node-uuid=1be26c0e-7a3c-4b5d-9e8f-0123456789ab BOOTIF=01-${mac:hexhyp} initrd=deploy_ramdisk || goto ferrum_retry
initrd --timeout 60000 --name deploy_ramdisk http://192.0.2.9/ipa.initramfs || goto ferrum_retry
boot || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_deploy
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "inspecting-uefi": (
        "deploy",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is inspecting: boot the deploy ramdisk (uefi)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_deploy
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state inspecting
echo Ferrum: loading the deploy kernel and ramdisk (uefi)
kernel --timeout 60000 http://192.0.2.9/ipa.kernel selinux=0 troubleshoot=0 text nofb vga=normal console=tty0 console=ttyS0,115200n8 ipa-debug=1 ipa-api-url=http://192.0.2.1:6385 ipa-node-uuid=1be26c0e-7a3c-4b5d-9e8f-0123456789ab ipa-inspection-callback-url=http://192.0.2.1:6385/v1/continue_inspection BOOTIF=01-52-54-00-12-34-57 initrd=deploy_ramdisk || goto ferrum_retry
initrd --timeout 60000 --name deploy_ramdisk http://192.0.2.9/ipa.initramfs || goto ferrum_retry
boot || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_deploy
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "rescuing-bios": (
        "deploy",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is rescuing: boot the rescue ramdisk (bios)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_deploy
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state rescuing
echo Ferrum: loading the rescue kernel and ramdisk (bios)
kernel --timeout 60000 http://192.0.2.9/rescue.kernel selinux=0 troubleshoot=0 text nofb vga=normal console=tty0 console=ttyS0,115200n8 ipa-api-url=http://192.0.2.1:6385 ipa-node-uuid=1be26c0e-7a3c-4b5d-9e8f-0123456789ab BOOTIF=01-52-54-00-12-34-56 initrd=deploy_ramdisk || goto ferrum_retry
initrd --timeout 60000 --name deploy_ramdisk http://192.0.2.9/rescue.initramfs || goto ferrum_retry
boot || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_deploy
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "active-whole-disk-bios": (
        "local_disk",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active with its image on the local disk (bios)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting the local disk (bios)
sanboot --no-describe --drive 0x80 || exit 0
""",
    ),
    "active-whole-disk-uefi": (
        "local_disk",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active with its image on the local disk (uefi)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting the local disk (uefi)
# UEFI iPXE cannot boot a firmware disk by drive number: return to the
# firmware, whose boot order continues with the disk.
exit 0
""",
    ),
    "active-ramdisk-uefi": (
        "ramdisk",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active: boot the ramdisk instance (uefi)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_instance
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting the ramdisk instance (uefi)
kernel --timeout 60000 http://192.0.2.9/app.kernel root=/dev/ram0 text nofb vga=normal console=tty0 console=ttyS0,115200n8 app.mode=edge initrd=ramdisk || goto ferrum_retry
initrd --timeout 60000 --name ramdisk http://192.0.2.9/app.initramfs || goto ferrum_retry
boot || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_instance
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "active-ramdisk-iso-bios": (
        "ramdisk",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active: boot the instance boot ISO (bios)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_instance
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting the instance boot ISO (bios)
sanboot --no-describe http://192.0.2.9/app.iso || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_instance
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "active-iscsi-chap-bios": (
        "san",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active and boots from volume vol-0 (bios)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_san
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting from volume vol-0 (bios)
set initiator-iqn iqn.2004-10.org.example:node-1
set username node1
set password s3cret-Pw
sanhook --drive 0x80 iscsi:192.0.2.20::3260:1:iqn.2010-10.org.openstack:volume-7 || goto ferrum_retry
clear username
clear password
sanhook --drive 0x81 iscsi:192.0.2.21::3261:a:iqn.2010-10.org.openstack:volume-8 || goto ferrum_retry
set username node1
set password s3cret-Pw
sanboot --no-describe --drive 0x80 || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_san
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "active-iscsi-multipath-uefi": (
        "san",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active and boots from volume vol-0 (uefi)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_san
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting from volume vol-0 (uefi)
set initiator-iqn iqn.2004-10.org.example:node-1
sanhook --drive 0x80 iscsi:192.0.2.20::3260:2:iqn.2010-10.org.openstack:volume-7 iscsi:192.0.2.21::3260:2:iqn.2010-10.org.openstack:volume-7 || goto ferrum_retry
sanboot --no-describe --drive 0x80 || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_san
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "active-fcoe-uefi": (
        "san",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active and boots from volume vol-fc (uefi)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_san
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting from volume vol-fc (uefi)
sanhook --drive 0x80 fcp:20:00:00:1f:16:bc:fe:2f:0 || goto ferrum_retry
sanboot --no-describe --drive 0x80 || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_san
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "active-nfs-root-bios": (
        "san",
        """\
#!ipxe
# Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab (rack1-node1) is active: boot the NFS root 192.0.2.30:/exports/node1,vers=4,tcp (bios)
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
set ferrum_attempt:int32 0
:ferrum_instance
imgfree
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in state active
echo Ferrum: booting the NFS root 192.0.2.30:/exports/node1,vers=4,tcp (bios)
kernel --timeout 60000 http://192.0.2.9/nfs.kernel root=/dev/nfs nfsroot=192.0.2.30:/exports/node1,vers=4,tcp ip=dhcp rw nofb vga=normal console=tty0 console=ttyS0,115200n8 initrd=ramdisk || goto ferrum_retry
initrd --timeout 60000 --name ramdisk http://192.0.2.9/nfs.initramfs || goto ferrum_retry
boot || goto ferrum_retry
:ferrum_retry
inc ferrum_attempt
iseq ${ferrum_attempt} 10 && goto ferrum_fail ||
echo Ferrum: attempt ${ferrum_attempt} of 10 failed, retrying in ${ferrum_attempt} s
sleep ${ferrum_attempt}
goto ferrum_instance
:ferrum_fail
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab did not boot
echo Ferrum: giving up after 10 attempts, exiting to the next boot device
exit 1
""",
    ),
    "manageable-error": (
        "error",
        """\
#!ipxe
# Ferrum: nothing to boot here: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in provision state [manageable], which does not boot from the network
set ferrum_node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab
echo Ferrum: cannot network-boot this machine:
echo Ferrum: node 1be26c0e-7a3c-4b5d-9e8f-0123456789ab is in provision state
echo Ferrum: [manageable], which does not boot from the network
echo Ferrum: exiting to the next boot device
exit 1
""",
    ),
    "unknown-mac-error": (
        "error",
        """\
#!ipxe
# Ferrum: nothing to boot here: no node has a port with MAC 52:54:00:ff:ff:ff
echo Ferrum: cannot network-boot this machine:
echo Ferrum: no node has a port with MAC 52:54:00:ff:ff:ff
echo Ferrum: exiting to the next boot device
exit 1
""",
    ),
}

BOOT_IPXE = """\
#!ipxe
# Ferrum first-stage script (seed 003): chain this machine's per-node script,
# rendered per request from its node's provision state. Tried in order: the
# MAC of the NIC iPXE booted from, every other NIC (net0..net7), the SMBIOS UUID.
# A per-node script that returns sets ferrum_node when the node is known; then
# no other NIC is tried and we exit to the next boot device.
set ferrum_node
set ferrum_try:int32 0
:ferrum_start
echo Ferrum: looking up this machine by MAC ${mac}
chain --timeout 60000 http://192.0.2.1:8080/ipxe?mac=${mac} || goto ferrum_mac_failed
exit 0
:ferrum_mac_failed
isset ${ferrum_node} && exit 1 ||
set ferrum_nic:int32 0
:ferrum_nic
isset ${net${ferrum_nic}/mac} || goto ferrum_by_uuid
iseq ${net${ferrum_nic}/mac} ${mac} && goto ferrum_nic_next ||
echo Ferrum: looking up this machine by MAC ${net${ferrum_nic}/mac} (net${ferrum_nic})
chain --timeout 60000 http://192.0.2.1:8080/ipxe?mac=${net${ferrum_nic}/mac} || goto ferrum_nic_failed
exit 0
:ferrum_nic_failed
isset ${ferrum_node} && exit 1 ||
:ferrum_nic_next
inc ferrum_nic
iseq ${ferrum_nic} 8 || goto ferrum_nic
:ferrum_by_uuid
isset ${uuid} || goto ferrum_nomatch
echo Ferrum: looking up this machine by SMBIOS UUID ${uuid}
chain --timeout 60000 http://192.0.2.1:8080/ipxe?uuid=${uuid} || goto ferrum_uuid_failed
exit 0
:ferrum_uuid_failed
isset ${ferrum_node} && exit 1 ||
:ferrum_nomatch
inc ferrum_try
echo Ferrum: no node matches any MAC or the SMBIOS UUID of this machine
iseq ${ferrum_try} 10 && goto ferrum_give_up ||
echo Ferrum: attempt ${ferrum_try} of 10, retrying in 10 seconds
sleep 10
goto ferrum_start
:ferrum_give_up
echo Ferrum: giving up, exiting to the next boot device
exit 1
"""


@pytest.mark.parametrize("name", sorted(GOLDEN))
async def test_golden_script(name: str) -> None:
    data, selector = SCENARIOS[name]
    rendered = await render(data, selector)
    kind, script = GOLDEN[name]
    assert (rendered.kind, rendered.script) == (kind, script)


def test_golden_boot_ipxe() -> None:
    assert ScriptRenderer(StaticReader([]), settings()).first_stage("http://192.0.2.1:8080/") == BOOT_IPXE


@pytest.mark.parametrize("state", sorted(RAMDISK_STATES))
@pytest.mark.parametrize("mode", ["bios", "uefi"])
async def test_every_ramdisk_state_boots_the_deploy_ramdisk(state: str, mode: str) -> None:
    rendered = await render(node(state, boot_mode=mode), {"mac": MAC})
    assert rendered.kind == "deploy" and rendered.node_uuid == UUID
    assert f"is in state {state}" in rendered.script and f"ramdisk ({mode})" in rendered.script


@pytest.mark.parametrize("state", sorted(states.ALL_STATES - RAMDISK_STATES - {states.ACTIVE}))
async def test_every_other_state_gets_an_error_script(state: str) -> None:
    rendered = await render(node(state), {"mac": MAC})
    assert rendered.kind == "error" and f"provision state [{state}]" in rendered.reason
    assert rendered.script.rstrip().endswith("exit 1") and f"set ferrum_node {UUID}" in rendered.script


async def test_boot_mode_sources_and_default() -> None:
    by_caps = node("active", properties={"capabilities": "boot_mode:bios,secure_boot:false"})
    by_instance = node("active", instance_info={"deploy_boot_mode": "bios"})
    for data in (by_caps, by_instance):
        assert "sanboot --no-describe --drive 0x80" in (await render(data, {"mac": MAC})).script
    assert (await render(node("active"), {"mac": MAC})).script.rstrip().endswith("exit 0")  # default uefi
    bios_default = await render(node("active"), {"mac": MAC}, default_boot_mode="bios")
    assert "(bios)" in bios_default.script


async def test_settings_shape_the_scripts(tmp_path: Path) -> None:
    rendered = await render(
        node("deploying"), {"mac": MAC}, boot_timeout=5.0, boot_retries=3, kernel_append_params="console=ttyS1"
    )
    assert "kernel --timeout 5000 " in rendered.script and "iseq ${ferrum_attempt} 3 " in rendered.script
    assert " console=ttyS1 ipa-api-url=" in rendered.script and "vga=normal" not in rendered.script
    fallback = await render(node("deploying"), {"mac": MAC}, api_url="")
    assert "ipa-api-url=http://127.0.0.1:6385 " in fallback.script  # the api's configured host:port
    ephemeral = load_settings({}, overrides={"api": {"port": 0}, None: {"state_dir": str(tmp_path)}})
    local = Endpoints()
    renderer = ScriptRenderer(StaticReader([node("deploying")]), ephemeral, local_api_url=local.local_api_url)
    no_api = await renderer.render(mac=MAC)
    assert no_api.kind == "error" and "FERRUM_IPXE_API_URL" in no_api.reason
    local.api_url = "http://0.0.0.0:41234"  # what an api on port 0 in the same process records when it starts
    assert "ipa-api-url=http://127.0.0.1:41234 " in (await renderer.render(mac=MAC)).script
