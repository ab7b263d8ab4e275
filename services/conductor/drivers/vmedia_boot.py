"""The ``redfish-virtual-media`` boot interface: boot from a virtual CD the BMC attaches (seed 002).

Deploy (``prepare_ramdisk``, the seed's ``setup_virtual_media_boot``):

1. check the BMC has a virtual CD (and a floppy or USB slot when the
   parameters go on a floppy);
2. put the agent's parameters (api URL, node UUID, a pregenerated agent
   token, BOOTIF) on a floppy, ``image-<node uuid>`` with a TTL, and insert
   its temp URL into the removable slot;
3. insert the deploy ISO into the CD: ``deploy_iso`` as given, else one built
   from ``deploy_kernel`` + ``deploy_ramdisk`` whose command line holds no
   node data, shared by every node that boots the same files (usage counted);
   without a floppy, a node's own ISO with the parameters on its line;
4. boot once from the CD. The deploy interface then powers on.

``clean_up_ramdisk`` (``cleanup_virtual_media_boot``) ejects both media,
deletes the floppy and gives the shared ISO back. Every step is safe to
repeat: media are ejected before they are inserted, the floppy is stored
again under the same name with the same token, and the usage count is taken
once per node (``driver_internal_info``) — a conductor that adopts the
deploy runs the steps again.

Instance (``prepare_instance``): a node that netboots its own kernel and
ramdisk (the ``ramdisk`` deploy interface, or ``boot_option`` ``netboot``)
boots a boot ISO from the CD: ``instance_info['boot_iso']`` when given, else
the shared ISO of (image, kernel, ramdisk), recorded there as ``swift:<name>``
as Ironic records it. Its config drive goes into the removable slot, or on a
BMC with only a CD into the node's own combined ISO (label ``config-2``).
``before_power_on`` attaches all of it again, with fresh temp URLs, before
every power on and reboot. Anything else boots from its disk.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from services.common import errors, states
from services.common.images import boot_iso
from services.conductor.drivers import base
from services.conductor.drivers.capabilities import check_capability
from services.conductor.drivers.media import IsoRecipe, MediaImages

LOG = logging.getLogger(__name__)

CD, REMOVABLE = "cdrom", "floppy"  # the management interface's virtual media devices
OURS = "swift:"  # instance_info boot_iso of an ISO the conductor made (Ironic's mark)
DEPLOY_ISO_KEY = "vmedia_deploy_iso"  # driver_internal_info: the shared deploy ISO this node counts on
BOOT_ISO_KEY = "vmedia_boot_iso"  # driver_internal_info: the shared instance ISO this node counts on
DEFAULT_PLACEHOLDER = "%default%"
_TRUE = ("1", "true", "yes", "on", "y")
_FALSE = ("0", "false", "no", "off", "n")


@dataclass(frozen=True)
class VmediaInfo:
    """The virtual-media fields of driver_info, checked."""

    iso: str | None  # deploy_iso (or rescue_iso)
    kernel: str | None
    ramdisk: str | None
    bootloader: str | None
    config_via_removable: bool | None  # None: the interface's default
    external_http_url: str | None
    kernel_append_params: str | None


def _url(node: Mapping[str, Any], key: str, value: Any) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")) or any(c.isspace() for c in value):
        raise errors.InvalidParameterValue(f"Node {node['uuid']}: driver_info {key} must be an http(s) URL")
    return value


def _bool(node: Mapping[str, Any], key: str, value: Any) -> bool | None:
    if value in (None, ""):
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise errors.InvalidParameterValue(f"Node {node['uuid']}: driver_info {key} must be a boolean, not {value!r}")


def parse_vmedia_info(node: Mapping[str, Any], *, aliases: Mapping[str, str], mode: str = "deploy") -> VmediaInfo:
    """driver_info for booting the ``mode`` (deploy or rescue) ramdisk; no network access."""
    info = node.get("driver_info") or {}

    def get(key: str) -> tuple[str, Any]:
        if info.get(key) not in (None, "") or key not in aliases:
            return key, info.get(key)
        return aliases[key], info.get(aliases[key])

    iso = _url(node, *get(f"{mode}_iso"))
    kernel = _url(node, *get(f"{mode}_kernel"))
    ramdisk = _url(node, *get(f"{mode}_ramdisk"))
    if not iso and not (kernel and ramdisk):
        missing = [k for k, v in ((f"{mode}_kernel", kernel), (f"{mode}_ramdisk", ramdisk)) if not v]
        raise errors.MissingParameter(
            f"Node {node['uuid']} needs driver_info {mode}_iso, or {mode}_kernel and {mode}_ramdisk, to boot "
            f"from virtual media (missing: {', '.join(missing)})"
        )
    append = info.get("kernel_append_params")
    if append not in (None, ""):
        if not isinstance(append, str):
            raise errors.InvalidParameterValue(
                f"Node {node['uuid']}: driver_info kernel_append_params must be a string"
            )
        boot_iso.check_kernel_params(append.replace(DEFAULT_PLACEHOLDER, ""))
    return VmediaInfo(
        iso=iso,
        kernel=kernel,
        ramdisk=ramdisk,
        bootloader=_url(node, *get("bootloader")),
        config_via_removable=_bool(node, *get("config_via_removable")),
        external_http_url=_url(node, *get("external_http_url")),
        kernel_append_params=append or None,
    )


def rebase(url: str, base_url: str | None) -> str:
    """``url`` served from ``base_url`` instead (a proxy the BMC can reach in front of the object store)."""
    if not base_url:
        return url
    ours, theirs = urlsplit(url), urlsplit(base_url)
    return urlunsplit((theirs.scheme, theirs.netloc, theirs.path.rstrip("/") + ours.path, ours.query, ""))


def netboots(node: Mapping[str, Any]) -> bool:
    """Whether the instance boots its own kernel and ramdisk rather than its disk."""
    instance = node.get("instance_info") or {}
    capabilities = instance.get("capabilities") or {}
    option = instance.get("boot_option") or (
        capabilities.get("boot_option") if isinstance(capabilities, dict) else None
    )
    return node.get("deploy_interface") == "ramdisk" or option in ("netboot", "ramdisk")


class VirtualMediaBoot(base.BootInterface):
    """Boot from virtual media through the node's management interface (see the module docstring)."""

    name = "redfish-virtual-media"
    capabilities = frozenset({"virtual_media_boot", "ramdisk_boot"})
    # Ironic's older names of the same fields (it warns; Ferrum reads them).
    aliases: ClassVar[Mapping[str, str]] = {
        "deploy_iso": "redfish_deploy_iso",
        "rescue_iso": "redfish_rescue_iso",
        "config_via_removable": "config_via_floppy",
    }
    # Ironic's redfish-virtual-media puts the parameters on the command line unless
    # config_via_removable is set; Ferrum uses the floppy whenever the BMC has a slot,
    # so the command line carries no secret and one ISO serves many nodes.
    floppy_by_default: ClassVar[bool] = True

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.default_append = str(
            self.options.get("vmedia_kernel_append_params", "nofb vga=normal console=tty0 console=ttyS0,115200n8")
        )

    def get_properties(self) -> dict[str, str]:
        return {
            "deploy_iso": "URL of a deploy ISO, attached as it is. Either this or deploy_kernel and deploy_ramdisk.",
            "deploy_kernel": "URL of the deploy kernel the conductor builds the deploy ISO from.",
            "deploy_ramdisk": "URL of the deploy ramdisk the conductor builds the deploy ISO from.",
            "rescue_iso": "URL of a rescue ISO. Optional.",
            "rescue_kernel": "URL of the rescue kernel. Optional.",
            "rescue_ramdisk": "URL of the rescue ramdisk. Optional.",
            "bootloader": "URL of an EFI system partition image for the ISOs' UEFI boot; default Ferrum's GRUB.",
            "config_via_removable": "true/false: the agent's parameters on a virtual floppy/USB device (default: "
            "when the BMC has one); also exposes the config drive there for an instance.",
            "external_http_url": "Base URL the BMC reaches the object store's temp URLs at. Optional.",
            "kernel_append_params": "Kernel arguments of the ramdisk (%default% = the conductor's). Optional.",
        }

    async def validate(self, task: base.Task) -> None:
        if task.driver.storage.should_write_image(task):  # else the OS is on a volume: no ramdisk (seed 004)
            parse_vmedia_info(task.node, aliases=self.aliases)
        management = task.driver.management
        if not check_capability(management, "virtual_media"):
            raise errors.InvalidParameterValue(
                f"Node {task.node['uuid']}: boot interface {self.name} needs a management interface that attaches "
                f"virtual media; {management.name!r} cannot"
            )
        # The one network check: a BMC without a virtual CD is refused before the deploy starts.
        await self.check_bmc(task)

    # ---- the deploy ramdisk -------------------------------------------------------------------

    async def prepare_ramdisk(self, task: base.Task, ramdisk_params: Mapping[str, Any]) -> None:
        try:
            await self.setup_virtual_media_boot(task)
        except Exception:
            # A refused URL or a failed build leaves nothing inserted and no object behind.
            try:
                await self.cleanup_virtual_media_boot(task)
            except Exception:  # the first failure is the one to report
                LOG.warning("virtual media clean up after a failed set up failed", exc_info=True)
            raise

    async def clean_up_ramdisk(self, task: base.Task) -> None:
        await self.cleanup_virtual_media_boot(task)

    async def setup_virtual_media_boot(self, task: base.Task) -> None:
        info = parse_vmedia_info(task.node, aliases=self.aliases)
        media = _media(task)
        uuid = task.node["uuid"]
        devices = await self.check_bmc(task)
        wanted = info.config_via_removable
        use_floppy = (REMOVABLE in devices and self.floppy_by_default) if wanted is None else wanted
        if use_floppy and REMOVABLE not in devices:
            raise errors.BMCError(
                f"Node {uuid}: config_via_removable is set, but the BMC has no virtual floppy or USB device"
            )
        params: dict[str, str] = {}
        if use_floppy or not info.iso:  # a pre-built ISO without a floppy cannot take a token (as in Ironic)
            params = self.agent_parameters(task, media.api_url(), await _agent_token(task))
        if use_floppy:
            floppy_url = await media.publish_floppy(uuid, params)
            await self.attach(task, REMOVABLE, rebase(floppy_url, info.external_http_url))
        if info.iso:
            await media.check_reachable(info.iso, "deploy ISO (driver_info deploy_iso)")
            iso_url = info.iso
        else:
            assert info.kernel and info.ramdisk  # parse_vmedia_info made sure
            if use_floppy:
                recipe = IsoRecipe(
                    info.kernel, info.ramdisk, self.command_line(info, ["boot_method=vmedia"]), info.bootloader or ""
                )
                iso_url = await self.shared_iso_url(task, DEPLOY_ISO_KEY, recipe)
            else:
                words = [f"{k}={v}" for k, v in params.items()]
                recipe = IsoRecipe(info.kernel, info.ramdisk, self.command_line(info, words), info.bootloader or "")
                iso_url = await media.publish_node_iso(uuid, recipe, expires=True)
            iso_url = rebase(iso_url, info.external_http_url)
        await self.attach(task, CD, iso_url)
        await self.boot_once_from_cd(task)
        LOG.info("virtual media boot prepared node_uuid=%s floppy=%s", uuid, use_floppy)

    async def cleanup_virtual_media_boot(self, task: base.Task) -> None:
        media = _media(task)
        await self.detach_all(task)
        await media.remove_floppy(task.node["uuid"])
        await release_held(task, media, DEPLOY_ISO_KEY)
        await media.remove_node_iso(task.node["uuid"])

    # ---- the instance -------------------------------------------------------------------------

    async def prepare_instance(self, task: base.Task) -> None:
        await self.cleanup_virtual_media_boot(task)
        if netboots(task.node):
            await self.attach_instance_media(task)
            return
        info = parse_vmedia_info(task.node, aliases=self.aliases)
        if info.config_via_removable:
            drive = await _media(task).configdrive(task)
            if drive is not None:
                await self.attach(task, REMOVABLE, rebase(drive[0], info.external_http_url))
        await task.driver.management.set_boot_device(task, "disk", persistent=True)

    async def clean_up_instance(self, task: base.Task) -> None:
        media = _media(task)
        await self.cleanup_virtual_media_boot(task)
        await release_held(task, media, BOOT_ISO_KEY)
        await media.remove_configdrive(task.node["uuid"])

    async def before_power_on(self, task: base.Task) -> None:
        # Servicing reboots a deployed node too (a BIOS step): it must come back to its instance.
        if task.node.get("provision_state") in (states.ACTIVE, states.SERVICING) and netboots(task.node):
            await self.attach_instance_media(task)

    async def attach_instance_media(self, task: base.Task) -> None:
        """The instance's boot ISO in the CD (and its config drive), booting from the CD from now on."""
        info = parse_vmedia_info(task.node, aliases=self.aliases)
        media = _media(task)
        devices = await self.check_bmc(task)
        drive = None
        if task.node.get("deploy_interface") == "ramdisk" or info.config_via_removable:
            drive = await media.configdrive(task)
        if drive is not None and REMOVABLE not in devices:
            # One slot: the config drive is folded into the node's own ISO (label config-2).
            await release_held(task, media, BOOT_ISO_KEY)
            found = await media.node_iso_url(task.node["uuid"])
            if found is None:
                found = await media.publish_node_iso(
                    task.node["uuid"], self.instance_recipe(task, info), inject=drive[1], expires=False
                )
            iso_url, drive = rebase(found, info.external_http_url), None
        elif _given_iso(task):
            iso_url = await self.instance_iso_url(task, info)
        else:
            iso_url = rebase(await self.instance_iso_url(task, info), info.external_http_url)
        await self.detach_all(task)
        if drive is not None:
            await self.attach(task, REMOVABLE, rebase(drive[0], info.external_http_url))
        await self.attach(task, CD, iso_url)
        await task.driver.management.set_boot_device(task, "cdrom", persistent=True)

    def instance_recipe(self, task: base.Task, info: VmediaInfo) -> IsoRecipe:
        instance = task.node.get("instance_info") or {}
        for key in ("kernel", "ramdisk"):
            if not isinstance(instance.get(key), str) or not instance[key].startswith(("http://", "https://")):
                raise errors.MissingParameter(
                    f"Node {task.node['uuid']} netboots its instance but has no instance_info {key} URL (or boot_iso)"
                )
        append = instance.get("kernel_append_params") or info.kernel_append_params
        extra = instance.get("ramdisk_kernel_arguments") or ""
        words = ["root=/dev/ram0", "text", _append(append, self.default_append), str(extra)]
        return IsoRecipe(
            instance["kernel"],
            instance["ramdisk"],
            boot_iso.check_kernel_params(" ".join(w for w in words if w)),
            info.bootloader or "",
            image=str(instance.get("image_source") or ""),
        )

    async def instance_iso_url(self, task: base.Task, info: VmediaInfo) -> str:
        """The boot ISO named for the instance, else the shared one of its image, kernel and ramdisk."""
        given = (task.node.get("instance_info") or {}).get("boot_iso")
        if given and not str(given).startswith(OURS):
            url = _url(task.node, "instance_info boot_iso", given)
            assert url is not None
            await _media(task).check_reachable(url, "boot ISO (instance_info boot_iso)")
            await release_held(task, _media(task), BOOT_ISO_KEY)
            return url
        recipe = self.instance_recipe(task, info)
        url = await self.shared_iso_url(task, BOOT_ISO_KEY, recipe)
        name = task.node["driver_internal_info"][BOOT_ISO_KEY]
        if (task.node.get("instance_info") or {}).get("boot_iso") != OURS + name:
            await task.save_fields({"instance_info": {**task.node["instance_info"], "boot_iso": OURS + name}})
        return url

    # ---- pieces -------------------------------------------------------------------------------

    def command_line(self, info: VmediaInfo, words: list[str]) -> str:
        return boot_iso.check_kernel_params(" ".join([_append(info.kernel_append_params, self.default_append), *words]))

    def agent_parameters(self, task: base.Task, api_url: str, token: str) -> dict[str, str]:
        """What the agent needs to find the api and prove who it is (Ironic's ramdisk params)."""
        params = {"ipa-api-url": api_url, "ipa-node-uuid": task.node["uuid"], "ipa-agent-token": token}
        macs = [p["address"] for p in task.ports if p.get("pxe_enabled", True)] or [p["address"] for p in task.ports]
        if macs:
            params["BOOTIF"] = macs[0]
        params["boot_method"] = "vmedia"
        return params

    async def shared_iso_url(self, task: base.Task, key: str, recipe: IsoRecipe) -> str:
        """A temp URL of the shared ISO for ``recipe``, counted once for this node under ``key``."""
        media = _media(task)
        for _attempt in range(2):
            held = (task.node.get("driver_internal_info") or {}).get(key)
            if held != recipe.cache_name():
                await release_held(task, media, key)
                # Counted first, recorded after: a crash in between leaves one use too many
                # (the ISO outlives its last node), never one too few (deleted under a node).
                name = await media.acquire_shared_iso(recipe)
                await task.save_internal_info({key: name})
            url = await media.shared_iso_url(recipe.cache_name())
            if url is not None:
                return url
            await task.save_internal_info({}, remove=(key,))  # deleted behind our back: take a new one
        raise errors.ImageError(
            f"the boot ISO {recipe.cache_name()} disappeared while node {task.node['uuid']} used it"
        )

    async def check_bmc(self, task: base.Task) -> set[str]:
        """The virtual media devices the BMC has; a BMC without a virtual CD cannot do this."""
        slots = await task.driver.management.get_virtual_media(task)
        found = set()
        for slot in slots:
            types = {t.lower() for t in slot.get("media_types") or ()}
            if types & {"cd", "dvd"}:
                found.add(CD)
            if types & {"floppy", "usbstick"}:
                found.add(REMOVABLE)
        if CD not in found:
            raise errors.BMCError(
                f"Node {task.node['uuid']} cannot boot from virtual media: its BMC has no virtual CD "
                f"(virtual media devices: {', '.join(sorted(found)) or 'none'})"
            )
        return found

    async def attach(self, task: base.Task, device: str, url: str) -> None:
        """Eject, then insert: Ironic's order, and what makes a repeated step harmless."""
        management: Any = task.driver.management
        await management.eject_virtual_media(task, device)
        await management.insert_virtual_media(task, device, url)

    async def detach_all(self, task: base.Task) -> None:
        management: Any = task.driver.management
        await management.eject_virtual_media(task, CD)
        await management.eject_virtual_media(task, REMOVABLE)

    async def boot_once_from_cd(self, task: base.Task) -> None:
        await task.driver.management.set_boot_device(task, "cdrom", persistent=False)


def _append(configured: str | None, default: str) -> str:
    if not configured:
        return default
    return configured.replace(DEFAULT_PLACEHOLDER, default)


def _given_iso(task: base.Task) -> bool:
    given = (task.node.get("instance_info") or {}).get("boot_iso")
    return bool(given) and not str(given).startswith(OURS)


def _media(task: base.Task) -> MediaImages:
    if task.media is None:
        raise errors.ImageError("virtual-media boot needs the conductor's object store; this task has none")
    return task.media


async def _agent_token(task: base.Task) -> str:
    """The node's agent token, made now when it has none: the floppy hands it over, so the
    agent's first lookup gets ``******`` and keeps its own (Ironic's pregenerated token)."""
    token = (task.node.get("driver_internal_info") or {}).get("agent_secret_token")
    if token:
        return str(token)
    token = secrets.token_urlsafe(32)
    await task.save_internal_info({"agent_secret_token": token})
    return token


async def release_held(task: base.Task, media: MediaImages, key: str) -> None:
    """Give back the shared ISO this node counts on under ``key``: forgotten first, then released,
    so a repeated clean up never releases twice."""
    held = (task.node.get("driver_internal_info") or {}).get(key)
    if not held:
        return
    await task.save_internal_info({}, remove=(key,))
    await media.release_shared_iso(str(held))
