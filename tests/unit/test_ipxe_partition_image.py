"""A partition image netboots its own kernel with ``root=UUID=`` of the root
file system the deploy recorded, also while the deploy's last step powers
it on (the node still ``deploying``); without the UUID or the kernel the
renderer refuses with a reason."""

from __future__ import annotations

from services.ipxe.interpret import interpret_script
from tests.unit.test_ipxe_scenarios import KERNEL, MAC, RAMDISK, node, render

ROOT = "0b9d5a3c-51a4-4d8e-9d55-0e0c4f6e1a77"
INSTANCE = {"image_source": "http://h/root.img", "kernel": KERNEL + "?instance", "ramdisk": RAMDISK + "?instance"}
WRITTEN = {"is_whole_disk_image": False, "root_uuid_or_disk_id": ROOT}


async def test_active_partition_image_boots_its_kernel_with_its_root() -> None:
    rendered = await render(node("active", instance_info=INSTANCE, internal=WRITTEN), {"mac": MAC})
    action = interpret_script(rendered.script, {})
    assert rendered.kind == "ramdisk" and action.kind == "kernel", rendered.reason
    assert action.kernel_url == INSTANCE["kernel"]
    args = action.kernel_args if isinstance(action.kernel_args, str) else " ".join(action.kernel_args)
    assert f"root=UUID={ROOT}" in args and " ro " in f" {args} "
    assert "ipa-api-url" not in args


async def test_the_deploys_last_step_gets_the_instance_not_the_ramdisk() -> None:
    finishing = {**WRITTEN, "deploy_phase": "finishing", "finish_step": "boot_instance"}
    rendered = await render(node("deploying", instance_info=INSTANCE, internal=finishing), {"mac": MAC})
    assert rendered.kind == "ramdisk" and f"root=UUID={ROOT}" in rendered.script
    earlier = {**WRITTEN, "deploy_phase": "finishing", "finish_step": "prepare_instance_boot"}
    rendered = await render(node("deploying", instance_info=INSTANCE, internal=earlier), {"mac": MAC})
    assert rendered.kind == "deploy"


async def test_a_partition_image_without_its_root_or_kernel_is_refused() -> None:
    rendered = await render(
        node("active", instance_info=INSTANCE, internal={"is_whole_disk_image": False}), {"mac": MAC}
    )
    assert rendered.kind == "error" and "root file system UUID" in rendered.reason
    no_kernel = {k: v for k, v in INSTANCE.items() if k != "kernel"}
    rendered = await render(node("active", instance_info=no_kernel, internal=WRITTEN), {"mac": MAC})
    assert rendered.kind == "error" and "instance_info kernel" in rendered.reason
