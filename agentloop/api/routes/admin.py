"""/v1/admin: start training, follow and cancel training runs, list adapters, activate one (rollback), the
tenant's settings. Admin keys only: a tenant's admins see and change their tenant's runs and adapters only;
operator keys every run and adapter, the shared ones (`agentloop learn`, the schedule, `shared` runs) too."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from agentloop import events
from agentloop.api import service
from agentloop.api.deps import AdminPrincipal, SessionDep
from agentloop.api.schemas import (
    AdapterPublic,
    BaseServed,
    ErrorBody,
    TenantPublic,
    TenantUpdate,
    TrainCreate,
    TrainingRunPublic,
)
from agentloop.learner import adapters
from agentloop.settings import get_settings
from agentloop.store.models import TrainingRunStatus
from agentloop.worker.dispatch import publish_training

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})


@router.post(
    "/train",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TrainingRunPublic,
    responses={422: {"model": ErrorBody}, 503: {"model": ErrorBody}},
)
def train(body: TrainCreate, session: SessionDep, principal: AdminPrincipal) -> TrainingRunPublic:
    """Start a training run now; follow it at /v1/admin/training-runs/{id}. `config.world` names the world to
    train on, or `config.app` one of this tenant's resettable registered apps; a run that could not train (an
    unknown world or app, an app that cannot be reset, no train tasks) is 422 and nothing is queued; 503 when
    the app could not be asked for its tasks."""
    run = service.start_training(session, principal, body, get_settings().secret_key)
    session.commit()
    publish_training(run.id)
    return service.training_run_public(run)


@router.get("/training-runs", response_model=list[TrainingRunPublic])
def training_runs(
    session: SessionDep, principal: AdminPrincipal, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> list[TrainingRunPublic]:
    return [service.training_run_public(r) for r in service.list_training_runs(session, principal, limit)]


@router.get("/training-runs/{run_id}", response_model=TrainingRunPublic, responses={404: {"model": ErrorBody}})
def training_run(run_id: str, session: SessionDep, principal: AdminPrincipal) -> TrainingRunPublic:
    """Progress (phase, tasks and rollouts done) and per-iteration metrics."""
    return service.training_run_public(service.get_training_run(session, principal, run_id))


@router.post(
    "/training-runs/{run_id}/cancel",
    response_model=TrainingRunPublic,
    status_code=status.HTTP_202_ACCEPTED,
    responses={200: {"model": TrainingRunPublic}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
def cancel_training_run(
    run_id: str, session: SessionDep, principal: AdminPrincipal, response: Response
) -> TrainingRunPublic:
    """Cancel a run: a queued one at once (200, `cancelled`); a running one at its learner's next safe point
    (202, still `running` with `cancel_requested`; it ends `cancelled`). Nothing of the iteration it stops in
    is kept and the active adapter keeps serving. A run that already ended is 409."""
    run = service.cancel_training_run(session, principal, run_id)
    session.commit()
    events.publish(events.run_channel(run_id), {"type": "progress"})
    if run.status == TrainingRunStatus.CANCELLED:
        response.status_code = status.HTTP_200_OK
    return service.training_run_public(run)


@router.get("/adapters", response_model=list[AdapterPublic])
def list_adapters(session: SessionDep, principal: AdminPrincipal, base_model: str | None = None) -> list[AdapterPublic]:
    return [service.adapter_public(a) for a in service.list_adapters(session, principal, base_model)]


@router.post(
    "/adapters/{name}/activate",
    response_model=AdapterPublic | BaseServed,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
def activate(name: str, session: SessionDep, principal: AdminPrincipal) -> AdapterPublic | BaseServed:
    """Serve this version to its owner's episodes from the next one on (promotion by hand or rollback): a
    tenant admin one of its tenant's versions, an operator any. `base`: the base model (an operator: for the
    deployment, so tenants without their own version run on the base model)."""
    row = service.activate_adapter(session, principal, name)
    session.commit()
    model = get_settings().model_name
    adapters.announce(row, model, None if principal.is_operator else principal.tenant_id)
    return service.adapter_public(row) if row is not None else BaseServed(base_model=model)


@router.get("/tenant", response_model=TenantPublic)
def tenant(session: SessionDep, principal: AdminPrincipal) -> TenantPublic:
    """This key's tenant: its training settings and what its new episodes run on."""
    return service.tenant_public(session, principal)


@router.patch("/tenant", response_model=TenantPublic, responses={422: {"model": ErrorBody}})
def update_tenant(body: TenantUpdate, session: SessionDep, principal: AdminPrincipal) -> TenantPublic:
    """`share_training`: whether shared runs (the deployment's adapter) may train on this tenant's data."""
    service.update_tenant(session, principal, body)
    session.commit()
    return service.tenant_public(session, principal)
