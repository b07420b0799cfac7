"""/v1/admin: start training, follow and cancel training runs, list adapters, activate one (rollback). Admin keys
only; a tenant's admins see the runs they started and the deployment's (`agentloop learn`, the schedule)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from agentloop import events
from agentloop.api import service
from agentloop.api.deps import AdminPrincipal, SessionDep
from agentloop.api.schemas import AdapterPublic, ErrorBody, TrainCreate, TrainingRunPublic
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
    response_model=AdapterPublic,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
def activate(name: str, session: SessionDep, principal: AdminPrincipal) -> AdapterPublic:
    """Serve this version from the next episode on (any stored version: promotion by hand or rollback)."""
    row = service.activate_adapter(session, principal, name)
    session.commit()
    adapters.announce(row)
    return service.adapter_public(row)
