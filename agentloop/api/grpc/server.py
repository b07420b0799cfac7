"""The gRPC server: AgentService, AdminService, the standard health service and reflection, on one
grpc.aio server in the caller's event loop."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agentloop.api.grpc.admin import AdminService
from agentloop.api.grpc.agent import AgentService
from agentloop.proto_gen.agentloop.v1 import agent_pb2, agent_pb2_grpc
from agentloop.settings import Settings
from agentloop.store.db import serve_requests

log = logging.getLogger(__name__)

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name  # "agentloop.v1.AgentService"
ADMIN_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
SERVICES = (AGENT_SERVICE, ADMIN_SERVICE)


@dataclass
class GrpcServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    address: str
    port: int  # the bound port (the one asked for, or the one the system chose for port 0)

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls at once (health turns NOT_SERVING) and give running calls, streams
        included, `grace_s` seconds to finish; then cancel what is left."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        log.info("gRPC server on %s stopped", self.address)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def start_server(settings: Settings, host: str, port: int) -> GrpcServer:
    """Bind and start. Port 0 takes a free port (see `.port`). Raises RuntimeError if it cannot bind."""
    serve_requests()  # pooled connections checked after idling, not at every checkout (store/db.py)
    server = grpc.aio.server(
        options=[
            # same limit as REST's request bodies; larger messages are RESOURCE_EXHAUSTED
            ("grpc.max_receive_message_length", settings.max_body_bytes),
        ]
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentService(), server)
    agent_pb2_grpc.add_AdminServiceServicer_to_server(AdminService(), server)
    health_servicer = health.aio.HealthServicer()
    for name in ("", *SERVICES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(_address(host, port))
    await server.start()
    address = _address(host, bound)
    log.info("gRPC serving on %s", address)
    return GrpcServer(server, health_servicer, address, bound)
