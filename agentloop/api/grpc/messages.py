"""Between the wire and the service: protobuf requests -> the REST input schemas (validated by the
same pydantic classes), the REST output schemas -> protobuf messages. No rules live here."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, TypeVar

from google.protobuf import json_format, struct_pb2, timestamp_pb2
from pydantic import BaseModel, ValidationError

from agentloop.api.errors import InvalidRequest
from agentloop.api.schemas import (
    AdapterPublic,
    AppPublic,
    BaseServed,
    FeedbackCreate,
    FeedbackPublic,
    StepPublic,
    TaskCreate,
    TaskPublic,
    TenantPublic,
    TrainCreate,
    TrainingRunPublic,
)
from agentloop.api.streams import Position, TaskEvent
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb

TASK_STATUS = {
    "queued": pb.TASK_STATUS_QUEUED,
    "running": pb.TASK_STATUS_RUNNING,
    "finished": pb.TASK_STATUS_FINISHED,
    "failed": pb.TASK_STATUS_FAILED,
    "cancelled": pb.TASK_STATUS_CANCELLED,
}
TASK_STATUS_NAME: dict[int, str] = {number: name for name, number in TASK_STATUS.items()}
TRAINING_RUN_STATUS = {
    "queued": pb.TRAINING_RUN_STATUS_QUEUED,
    "running": pb.TRAINING_RUN_STATUS_RUNNING,
    "finished": pb.TRAINING_RUN_STATUS_FINISHED,
    "failed": pb.TRAINING_RUN_STATUS_FAILED,
    "cancelled": pb.TRAINING_RUN_STATUS_CANCELLED,
}
ADAPTER_STATUS = {
    "candidate": pb.ADAPTER_STATUS_CANDIDATE,
    "active": pb.ADAPTER_STATUS_ACTIVE,
    "rejected": pb.ADAPTER_STATUS_REJECTED,
    "retired": pb.ADAPTER_STATUS_RETIRED,
}
APP_KIND = {"builtin": pb.APP_KIND_BUILTIN, "openapi": pb.APP_KIND_OPENAPI}
DEFAULT_PAGE_SIZE = 20  # REST's default `limit`

Schema = TypeVar("Schema", bound=BaseModel)


def _validated(schema: type[Schema], **fields: Any) -> Schema:
    try:
        return schema(**fields)
    except ValidationError as exc:
        raise InvalidRequest.from_validation(exc) from None


# --- requests -----------------------------------------------------------------------------------


def task_create(request: pb.SubmitTaskRequest) -> TaskCreate:
    """The REST body this request stands for (so both give the same idempotency fingerprint)."""
    fields: dict[str, Any] = {"world": request.world or "builtin", "metadata": dict(request.metadata)}
    for name in ("instruction", "task_ref", "seed", "max_turns", "temperature"):
        if request.HasField(name):
            fields[name] = getattr(request, name)
    if request.apps:
        fields["apps"] = list(request.apps)
    return _validated(TaskCreate, **fields)


def idempotency_key(request: pb.SubmitTaskRequest) -> str | None:
    return request.idempotency_key or None


def status_filter(status: int) -> str | None:
    if status == pb.TASK_STATUS_UNSPECIFIED:
        return None
    if status not in TASK_STATUS_NAME:
        raise InvalidRequest(f"unknown status {status}; use a TaskStatus value, or leave it unset for all")
    return TASK_STATUS_NAME[status]


def page_size(size: int) -> int:
    return size or DEFAULT_PAGE_SIZE


def position(request: pb.StreamStepsRequest) -> Position:
    if request.attempt < 0 or request.from_index < 0:
        raise InvalidRequest("attempt and from_index must be >= 0 (0 and 0: the latest attempt from its start)")
    return Position(request.attempt, request.from_index - 1)


def feedback_create(request: pb.SubmitFeedbackRequest) -> FeedbackCreate:
    fields: dict[str, Any] = {"reward": request.reward}
    if request.HasField("comment"):
        fields["comment"] = request.comment
    return _validated(FeedbackCreate, **fields)


def _whole_numbers(value: Any) -> Any:
    """Struct carries every number as a double; a training option like `tasks_per_iteration: 8`
    must arrive as the integer 8."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def train_create(request: pb.TrainRequest) -> TrainCreate:
    config = _whole_numbers(json_format.MessageToDict(request.config)) if request.HasField("config") else {}
    return _validated(
        TrainCreate,
        algo=request.algo or "loop",
        recipe=request.recipe or None,
        iterations=request.iterations or 1,
        shared=request.shared,
        config=config,
    )


# --- responses ----------------------------------------------------------------------------------


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    """Any JSON object as a Struct (values JSON cannot carry, such as datetimes, as strings)."""
    return json_format.ParseDict(json.loads(json.dumps(value or {}, default=str)), struct_pb2.Struct())


def task(t: TaskPublic) -> pb.Task:
    return pb.Task(
        id=t.id,
        status=TASK_STATUS[t.status],
        world=t.world,
        task_ref=t.task_ref,
        instruction=t.instruction,
        apps=t.apps,
        attempts=t.attempts,
        cancel_requested=t.cancel_requested,
        answer=t.answer,
        reward=t.reward,
        success=t.success,
        error=t.error,
        adapter=t.adapter,
        metadata=t.metadata,
        created_at=timestamp(t.created_at),
        started_at=timestamp(t.started_at),
        finished_at=timestamp(t.finished_at),
    )


def step(s: StepPublic) -> pb.Step:
    action = pb.ToolCall(app=s.action.app, api=s.action.api, args=struct(s.action.args)) if s.action else None
    return pb.Step(
        index=s.index,
        attempt=s.attempt,
        prompt_token_count=s.prompt_token_count,
        output_token_ids=s.output_token_ids,
        output_logprobs=s.output_logprobs,
        output_text=s.output_text,
        finish_reason=s.finish_reason,
        action=action,
        observation=s.observation,
        observation_token_ids=s.observation_token_ids,
        error_kind=s.error_kind,
        gen_s=s.gen_s,
        env_s=s.env_s,
        created_at=timestamp(s.created_at),
    )


def task_event(event: TaskEvent) -> pb.TaskEvent:
    if event.kind == "step":
        assert event.step is not None
        return pb.TaskEvent(step=step(event.step))
    if event.kind == "attempt":
        return pb.TaskEvent(attempt=pb.AttemptStarted(attempt=event.position.attempt))
    assert event.task is not None
    return pb.TaskEvent(result=task(event.task))


def feedback(f: FeedbackPublic) -> pb.Feedback:
    return pb.Feedback(
        id=f.id, task_id=f.task_id, reward=f.reward, comment=f.comment, created_at=timestamp(f.created_at)
    )


def app(a: AppPublic) -> pb.App:
    return pb.App(
        name=a.name,
        description=a.description,
        kind=APP_KIND[a.kind],
        api_count=a.apis,
        base_url=a.base_url,
        resettable=a.resettable,
    )


def training_run(r: TrainingRunPublic) -> pb.TrainingRun:
    return pb.TrainingRun(
        id=r.id,
        algo=r.algo,
        status=TRAINING_RUN_STATUS.get(r.status, pb.TRAINING_RUN_STATUS_UNSPECIFIED),
        trigger=r.trigger,
        iteration=r.iteration,
        progress=struct(r.progress),
        metrics=[struct(m if isinstance(m, dict) else {"value": m}) for m in r.metrics],
        config=struct(r.config),
        error=r.error,
        adapter=r.adapter,
        created_at=timestamp(r.created_at),
        started_at=timestamp(r.started_at),
        finished_at=timestamp(r.finished_at),
        cancel_requested=r.cancel_requested,
        shared=r.shared,
        trained_on=struct(r.trained_on),
    )


def adapter(a: AdapterPublic) -> pb.Adapter:
    return pb.Adapter(
        name=a.name,
        version=a.version,
        base_model=a.base_model,
        parent=a.parent,
        status=ADAPTER_STATUS[a.status],
        training_run_id=a.training_run_id,
        metrics=struct(a.metrics),
        sha256=a.sha256,
        created_at=timestamp(a.created_at),
        activated_at=timestamp(a.activated_at),
        shared=a.shared,
        damage=a.damage,
    )


def base_served(b: BaseServed) -> pb.Adapter:
    return pb.Adapter(name=b.name, base_model=b.base_model, status=ADAPTER_STATUS[b.status])


def tenant(t: TenantPublic) -> pb.Tenant:
    return pb.Tenant(name=t.name, share_training=t.share_training, serving=t.serving)
