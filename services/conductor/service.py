"""The conductor service: gRPC ConductorService over the manager, registry
membership, periodic work, a /metrics endpoint and graceful shutdown."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import asyncpg
import grpc
from aiohttp import web

from ferrum.v1 import conductor_pb2 as pb
from ferrum.v1 import conductor_pb2_grpc as pb_grpc
from services.common import errors
from services.common.aiohttp_serving import start_http_site
from services.common.conductor_messages import (
    deploy_info_dict,
    deploy_progress_dict,
    indicators_message,
    step_dicts,
    vendor_method_message,
    virtual_media_reply,
)
from services.common.config import Settings
from services.common.db.conductors import ConductorRepository
from services.common.db.node_secrets import NodeSecrets
from services.common.db.outage import is_unavailable, unavailable
from services.common.endpoints import Endpoints
from services.common.grpc_auth import internal_token_authenticator
from services.common.grpcserver import start_grpc_server, stop_grpc_server
from services.common.internal_token import internal_token
from services.common.jsonutil import dumps
from services.common.keyring import Keyring
from services.common.local_rpc import LocalServicer
from services.common.logs import node_uuid_var
from services.common.metrics import ServiceMetrics
from services.common.tls import server_ssl_context, tls_files
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.liveness import LivenessLock
from services.conductor.manager import ConductorManager
from services.conductor.periodic import PeriodicWork

LOG = logging.getLogger(__name__)


def agent_api_url(settings: Settings, endpoints: Endpoints | None) -> str:
    """The api URL a deploy agent calls back (for the virtual floppy): configured, the api's public
    endpoint, else the api of this process (``ferrum stack``, the demo, the tests)."""
    if settings.conductor.vmedia_api_url:
        return settings.conductor.vmedia_api_url
    if settings.api.public_endpoint:
        return settings.api.public_endpoint
    return endpoints.local_api_url() if endpoints is not None and endpoints.api_url else ""


def _json_or(value: str, default: Any) -> Any:
    return json.loads(value) if value else default


class ConductorServicer(pb_grpc.ConductorServiceServicer):
    """Thin translation between protobuf messages and ConductorManager calls."""

    def __init__(self, manager: ConductorManager) -> None:
        self.manager = manager

    async def _run(self, context: grpc.aio.ServicerContext, node_uuid: str, coro: Any) -> Any:
        node_uuid_var.set(node_uuid or "-")
        try:
            return await coro
        except errors.FerrumError as exc:
            await errors.abort_with(context, exc)
        except (asyncpg.DataError, ValueError) as exc:
            await errors.abort_with(context, errors.InvalidParameterValue(str(exc)))
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            await errors.abort_with(context, unavailable(exc))

    async def CreateNode(
        self, request: pb.ConductorCreateNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConductorNodeReply:
        node = await self._run(context, "", self.manager.create_node(json.loads(request.node_json)))
        return pb.ConductorNodeReply(node_json=dumps(node))

    async def UpdateNode(
        self, request: pb.ConductorUpdateNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConductorNodeReply:
        node = await self._run(
            context,
            request.node_uuid,
            self.manager.update_node(
                request.node_uuid, json.loads(request.changes_json), reset_interfaces=request.reset_interfaces
            ),
        )
        return pb.ConductorNodeReply(node_json=dumps(node))

    async def DestroyNode(self, request: pb.NodeRef, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(context, request.node_uuid, self.manager.destroy_node(request.node_uuid))
        return pb.Empty()

    async def DoProvisionAction(
        self, request: pb.ProvisionActionRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.do_provision_action(
                request.node_uuid,
                request.event,
                configdrive=_json_or(request.configdrive_json, None),
                clean_steps=step_dicts(request.clean_steps),
                rescue_password=request.rescue_password or None,
                deploy_steps=step_dicts(request.deploy_steps),
                disable_ramdisk=request.disable_ramdisk,
                service_steps=step_dicts(request.service_steps),
            ),
        )
        return pb.Empty()

    async def ChangePowerState(self, request: pb.PowerStateRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.change_power_state(request.node_uuid, request.target, request.timeout or None),
        )
        return pb.Empty()

    async def SetMaintenance(self, request: pb.MaintenanceRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.set_maintenance(request.node_uuid, request.maintenance, request.reason or None),
        )
        return pb.Empty()

    async def SetBootDevice(self, request: pb.BootDeviceRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.set_boot_device(request.node_uuid, request.boot_device, request.persistent),
        )
        return pb.Empty()

    async def GetBootDevice(self, request: pb.NodeRef, context: grpc.aio.ServicerContext) -> pb.BootDeviceReply:
        result = await self._run(context, request.node_uuid, self.manager.get_boot_device(request.node_uuid))
        return pb.BootDeviceReply(
            boot_device=result.get("boot_device") or "", persistent=bool(result.get("persistent"))
        )

    async def GetSupportedBootDevices(
        self, request: pb.NodeRef, context: grpc.aio.ServicerContext
    ) -> pb.SupportedBootDevicesReply:
        devices = await self._run(
            context, request.node_uuid, self.manager.get_supported_boot_devices(request.node_uuid)
        )
        return pb.SupportedBootDevicesReply(boot_devices=devices)

    async def ValidateDriverInterfaces(
        self, request: pb.NodeRef, context: grpc.aio.ServicerContext
    ) -> pb.ValidateReply:
        results = await self._run(context, request.node_uuid, self.manager.validate_interfaces(request.node_uuid))
        return pb.ValidateReply(
            interfaces=[pb.InterfaceValidation(interface=k, result=ok, reason=reason) for k, ok, reason in results]
        )

    async def VifAttach(self, request: pb.VifRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.vif_attach(
                request.node_uuid, request.vif_id, port_uuid=request.port_uuid, portgroup_uuid=request.portgroup_uuid
            ),
        )
        return pb.Empty()

    async def VifDetach(self, request: pb.VifRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(context, request.node_uuid, self.manager.vif_detach(request.node_uuid, request.vif_id))
        return pb.Empty()

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.agents.heartbeat(
                request.node_uuid,
                callback_url=request.callback_url,
                agent_version=request.agent_version,
                agent_token=request.agent_token,
                agent_status=request.agent_status,
                progress=deploy_progress_dict(request.progress) if request.HasField("progress") else None,
                agent_verify_ca=request.agent_verify_ca,
                deploy_info=deploy_info_dict(request.deploy_info) if request.HasField("deploy_info") else None,
            ),
        )
        return pb.Empty()

    async def PassDeployInfo(self, request: pb.PassDeployInfoRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.agents.pass_deploy_info(request.node_uuid, deploy_info_dict(request.info)),
        )
        return pb.Empty()

    async def ContinueInspection(
        self, request: pb.ContinueInspectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        data = _json_or(request.data_json, None)
        if not isinstance(data, dict):
            await errors.abort_with(context, errors.InvalidParameterValue("data_json must be a JSON object"))
        await self._run(context, request.node_uuid, self.manager.continue_inspection(request.node_uuid, data))
        return pb.Empty()

    async def GetNodeInventory(self, request: pb.NodeRef, context: grpc.aio.ServicerContext) -> pb.NodeInventoryReply:
        stored = await self._run(context, request.node_uuid, self.manager.get_inventory(request.node_uuid))
        return pb.NodeInventoryReply(
            inventory_json=dumps(stored["inventory"]), plugin_data_json=dumps(stored["plugin_data"])
        )

    async def AttachVirtualMedia(self, request: pb.VirtualMediaRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.virtual_media.attach(request.node_uuid, request.device_type, request.image_url),
        )
        return pb.Empty()

    async def DetachVirtualMedia(self, request: pb.VirtualMediaRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        devices = list(request.device_types) or None
        await self._run(context, request.node_uuid, self.manager.virtual_media.detach(request.node_uuid, devices))
        return pb.Empty()

    async def GetVirtualMedia(self, request: pb.NodeRef, context: grpc.aio.ServicerContext) -> pb.VirtualMediaReply:
        media = await self._run(context, request.node_uuid, self.manager.virtual_media.list(request.node_uuid))
        return virtual_media_reply(media)

    async def LookupToken(self, request: pb.NodeRef, context: grpc.aio.ServicerContext) -> pb.LookupTokenReply:
        result = await self._run(context, request.node_uuid, self.manager.agents.lookup_token(request.node_uuid))
        token, node = result
        return pb.LookupTokenReply(agent_token=token, node_json=dumps(node))

    async def GetVendorMethods(
        self, request: pb.VendorMethodsRequest, context: grpc.aio.ServicerContext
    ) -> pb.VendorMethodsReply:
        methods = await self._run(
            context, request.node_uuid, self.manager.vendor.methods(request.node_uuid, request.driver)
        )
        return pb.VendorMethodsReply(methods={name: vendor_method_message(spec) for name, spec in methods.items()})

    async def VendorPassthru(
        self, request: pb.VendorPassthruRequest, context: grpc.aio.ServicerContext
    ) -> pb.VendorPassthruReply:
        is_async, attach, result = await self._run(
            context,
            request.node_uuid,
            self.manager.vendor.call(
                request.node_uuid,
                request.driver,
                request.method,
                request.http_method,
                _json_or(request.data_json, None),
            ),
        )
        return pb.VendorPassthruReply(is_async=is_async, attach=attach, return_json=dumps(result))

    async def GetSupportedIndicators(
        self, request: pb.NodeRef, context: grpc.aio.ServicerContext
    ) -> pb.IndicatorsReply:
        result = await self._run(context, request.node_uuid, self.manager.indicators.supported(request.node_uuid))
        return indicators_message(result)

    async def GetIndicatorState(
        self, request: pb.IndicatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.IndicatorStateReply:
        state = await self._run(
            context,
            request.node_uuid,
            self.manager.indicators.state(request.node_uuid, request.component, request.indicator),
        )
        return pb.IndicatorStateReply(state=state)

    async def SetIndicatorState(self, request: pb.IndicatorRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.indicators.set_state(request.node_uuid, request.component, request.indicator, request.state),
        )
        return pb.Empty()

    async def SetBootMode(self, request: pb.BootModeRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context, request.node_uuid, self.manager.boot_settings.set_boot_mode(request.node_uuid, request.target)
        )
        return pb.Empty()

    async def SetSecureBootState(self, request: pb.SecureBootRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(
            context,
            request.node_uuid,
            self.manager.boot_settings.set_secure_boot_state(request.node_uuid, request.target),
        )
        return pb.Empty()

    async def SetConsoleMode(self, request: pb.ConsoleModeRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        await self._run(context, request.node_uuid, self.manager.consoles.set_mode(request.node_uuid, request.enabled))
        return pb.Empty()

    async def SetTargetRaidConfig(
        self, request: pb.TargetRaidConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        target = json.loads(request.target_raid_config_json or "{}")
        await self._run(context, request.node_uuid, self.manager.raid_settings.set_target(request.node_uuid, target))
        return pb.Empty()

    async def GetConsoleInformation(
        self, request: pb.NodeRef, context: grpc.aio.ServicerContext
    ) -> pb.ConsoleInfoReply:
        info = await self._run(context, request.node_uuid, self.manager.consoles.information(request.node_uuid))
        if info is None:
            return pb.ConsoleInfoReply(console_enabled=False)
        return pb.ConsoleInfoReply(console_enabled=True, console_info={k: str(v) for k, v in info.items()})


class ConductorService:
    """One conductor process (or one member of ``ferrum stack``)."""

    name = "conductor"

    def __init__(self, settings: Settings, pool: asyncpg.Pool, endpoints: Endpoints | None = None) -> None:
        self.settings = settings
        self.config = settings.conductor
        self.pool = pool
        self.hostname = settings.conductor_hostname()
        self.endpoints = endpoints
        self.metrics = ServiceMetrics("conductor")
        self.registry = DriverRegistry(self.config)
        self.objectstore: Any = None
        # Configured, else the object store started before us in this process.
        address = self.config.objectstore_address or (endpoints.objectstore_grpc if endpoints else "")
        if address:
            from services.common.objectstore_client import ObjectStoreClient

            self.objectstore = ObjectStoreClient(address, tls=tls_files(settings.security), endpoints=endpoints)
        work_dir = Path(self.config.vmedia_work_dir or Path(settings.state_dir) / "vmedia") / self.hostname
        self.manager = ConductorManager(
            pool,
            self.registry,
            self.config,
            hostname=self.hostname,
            secrets=NodeSecrets(Keyring.from_config(settings.security)),
            objectstore=self.objectstore,
            vmedia_work_dir=work_dir,
            image_cache_dir=Path(self.config.image_cache_dir or Path(settings.state_dir) / "image-cache")
            / self.hostname,
            api_url=lambda: agent_api_url(settings, endpoints),
            console_ssl_context=server_ssl_context(tls) if (tls := tls_files(settings.security)) else None,
        )
        self.bound: dict[str, str] = {}
        self._grpc: Any = None
        self._health: Any = None
        self._http: web.AppRunner | None = None
        self._periodic: PeriodicWork | None = None
        self._liveness: LivenessLock | None = None
        self._address = ""

    async def start(self) -> dict[str, str]:
        c = self.config
        servicer = ConductorServicer(self.manager)
        token = await internal_token(self.settings, self.pool)
        if self.objectstore is not None:
            self.objectstore.present_token(token)
        self._grpc, grpc_port, self._health = await start_grpc_server(
            host=c.host,
            port=c.grpc_port,
            metrics=self.metrics,
            register=lambda server: pb_grpc.add_ConductorServiceServicer_to_server(servicer, server),
            service_names=[pb.DESCRIPTOR.services_by_name["ConductorService"].full_name],
            authenticate=internal_token_authenticator(token),
            tls=tls_files(self.settings.security),
        )
        app = web.Application()
        app.router.add_get("/metrics", self.metrics.handle)
        tls = tls_files(self.settings.security)
        self._http, metrics_port = await start_http_site(
            app,
            c.host,
            c.metrics_port,
            listener="conductor-metrics",
            ssl_context=server_ssl_context(tls) if tls is not None else None,
        )
        address = self._address = f"{c.host}:{grpc_port}"
        if self.endpoints is not None:  # the api of this process calls us without gRPC
            self.endpoints.servicers[address] = LocalServicer(
                servicer, pb.DESCRIPTOR.services_by_name["ConductorService"], metrics=self.metrics
            )
        conductors = ConductorRepository(self.pool)
        # The liveness lock first: a second process with our hostname stops here,
        # and nobody sees this conductor online without its lock.
        self._liveness = LivenessLock(
            self._connect,
            conductor_id=await conductors.row_id(self.hostname),
            hostname=self.hostname,
            check_interval=c.liveness_check_interval,
            start_timeout=max(c.heartbeat_timeout, 5.0),
        )
        await self._liveness.start()
        registration: dict[str, Any] = {
            "hostname": self.hostname,
            "grpc_address": address,
            "conductor_group": c.conductor_group,
            "hardware_types": list(self.registry.hardware_types),
            "interfaces": self.registry.describe(),
            "liveness_lock": True,
        }
        await conductors.register(**registration)
        self.manager.tasks.start()
        await self._resume_own_locks()
        self._periodic = PeriodicWork(self.manager, registration=registration)
        self._periodic.start()
        try:  # the consoles this conductor ran before a restart, or now owns
            await self.manager.consoles.reconcile()
        except Exception:
            LOG.exception("starting the enabled consoles failed; the periodic check tries again")
        LOG.info("conductor %s registered at %s for %s", self.hostname, address, ",".join(self.registry.hardware_types))
        self.bound = {
            "conductor gRPC": address,
            "conductor metrics": f"{'https' if tls is not None else 'http'}://{c.host}:{metrics_port}/metrics",
        }
        return self.bound

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.settings.database.url, timeout=10)

    async def _resume_own_locks(self) -> None:
        """A previous incarnation with our hostname died holding these locks:
        its work is resumed, as another conductor would resume it."""
        stale = await self.manager.nodes.list_reserved_by([self.hostname])
        for node in stale:
            await self.manager.takeover.resume_adopted(node, reason=f"conductor {self.hostname} restarted")

    async def stop(self) -> None:
        if self._periodic:
            await self._periodic.stop()
        await self.manager.console_proxies.close()
        await self.manager.agents.stop()
        await self.manager.tasks.stop()
        for implementations in self.registry.enabled.values():
            for implementation in implementations.values():
                try:
                    await implementation.close()
                except Exception:  # one driver's cleanup must not stop the others'
                    LOG.exception("closing interface %s failed", implementation.name)
        await ConductorRepository(self.pool).unregister(self.hostname)
        if self._liveness is not None:
            await self._liveness.stop()
        if self.endpoints is not None:
            self.endpoints.servicers.pop(self._address, None)
        if self._grpc is not None:
            await stop_grpc_server(self._grpc, self._health)
        if self._http is not None:
            await self._http.cleanup()
        if self.objectstore is not None:
            await self.objectstore.close()
