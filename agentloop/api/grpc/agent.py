"""agentloop.v1.AgentService: each method does what its REST route does, with the same service
functions (`agentloop.api.service`) and the same stream (`agentloop.api.streams`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from agentloop import events
from agentloop.api import service, streams
from agentloop.api.auth import Principal
from agentloop.api.grpc import messages
from agentloop.api.grpc.calls import Context, blocking, deadline, principal, translates_errors
from agentloop.api.schemas import AppPublic, FeedbackCreate, FeedbackPublic, TaskCreate, TaskPublic
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.proto_gen.agentloop.v1 import agent_pb2_grpc
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker
from agentloop.worker.dispatch import publish_episode

# --- blocking halves (run in a thread): a session each, commit, then publish -----------------------


def submit_task(caller: Principal, body: TaskCreate, idempotency_key: str | None) -> tuple[TaskPublic, bool]:
    with get_sessionmaker()() as session:
        task, created = service.create_task(session, caller, body, idempotency_key, get_settings().secret_key)
        session.commit()
    if created:
        publish_episode(task.id)
    return service.task_public(task), created


def get_task(caller: Principal, task_id: str) -> TaskPublic:
    with get_sessionmaker()() as session:
        return service.task_public(service.get_task(session, caller, task_id))


def list_tasks(caller: Principal, status: str | None, limit: int, cursor: str | None) -> tuple[list[TaskPublic], str]:
    with get_sessionmaker()() as session:
        tasks, next_cursor = service.list_tasks(session, caller, status, limit, cursor)
        return [service.task_public(t) for t in tasks], next_cursor or ""


def cancel_task(caller: Principal, task_id: str) -> TaskPublic:
    with get_sessionmaker()() as session:
        task = service.cancel_task(session, caller, task_id)
        session.commit()
    events.publish(events.task_channel(task_id), {"type": "status"})
    return service.task_public(task)


def add_feedback(caller: Principal, task_id: str, body: FeedbackCreate) -> FeedbackPublic:
    with get_sessionmaker()() as session:
        reward = service.add_feedback(session, caller, task_id, body)
        session.commit()
    return service.feedback_public(reward)


def list_apps(caller: Principal, world: str) -> Sequence[AppPublic]:
    with get_sessionmaker()() as session:
        apps = service.list_apps(session, caller, world)
        session.commit()  # keeps the operations resolved for an app registered before they were stored
        return apps


# --- the service ------------------------------------------------------------------------------------


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    @translates_errors
    async def SubmitTask(self, request: pb.SubmitTaskRequest, context: Context) -> pb.SubmitTaskResponse:
        caller = await principal(context)
        body = messages.task_create(request)
        task, created = await blocking(context, submit_task, caller, body, messages.idempotency_key(request))
        return pb.SubmitTaskResponse(task=messages.task(task), replayed=not created)

    @translates_errors
    async def GetTask(self, request: pb.GetTaskRequest, context: Context) -> pb.Task:
        caller = await principal(context)
        return messages.task(await blocking(context, get_task, caller, request.task_id))

    @translates_errors
    async def ListTasks(self, request: pb.ListTasksRequest, context: Context) -> pb.ListTasksResponse:
        caller = await principal(context)
        status, limit = messages.status_filter(request.status), messages.page_size(request.page_size)
        tasks, token = await blocking(context, list_tasks, caller, status, limit, request.page_token or None)
        return pb.ListTasksResponse(tasks=[messages.task(t) for t in tasks], next_page_token=token)

    @translates_errors
    async def CancelTask(self, request: pb.CancelTaskRequest, context: Context) -> pb.Task:
        caller = await principal(context)
        return messages.task(await blocking(context, cancel_task, caller, request.task_id))

    @translates_errors
    async def StreamSteps(self, request: pb.StreamStepsRequest, context: Context) -> AsyncIterator[pb.TaskEvent]:
        caller = await principal(context)
        position = messages.position(request)
        async for event in streams.follow_task(caller, request.task_id, position, deadline=deadline(context)):
            yield messages.task_event(event)

    @translates_errors
    async def RunTask(self, request: pb.SubmitTaskRequest, context: Context) -> AsyncIterator[pb.TaskEvent]:
        caller = await principal(context)
        body = messages.task_create(request)
        task, _ = await blocking(context, submit_task, caller, body, messages.idempotency_key(request))
        yield pb.TaskEvent(submitted=messages.task(task))
        async for event in streams.follow_task(caller, task.id, deadline=deadline(context)):
            yield messages.task_event(event)

    @translates_errors
    async def SubmitFeedback(self, request: pb.SubmitFeedbackRequest, context: Context) -> pb.Feedback:
        caller = await principal(context)
        body = messages.feedback_create(request)
        return messages.feedback(await blocking(context, add_feedback, caller, request.task_id, body))

    @translates_errors
    async def ListApps(self, request: pb.ListAppsRequest, context: Context) -> pb.ListAppsResponse:
        caller = await principal(context)
        apps = await blocking(context, list_apps, caller, request.world or "builtin")
        return pb.ListAppsResponse(apps=[messages.app(a) for a in apps])
