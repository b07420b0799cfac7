"""/v1/demonstrations: upload (checked, and replayed on built-in worlds), list, get, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from agentloop.api import demonstrations, service
from agentloop.api.deps import CurrentPrincipal, SessionDep
from agentloop.api.schemas import ERRORS, DemonstrationCreate, DemonstrationPage, DemonstrationPublic, ErrorBody
from agentloop.settings import get_settings

router = APIRouter(prefix="/v1/demonstrations", tags=["demonstrations"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=DemonstrationPublic,
    responses={
        **ERRORS,
        503: {"model": ErrorBody, "description": "The app whose task it names is down; see Retry-After."},
    },
)
def create_demonstration(
    body: DemonstrationCreate, session: SessionDep, principal: CurrentPrincipal, response: Response
) -> DemonstrationPublic:
    """Upload an expert trajectory of a task. Each step is checked (its app is one of the task's, its API
    exists, its args pass the API's schema); on a world whose apps are all built in, the steps are replayed
    in order on the task's initial world and each keeps what it returned there as its `observation`. A bad
    step is a 422 naming its index (from 0), and nothing is stored."""
    row = demonstrations.create_demonstration(session, principal, body, get_settings().secret_key)
    session.commit()
    response.headers["Location"] = f"/v1/demonstrations/{row.id}"
    return demonstrations.demonstration_public(row)


@router.get("", response_model=DemonstrationPage, responses=ERRORS)
def list_demonstrations(
    session: SessionDep,
    principal: CurrentPrincipal,
    world: str | None = None,
    task_ref: str | None = None,
    limit: Annotated[int, Query(ge=1, le=service.MAX_PAGE)] = 20,
    cursor: str | None = None,
) -> DemonstrationPage:
    """Your demonstrations, newest first; `world` and `task_ref` keep only those of one world or task."""
    rows, next_cursor = demonstrations.list_demonstrations(session, principal, world, task_ref, limit, cursor)
    return DemonstrationPage(items=[demonstrations.demonstration_public(r) for r in rows], next_cursor=next_cursor)


@router.get("/{demo_id}", response_model=DemonstrationPublic, responses=ERRORS)
def get_demonstration(demo_id: str, session: SessionDep, principal: CurrentPrincipal) -> DemonstrationPublic:
    return demonstrations.demonstration_public(demonstrations.get_demonstration(session, principal, demo_id))


@router.delete("/{demo_id}", status_code=status.HTTP_204_NO_CONTENT, responses=ERRORS)
def delete_demonstration(demo_id: str, session: SessionDep, principal: CurrentPrincipal) -> Response:
    demonstrations.delete_demonstration(session, principal, demo_id)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
