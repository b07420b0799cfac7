"""/v1/apps: the apps an agent can use (built-in and registered external ones) and their API docs."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from agentloop.api import service
from agentloop.api.deps import CurrentPrincipal, SessionDep
from agentloop.api.schemas import ApiDocPublic, AppCreate, AppPublic, ErrorBody
from agentloop.settings import get_settings

router = APIRouter(prefix="/v1/apps", tags=["apps"])


@router.get("", response_model=list[AppPublic], responses={401: {"model": ErrorBody}})
def list_apps(session: SessionDep, principal: CurrentPrincipal, world: str = "builtin") -> list[AppPublic]:
    """The world's built-in apps and the apps your tenant registered."""
    apps = service.list_apps(session, principal, world)
    session.commit()  # keeps the operations resolved for an app registered before they were stored
    return apps


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=AppPublic,
    responses={403: {"model": ErrorBody}, 409: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
def register_app(body: AppCreate, session: SessionDep, principal: CurrentPrincipal) -> AppPublic:
    """Register an external app from its OpenAPI 3 document. Each operation becomes an API the agent can
    call (agentloop_tasks / agentloop_reset / agentloop_evaluate make it an evaluation environment)."""
    row = service.register_app(session, principal, body, get_settings().secret_key)
    session.commit()
    return service.app_public(row)


@router.delete("/{app}", status_code=status.HTTP_204_NO_CONTENT, responses={404: {"model": ErrorBody}})
def delete_app(app: str, session: SessionDep, principal: CurrentPrincipal) -> Response:
    service.delete_app(session, principal, app)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{app}/apis", response_model=list[ApiDocPublic], responses={404: {"model": ErrorBody}})
def app_apis(app: str, session: SessionDep, principal: CurrentPrincipal, world: str = "builtin") -> list[ApiDocPublic]:
    docs = service.app_apis(session, principal, world, app, get_settings().secret_key)
    session.commit()  # as in list_apps
    return docs
