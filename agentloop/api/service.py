"""What the API does, independent of transport: REST routes and gRPC servicers both call these.

Functions take a session and the caller's principal, raise `ServiceError`s, and never commit:
the caller commits, then publishes (a task exists once its row is committed)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentloop.api.auth import Principal
from agentloop.api.errors import (
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    Unavailable,
)
from agentloop.api.schemas import (
    AdapterPublic,
    ApiDocPublic,
    AppCreate,
    AppPublic,
    EpisodePublic,
    FeedbackCreate,
    FeedbackPublic,
    StepPublic,
    TaskCreate,
    TaskPublic,
    TaskStatusName,
    TaskTarget,
    TenantPublic,
    TenantUpdate,
    ToolCallPublic,
    TrainCreate,
    TrainingRunPublic,
)
from agentloop.apps.addresses import NetworkError, parse_networks
from agentloop.apps.external import ExternalApp, free_instruction_refusal, split_task_ref
from agentloop.apps.openapi import (
    EVALUATE_OP,
    HIDDEN_OPS,
    RESET_OP,
    AppRegistrationError,
    check_argument_schemas,
    parse_document,
)
from agentloop.apps.openapi_refs import DocumentLimitExceeded
from agentloop.apps.registry import UnknownWorld, WorldProvider, get_world, why_no_task
from agentloop.apps.remote_env import EnvironmentFailure
from agentloop.apps.remote_http import Origin
from agentloop.apps.tasks import ScenarioSetupError
from agentloop.apps.world import ALWAYS_AVAILABLE
from agentloop.learner import adapters
from agentloop.learner.config import LoopConfig
from agentloop.learner.task_source import TaskSourceError, TaskSourceUnavailable, load_source
from agentloop.settings import get_settings
from agentloop.store import adapters as adapter_store
from agentloop.store import apps as app_store
from agentloop.store import episodes as episode_store
from agentloop.store import tasks as task_store
from agentloop.store import tenants as tenant_store
from agentloop.store import training_runs as run_store
from agentloop.store.models import (
    ACTIVE_SQL,
    Adapter,
    App,
    Episode,
    Reward,
    Step,
    Task,
    TaskStatus,
    TrainingRun,
    TrainingRunStatus,
    utcnow,
)
from agentloop.store.secrets import encrypt

MAX_PAGE = 100


def _world(name: str) -> WorldProvider:
    try:
        return get_world(name)
    except UnknownWorld as exc:
        raise InvalidRequest(str(exc.args[0])) from None


def request_hash(body: TaskCreate) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def resolve_task(session: Session, principal: Principal, body: TaskTarget, secret_key: str) -> tuple[str, list[str]]:
    """The instruction and apps of the task a request names (a new task, a demonstration), checked against
    its world and the tenant's apps."""
    world = _world(body.world)
    if body.task_ref is not None:
        external = split_task_ref(body.task_ref)
        if external is not None and (app := external_app(session, principal, external[0], secret_key)):
            return _external_task(app, external[1]), [app.name]
        try:
            spec = world.task(body.task_ref)
        except KeyError as exc:  # the built-in world says why (an unknown id, a procedural ref of a dev scenario...)
            reason = why_no_task(exc, body.task_ref) or (
                f"no task {body.task_ref!r} in world {body.world!r}; list them with "
                f"`agentloop world tasks --world {body.world}`"
            )
            hint = "" if "@" in body.task_ref else " (an external app's tasks are named '<app>:<task>')"
            raise InvalidRequest(f"unknown task_ref: {reason}{hint}") from None
        except ScenarioSetupError as exc:  # a procedural ref whose seed gives its scenario nothing to work with
            raise InvalidRequest(f"task_ref {body.task_ref!r} names no task: {exc}; try another seed") from None
        return spec.instruction, list(spec.apps)
    assert body.instruction is not None and body.apps is not None
    registered = {row.name: row for row in app_store.list_apps(session, principal.tenant_id)}
    unknown = [a for a in body.apps if a not in world.apps and a not in registered]
    if unknown:
        known = ", ".join([a for a in world.apps if a not in ALWAYS_AVAILABLE] + sorted(registered))
        raise InvalidRequest(f"unknown app(s) {', '.join(map(repr, unknown))} in world {body.world!r}; known: {known}")
    for name in body.apps:
        if name in registered and _is_environment(registered[name]):
            raise InvalidRequest(free_instruction_refusal(name))
    return body.instruction, list(dict.fromkeys(body.apps))


def _is_environment(row: App) -> bool:
    try:
        return {RESET_OP, EVALUATE_OP} <= set(app_store.operation_ids(row))
    except AppRegistrationError:  # registered before the current limits and over one: not usable anyway
        return False


def _external_task(app: ExternalApp, ref: str) -> str:
    """The instruction of the app's task `ref`. The one request a submission makes to the app: one try with a
    short timeout, so that a client learns at once (503, Retry-After) that the app it names is down."""
    environment = app.environment()
    if environment is None:
        raise InvalidRequest(f"app {app.name!r} declares no agentloop_reset/agentloop_evaluate: it has no tasks")
    settings = get_settings()
    try:
        offered = {t["task_ref"]: t for t in environment.tasks(timeout_s=settings.app_submit_timeout_s)}
    except EnvironmentFailure as exc:
        if exc.retryable:
            raise Unavailable(
                f"app {app.name!r} cannot be reached, so the task was not queued ({exc.message}); "
                "submit it again once the app is up",
                retry_after_s=settings.app_retry_after_s,
            ) from None
        raise Unavailable(f"could not list the tasks of app {app.name!r}: {exc.message}") from None
    if ref not in offered:
        raise InvalidRequest(f"app {app.name!r} offers no task {ref!r}")
    return str(offered[ref].get("instruction", ""))


def create_task(
    session: Session, principal: Principal, body: TaskCreate, idempotency_key: str | None, secret_key: str
) -> tuple[Task, bool]:
    """Insert a queued task. Returns (task, created); a replayed Idempotency-Key returns the original."""
    digest = request_hash(body)
    if idempotency_key is not None:
        if not 1 <= len(idempotency_key) <= 200:
            raise InvalidRequest("Idempotency-Key must be 1 to 200 characters")
        existing = task_store.get_task_by_idempotency_key(session, principal.tenant_id, idempotency_key)
        if existing is not None:
            return _replay(existing, digest), False
    instruction, apps = resolve_task(session, principal, body, secret_key)
    _check_active_quota(session, principal)
    task = Task(
        tenant_id=principal.tenant_id,
        world=body.world,
        task_ref=body.task_ref,
        instruction=instruction,
        apps=apps,
        options={
            k: v
            for k, v in {
                "seed": body.seed,
                "max_turns": body.max_turns,
                "temperature": body.temperature,
                "metadata": body.metadata,
            }.items()
            if v is not None
        },
        idempotency_key=idempotency_key,
        request_hash=digest,
    )
    if idempotency_key is None:  # nothing to race on: written with the request's commit
        session.add(task)
        session.flush()
        return task, True
    try:
        with session.begin_nested():
            session.add(task)
            session.flush()
    except IntegrityError:
        # a concurrent request with the same key won the race
        existing = task_store.get_task_by_idempotency_key(session, principal.tenant_id, idempotency_key)
        if existing is None:
            raise
        return _replay(existing, digest), False
    return task, True


def _check_active_quota(session: Session, principal: Principal) -> None:
    """QuotaExceeded when the tenant has `max_active_tasks_per_tenant` tasks queued or running (checked at
    submission: requests at the same instant may pass it by a few)."""
    quota = get_settings().max_active_tasks_per_tenant
    active = session.scalar(
        sa.select(sa.func.count()).select_from(Task).where(Task.tenant_id == principal.tenant_id, sa.text(ACTIVE_SQL))
    )
    if (active or 0) >= quota:
        raise QuotaExceeded(
            f"tenant {principal.tenant!r} has {active} tasks queued or running, its quota "
            f"(AGENTLOOP_MAX_ACTIVE_TASKS_PER_TENANT = {quota}); submit again when one ends",
            retry_after_s=5,
        )


def _replay(existing: Task, digest: str) -> Task:
    if existing.request_hash != digest:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used with a different request body; use a new key for a new task"
        )
    return existing


def get_task(session: Session, principal: Principal, task_id: str) -> Task:
    task = task_store.get_task(session, task_id, principal.tenant_id)
    if task is None:
        raise NotFound(f"no task {task_id!r}")
    return task


class Paged(Protocol):
    """A row listed newest first: pages are keyed on its (created_at, id)."""

    @property
    def id(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...


P = TypeVar("P", bound=Paged)


def encode_cursor(row: Paged) -> str:
    return base64.urlsafe_b64encode(f"{row.created_at.isoformat()}|{row.id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, tid = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        return datetime.fromisoformat(created), tid
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("invalid cursor: pass the `next_cursor` of a previous page unchanged") from None


def page_start(limit: int, cursor: str | None) -> tuple[datetime, str] | None:
    """Check a page request; the key its rows come after (None: from the newest)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
    return decode_cursor(cursor) if cursor else None


def page_of(rows: list[P], limit: int) -> tuple[list[P], str | None]:
    """A page from `limit + 1` rows fetched, and the cursor of the next page (None: this is the last)."""
    page, more = rows[:limit], len(rows) > limit
    return page, encode_cursor(page[-1]) if more else None


def list_tasks(
    session: Session, principal: Principal, status: str | None, limit: int, cursor: str | None
) -> tuple[list[Task], str | None]:
    if status is not None and status not in TaskStatus.ALL:
        raise InvalidRequest(f"unknown status {status!r}; one of {', '.join(TaskStatus.ALL)}")
    before = page_start(limit, cursor)
    return page_of(task_store.list_tasks(session, principal.tenant_id, status, limit + 1, before), limit)


def cancel_task(session: Session, principal: Principal, task_id: str) -> Task:
    task = get_task(session, principal, task_id)
    if task.status in TaskStatus.TERMINAL:
        raise Conflict(f"task {task_id} already ended ({task.status}); nothing to cancel")
    task.cancel_requested = True
    if task.status == TaskStatus.QUEUED:
        task.status = TaskStatus.CANCELLED
        task.finished_at = utcnow()
    # a running task stops at its next turn; the worker records it as cancelled
    return task


def task_steps(
    session: Session,
    principal: Principal,
    task_id: str,
    after: int = -1,
    limit: int = MAX_PAGE,
    attempt: int | None = None,
) -> tuple[Episode | None, Sequence[Step]]:
    """Steps of the task's latest attempt (or of `attempt`), after step index `after`."""
    get_task(session, principal, task_id)
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit must be between 1 and 1000")
    episode = episode_store.latest_episode(session, task_id)
    if attempt is not None and (episode is None or attempt != episode.attempt):
        episode = session.query(Episode).filter_by(task_id=task_id, attempt=attempt).first()
        if episode is None:
            raise NotFound(f"task {task_id} has no attempt {attempt}")
    if episode is None:
        return None, []
    return episode, episode_store.steps_of(session, episode.id, after, limit)


def add_feedback(session: Session, principal: Principal, task_id: str, body: FeedbackCreate) -> Reward:
    task = get_task(session, principal, task_id)
    if task.status not in (TaskStatus.FINISHED, TaskStatus.FAILED):
        raise Conflict(f"task {task_id} is {task.status}; feedback is for tasks that ended")
    episode = episode_store.latest_episode(session, task_id)
    reward = episode_store.add_reward(
        session,
        source="client",
        value=body.reward,
        task_id=task_id,
        episode_id=episode.id if episode else None,
        comment=body.comment,
    )
    session.flush()
    return reward


def external_app(session: Session, principal: Principal, name: str, secret_key: str) -> ExternalApp | None:
    row = app_store.get_app(session, principal.tenant_id, name)
    if row is None:
        return None
    try:
        return app_store.to_external(row, secret_key)
    except AppRegistrationError as exc:  # registered before the current limits and over one
        raise InvalidRequest(f"app {name!r} can no longer be used: {exc}; register it again") from None


def register_app(session: Session, principal: Principal, body: AppCreate, secret_key: str) -> App:
    """Check the document (its limits, its argument schemas) and the address, then store the app (its auth
    header encrypted)."""
    if body.name in _world("builtin").apps:
        raise Conflict(f"{body.name!r} is the name of a built-in app; choose another name")
    if body.allowed_networks and not principal.is_operator:
        raise PermissionDenied(
            "allowed_networks needs an operator key: only the deployment's operator may let the agent call "
            "private networks"
        )
    try:
        networks = parse_networks(body.allowed_networks)
        operations = parse_document(body.openapi)
        check_argument_schemas(operations)
        Origin.parse(body.base_url).checked_addresses(networks)
    except NetworkError as exc:
        raise InvalidRequest(str(exc)) from None
    except DocumentLimitExceeded as exc:
        raise InvalidRequest(str(exc), {"limit": exc.setting, "value": exc.limit, "env": exc.env}) from None
    except AppRegistrationError as exc:
        raise InvalidRequest(str(exc)) from None
    if not operations:
        raise InvalidRequest("the document declares no operations (get, post, put, patch or delete)")
    if app_store.get_app(session, principal.tenant_id, body.name) is not None:
        raise Conflict(f"an app named {body.name!r} is already registered; delete it first to replace it")
    quota = get_settings().max_apps_per_tenant
    held = session.scalar(sa.select(sa.func.count()).select_from(App).where(App.tenant_id == principal.tenant_id))
    if (held or 0) >= quota:
        raise QuotaExceeded(
            f"tenant {principal.tenant!r} has registered {held} apps, its quota (AGENTLOOP_MAX_APPS_PER_TENANT = "
            f"{quota}); delete one to register another"
        )
    header = encrypt(f"{body.auth_header.name}:{body.auth_header.value}", secret_key) if body.auth_header else None
    row = App(
        tenant_id=principal.tenant_id,
        name=body.name,
        description=body.description,
        kind="openapi",
        spec=body.openapi,
        base_url=body.base_url,
        auth_header_encrypted=header,
        allowed_networks=[str(network) for network in networks],
    )
    app_store.store_operations(row, operations)
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        raise Conflict(f"an app named {body.name!r} is already registered") from None
    return row


def delete_app(session: Session, principal: Principal, name: str) -> None:
    row = app_store.get_app(session, principal.tenant_id, name)
    if row is None:
        raise NotFound(f"no registered app {name!r}")
    session.delete(row)


def app_public(row: App) -> AppPublic:
    """What a listing shows of a registered app, from its stored operation ids (never its document)."""
    try:
        ids = set(app_store.operation_ids(row))
    except AppRegistrationError:
        ids = set()  # registered before the current limits and over one: app_apis says which
    return AppPublic(
        name=row.name,
        description=row.description,
        kind="openapi",
        apis=len(ids - HIDDEN_OPS),
        base_url=row.base_url,
        allowed_networks=list(row.allowed_networks),
        resettable={RESET_OP, EVALUATE_OP} <= ids,
    )


def list_apps(session: Session, principal: Principal, world: str) -> list[AppPublic]:
    provider = _world(world)
    builtin = [
        AppPublic(
            name=name, description=spec.description, kind="builtin", apis=sum(not a.hidden for a in spec.apis.values())
        )
        for name, spec in provider.apps.items()
    ]
    return builtin + [app_public(row) for row in app_store.list_apps(session, principal.tenant_id)]


def app_apis(session: Session, principal: Principal, world: str, app: str, secret_key: str) -> list[ApiDocPublic]:
    provider = _world(world)
    spec = provider.apps.get(app)
    if spec is None:
        registered = external_app(session, principal, app, secret_key)
        if registered is None:
            raise NotFound(f"no app {app!r} in world {world!r} and no registered app of that name")
        spec = registered.spec()
    return [ApiDocPublic.model_validate(a.doc()) for a in spec.apis.values() if not a.hidden]


# --- admin: training and adapters ------------------------------------------------------------


def start_training(
    session: Session, principal: Principal, body: TrainCreate, secret_key: str, trigger: str = "admin"
) -> TrainingRun:
    """Queue a training run (the caller commits, then publishes its id to the learner queue). Its world, or
    its app (`config.app`: one of the tenant's registered apps), is checked first: nothing is stored for a
    run that could not train."""
    principal.require_admin()
    if body.shared:
        principal.require_operator()
    tenant_id = None if body.shared else principal.tenant_id
    try:
        if body.recipe is not None:
            config = LoopConfig.for_recipe(body.recipe, **body.config)
        else:
            config = LoopConfig.for_algo(body.algo, iterations=body.iterations, **body.config)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(str(exc)) from None
    try:
        load_source(session, config, tenant_id, secret_key)
    except TaskSourceError as exc:
        raise InvalidRequest(str(exc)) from None
    except TaskSourceUnavailable as exc:
        raise Unavailable(str(exc)) from None
    run = TrainingRun(
        algo=config.label,
        status=TrainingRunStatus.QUEUED,
        trigger=trigger,
        tenant_id=tenant_id,
        config=config.to_dict(),
        progress={"phase": "queued"},
    )
    session.add(run)
    session.flush()
    return run


def _owner_scope(principal: Principal) -> str | None:
    """Whose runs and adapters the caller sees: its tenant's (an admin), or every owner's (None: an operator)."""
    principal.require_admin()
    return None if principal.is_operator else principal.tenant_id


def get_training_run(session: Session, principal: Principal, run_id: str, for_update: bool = False) -> TrainingRun:
    """A run the caller may see: a tenant admin its tenant's runs, an operator every run (the shared ones
    too). Anyone else's is NotFound."""
    run = run_store.get_run(session, run_id, _owner_scope(principal), for_update=for_update)
    if run is None:
        raise NotFound(f"no training run {run_id!r}")
    return run


def list_training_runs(session: Session, principal: Principal, limit: int = 20) -> Sequence[TrainingRun]:
    return run_store.list_runs(session, _owner_scope(principal), limit)


def cancel_training_run(session: Session, principal: Principal, run_id: str) -> TrainingRun:
    """Cancel a queued run at once, or a running one at its learner's next safe point (between rollout
    batches, after the rollouts, between update minibatches, before promotion): nothing of the iteration it
    stops in is kept and the active adapter keeps serving. The caller commits."""
    run = get_training_run(session, principal, run_id, for_update=True)
    if run.status in TrainingRunStatus.TERMINAL:
        raise Conflict(f"training run {run_id} already ended ({run.status}); nothing to cancel")
    run_store.request_cancel(session, run, f"cancelled by an admin of tenant {principal.tenant!r}")
    return run


def list_adapters(session: Session, principal: Principal, base_model: str | None = None) -> Sequence[Adapter]:
    """A tenant admin's: its tenant's versions; an operator's: every owner's, the shared ones included."""
    scope = _owner_scope(principal)
    return adapter_store.list_adapters(session, base_model, scope, every_owner=scope is None)


BASE = "base"  # the adapter name that stands for none: the base model


def activate_adapter(session: Session, principal: Principal, name: str) -> Adapter | None:
    """Make a stored version its owner's active one (promotion by hand, or rollback): a tenant admin one of its
    tenant's, an operator any (the shared ones). `base`: the caller's tenant (an operator: the deployment) is
    served the base model; returns None then. The caller commits and announces."""
    scope = _owner_scope(principal)
    if name == BASE:
        adapters.activate_base(session, get_settings().model_name, scope)
        return None
    row = adapter_store.get_adapter(session, name)
    if row is None or (scope is not None and row.tenant_id != scope):
        raise NotFound(
            f"no adapter {name!r}; list them with GET /v1/admin/adapters (gRPC: AdminService.ListAdapters), "
            f"or activate {BASE!r} for the base model"
        )
    try:  # the active one again too: its files are verified (and a damage found earlier cleared) all the same
        adapters.activate(session, row)
    except (FileNotFoundError, ValueError) as exc:
        raise Conflict(f"cannot activate {name}: {exc}") from None
    return row


def tenant_public(session: Session, principal: Principal) -> TenantPublic:
    principal.require_admin()
    row = tenant_store.get_tenant(session, principal.tenant_id)
    assert row is not None, "a key's tenant exists"
    served = adapter_store.serving_adapter(session, get_settings().model_name, principal.tenant_id)
    return TenantPublic(name=row.name, share_training=row.share_training, serving=served.name if served else BASE)


def update_tenant(session: Session, principal: Principal, body: TenantUpdate) -> None:
    """Change the caller's tenant's own settings. The caller commits."""
    principal.require_admin()
    row = tenant_store.get_tenant(session, principal.tenant_id)
    assert row is not None, "a key's tenant exists"
    row.share_training = body.share_training


def training_run_public(run: TrainingRun) -> TrainingRunPublic:
    return TrainingRunPublic(
        id=run.id,
        algo=run.algo,
        status=run.status,
        trigger=run.trigger,
        iteration=run.iteration,
        cancel_requested=run.cancel_requested,
        progress=run.progress,
        metrics=run.metrics,
        config=run.config,
        error=run.error,
        adapter=run.adapter,
        shared=run.tenant_id is None,
        trained_on=run.trained_on or {},
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
    )


def adapter_public(row: Adapter) -> AdapterPublic:
    return AdapterPublic(
        name=row.name,
        version=row.version,
        base_model=row.base_model,
        parent=row.parent,
        status=cast(Any, row.status),
        shared=row.tenant_id is None,
        training_run_id=row.training_run_id,
        metrics=row.metrics,
        sha256=row.sha256,
        created_at=row.created_at,
        activated_at=row.activated_at,
        damage=row.damage,
    )


# --- public views ---------------------------------------------------------------------------


def task_public(task: Task) -> TaskPublic:
    return TaskPublic(
        id=task.id,
        status=cast(TaskStatusName, task.status),
        world=task.world,
        task_ref=task.task_ref,
        instruction=task.instruction,
        apps=task.apps,
        attempts=task.attempts,
        cancel_requested=task.cancel_requested,
        answer=task.answer,
        reward=task.reward,
        success=task.success,
        error=task.error,
        adapter=task.adapter,
        metadata=task.options.get("metadata", {}),
        created_at=task.created_at,
        started_at=task.started_at,
        finished_at=task.finished_at,
    )


def step_public(step: Step, attempt: int) -> StepPublic:
    return StepPublic(
        index=step.index,
        attempt=attempt,
        prompt_token_count=step.prompt_token_count,
        output_token_ids=step.output_token_ids,
        output_logprobs=step.output_logprobs,
        output_text=step.output_text,
        finish_reason=step.finish_reason,
        action=ToolCallPublic.model_validate(step.action) if step.action else None,
        observation=step.observation,
        observation_token_ids=step.observation_token_ids,
        error_kind=step.error_kind,
        gen_s=step.gen_s,
        env_s=step.env_s,
        created_at=step.created_at,
    )


def episode_public(ep: Episode) -> EpisodePublic:
    return EpisodePublic(
        id=ep.id,
        attempt=ep.attempt,
        status=ep.status,
        finish_reason=ep.finish_reason,
        policy=ep.policy,
        adapter=ep.adapter,
        prompt_token_ids=ep.prompt_token_ids,
        num_steps=ep.num_steps,
        tokens_generated=ep.tokens_generated,
        answer=ep.answer,
    )


def feedback_public(reward: Reward) -> FeedbackPublic:
    assert reward.task_id is not None
    return FeedbackPublic(
        id=reward.id, task_id=reward.task_id, reward=reward.value, comment=reward.comment, created_at=reward.created_at
    )
