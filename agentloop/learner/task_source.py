"""Where a training run's tasks come from: the splits of a world (the built-in one, a plugin's), or the
tasks a registered app offers (`agentloop_tasks`), each episode reset in the app and scored by it
(`agentloop_reset`, `agentloop_evaluate`; see docs/apps.md).

The same function checks a run before it is queued (the train route, gRPC Train, `agentloop learn`),
so a run naming an unknown world or app, an app that cannot be reset, or no train tasks is refused
with nothing stored, and loads the tasks when the learner starts. The built-in world also draws fresh
train tasks (`TaskSource.fresh`): a train scenario set up on a new seed, the ref `<scenario>@<seed>`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.agent.eval_runs import eval_task, external_tasks, world_tasks
from agentloop.agent.evaluate import EvalTask
from agentloop.apps.base import ApiError
from agentloop.apps.external import ExternalApp, split_task_ref
from agentloop.apps.openapi import TASKS_OP, AppRegistrationError
from agentloop.apps.registry import (
    ProceduralWorld,
    UnknownWorld,
    WorldProvider,
    draw_instance,
    get_world,
    why_no_task,
)
from agentloop.apps.tasks import ScenarioSetupError, TaskSpec
from agentloop.learner.config import LoopConfig
from agentloop.store.apps import operation_ids, to_external
from agentloop.store.models import App
from agentloop.store.tenants import sharing_tenants

APP_WORLD = "app:{}"  # what an app's rollouts (and `agentloop eval --app` runs) record as their world


class TaskSourceError(ValueError):
    """The run names nothing it can train on; the message says what to change."""


class TaskSourceUnavailable(Exception):
    """The app could not be asked for its tasks (unreachable, or a bad answer)."""


@dataclass
class TaskSource:
    world: str  # what the run's episodes record as their world: the world's name, or "app:<name>"
    train: list[EvalTask]  # the tasks of the configured splits (an app's as "<app>:<ref>")
    dev: list[EvalTask] = field(default_factory=list)  # the promotion gate's tasks (none without promotion)
    dev_set: str = ""  # where those come from: "<world>/<split>" or "app:<name>/<split>"
    app: str | None = None
    tenant_id: str | None = None  # the app's tenant
    # the tenants whose served episodes, feedback and demonstrations the run may read: a tenant's run its own
    # only; a shared run (no tenant) those that share their data (`Tenant.share_training`)
    readers: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = ()  # `fresh` draws only these train scenarios (empty: any)

    @property
    def provider(self) -> WorldProvider:
        """The world whose tasks these are (not for an app's source: its tasks are the app's)."""
        if self.app is not None:
            raise TaskSourceError(f"task source {self.world!r} is an app's: it has no world provider")
        return _provider(self.world)

    @property
    def procedural(self) -> bool:
        """Whether `fresh` can draw tasks: a world with train scenarios that take `<scenario>@<seed>`."""
        return self._procedural_world() is not None

    def _procedural_world(self) -> tuple[ProceduralWorld, list[str]] | None:
        provider = None if self.app is not None else self.provider
        if not isinstance(provider, ProceduralWorld):
            return None
        scenarios = [s for s in provider.procedural_scenarios() if not self.scenarios or s in self.scenarios]
        return (provider, scenarios) if scenarios else None

    def fresh(self, rng: random.Random, n: int) -> list[EvalTask]:
        """`n` new train tasks: each a train scenario picked uniformly with `rng`, set up on a seed drawn from
        `rng` (ref `<scenario>@<seed>`, with its oracle as `expert`); the same rng state gives the same tasks.
        Only a source with procedural tasks (`procedural`: the built-in world) has them, else TaskSourceError."""
        if n < 0:
            raise ValueError(f"n must be 0 or more, not {n}")
        found = self._procedural_world()
        if found is None:
            raise TaskSourceError(
                f"task source {self.world!r} has no procedural tasks: only the built-in world sets its train "
                "scenarios up on fresh seeds; train on the source's listed tasks (turn `procedural` off)"
            )
        provider, scenarios = found
        return [eval_task(provider, _draw(provider, rng.choice(scenarios), rng)) for _ in range(n)]


def _provider(name: str) -> WorldProvider:
    try:
        return get_world(name)
    except UnknownWorld as exc:
        raise TaskSourceError(str(exc.args[0])) from None


def _draw(provider: ProceduralWorld, scenario: str, rng: random.Random) -> TaskSpec:
    """`scenario` set up on a seed from `rng` (`draw_instance`); a scenario no seed sets up is a TaskSourceError."""
    try:
        return draw_instance(provider, scenario, rng)
    except ScenarioSetupError as exc:
        raise TaskSourceError(str(exc)) from None


def of_scenarios(tasks: list[EvalTask], scenarios: tuple[str, ...]) -> list[EvalTask]:
    """The tasks of the named scenarios (all when none is named)."""
    return [t for t in tasks if t.scenario in scenarios] if scenarios else tasks


def check_scenarios(scenarios: tuple[str, ...], known: set[str], where: str) -> None:
    """A scenario named that is not `known` is an error naming those that are."""
    unknown = [s for s in scenarios if s not in known]
    if unknown:
        raise TaskSourceError(
            f"{where} has no tasks of scenario(s) {', '.join(map(repr, unknown))}; its scenarios: "
            + ", ".join(sorted(known))
        )


def find_app(session: Session, name: str, tenant_id: str | None) -> App:
    """The registered app `name` of `tenant_id` (None: of whichever single tenant registered that name)."""
    stmt = sa.select(App).where(App.name == name)
    if tenant_id is not None:
        stmt = stmt.where(App.tenant_id == tenant_id)
    rows = session.scalars(stmt).all()
    if not rows:
        whose = " for this tenant" if tenant_id is not None else ""
        raise TaskSourceError(
            f"no registered app named {name!r}{whose}; register it with POST /v1/apps (GET /v1/apps lists them)"
        )
    if len(rows) > 1:
        raise TaskSourceError(f"several tenants registered an app named {name!r}; name the tenant (--tenant)")
    return rows[0]


def _external(row: App, secret_key: str) -> ExternalApp:
    try:
        app = to_external(row, secret_key)
        ids = set(operation_ids(row))
    except AppRegistrationError as exc:  # registered before the current limits and over one
        raise TaskSourceError(f"app {row.name!r} can no longer be used: {exc}; register it again") from None
    if app.environment() is None:
        raise TaskSourceError(
            f"app {row.name!r} cannot be trained on: its OpenAPI document declares no agentloop_reset and "
            "agentloop_evaluate operations, so its tasks cannot be reset for each rollout and scored (docs/apps.md)"
        )
    if TASKS_OP not in ids:
        raise TaskSourceError(f"app {row.name!r} declares no {TASKS_OP} operation: it offers no tasks to sample")
    return app


def _app_tasks(app: ExternalApp, provider: WorldProvider, refs: list[str] | None = None) -> list[EvalTask]:
    try:
        return external_tasks(app, lambda: provider.new_world(0, []), refs, qualified=True)
    except ApiError as exc:
        raise TaskSourceUnavailable(f"could not list the tasks of app {app.name!r}: {exc.message}") from None


def load_source(session: Session | None, config: LoopConfig, tenant_id: str | None, secret_key: str) -> TaskSource:
    """The run's train tasks (and dev tasks, when it promotes); raises TaskSourceError if there are none,
    TaskSourceUnavailable if the app cannot be asked. `tenant_id`: the run's tenant, whose data it reads and
    whose app `config.app` is; None: a shared run, which reads only the data of tenants that share theirs and
    trains on an app (the single one registered under that name) only when its tenant shares."""
    provider = _provider(config.world)
    if tenant_id is not None:
        readers: tuple[str, ...] = (tenant_id,)
    else:  # without a database (a world's tasks only) a shared run reads no tenant's data
        readers = sharing_tenants(session) if session is not None else ()

    def world_split(split: str, limit: int | None = None, scenarios: tuple[str, ...] = ()) -> list[EvalTask]:
        try:
            return of_scenarios(world_tasks(provider, split), scenarios)[:limit]
        except ValueError as exc:
            raise TaskSourceError(str(exc)) from None

    if config.app is None:
        if config.scenarios:  # named in any split: the built-in world's dev scenarios are not its train ones
            check_scenarios(config.scenarios, {t.scenario_id for t in provider.tasks()}, f"world {provider.name!r}")
        train = [t for split in config.splits for t in world_split(split, scenarios=config.scenarios)]
        measured = config.promote or config.agreement_prefixes > 0  # agreement is measured at dev oracle prefixes
        dev = world_split(config.dev_split, config.dev_limit, config.scenarios) if measured else []
        dev_set = f"{provider.name}/{config.dev_split}"
        source = TaskSource(provider.name, train, dev, dev_set, readers=readers, scenarios=config.scenarios)
        if not train and not (config.procedural and source.procedural):
            raise TaskSourceError(
                f"world {provider.name!r} has no tasks of scenario(s) {', '.join(config.scenarios)} in split(s) "
                f"{', '.join(config.splits)}"
            )
        if measured and not dev:
            raise TaskSourceError(
                f"world {provider.name!r} has no {config.dev_split} tasks of scenario(s) {', '.join(config.scenarios)} "
                "to measure on: name one that has, or turn promotion and agreement off"
            )
        return source
    if session is None:
        raise TaskSourceError(f"app {config.app!r}: training on an app needs the database it is registered in")
    row = find_app(session, config.app, tenant_id)
    if row.tenant_id not in readers:
        raise TaskSourceError(
            f"app {config.app!r} belongs to a tenant that does not share its data with shared runs "
            "(share_training); its own admin can train on it"
        )
    app = _external(row, secret_key)
    offered = _app_tasks(app, provider)
    check_scenarios(config.scenarios, {t.scenario for t in offered}, f"app {app.name!r}")
    offered = of_scenarios(offered, config.scenarios)
    train = [t for t in offered if t.split in config.splits]
    if not train:
        splits = ", ".join(sorted({t.split for t in offered})) or "none: it lists no tasks"
        raise TaskSourceError(
            f"app {app.name!r} offers no tasks in split(s) {', '.join(config.splits)} (its {TASKS_OP} splits: "
            f"{splits}); name others with the `splits` option"
        )
    source = TaskSource(APP_WORLD.format(app.name), train, app=app.name, tenant_id=row.tenant_id, readers=readers)
    if config.promote:
        # the gate measures on the app's own dev tasks; an app without any is gated on the world's dev split
        # (the adapter serves every episode of the base model, so it must not get worse there)
        app_dev = [t for t in offered if t.split == config.dev_split][: config.dev_limit]
        if app_dev:
            source.dev, source.dev_set = app_dev, f"{source.world}/{config.dev_split}"
        else:
            source.dev = world_split(config.dev_split, config.dev_limit)
            source.dev_set = f"{provider.name}/{config.dev_split}"
    return source


def rollout_task(
    session: Session, world: str, app: str | None, tenant_id: str | None, task_ref: str, secret_key: str
) -> EvalTask:
    """One task of a run, as a `rollouts` worker rebuilds it from its job."""
    provider = _provider(world)
    if app is None:
        try:  # a listed task, or a procedural one (`fresh`) that no listing holds
            spec = provider.task(task_ref)
        except KeyError as exc:
            reason = why_no_task(exc, task_ref)
            raise TaskSourceError(
                f"no task {task_ref!r} in world {world!r}" + (f": {reason}" if reason else "")
            ) from None
        return eval_task(provider, spec)
    own = split_task_ref(task_ref)
    if own is None or own[0] != app:
        raise TaskSourceError(f"task {task_ref!r} is not a task of app {app!r}")
    found = _app_tasks(_external(find_app(session, app, tenant_id), secret_key), provider, [own[1]])
    if len(found) != 1:
        raise TaskSourceError(f"no task {task_ref!r} in world {world!r}")
    return found[0]
