"""/v1/apps: the apps an agent can use, and their API documentation."""

from __future__ import annotations

from fastapi import APIRouter

from agentloop.api import service
from agentloop.api.deps import CurrentPrincipal
from agentloop.api.schemas import ApiDocPublic, AppPublic, ErrorBody

router = APIRouter(prefix="/v1/apps", tags=["apps"])


@router.get("", response_model=list[AppPublic], responses={401: {"model": ErrorBody}})
def list_apps(principal: CurrentPrincipal, world: str = "builtin") -> list[AppPublic]:
    return service.list_apps(principal, world)


@router.get("/{app}/apis", response_model=list[ApiDocPublic], responses={404: {"model": ErrorBody}})
def app_apis(app: str, principal: CurrentPrincipal, world: str = "builtin") -> list[ApiDocPublic]:
    return service.app_apis(principal, world, app)
