"""Request and response schemas of the public API. Tables never go on the wire."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from agentloop.learner.config import Algo
from agentloop.store.models import TaskStatus

TaskStatusName = Literal["queued", "running", "finished", "failed", "cancelled"]
assert set(TaskStatusName.__args__) == set(TaskStatus.ALL)  # type: ignore[attr-defined]


ClientMetadata = Annotated[dict[str, str], Field(max_length=32, description="Yours; stored as given.")]


class Strict(BaseModel):
    # what the document says, and no more: unknown fields and other types (`0` for a boolean, `"3"` for an
    # integer) are refused rather than coerced
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        """JSON Schema's integer: 3.0 is one, which a strict int field would refuse ("3" and 3.5 are not)."""
        if not isinstance(data, dict):
            return data
        ints = _int_fields(cls)
        return {k: int(v) if k in ints and isinstance(v, float) and v.is_integer() else v for k, v in data.items()}


@cache
def _int_fields(model: type[BaseModel]) -> frozenset[str]:
    """A request model's integer fields (`int`, `int | None`): read once per model, not per request."""
    return frozenset(n for n, f in model.model_fields.items() if f.annotation is int or int in get_args(f.annotation))


class TaskTarget(Strict):
    """The task a request is about: either a task of a world (`task_ref`, evaluated, usable for training) or
    a free instruction over named apps of that world."""

    instruction: str | None = Field(None, min_length=1, max_length=20_000, description="What the agent should do.")
    world: str = Field("builtin", max_length=64, description="The world whose apps the agent uses.")
    task_ref: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="A task of the world, e.g. `wallet_balance-1`; `wallet_balance@1234`: a train scenario, new seed.",
    )
    apps: list[str] | None = Field(
        None,
        max_length=32,
        description="Apps the agent may use (with `instruction`); api_docs and supervisor are always available.",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="World seed for free instructions.")

    @model_validator(mode="after")
    def _one_kind(self) -> TaskTarget:
        if self.task_ref is None and self.instruction is None:
            raise ValueError("give either `task_ref` (a task of the world) or `instruction` with `apps`")
        if self.task_ref is not None and (self.instruction is not None or self.apps is not None):
            raise ValueError("`task_ref` brings its own instruction and apps: leave out `instruction` and `apps`")
        if self.instruction is not None and not self.apps:
            raise ValueError('an `instruction` needs `apps`: the apps the agent may use, e.g. ["notes"]')
        return self


class TaskCreate(TaskTarget):
    """A task to queue: a task of a world, or a free instruction over named apps of that world."""

    max_turns: int | None = Field(None, ge=1, le=200, description="Override the service's turn limit.")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="Override the sampling temperature.")
    metadata: ClientMetadata = Field(default_factory=dict)


class TaskPublic(BaseModel):
    id: str
    status: TaskStatusName
    world: str
    task_ref: str | None
    instruction: str
    apps: list[str]
    attempts: int
    cancel_requested: bool
    answer: str | None
    reward: float | None = Field(
        description="Fraction of the evaluator's tests passed, 0 to 1, once a task of a world (`task_ref`) "
        "finished. Null while it runs, for a free instruction, and for a task that failed or was cancelled: "
        "an episode cut short is not evaluated (nor trained on)."
    )
    success: bool | None = Field(description="Every evaluator test passed; null whenever `reward` is.")
    error: str | None
    adapter: str | None
    metadata: dict[str, str]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class TaskPage(BaseModel):
    items: list[TaskPublic]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page; null on the last.")


class ToolCallPublic(BaseModel):
    app: str
    api: str
    args: dict[str, Any]


class StepPublic(BaseModel):
    index: int
    attempt: int
    prompt_token_count: int
    output_token_ids: list[int]
    output_logprobs: list[float]
    output_text: str
    finish_reason: str
    action: ToolCallPublic | None
    observation: str
    observation_token_ids: list[int]
    error_kind: str | None
    gen_s: float
    env_s: float
    created_at: datetime


class EpisodePublic(BaseModel):
    id: str
    attempt: int
    status: str
    finish_reason: str | None
    policy: str
    adapter: str | None
    prompt_token_ids: list[int]
    num_steps: int
    tokens_generated: int
    answer: str | None


class StepPage(BaseModel):
    episode: EpisodePublic | None
    items: list[StepPublic]


class FeedbackCreate(Strict):
    reward: float = Field(..., ge=0.0, le=1.0, description="How well the task was done, 0 to 1.")
    comment: str | None = Field(None, max_length=5_000)


class FeedbackPublic(BaseModel):
    id: int
    task_id: str
    reward: float
    comment: str | None
    created_at: datetime


class AuthHeader(Strict):
    name: str = Field(..., min_length=1, max_length=100, pattern=r"^[A-Za-z0-9-]+$")
    value: str = Field(..., min_length=1, max_length=4096)


class AppCreate(Strict):
    """An external app: its OpenAPI 3 document and where it is served."""

    name: str = Field(..., pattern=r"^[a-z][a-z0-9_]{1,39}$", description="How the agent names the app.")
    description: str = Field("", max_length=2_000)
    openapi: dict[str, Any] = Field(..., description="The OpenAPI 3 document; each operationId becomes an API.")
    base_url: str = Field(..., max_length=2_000, description="Where the operations' paths are served.")
    auth_header: AuthHeader | None = Field(None, description="Sent on every call; stored encrypted.")
    allowed_networks: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Private networks (CIDRs, like 10.0.0.0/8) it may also be called on; operator keys only. "
        "Link-local, multicast, broadcast and 0.0.0.0/8 are never allowed.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_allow_private(cls, data: Any) -> Any:
        if isinstance(data, dict) and "allow_private" in data:
            raise ValueError(
                "allow_private was replaced by allowed_networks: name the private networks (CIDRs) the app is "
                'served on, like ["10.0.0.0/8"] (operator keys only)'
            )
        return data


class AppPublic(BaseModel):
    name: str
    description: str
    kind: Literal["builtin", "openapi"]
    apis: int
    base_url: str | None = None
    allowed_networks: list[str] = Field(default_factory=list, description="Private networks it may be called on.")
    resettable: bool = Field(False, description="Declares agentloop_reset/evaluate: usable for eval and training.")


class ApiParameterPublic(BaseModel):
    name: str
    type: Any
    required: bool
    description: str | None = None
    default: Any = None
    enum: list[Any] | None = None
    minimum: Any = None
    maximum: Any = None
    format: Any = None
    outline: str | None = Field(
        None,
        alias="schema",
        description="Nested objects and arrays written compactly, e.g. {street: string, tags?: [string]}.",
    )


class ApiDocPublic(BaseModel):
    app: str
    api: str
    description: str
    parameters: list[ApiParameterPublic]
    returns: str


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorBody(BaseModel):
    error: ErrorDetail


# what the routes of a tenant's resources (tasks, demonstrations) answer besides success
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    422: {"model": ErrorBody},
}


class TrainCreate(Strict):
    """Start a training run now."""

    algo: Algo = Field("loop", description="The algorithm (docs/learning.md).")
    recipe: str | None = Field(
        None,
        description="A recipe instead of one algorithm: its phases run in order, each iteration gated on dev "
        "(`default`: sft, then stepagent-implicit, then loop+step).",
    )
    iterations: int = Field(1, ge=1, le=1000, description="Iterations to run (a recipe's phases say their own).")
    shared: bool = Field(
        False,
        description="Operator keys only: a shared run, which trains the deployment's shared adapter on the data of "
        "the tenants that share theirs. Otherwise the run is the key's tenant's: its adapter, its data only.",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the training config (e.g. tasks_per_iteration, lr; world, or app: the name of one "
        "of this tenant's registered resettable apps, whose train tasks are then sampled).",
    )


class TrainingRunPublic(BaseModel):
    id: str
    algo: str
    status: str
    trigger: str = Field(description="What started it: admin (the train route), cli (agentloop learn), schedule:<why>.")
    iteration: int
    cancel_requested: bool = Field(
        description="Cancel was asked for; a running run stops at its learner's next safe point, then is cancelled."
    )
    progress: dict[str, Any]
    metrics: list[Any] = Field(description="One entry of namespaced metrics per finished iteration.")
    config: dict[str, Any]
    error: str | None = Field(description="Why it failed or was cancelled (or was re-queued after a lost learner).")
    adapter: str | None = Field(description="The last adapter this run produced.")
    shared: bool = Field(description="A shared run (the deployment's adapter), not one tenant's.")
    trained_on: dict[str, Any] = Field(
        description="What it read besides its world: `tenants` whose data it may read, `episodes` it used."
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class AdapterPublic(BaseModel):
    name: str
    version: int
    base_model: str
    parent: str | None
    status: Literal["candidate", "active", "rejected", "retired"]
    shared: bool = Field(description="The deployment's shared adapter (else the tenant's own).")
    training_run_id: str | None
    metrics: dict[str, Any]
    sha256: str
    created_at: datetime
    activated_at: datetime | None
    damage: str | None = Field(
        None, description="Why a worker could not serve its files (missing, checksum wrong); None while they verify."
    )


class BaseServed(BaseModel):
    """Activating `base`: the owner's episodes run on the base model."""

    name: Literal["base"] = "base"
    base_model: str
    status: Literal["active"] = "active"


class TenantPublic(BaseModel):
    name: str
    share_training: bool = Field(
        description="Shared runs (the deployment's adapter) may train on this tenant's episodes, feedback and "
        "demonstrations."
    )
    serving: str = Field(description="What new episodes run on: an adapter version's name, or `base`.")


class TenantUpdate(Strict):
    share_training: StrictBool


MAX_DEMONSTRATION_STEPS = 200


class DemonstrationStep(Strict):
    """One expert tool call, and (optionally) what it returned."""

    app: str = Field(..., min_length=1, max_length=64, description="An app of the task (or api_docs, supervisor).")
    api: str = Field(..., min_length=1, max_length=64, description="One of that app's APIs.")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments its schema accepts.")
    observation: Any = Field(
        None,
        description="What the call returned. Replaced by what it returns when the service replays the steps "
        "(every app built in); kept as given otherwise (steps over external apps are never called).",
    )


class DemonstrationCreate(TaskTarget):
    """An expert trajectory of a task, named as a task is named (`task_ref`, or `instruction` with `apps`)."""

    steps: list[DemonstrationStep] = Field(..., min_length=1, max_length=MAX_DEMONSTRATION_STEPS)
    metadata: ClientMetadata = Field(default_factory=dict)


class DemonstrationStepPublic(BaseModel):
    app: str
    api: str
    args: dict[str, Any]
    observation: Any


class DemonstrationPublic(BaseModel):
    id: str
    world: str
    task_ref: str | None
    instruction: str
    apps: list[str]
    seed: int = Field(description="Seed of the world a free instruction's steps were replayed on.")
    steps: list[DemonstrationStepPublic]
    replayed: bool = Field(
        description="The steps were run, in order, on the task's initial world and each `observation` is what it "
        "returned there; false: checked against the apps' schemas only, observations as uploaded."
    )
    metadata: dict[str, str]
    created_at: datetime


class DemonstrationPage(BaseModel):
    items: list[DemonstrationPublic]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page; null on the last.")
