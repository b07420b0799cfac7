"""Demonstrations: expert trajectories a client uploads (REST, `agentloop demos import`), for StepAgent and
supervised warm starts. Functions take a session and the caller's principal and never commit.

A demonstration names its task as a task does: `task_ref`, or `instruction` with `apps`. Every step must
call an app of the task (or api_docs, supervisor) and one of its APIs, with arguments its schema accepts.
When every app of the task is one of its world's own, the steps are then run in order on the task's initial
world (a free instruction: a fresh world of `seed`) and each keeps what it returned there as its
observation, whatever the upload said. Steps over a registered external app are checked against the app's
stored operations and never called: observations stay as uploaded, and the demonstration is not `replayed`.
A demonstration with any bad step is refused whole (422 naming the step); nothing is stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from agentloop.api import service
from agentloop.api.auth import Principal
from agentloop.api.errors import InvalidRequest, NotFound
from agentloop.api.schemas import DemonstrationCreate, DemonstrationPublic, DemonstrationStepPublic
from agentloop.apps.external import ExternalApp
from agentloop.apps.registry import WorldProvider, get_world
from agentloop.apps.replay import StepRejected, check_steps, replay_steps
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World
from agentloop.settings import get_settings
from agentloop.store import demonstrations as demo_store
from agentloop.store.models import Demonstration


def _externals(
    session: Session, principal: Principal, provider: WorldProvider, apps: list[str], secret_key: str
) -> dict[str, ExternalApp]:
    """The tenant's registered apps among the task's (resolve_task checked that each app is one or the other)."""
    found = {}
    for name in apps:
        if name not in provider.apps and (app := service.external_app(session, principal, name, secret_key)):
            found[name] = app
    return found


def _world(
    provider: WorldProvider, body: DemonstrationCreate, apps: list[str], externals: Mapping[str, ExternalApp]
) -> World:
    """The world the steps are checked on, as a worker would build it for the task (no external app reset)."""
    if body.task_ref is not None and not externals:
        world = provider.task_world(body.task_ref)
    else:
        world = provider.new_world(body.seed, [a for a in apps if a not in externals])
    for app in externals.values():
        world.attach(app.spec())
    return world


def create_demonstration(
    session: Session, principal: Principal, body: DemonstrationCreate, secret_key: str
) -> Demonstration:
    """Check the demonstration, replay it where its world allows, and insert it (the caller commits)."""
    instruction, apps = service.resolve_task(session, principal, body, secret_key)
    provider = get_world(body.world)
    externals = _externals(session, principal, provider, apps, secret_key)
    world = _world(provider, body, apps, externals)
    calls = [ToolCall(step.app, step.api, step.args) for step in body.steps]
    try:
        check_steps(world, calls, get_settings().demonstration_max_args_bytes)
        observations = [step.observation for step in body.steps] if externals else replay_steps(world, calls)
    except StepRejected as exc:
        details = {"step": exc.index, "app": exc.call.app, "api": exc.call.api, "reason": exc.reason}
        raise InvalidRequest(exc.message, details) from None
    return demo_store.create_demonstration(
        session,
        principal.tenant_id,
        world=body.world,
        task_ref=body.task_ref,
        instruction=instruction,
        apps=apps,
        seed=body.seed,
        steps=[{**call.to_dict(), "observation": obs} for call, obs in zip(calls, observations, strict=True)],
        replayed=not externals,
        metadata=body.metadata,
    )


def parse_upload(text: str) -> DemonstrationCreate:
    """One line of a `demos import` file: the JSON body of POST /v1/demonstrations."""
    try:
        return DemonstrationCreate.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidRequest.from_validation(exc) from None


def get_demonstration(session: Session, principal: Principal, demo_id: str) -> Demonstration:
    row = demo_store.get_demonstration(session, demo_id, principal.tenant_id)
    if row is None:
        raise NotFound(f"no demonstration {demo_id!r}")
    return row


def list_demonstrations(
    session: Session,
    principal: Principal,
    world: str | None,
    task_ref: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Demonstration], str | None]:
    """The tenant's demonstrations, newest first, optionally of one world or one task."""
    before = service.page_start(limit, cursor)
    rows = demo_store.list_demonstrations(
        session, principal.tenant_id, world=world, task_ref=task_ref, limit=limit + 1, before=before
    )
    return service.page_of(rows, limit)


def delete_demonstration(session: Session, principal: Principal, demo_id: str) -> None:
    if not demo_store.delete_demonstration(session, demo_id, principal.tenant_id):
        raise NotFound(f"no demonstration {demo_id!r}")


def demonstration_public(row: Demonstration) -> DemonstrationPublic:
    return DemonstrationPublic(
        id=row.id,
        world=row.world,
        task_ref=row.task_ref,
        instruction=row.instruction,
        apps=row.apps,
        seed=row.seed,
        steps=[DemonstrationStepPublic.model_validate(step) for step in row.steps],
        replayed=row.replayed,
        metadata=row.meta,
        created_at=row.created_at,
    )


def upload_body(row: Demonstration) -> dict[str, Any]:
    """The request body that uploads this demonstration again (`agentloop demos export`, then import)."""
    task: dict[str, Any] = (
        {"task_ref": row.task_ref} if row.task_ref is not None else {"instruction": row.instruction, "apps": row.apps}
    )
    return {"world": row.world, **task, "seed": row.seed, "steps": row.steps, "metadata": row.meta}
