"""What `agentloop eval` puts together: the tasks (a world's split, or an external app's tasks), the
policy named on the command line, and the stored record of the run (eval_runs + its episodes)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from agentloop.agent.actions import action_space
from agentloop.agent.episode import Episode
from agentloop.agent.evaluate import EpisodeResult, EvalTask
from agentloop.agent.external_episode import NotAnEnvironment, start_external_episode
from agentloop.apps.external import SEPARATOR, ExternalApp
from agentloop.apps.registry import WorldProvider
from agentloop.apps.tasks import TaskSpec, ToolCall, run_oracle
from agentloop.apps.world import World
from agentloop.policy.base import Policy
from agentloop.settings import Settings
from agentloop.store import adapters as adapter_store
from agentloop.store import episodes as episode_store
from agentloop.store.models import EvalRun, utcnow

POLICIES = ("oracle", "random", "model")


def world_tasks(provider: WorldProvider, split: str | None, limit: int | None = None) -> list[EvalTask]:
    specs = provider.tasks(split)
    if not specs:
        known = sorted({t.split for t in provider.tasks()})
        raise ValueError(f"world {provider.name!r} has no tasks in split {split!r}; its splits: {', '.join(known)}")
    if limit is not None:
        specs = specs[:limit]
    return [eval_task(provider, spec) for spec in specs]


def named_world_tasks(provider: WorldProvider, refs: list[str]) -> list[EvalTask]:
    """The world's tasks of these refs, in their order; a ref the world does not know is a ValueError."""
    specs, unknown = [], []
    for ref in refs:
        try:
            specs.append(provider.task(ref))
        except KeyError:
            unknown.append(ref)
    if unknown:
        raise ValueError(f"world {provider.name!r} has no task(s) {', '.join(unknown)}")
    return [eval_task(provider, spec) for spec in specs]


def _read_refs(path: Path) -> list[str]:
    """One task ref per line; blank lines skipped."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read task refs from {path}: {exc.strerror}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def eval_task(provider: WorldProvider, spec: TaskSpec) -> EvalTask:
    def start() -> tuple[World, Any]:
        return provider.task_world(spec.id), spec.evaluator

    def expert(world: World) -> list[ToolCall]:
        scratch = world.scratch_copy()
        try:
            return run_oracle(spec, scratch).actions
        finally:
            scratch.close()

    return EvalTask(
        task_ref=spec.id,
        scenario=spec.scenario_id,
        split=spec.split,
        difficulty=spec.difficulty,
        instruction=spec.instruction,
        start=start,
        expert=expert,
        world=provider.name,
    )


def external_tasks(
    app: ExternalApp,
    base_world: Callable[[], World],
    task_refs: list[str] | None,
    split: str | None = None,
    qualified: bool = False,
) -> list[EvalTask]:
    """Tasks of an external app that declares agentloop_reset/evaluate (those named, else every one, or
    those of `split`); each episode resets the app first. `qualified`: task refs "<app>:<ref>", as served
    tasks and training name them, instead of the app's own."""
    env = app.environment()
    if env is None:
        raise NotAnEnvironment(f"app {app.name!r} declares no agentloop_reset and agentloop_evaluate operations")
    offered = {t["task_ref"]: t for t in env.tasks()}
    refs = task_refs if task_refs is not None else list(offered)
    unknown = [r for r in refs if r not in offered]
    if unknown:
        raise ValueError(f"app {app.name!r} does not offer task(s) {', '.join(unknown)}")
    if split is not None:
        refs = [r for r in refs if str(offered[r].get("split", "test")) == split]

    def start(ref: str) -> tuple[World, Any]:
        started = start_external_episode(app, ref, base_world())
        return started.world, started.evaluator

    return [
        EvalTask(
            task_ref=f"{app.name}{SEPARATOR}{ref}" if qualified else ref,
            scenario=ref,
            split=str(offered[ref].get("split", "test")),
            difficulty=0,
            instruction=str(offered[ref]["instruction"]),
            start=partial(start, ref),
        )
        for ref in refs
    ]


def parse_policy(spec: str) -> tuple[str, str | None]:
    """ "oracle" | "random" | "model" | "model@<adapter>" -> (kind, adapter)."""
    kind, _, adapter = spec.partition("@")
    if kind not in POLICIES or (adapter and kind != "model"):
        raise ValueError(f"--policy must be oracle, random, model or model@<adapter>, not {spec!r}")
    return kind, adapter or None


def resolve_adapter(session: Session, settings: Settings, ref: str) -> tuple[str, str]:
    """An adapter by name (`<base>@v3`, or just `v3`) or by directory: (name, path)."""
    for name in (ref, f"{settings.model_name}@{ref}"):
        row = adapter_store.get_adapter(session, name)
        if row is not None:
            return row.name, row.path
    path = Path(ref)
    if (path / "adapter_config.json").exists():
        return path.name, str(path)
    raise ValueError(f"no adapter named {ref!r} (see GET /v1/admin/adapters) and no adapter directory there")


def oracle_preparer(policy: Any) -> Callable[[Episode, EvalTask], None]:
    def prepare(ep: Episode, task: EvalTask) -> None:
        if task.expert is None:
            raise ValueError(f"task {task.task_ref} has no oracle solution")
        assert ep.key is not None
        policy.plan_actions(ep.key, task.expert(ep.world), action_space(ep.world.commands))

    return prepare


# --- the stored record --------------------------------------------------------------------------


def start_run(session: Session, **fields: Any) -> EvalRun:
    run = EvalRun(**fields)
    session.add(run)
    session.flush()
    return run


def record_episode(session: Session, run: EvalRun, policy: Policy, result: EpisodeResult) -> None:
    episode_store.add_finished_episode(
        session,
        result.episode,
        kind="eval",
        world=run.world,
        task_ref=result.task.task_ref,
        instruction=result.task.instruction,
        policy=policy.name,
        adapter=run.adapter,
        verdict=result.verdict,
        error=result.error,
        eval_run_id=run.id,
    )


def finish_run(session: Session, run: EvalRun, metrics: dict[str, Any], error: str | None = None) -> None:
    run.metrics = metrics
    run.status = "failed" if error else "finished"
    run.error = error
    run.finished_at = utcnow()


# --- the command --------------------------------------------------------------------------------


def load_external_app(session: Session, settings: Settings, name: str, tenant: str | None) -> tuple[ExternalApp, str]:
    """A registered app by name (and tenant, when several tenants registered that name)."""
    import sqlalchemy as sa

    from agentloop.store.apps import to_external
    from agentloop.store.models import App, Tenant

    stmt = sa.select(App, Tenant.name).join(Tenant, Tenant.id == App.tenant_id).where(App.name == name)
    if tenant:
        stmt = stmt.where(Tenant.name == tenant)
    rows = session.execute(stmt).all()
    if not rows:
        raise ValueError(f"no registered app named {name!r}" + (f" for tenant {tenant!r}" if tenant else ""))
    if len(rows) > 1:
        raise ValueError(f"several tenants registered an app named {name!r}; pass --tenant")
    row, _ = rows[0]
    return to_external(row, settings.secret_key), row.tenant_id


def run_eval_command(
    settings: Settings,
    *,
    world: str,
    split: str | None,
    policy: str,
    k: int,
    limit: int | None,
    app_name: str | None,
    tenant: str | None,
    task_refs: Path | None,
    max_turns: int | None,
    max_new_tokens: int | None,
    temperature: float,
    batch_size: int | None,
    fresh: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from agentloop.agent.episode import Limits
    from agentloop.agent.evaluate import run_eval, scored, summarize, tgc
    from agentloop.apps.builtin import BUILTIN
    from agentloop.apps.registry import fresh_instances, get_world
    from agentloop.store.db import session_scope

    if fresh is not None and (task_refs is not None or app_name):
        raise ValueError("--fresh draws its own tasks: not with --task-refs or --app")
    kind, adapter_ref = parse_policy(policy)
    tenant_id = None
    with session_scope() as s:
        if app_name:
            external, tenant_id = load_external_app(s, settings, app_name, tenant)
            refs = _read_refs(task_refs) if task_refs is not None else None
            tasks = external_tasks(external, lambda: BUILTIN.new_world(0, []), refs)
            apps: dict[str, Any] = {**BUILTIN.apps, external.name: external.spec()}
            world_name, split_name = f"app:{app_name}", None
        else:
            provider = get_world(world)
            if task_refs is not None:  # named tasks (procedural `<scenario>@<seed>` refs too) instead of a split
                tasks = named_world_tasks(provider, _read_refs(task_refs))[:limit]
                world_name, split_name = world, None
            elif fresh is not None:  # new instances of the train scenarios: seeds no listed task has
                tasks = [eval_task(provider, spec) for spec in fresh_instances(provider, fresh, seed)][:limit]
                world_name, split_name = world, f"fresh@{seed}"
            else:
                tasks = world_tasks(provider, split, limit)
                world_name, split_name = world, split
            apps = dict(provider.apps)
        if not tasks:
            raise ValueError(f"no tasks to run (world {world!r}, split {split!r})")
        adapter = resolve_adapter(s, settings, adapter_ref) if adapter_ref else None

    prepare = None
    if kind == "model":
        from agentloop.policy.local import LocalPolicy

        runner: Policy = LocalPolicy.from_settings(settings)
        if adapter:
            runner.load_adapter(*adapter)
    else:
        from transformers import AutoTokenizer

        from agentloop.policy.models import resolve_model_dir

        tokenizer: Any = AutoTokenizer.from_pretrained(resolve_model_dir(settings.model, settings.models_dir))
        if kind == "oracle":
            from agentloop.policy.scripted import ScriptedPolicy

            runner = ScriptedPolicy(tokenizer, name="oracle")
            prepare = oracle_preparer(runner)
        else:
            from agentloop.policy.random_policy import RandomPolicy

            runner = RandomPolicy(tokenizer, apps)

    # no wall-clock limit: an offline run decodes many episodes together, so a served episode's clock
    # would measure the batch and the machine's load, not the agent
    limits = Limits.from_settings(
        settings, max_turns=max_turns, max_new_tokens=max_new_tokens, temperature=temperature, wall_time_s=1e9
    )
    with session_scope() as s:
        run = start_run(
            s,
            world=world_name,
            split=split_name,
            app=app_name,
            tenant_id=tenant_id,
            policy=kind,
            adapter=adapter[0] if adapter else None,
            k=k,
            config={"limits": limits.__dict__, "tasks": len(tasks), "policy_name": runner.name},
        )
        run_id = run.id

    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]eval[/bold] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("TGC {task.fields[tgc]:.1f}"),
        TimeElapsedColumn(),
    )
    done: list[EpisodeResult] = []
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(f"{world_name}/{split_name or 'tasks'} {policy}", total=len(tasks) * k, tgc=0.0)

        def on_result(result: EpisodeResult) -> None:
            done.append(result)
            with session_scope() as s:
                record_episode(s, s.merge(run), runner, result)
            progress.update(bar, advance=1, tgc=tgc(scored(done)))

        try:
            run_eval(
                runner,
                tasks,
                k,
                limits,
                batch_size or settings.max_batch_size,
                on_result=on_result,
                adapter=adapter[0] if adapter else None,
                prepare=prepare,
            )
        except Exception as exc:
            with session_scope() as s:
                finish_run(s, s.merge(run), summarize(done), error=f"{type(exc).__name__}: {exc}")
            raise
    metrics = summarize(done)
    with session_scope() as s:
        finish_run(s, s.merge(run), metrics)

    table = Table(title=f"eval {run_id} — {policy} on {world_name} {split_name or ''}")
    for col in ("slice", "TGC", "SGC", "mean reward", "episodes"):
        table.add_column(col)
    table.add_row(
        "all",
        f"{metrics['tgc']:.1f}",
        f"{metrics['sgc']:.1f}",
        f"{metrics['mean_reward']:.3f}",
        str(metrics["episodes"]),
    )
    for d, block in metrics["difficulty"].items():
        table.add_row(
            f"difficulty {d}",
            f"{block['tgc']:.1f}",
            f"{block['sgc']:.1f}",
            f"{block['mean_reward']:.3f}",
            str(block["episodes"]),
        )
    console.print(table)
    console.print(f"episodes ended by: {metrics['finish_reasons']}; mean turns {metrics['mean_turns']}")
    if metrics["errors"]:
        reasons = sorted({r.error for r in done if r.error})
        console.print(
            f"{metrics['errors']} episode(s) could not be evaluated and count in no figure above: " + "; ".join(reasons)
        )
    console.print("behaviour: " + ", ".join(f"{k} {v}" for k, v in metrics["behaviour"].items()))
    return {"eval_run": run_id, "world": world_name, "split": split_name, "policy": policy, "k": k, **metrics}
