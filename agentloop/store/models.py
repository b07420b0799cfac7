"""SQLAlchemy 2.0 tables: the system of record for tasks, episodes, steps, rewards and adapters."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

NUL, NUL_STAND_IN = "\x00", "\ufffd"  # PostgreSQL's text and jsonb refuse NUL; a model may still write it


def without_nul(value: Any) -> Any:
    """`value` with every NUL in its strings (JSON keys too) replaced by U+FFFD: what a model writes is stored,
    whatever bytes it holds, instead of failing its episode (the exact tokens are kept as ids anyway)."""
    if isinstance(value, str):
        return value.replace(NUL, NUL_STAND_IN) if NUL in value else value
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value


class Text(TypeDecorator[str]):
    """Text that every backend stores: NUL becomes U+FFFD."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        return without_nul(value)


class JSONValue(TypeDecorator[Any]):
    """JSON (jsonb on PostgreSQL) whose strings hold no NUL."""

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else sa.JSON())

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return without_nul(value)


JSONType = JSONValue()


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return str(uuid.uuid4())


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use agentloop.store.models.utcnow()")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType, list[Any]: JSONType}


class TaskStatus:
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"  # the episode ran to its end; `success` and `reward` say how well
    FAILED = "failed"
    CANCELLED = "cancelled"
    TERMINAL = (FINISHED, FAILED, CANCELLED)
    ALL = (QUEUED, RUNNING, FINISHED, FAILED, CANCELLED)


class TrainingRunStatus:
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"  # an error, or a lost `agentloop learn` (resume it with `agentloop learn --resume`)
    CANCELLED = "cancelled"  # stopped by an admin or a signal, at a safe point; nothing it was doing was kept
    TERMINAL = (FINISHED, FAILED, CANCELLED)
    ALL = (QUEUED, RUNNING, FINISHED, FAILED, CANCELLED)


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(sa.String(100), unique=True)
    # whether the deployment's shared runs (an operator's, the schedule's) may train on this tenant's episodes,
    # feedback and demonstrations; off until the tenant's admin turns it on
    share_training: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    # the tenant chose the base model itself (activated "base"): its episodes skip the shared adapter too
    serve_base: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(sa.String(16))  # client | admin | operator
    name: Mapped[str] = mapped_column(sa.String(100), default="")
    prefix: Mapped[str] = mapped_column(sa.String(16))  # shown in listings; the key itself is never stored
    key_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)  # sha256 hex of the full key
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]  # a rotated key: valid until then (the grace period), refused after

    tenant: Mapped[Tenant] = relationship()


class App(Base):
    """An app registered by a tenant (OpenAPI document + base URL). Built-in apps live in code."""

    __tablename__ = "apps"
    __table_args__ = (sa.UniqueConstraint("tenant_id", "name"),)
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    kind: Mapped[str] = mapped_column(sa.String(16), default="openapi")
    spec: Mapped[dict[str, Any]] = mapped_column(deferred=True)  # the document as registered
    # the operations with their $refs resolved, stored at registration so requests never parse `spec`
    # again (store/apps.py); NULL for an app registered before they were kept, until first used
    operations: Mapped[dict[str, Any] | None] = mapped_column(deferred=True)
    operation_ids: Mapped[list[Any] | None]  # all of them, agentloop_* included: what a listing shows
    base_url: Mapped[str] = mapped_column(sa.String(2048))
    auth_header_encrypted: Mapped[str | None] = mapped_column(Text)
    # private networks (CIDRs) an operator let it be called on besides global addresses (apps/addresses.py)
    allowed_networks: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# a task that is queued or running, written as the partial index below is (a planner uses the index for a
# query whose condition is this text, whatever the statement's parameters)
ACTIVE_SQL = "status IN ('queued', 'running')"


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "idempotency_key"),
        sa.Index("ix_tasks_tenant_created", "tenant_id", "created_at"),
        sa.Index("ix_tasks_status_lease", "status", "lease_expires_at"),
        # the active-task quota's count (api/service.py): only queued and running rows are in it
        sa.Index(
            "ix_tasks_tenant_active",
            "tenant_id",
            postgresql_where=sa.text(ACTIVE_SQL),
            sqlite_where=sa.text(ACTIVE_SQL),
        ),
    )
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(sa.String(16), default=TaskStatus.QUEUED)
    world: Mapped[str] = mapped_column(sa.String(64))
    task_ref: Mapped[str | None] = mapped_column(sa.String(200))
    instruction: Mapped[str] = mapped_column(Text)
    apps: Mapped[list[Any]]
    options: Mapped[dict[str, Any]]  # seed, max_turns, temperature, metadata
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(200))
    request_hash: Mapped[str] = mapped_column(sa.String(64))
    attempts: Mapped[int] = mapped_column(default=0)
    lease_owner: Mapped[str | None] = mapped_column(sa.String(200))
    lease_expires_at: Mapped[datetime | None]
    dispatched_at: Mapped[datetime | None]
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    error: Mapped[str | None] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text)
    reward: Mapped[float | None]
    success: Mapped[bool | None]
    adapter: Mapped[str | None] = mapped_column(sa.String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class TrainingRun(Base):
    __tablename__ = "training_runs"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    algo: Mapped[str] = mapped_column(sa.String(32))
    status: Mapped[str] = mapped_column(sa.String(16), default=TrainingRunStatus.QUEUED)
    trigger: Mapped[str] = mapped_column(sa.String(32), default="admin")  # admin | cli | schedule:<why>
    # the tenant whose admin started it; None: the deployment's (`agentloop learn`, the schedule)
    tenant_id: Mapped[str | None] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    config: Mapped[dict[str, Any]]
    progress: Mapped[dict[str, Any]] = mapped_column(default=dict)
    metrics: Mapped[list[Any]] = mapped_column(default=list)
    iteration: Mapped[int] = mapped_column(default=0)
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")
    # the learner stops at its next safe point and records the run as cancelled; never claimed again
    cancel_requested: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    error: Mapped[str | None] = mapped_column(Text)  # why it failed, was cancelled or was re-queued
    adapter: Mapped[str | None] = mapped_column(sa.String(200))
    # what the run read besides the world: {"episodes": [ids of logged episodes], "tenants": [their tenant ids]}
    trained_on: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    lease_owner: Mapped[str | None] = mapped_column(sa.String(200))
    lease_expires_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class EvalRun(Base):
    """One `agentloop eval`: a policy run over a split of a world (or over an external app's tasks)."""

    __tablename__ = "eval_runs"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    world: Mapped[str] = mapped_column(sa.String(64))
    split: Mapped[str | None] = mapped_column(sa.String(32))
    app: Mapped[str | None] = mapped_column(sa.String(64))  # an external app's name, for app evaluations
    tenant_id: Mapped[str | None] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    policy: Mapped[str] = mapped_column(sa.String(200))
    adapter: Mapped[str | None] = mapped_column(sa.String(200))
    k: Mapped[int] = mapped_column(default=1)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # limits, temperature, task count
    status: Mapped[str] = mapped_column(sa.String(16), default="running")  # running | finished | failed
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class Episode(Base):
    """One attempt at a task (served) or one rollout (training); pinned to one adapter."""

    __tablename__ = "episodes"
    __table_args__ = (
        sa.Index("ix_episodes_task_attempt", "task_id", "attempt"),
        sa.Index("ix_episodes_run_iteration", "training_run_id", "iteration"),
    )
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    task_id: Mapped[str | None] = mapped_column(sa.ForeignKey("tasks.id", ondelete="CASCADE"))
    training_run_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("training_runs.id", ondelete="CASCADE"), index=True
    )
    eval_run_id: Mapped[str | None] = mapped_column(sa.ForeignKey("eval_runs.id", ondelete="CASCADE"), index=True)
    iteration: Mapped[int | None]  # training iteration of a rollout
    attempt: Mapped[int] = mapped_column(default=1)
    kind: Mapped[str] = mapped_column(sa.String(16), default="served")  # served | rollout | eval
    world: Mapped[str] = mapped_column(sa.String(64))
    task_ref: Mapped[str | None] = mapped_column(sa.String(200))
    seed: Mapped[int] = mapped_column(default=0)
    instruction: Mapped[str] = mapped_column(Text)
    policy: Mapped[str] = mapped_column(sa.String(200))
    adapter: Mapped[str | None] = mapped_column(sa.String(200))
    status: Mapped[str] = mapped_column(sa.String(16), default="running")  # running|finished|abandoned|failed
    finish_reason: Mapped[str | None] = mapped_column(sa.String(32))
    prompt_token_ids: Mapped[list[Any]]
    answer: Mapped[str | None] = mapped_column(Text)
    num_steps: Mapped[int] = mapped_column(default=0)
    tokens_generated: Mapped[int] = mapped_column(default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]

    steps: Mapped[list[Step]] = relationship(
        back_populates="episode", order_by="Step.index", cascade="all, delete-orphan"
    )


class Step(Base):
    """One agent turn: exactly the sampled token ids and their log-probs, the action and its result."""

    __tablename__ = "steps"
    __table_args__ = (sa.UniqueConstraint("episode_id", "index"),)
    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)
    episode_id: Mapped[str] = mapped_column(sa.ForeignKey("episodes.id", ondelete="CASCADE"))
    index: Mapped[int]
    prompt_token_count: Mapped[int]  # context length the turn was sampled from
    output_token_ids: Mapped[list[Any]]
    output_logprobs: Mapped[list[Any]]
    output_text: Mapped[str] = mapped_column(Text)
    finish_reason: Mapped[str] = mapped_column(sa.String(16))  # stop | length
    action: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    observation: Mapped[str] = mapped_column(Text)
    observation_token_ids: Mapped[list[Any]]  # appended to the context after the output
    error_kind: Mapped[str | None] = mapped_column(sa.String(32))
    gen_s: Mapped[float]
    env_s: Mapped[float]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    episode: Mapped[Episode] = relationship(back_populates="steps")


class Reward(Base):
    __tablename__ = "rewards"
    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)
    episode_id: Mapped[str | None] = mapped_column(sa.ForeignKey("episodes.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[str | None] = mapped_column(sa.ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    source: Mapped[str] = mapped_column(sa.String(16))  # evaluator | client | expert
    value: Mapped[float]
    success: Mapped[bool | None]
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Demonstration(Base):
    """An expert trajectory a client uploaded: the steps (tool calls and what each returned) of one task,
    for StepAgent and supervised warm starts. `replayed`: its observations are the world's own answers."""

    __tablename__ = "demonstrations"
    __table_args__ = (sa.Index("ix_demonstrations_tenant_created", "tenant_id", "created_at"),)
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    # None: the deployment's own (no tenant sees it over the API; training on every tenant's data does)
    tenant_id: Mapped[str | None] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    world: Mapped[str] = mapped_column(sa.String(64))
    task_ref: Mapped[str | None] = mapped_column(sa.String(200))
    instruction: Mapped[str] = mapped_column(Text)
    apps: Mapped[list[Any]]
    seed: Mapped[int] = mapped_column(default=0, server_default="0")  # of a free instruction's world
    steps: Mapped[list[Any]]  # [{"app", "api", "args", "observation"}]
    # the steps were run on the task's initial world and `observation` is what each returned; False: checked
    # against the apps' schemas only (external apps are never called), observations as the client gave them
    replayed: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict, server_default="{}")  # the client's
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Adapter(Base):
    __tablename__ = "adapters"
    __table_args__ = (sa.UniqueConstraint("base_model", "version"),)
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)  # <base>@v<N>
    base_model: Mapped[str] = mapped_column(sa.String(200))
    # whose it is: the tenant whose run trained it (served to that tenant only), or None: the deployment's
    # shared adapter, served to every tenant without an active one of its own
    tenant_id: Mapped[str | None] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    version: Mapped[int]
    parent: Mapped[str | None] = mapped_column(sa.String(200))
    training_run_id: Mapped[str | None] = mapped_column(sa.ForeignKey("training_runs.id", ondelete="SET NULL"))
    path: Mapped[str] = mapped_column(sa.String(2048))
    sha256: Mapped[str] = mapped_column(sa.String(64))
    status: Mapped[str] = mapped_column(sa.String(16), default="candidate")  # candidate|active|rejected|retired
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    activated_at: Mapped[datetime | None]
    # why a serving process could not use its files (missing, checksum wrong, unloadable), and since when;
    # cleared when they verify again (a load or an activation): /readyz and /metrics report it
    damage: Mapped[str | None] = mapped_column(Text)
    damaged_at: Mapped[datetime | None]
