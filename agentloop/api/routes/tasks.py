"""/v1/tasks: create (idempotent), get, list, cancel, steps, live events (SSE), feedback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Header, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from agentloop import events
from agentloop.api import service, streams
from agentloop.api.deps import CurrentPrincipal, SessionDep
from agentloop.api.errors import InvalidRequest, ServiceError
from agentloop.api.schemas import (
    ERRORS,
    ErrorBody,
    FeedbackCreate,
    FeedbackPublic,
    StepPage,
    TaskCreate,
    TaskPage,
    TaskPublic,
)
from agentloop.settings import get_settings
from agentloop.worker.dispatch import publish_episode

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TaskPublic,
    responses={
        **ERRORS,
        503: {"model": ErrorBody, "description": "The app whose task it names is down; see Retry-After."},
    },
)
def create_task(
    body: TaskCreate,
    session: SessionDep,
    principal: CurrentPrincipal,
    response: Response,
    background: BackgroundTasks,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> TaskPublic:
    """Queue a task. The response comes once the task is stored; the agent runs it in the background."""
    task, created = service.create_task(session, principal, body, idempotency_key, get_settings().secret_key)
    session.commit()
    session.close()  # its connection back to the pool now, before the publish below takes one of its own
    if created:
        # sent to the queue once the response is out: a process that dies in between leaves a stored task
        # with no message, as one that died just before publishing would, and the sweeper publishes it
        background.add_task(publish_episode, task.id)
    else:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/tasks/{task.id}"
    return service.task_public(task)


@router.get("", response_model=TaskPage, responses=ERRORS)
def list_tasks(
    session: SessionDep,
    principal: CurrentPrincipal,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=service.MAX_PAGE)] = 20,
    cursor: str | None = None,
) -> TaskPage:
    """Your tasks, newest first."""
    tasks, next_cursor = service.list_tasks(session, principal, status, limit, cursor)
    page = TaskPage(items=[service.task_public(t) for t in tasks], next_cursor=next_cursor)
    session.close()  # in this thread: the session's end (deps.get_session) then costs no trip of its own
    return page


@router.get("/{task_id}", response_model=TaskPublic, responses=ERRORS)
def get_task(task_id: str, session: SessionDep, principal: CurrentPrincipal) -> TaskPublic:
    task = service.task_public(service.get_task(session, principal, task_id))
    session.close()  # as list_tasks'
    return task


@router.post("/{task_id}/cancel", response_model=TaskPublic, responses={**ERRORS, 409: {"model": ErrorBody}})
def cancel_task(task_id: str, session: SessionDep, principal: CurrentPrincipal) -> TaskPublic:
    """Cancel a queued task at once, or a running one at its next turn."""
    task = service.cancel_task(session, principal, task_id)
    session.commit()
    events.publish(events.task_channel(task_id), {"type": "status"})
    return service.task_public(task)


@router.get("/{task_id}/steps", response_model=StepPage, responses=ERRORS)
def task_steps(
    task_id: str,
    session: SessionDep,
    principal: CurrentPrincipal,
    after: Annotated[int, Query(ge=-1)] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> StepPage:
    """Steps of the latest attempt (exact token ids and log-probs, tool calls, observations)."""
    episode, steps = service.task_steps(session, principal, task_id, after, limit, attempt)
    return StepPage(
        episode=service.episode_public(episode) if episode else None,
        items=[service.step_public(s, episode.attempt) for s in steps] if episode else [],
    )


@router.post(
    "/{task_id}/feedback",
    status_code=201,
    response_model=FeedbackPublic,
    responses={**ERRORS, 409: {"model": ErrorBody}},
)
def add_feedback(
    task_id: str, body: FeedbackCreate, session: SessionDep, principal: CurrentPrincipal
) -> FeedbackPublic:
    """Rate how well a finished task was done (0 to 1); used as a reward for training."""
    reward = service.add_feedback(session, principal, task_id, body)
    session.commit()
    return service.feedback_public(reward)


# --- SSE ------------------------------------------------------------------------------------


def _sse(event: str, data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def parse_resume(value: str | None) -> tuple[int, int]:
    """`<attempt>.<index>` of the last event a client saw (SSE ids)."""
    if not value:
        return 0, -1
    try:
        attempt, index = value.split(".", 1)
        return int(attempt), int(index)
    except ValueError:
        raise InvalidRequest(f"invalid Last-Event-ID {value!r}: expected '<attempt>.<step index>'") from None


@router.get(
    "/{task_id}/events",
    responses=ERRORS,
    response_class=StreamingResponse,
    openapi_extra={"responses": {"200": {"content": {"text/event-stream": {}}}}},
)
async def task_events(
    task_id: str,
    request: Request,
    principal: CurrentPrincipal,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    after: Annotated[str | None, Query(description="Resume after this event id ('<attempt>.<index>').")] = None,
) -> StreamingResponse:
    """Server-sent events: `step` for each step as it is stored, `attempt` when a retry starts, and
    `result` (the task) at the end. Reconnect with Last-Event-ID to resume with no gap. A stream that
    cannot go on (its key was revoked or expired) ends with an `error` event: the error body."""
    attempt, index = parse_resume(last_event_id or after)
    await run_in_threadpool(streams.check_task_access, principal, task_id)

    async def stream() -> AsyncIterator[str]:
        position = streams.Position(attempt, index)
        try:
            async for event in streams.follow_task(principal, task_id, position, stopped=request.is_disconnected):
                yield _sse_event(event)
        except ServiceError as exc:  # the 200 is sent: the error goes in the stream, then it closes
            yield _sse("error", exc.body())

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _sse_event(event: streams.TaskEvent) -> str:
    at = event.position
    if event.kind == "step":
        assert event.step is not None
        return _sse("step", event.step.model_dump(mode="json"), f"{at.attempt}.{at.index}")
    if event.kind == "attempt":
        return _sse("attempt", {"attempt": at.attempt}, f"{at.attempt}.{at.index}")
    assert event.task is not None
    return _sse("result", event.task.model_dump(mode="json"))
