"""The deploy agent: Ferrum's IPA-compatible ramdisk side, as an embeddable class.

One ``Agent`` is one machine's ramdisk: it serves the command API, looks
itself up on the api until the node is in a deploy/clean state, then
heartbeats so the conductor knows where to send commands. It owns no
process-wide state, so ``ferrum agent`` runs one and the simulator runs a
thousand in one event loop (sharing one ``aiohttp.ClientSession`` if given).
Power hooks let the embedder decide what "power off" and "reboot" mean.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from services.agent import callbacks, cmdline, hardware, imagewrite, server, vmedia
from services.agent.commands import COMMANDS, Command, CommandResult
from services.agent.iscsi_target import IscsiTarget
from services.agent.tls import ServingTls, auto_tls, configured_tls
from services.common import errors
from services.common.aiohttp_serving import start_http_site
from services.common.connection_guard import ListenerLimits

LOG = logging.getLogger(__name__)
AGENT_VERSION = "10.0.0"  # the IPA release whose behaviour this agent follows
MIN_HEARTBEAT_INTERVAL = 5.0
KEEP_COMMANDS = 50  # finished command results kept for GET /v1/commands


@dataclass(frozen=True)
class Disk:
    path: str  # file or block device to write
    name: str = "/dev/sda"  # what the agent reports as the device name
    serial: str = ""
    wwn: str = ""
    model: str = ""
    rotational: bool = False


@dataclass(frozen=True)
class AgentOptions:
    api_url: str  # Ironic-compatible api base, e.g. http://127.0.0.1:6385
    macs: tuple[str, ...]
    disks: tuple[Disk, ...]
    node_uuid: str = ""  # optional hint for lookup
    listen_host: str = "127.0.0.1"
    listen_port: int = 0  # 0 = ephemeral
    advertise_host: str = ""  # host put in callback_url; default listen_host
    advertise_port: int = 0  # port put in callback_url (a NAT or port forward in between); 0 = the bound port
    lookup_timeout: float = 300.0
    lookup_interval: float = 1.0
    # How long a masked token is looked up again before the agent locks down: the conductor that
    # issued it may have died before its reply arrived, and a survivor re-issues such a token
    # once it sees that conductor dead (conductor/agent_callbacks.py).
    masked_token_grace: float = 30.0
    heartbeat_interval: float | None = None  # None = heartbeat_timeout x random(0.3, 0.6), min 5 s, as IPA
    allow_md5: bool = False
    power_off: Callable[[], Awaitable[None]] | None = None  # hook: standby.power_off
    reboot: Callable[[], Awaitable[None]] | None = None  # hook: standby.run_image / reboot
    # hook: rescue.finalize_rescue hands the rescue login its crypt(3) password hash
    set_rescue_password: Callable[[str], Awaitable[None]] | None = None
    agent_token: str = ""  # pre-generated token (ipa-agent-token), else the lookup's
    global_request_id: str = ""  # ipa-global-request-id, sent on lookup/heartbeat
    tmp_dir: str = ""  # qcow2 spool / staging directory (default: system temp)
    write_block_size: int = imagewrite.DEFAULT_BLOCK_SIZE
    write_depth: int = imagewrite.DEFAULT_DEPTH  # buffers of write_block_size in flight per image
    direct_io: bool = True  # raw images bypass the page cache (O_DIRECT) where the disk's file system allows
    hostname: str = ""  # reported in the inventory
    # ipa-inspection-callback-url: post the inventory there first (in-band inspection)
    inspection_callback_url: str = ""
    # What the inventory reports when the host's own values are not the machine's (the simulator's machines).
    hardware: hardware.MachineFacts | None = None
    qcow2_stream: bool = True  # convert qcow2 while it downloads; False = stage it and run qemu-img
    conversion_slots: asyncio.Semaphore | None = None  # shared by embedded agents: bounds concurrent qemu-img runs
    write_slots: asyncio.Semaphore | None = None  # shared by embedded agents: bounds concurrent image writes
    ca_file: str = ""  # extra CA bundle for https api/image/config drive URLs (ipa-cafile)
    insecure: bool = False  # skip TLS verification of those URLs (ipa-insecure)
    progress_heartbeat_interval: float = 10.0  # while an image is being written, heartbeat at least this often
    # The command API's connection bounds (services/common/connection_guard.py): the conductor needs a few.
    max_connections: int = 128
    header_timeout: float = 10.0
    # The command API over TLS (services/agent/tls.py): given files (ipa-cert-file / ipa-key-file),
    # or a self-signed certificate made at start (ipa-enable-auto-tls); announced as agent_verify_ca.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    auto_tls: bool = False
    # The iSCSI deploy's target (seed 002): where tgtd listens; empty = listen_host, 0 = an ephemeral port.
    iscsi_listen_host: str = ""
    iscsi_portal_port: int = 0
    # The portal port put in the call-back (a NAT or port forward in between); 0 = the bound port.
    iscsi_advertise_port: int = 0


def options_from_kernel_cmdline(
    cmdline_text: str, *, floppy_parameters: Mapping[str, str] | None = None, **overrides: Any
) -> AgentOptions:
    """Options from ``ipa-api-url=..``, ``BOOTIF=..``, ``ipa-node-uuid``, ``ipa-agent-token``,
    ``ipa-global-request-id``, ``ipa-listen-port`` ... as the iPXE script passes them;
    keyword overrides win (disks never come from the command line).

    ``floppy_parameters`` are the virtual floppy's (``services.agent.vmedia``):
    with ``boot_method=vmedia`` on the command line they win over it, as in IPA;
    without it they are ignored."""
    if floppy_parameters and vmedia.wants_floppy(cmdline_text):
        cmdline_text = cmdline.with_parameters(cmdline_text, floppy_parameters)
    values = cmdline.option_values(cmdline_text)
    values.update(overrides)
    if "macs" in values:
        values["macs"] = tuple(cmdline.normalize_mac(m) for m in values["macs"])
    missing = [name for name in ("api_url", "macs", "disks") if not values.get(name)]
    if missing:
        raise errors.MissingParameter(
            f"agent options missing: {', '.join(missing)} "
            "(ipa-api-url and BOOTIF on the kernel command line, disks from the caller)"
        )
    values["disks"] = tuple(values["disks"])
    return AgentOptions(**values)


def route_address(api_url: str) -> str:
    """The local address the kernel would use to reach the api (what IPA
    advertises when it listens on every address). A UDP connect sends nothing."""
    parts = urlsplit(api_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise errors.InvalidParameterValue(
            f"cannot find a local address that reaches {api_url}: {exc}; set advertise_host"
        ) from None


def _tls_setting(options: AgentOptions) -> ssl.SSLContext | bool:
    """aiohttp's ``ssl`` argument for every https call the agent makes."""
    if options.insecure:
        return False
    if options.ca_file:
        try:
            return ssl.create_default_context(cafile=options.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise errors.InvalidParameterValue(f"CA file {options.ca_file!r} is not usable: {exc}") from None
    return True


def _command_named(name: str) -> Command:
    """The command ``<extension>.<command>``, refused as IPA refuses it."""
    extension, dot, command_name = name.partition(".")
    if not dot or not extension or not command_name:
        raise errors.InvalidParameterValue("Invalid command: Command name must be of the form <extension>.<name>")
    command = COMMANDS.get(name)
    if command is not None:
        return command
    if any(known.startswith(f"{extension}.") for known in COMMANDS):
        raise errors.InvalidParameterValue(f"Invalid command: Unknown command: {command_name[:100]}")
    raise errors.NotFound(f"Unknown command: {name[:100]}: extension {extension[:100]!r} not found")


def _check_params(command: Command, agent: Agent, name: str, params: dict[str, Any]) -> None:
    """Run the command's params check; every refusal is IPA's InvalidCommandParamsError (400).

    A check that fails on input its author did not foresee (a TypeError on an
    odd type, say) is still the caller's malformed input, never a 500; it is
    logged with its traceback so the check can be made explicit."""
    assert command.validate is not None
    try:
        command.validate(agent, params)
    except errors.Invalid as exc:
        raise errors.InvalidParameterValue(f"Invalid command parameters: {exc.message}") from None
    except Exception as exc:
        LOG.warning("command params refused name=%s reason=the check raised %r", name, exc, exc_info=True)
        raise errors.InvalidParameterValue(
            f"Invalid command parameters: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None


PASS_DEPLOY_INFO_ATTEMPTS = 6  # about 15 s of backoff before the report moves to the heartbeats


class Agent:
    """One machine's deploy agent. ``start()`` binds the command API and starts
    lookup + heartbeats in the background; ``stop()`` undoes all of it."""

    def __init__(self, options: AgentOptions, *, session: aiohttp.ClientSession | None = None) -> None:
        if not options.macs or not options.disks:
            raise errors.InvalidParameterValue("an agent needs at least one MAC and one disk")
        if options.max_connections < 1 or options.header_timeout <= 0:
            raise errors.InvalidParameterValue("an agent needs max_connections >= 1 and header_timeout > 0")
        self.options = options
        self.node_uuid: str | None = None
        self.node: dict[str, Any] = {}
        self.config: dict[str, Any] = {}
        self.last_error: str | None = None
        self.agent_token: str | None = options.agent_token or None
        self.progress: imagewrite.Progress | None = None
        self.partition_info: dict[str, Any] = {}
        self.root_fs_uuid: str | None = None  # a partition image's root file system (get_partition_uuids)
        # iSCSI deploy: the target serving the root disk, and the report a heartbeat carries
        # (``deploy_info``) when the conductor asked for heartbeat call-backs.
        self.iscsi_target: IscsiTarget | None = None
        self.deploy_info: dict[str, Any] | None = None
        self.heartbeats_sent = 0
        # Ferrum's api takes deploy_progress/deploy_info in heartbeats; Ironic's
        # refuses any field it does not know ("Unexpected arguments"), so after
        # such a refusal the agent heartbeats with IPA's fields only.
        self.heartbeat_extensions = True
        self.powered_down: str | None = None  # "power_off" / "reboot" once asked to leave the ramdisk
        self.looked_up = asyncio.Event()
        self._session = session
        self._own_session = session is None
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._commands: dict[str, CommandResult] = {}
        self._running: CommandResult | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._callback_task: asyncio.Task[None] | None = None
        self._heartbeat_now = asyncio.Event()
        self._api_headers: dict[str, str] = {}
        self._started_at = time.time()
        self.tls: ssl.SSLContext | bool = _tls_setting(options)
        self.serving_tls: ServingTls | None = None
        if bool(options.tls_cert_file) != bool(options.tls_key_file):
            raise errors.InvalidParameterValue("the agent's TLS needs both a certificate and a key file")
        if options.tls_cert_file:
            self.serving_tls = configured_tls(options.tls_cert_file, options.tls_key_file)
        self._route_address = ""

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if not self.options.advertise_host and self.options.listen_host in ("0.0.0.0", "::", ""):
            self._route_address = await asyncio.to_thread(route_address, self.options.api_url)
        if self.options.auto_tls and self.serving_tls is None:
            self.serving_tls = await asyncio.to_thread(auto_tls, self.advertise_host)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            self._runner, self._port = await start_http_site(
                server.build_app(self),
                self.options.listen_host,
                self.options.listen_port,
                listener="agent",
                limits=ListenerLimits(
                    max_connections=self.options.max_connections, header_timeout=self.options.header_timeout
                ),
                ssl_context=self.serving_tls.context if self.serving_tls is not None else None,
            )
        except OSError:
            if self._own_session:  # nothing may be left open when start fails
                await self._session.close()
                self._session = None
            raise
        self._started_at = time.time()
        LOG.info(
            "agent listening callback_url=%s macs=%s disks=%s",
            self.callback_url,
            ",".join(self.options.macs),
            ",".join(d.name for d in self.options.disks),
        )
        self._callback_task = asyncio.create_task(self._callback_loop(), name=f"agent-callbacks-{self._port}")

    async def stop(self) -> None:
        await self.stop_iscsi_target()
        current = asyncio.current_task()
        tasks = [t for t in (self._callback_task, *self._tasks) if t is not None and t is not current and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("agent not started")
        return self._session

    @property
    def port(self) -> int:
        return self._port

    @property
    def advertise_host(self) -> str:
        if self.options.advertise_host:
            return self.options.advertise_host
        if self.options.listen_host in ("0.0.0.0", "::", ""):
            return self._route_address
        return self.options.listen_host

    @property
    def callback_url(self) -> str:
        host = self.advertise_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        scheme = "https" if self.serving_tls is not None else "http"
        return f"{scheme}://{host}:{self.options.advertise_port or self._port}"

    def status(self) -> dict[str, Any]:
        return {"started_at": self._started_at, "version": AGENT_VERSION}

    # ---- commands -----------------------------------------------------------------------

    def command_results(self) -> list[CommandResult]:
        return list(self._commands.values())

    def get_command(self, command_id: str) -> CommandResult | None:
        return self._commands.get(command_id)

    def allow_md5(self) -> bool:
        return self.options.allow_md5 or self.config.get("agent_md5_checksum_enable") is True

    def remember_node(self, node: Any) -> None:
        """The conductor sends the node with deploy steps; newer properties (root hints) win."""
        if isinstance(node, dict) and node:
            self.node = {**self.node, **node}

    async def root_disk(self) -> hardware.DiskInfo:
        disks = await asyncio.to_thread(hardware.describe_disks, self.options.disks)
        hints = (self.node.get("properties") or {}).get("root_device") or None
        return hardware.select_root_disk(disks, hints)

    async def execute_command(self, name: str, params: dict[str, Any], *, wait: bool = False) -> CommandResult:
        """Run a command; sync ones finish here. Refusals are IPA's: 400 for a malformed
        name, an unknown command of a known extension or bad params (checked before
        anything starts, so nothing changes), 404 for an unknown extension, 409 busy."""
        command = _command_named(name)
        if self._running is not None and self._running.status == "RUNNING":
            raise errors.Conflict("Agent is busy")
        if command.validate is not None:
            _check_params(command, self, name, params)
        result = CommandResult(name.split(".", 1)[1], params)
        self._remember(result)
        LOG.info("command started id=%s name=%s async=%s", result.id, name, command.is_async)
        if not command.is_async:
            await self._run(command, result)
            return result
        self._running = result
        task = asyncio.create_task(self._run(command, result), name=f"agent-command-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if wait:
            await result.done.wait()
        return result

    async def _run(self, command: Any, result: CommandResult) -> None:
        try:
            outcome = await command.handler(self, result.params, result)
        except asyncio.CancelledError:
            result.fail(errors.FerrumError("command cancelled: the agent is stopping"))
            raise
        except Exception as exc:
            if not isinstance(exc, errors.FerrumError):
                LOG.exception("command crashed id=%s name=%s", result.id, result.name)
            result.fail(exc)
            LOG.warning(
                "command failed id=%s name=%s error=%s",
                result.id,
                result.name,
                result.error["message"] if result.error else "",
            )
        else:
            result.succeed(outcome)
            LOG.info("command succeeded id=%s name=%s", result.id, result.name)
        finally:
            if self._running is result:
                self._running = None
            self._heartbeat_now.set()  # tell the conductor at once, as IPA does

    def _remember(self, result: CommandResult) -> None:
        self._commands[result.id] = result
        if len(self._commands) > KEEP_COMMANDS:
            for old_id in [k for k, v in self._commands.items() if v.status != "RUNNING"][
                : len(self._commands) - KEEP_COMMANDS
            ]:
                del self._commands[old_id]

    def heartbeat_soon(self) -> None:
        """Send the next heartbeat now (a command finished, or a write started)."""
        self._heartbeat_now.set()

    def schedule_power_action(self, kind: str) -> None:
        """Power off / reboot once the current command's result is out (the hook may stop us)."""
        current = self._running

        async def act() -> None:
            if current is not None:
                await current.done.wait()
            await asyncio.sleep(0.05)  # let a wait=true response reach the conductor first
            self.powered_down = kind
            self._heartbeat_now.set()
            hook = self.options.power_off if kind == "power_off" else self.options.reboot
            LOG.info("leaving the ramdisk action=%s hook=%s", kind, "yes" if hook else "none")
            if hook is not None:
                await hook()

        task = asyncio.create_task(act(), name=f"agent-{kind}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop_callbacks(self, reason: str) -> None:
        """No more heartbeats (rescue finished: the conductor no longer drives this node)."""
        self.powered_down = reason
        self._heartbeat_now.set()
        LOG.info("callbacks stopped node_uuid=%s reason=%s", self.node_uuid, reason)

    # ---- lookup and heartbeats ----------------------------------------------------------

    async def _callback_loop(self) -> None:
        api = self.options.api_url.rstrip("/")
        version = await callbacks.negotiate_version(self.session, api, tls=self.tls)
        self._api_headers = {callbacks.VERSION_HEADER: version}
        if self.options.global_request_id:
            self._api_headers["X-OpenStack-Request-ID"] = self.options.global_request_id
        if self.options.inspection_callback_url:
            await self._post_inventory(self.options.inspection_callback_url)
            return  # the conductor powers the machine off once it has the inventory
        if not await self._lookup(api):
            return
        await self._heartbeat_loop(api)

    async def _post_inventory(self, url: str) -> None:
        """IPA's inspection: post ``{"inventory", "boot_interface"}`` until the api takes it."""
        disks = await asyncio.to_thread(hardware.describe_disks, self.options.disks)
        body = {
            "inventory": hardware.inventory(
                disks,
                self.options.macs,
                hostname=self.options.hostname,
                ipv4_address=self.advertise_host,
                facts=self.options.hardware,
            ),
            "boot_interface": self.options.macs[0],
        }
        deadline = time.monotonic() + self.options.lookup_timeout
        while True:
            try:
                node_uuid = await callbacks.continue_inspection(self.session, url, body, tls=self.tls)
                LOG.info("inventory posted node_uuid=%s", node_uuid)
                return
            except (callbacks.CallbackError, aiohttp.ClientError, TimeoutError) as exc:
                reason = str(exc) or type(exc).__name__
            if time.monotonic() + self.options.lookup_interval > deadline:
                self.last_error = f"posting the inventory failed: {reason}"
                LOG.error("inspection gave up macs=%s reason=%s", ",".join(self.options.macs), reason)
                return
            await asyncio.sleep(self.options.lookup_interval)

    async def _lookup(self, api: str) -> bool:
        started = time.monotonic()
        deadline = started + self.options.lookup_timeout
        delay = self.options.lookup_interval
        while True:
            try:
                found = await callbacks.lookup(
                    self.session, api, self.options.macs, self.options.node_uuid, self._api_headers, tls=self.tls
                )
                delay = self.options.lookup_interval
                reason = "node not found or not in a deploy state (404)"
            except (callbacks.CallbackError, aiohttp.ClientError, TimeoutError) as exc:
                found, reason = None, str(exc) or type(exc).__name__
                if isinstance(exc, callbacks.CallbackError) and exc.status == 409:
                    delay = min(30.0, max(delay * 2, 5.0))  # IPA backs off 5, 10, 30 s on lock contention
                elif isinstance(exc, callbacks.CallbackError) and exc.status == 503:
                    delay = min(30.0, max(delay * 2, 1.0))  # the api's database is restarting: back off
            if found is not None:
                if self._usable_token(found) or time.monotonic() - started >= self.options.masked_token_grace:
                    return self._accept_lookup(found)
                found, reason = None, "lookup returned a masked token; asking again"
            if time.monotonic() + delay > deadline:
                self.last_error = f"lookup failed after {self.options.lookup_timeout:.0f}s: {reason}"
                LOG.error("lookup gave up macs=%s reason=%s", ",".join(self.options.macs), reason)
                return False
            LOG.debug("lookup retry macs=%s reason=%s", ",".join(self.options.macs), reason)
            await asyncio.sleep(delay)

    def _usable_token(self, found: dict[str, Any]) -> bool:
        """A real token in the reply, or one pre-generated for this agent."""
        token = (found.get("config") or {}).get("agent_token")
        return bool(token and token != "******") or bool(self.agent_token)

    def _accept_lookup(self, found: dict[str, Any]) -> bool:
        config = found.get("config") or {}
        token = config.get("agent_token")
        if token and token != "******":
            self.agent_token = str(token)
        elif not self.agent_token:
            self.last_error = (
                "lookup returned no usable agent token (masked or missing) and none was "
                "pre-generated: refusing to serve commands"
            )
            LOG.error("agent locked down node_uuid=%s reason=no token", found["node"]["uuid"])
            return False
        self.node = dict(found["node"])
        self.node_uuid = str(self.node["uuid"])
        self.config = dict(config)
        self.last_error = None
        self.looked_up.set()
        LOG.info("lookup succeeded node_uuid=%s heartbeat_timeout=%s", self.node_uuid, config.get("heartbeat_timeout"))
        return True

    def _heartbeat_interval(self) -> float:
        if self.options.heartbeat_interval is not None:
            return self.options.heartbeat_interval
        timeout = float(self.config.get("heartbeat_timeout") or 300)
        return max(MIN_HEARTBEAT_INTERVAL, timeout * random.uniform(0.3, 0.6))

    def heartbeat_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "callback_url": self.callback_url,
            "agent_version": AGENT_VERSION,
            "agent_token": self.agent_token,
        }
        if self.serving_tls is not None:
            body["agent_verify_ca"] = self.serving_tls.certificate_pem
        if self.heartbeat_extensions and self.progress is not None:
            body["deploy_progress"] = self.progress.as_dict()
        if self.heartbeat_extensions and self.deploy_info is not None:
            body["deploy_info"] = dict(self.deploy_info)
        return body

    async def stop_iscsi_target(self) -> None:
        """Take the iSCSI deploy's target down (and stop reporting it)."""
        target, self.iscsi_target, self.deploy_info = self.iscsi_target, None, None
        if target is not None:
            await target.stop()

    async def pass_deploy_info(self, report: dict[str, Any], style: str) -> None:
        """Tell the conductor where the disk is exposed (or why it is not): by
        ``pass_deploy_info``, or in every heartbeat until the target stops."""
        if style == "heartbeat":
            self.deploy_info = report
            self.heartbeat_soon()
            return
        if self.node_uuid is None:
            raise errors.AgentError("the agent has not looked its node up yet")
        delay = 0.5
        for attempt in range(1, PASS_DEPLOY_INFO_ATTEMPTS + 1):
            try:
                await callbacks.pass_deploy_info(
                    self.session,
                    self.options.api_url.rstrip("/"),
                    self.node_uuid,
                    report,
                    self._api_headers,
                    tls=self.tls,
                )
                return
            except callbacks.CallbackError as exc:
                if exc.status is not None and exc.status < 500:
                    raise  # refused (a wrong key, a node not waiting): retrying cannot help
                reason = str(exc)
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = str(exc) or type(exc).__name__
            LOG.warning("pass_deploy_info failed attempt=%d reason=%s", attempt, reason)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        # The api or the node's conductor is away (a take-over in progress): heartbeats
        # retry for as long as it takes, and carry the same report.
        LOG.warning("pass_deploy_info kept failing; reporting in heartbeats node_uuid=%s", self.node_uuid)
        self.deploy_info = report
        self.heartbeat_soon()

    async def _heartbeat_loop(self, api: str) -> None:
        assert self.node_uuid is not None
        error_delay = 0.0
        while self.powered_down is None:
            self._heartbeat_now.clear()
            try:
                await callbacks.heartbeat(
                    self.session, api, self.node_uuid, self.heartbeat_body(), self._api_headers, tls=self.tls
                )
                self.heartbeats_sent += 1
                error_delay = 0.0
                if self.last_error and self.last_error.startswith("heartbeat"):
                    self.last_error = None
                delay = self._heartbeat_interval()
                if self.progress is not None and self.progress.stage not in ("done", "failed"):
                    delay = min(delay, self.options.progress_heartbeat_interval)
            except callbacks.CallbackError as exc:
                if self._refused_extensions(exc):
                    continue  # at once, with IPA's fields only
                delay = error_delay = self._heartbeat_failed(exc, error_delay)
            except (aiohttp.ClientError, TimeoutError) as exc:
                delay = error_delay = self._heartbeat_failed(exc, error_delay)
            try:  # asyncio.timeout, not wait_for: wait_for can swallow a cancel that races the event
                async with asyncio.timeout(delay):
                    await self._heartbeat_now.wait()
            except TimeoutError:
                pass

    def _refused_extensions(self, exc: callbacks.CallbackError) -> bool:
        """True (once) when the api refused Ferrum's heartbeat fields, as Ironic does."""
        text = str(exc)
        if not self.heartbeat_extensions or exc.status != 400 or "Unexpected argument" not in text:
            return False
        if "deploy_progress" not in text and "deploy_info" not in text:
            return False
        self.heartbeat_extensions = False
        LOG.info("the api does not take deploy_progress/deploy_info; heartbeating with IPA's fields only")
        return True

    def _heartbeat_failed(self, exc: BaseException, error_delay: float) -> float:
        """Record a failed heartbeat; the delay before the next try (doubling up to the interval)."""
        interval = self._heartbeat_interval()
        delay = min(interval, max(error_delay * 2, min(1.0, interval)))
        self.last_error = f"heartbeat failed: {exc or type(exc).__name__}"
        LOG.warning(
            "heartbeat failed node_uuid=%s retry_in=%.1fs reason=%s", self.node_uuid, delay, exc or type(exc).__name__
        )
        return delay
