"""agentloop.v1.AdminService (admin and operator keys): what /v1/admin does, with the same service functions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from agentloop import events
from agentloop.api import service, streams
from agentloop.api.auth import Principal
from agentloop.api.grpc import messages
from agentloop.api.grpc.calls import Context, admin, blocking, deadline, translates_errors
from agentloop.api.schemas import AdapterPublic, BaseServed, TenantPublic, TenantUpdate, TrainCreate, TrainingRunPublic
from agentloop.learner import adapters
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.proto_gen.agentloop.v1 import agent_pb2_grpc
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker
from agentloop.worker.dispatch import publish_training

# --- blocking halves (run in a thread) ----------------------------------------------------------------


def start_training(caller: Principal, body: TrainCreate) -> TrainingRunPublic:
    with get_sessionmaker()() as session:
        run = service.start_training(session, caller, body, get_settings().secret_key)
        session.commit()
    publish_training(run.id)
    return service.training_run_public(run)


def cancel_training_run(caller: Principal, run_id: str) -> TrainingRunPublic:
    with get_sessionmaker()() as session:
        run = service.cancel_training_run(session, caller, run_id)
        session.commit()
        public = service.training_run_public(run)
    events.publish(events.run_channel(run_id), {"type": "progress"})
    return public


def list_adapters(caller: Principal, base_model: str | None) -> Sequence[AdapterPublic]:
    with get_sessionmaker()() as session:
        return [service.adapter_public(a) for a in service.list_adapters(session, caller, base_model)]


def activate_adapter(caller: Principal, name: str) -> AdapterPublic | BaseServed:
    model = get_settings().model_name
    with get_sessionmaker()() as session:
        row = service.activate_adapter(session, caller, name)
        session.commit()
        public = service.adapter_public(row) if row is not None else BaseServed(base_model=model)
    adapters.announce(row, model, None if caller.is_operator else caller.tenant_id)
    return public


def get_tenant(caller: Principal) -> TenantPublic:
    with get_sessionmaker()() as session:
        return service.tenant_public(session, caller)


def update_tenant(caller: Principal, body: TenantUpdate) -> TenantPublic:
    with get_sessionmaker()() as session:
        service.update_tenant(session, caller, body)
        session.commit()
        return service.tenant_public(session, caller)


# --- the service ------------------------------------------------------------------------------------


class AdminService(agent_pb2_grpc.AdminServiceServicer):
    @translates_errors
    async def Train(self, request: pb.TrainRequest, context: Context) -> pb.TrainingRun:
        caller = await admin(context)
        body = messages.train_create(request)
        return messages.training_run(await blocking(context, start_training, caller, body))

    @translates_errors
    async def GetTrainingRun(self, request: pb.GetTrainingRunRequest, context: Context) -> pb.TrainingRun:
        caller = await admin(context)
        return messages.training_run(await blocking(context, streams.read_training_run, caller, request.run_id))

    @translates_errors
    async def StreamTrainingProgress(
        self, request: pb.StreamTrainingProgressRequest, context: Context
    ) -> AsyncIterator[pb.TrainingRun]:
        caller = await admin(context)
        async for run in streams.follow_training_run(caller, request.run_id, deadline=deadline(context)):
            yield messages.training_run(run)

    @translates_errors
    async def CancelTrainingRun(self, request: pb.CancelTrainingRunRequest, context: Context) -> pb.TrainingRun:
        caller = await admin(context)
        return messages.training_run(await blocking(context, cancel_training_run, caller, request.run_id))

    @translates_errors
    async def ListAdapters(self, request: pb.ListAdaptersRequest, context: Context) -> pb.ListAdaptersResponse:
        caller = await admin(context)
        rows = await blocking(context, list_adapters, caller, request.base_model or None)
        return pb.ListAdaptersResponse(adapters=[messages.adapter(a) for a in rows])

    @translates_errors
    async def ActivateAdapter(self, request: pb.ActivateAdapterRequest, context: Context) -> pb.Adapter:
        caller = await admin(context)
        public = await blocking(context, activate_adapter, caller, request.name)
        return messages.adapter(public) if isinstance(public, AdapterPublic) else messages.base_served(public)

    @translates_errors
    async def GetTenant(self, request: pb.GetTenantRequest, context: Context) -> pb.Tenant:
        caller = await admin(context)
        return messages.tenant(await blocking(context, get_tenant, caller))

    @translates_errors
    async def UpdateTenant(self, request: pb.UpdateTenantRequest, context: Context) -> pb.Tenant:
        caller = await admin(context)
        body = TenantUpdate(share_training=request.share_training)
        return messages.tenant(await blocking(context, update_tenant, caller, body))
