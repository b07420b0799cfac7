"""The `agentloop` command.

agentloop serve [--host H] [--port P] [--grpc-port G]  REST and gRPC APIs; with the embedded broker also a worker
agentloop grpc [--host H] [--port G]                   the gRPC API alone
agentloop worker [--queues ...] [--pool ...]           a Celery worker
agentloop beat                                         the Celery beat scheduler (lease sweeps)
agentloop inference [--host H] [--port P]              the model behind vLLM's OpenAI-compatible endpoints
agentloop migrate                                      upgrade the database schema
agentloop keys create --tenant T --role client|admin|operator   print a new API key (once); also list, revoke
agentloop keys rotate KEY_ID --grace 1h                print its replacement (once); the old key ends after the grace
agentloop demos import FILE.jsonl --tenant T           upload demonstrations (checked, replayed); also export
agentloop demo                                         run built-in tasks and print each step
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from agentloop.logs import configure_logging
from agentloop.settings import Settings, config_error_lines, get_settings

if TYPE_CHECKING:
    from agentloop.learner.trainer import Cancellation

app = typer.Typer(add_completion=False, no_args_is_help=True, help="agentloop: agents as a service that learn online.")
keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
app.add_typer(keys_app, name="keys")
world_app = typer.Typer(no_args_is_help=True, help="Worlds: the built-in one and those plugins add.")
app.add_typer(world_app, name="world")
demos_app = typer.Typer(no_args_is_help=True, help="Demonstrations: expert trajectories to learn from.")
app.add_typer(demos_app, name="demos")

log = logging.getLogger("agentloop")

ALL_QUEUES = "episodes,rollouts,learner,maintenance"


def _setup() -> Settings:
    settings = get_settings()
    configure_logging(settings.log_level)
    settings.ensure_home()
    return settings


def _migrate_if_embedded(settings: Settings) -> None:
    from agentloop.store.migrate import upgrade

    if settings.db_url.startswith("sqlite"):
        upgrade(settings.db_url)


def _bootstrap_key(settings: Settings) -> Path | None:
    """Local mode with no keys at all: create an operator key (whoever runs the local service owns the
    deployment) so the service can be used at once."""
    from agentloop.api.auth import any_keys, create_key
    from agentloop.store.db import session_scope

    if settings.env != "local":
        return None
    with session_scope() as s:
        if any_keys(s):
            return None
        _, key = create_key(s, "default", "operator", name="bootstrap")
    path = settings.home.resolve() / "admin.key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def _prepare_api(settings: Settings) -> Path | None:
    """Before an API process listens: migrate the embedded database, create the first admin key
    (returns its file, if created), start the embedded worker."""
    _migrate_if_embedded(settings)
    key_file = _bootstrap_key(settings)
    if settings.run_embedded_worker:
        _start_embedded_worker(settings)
    return key_file


@app.command()
def serve(
    host: str = typer.Option(None, help="Bind address (default AGENTLOOP_HOST)."),
    port: int = typer.Option(None, help="REST port (default AGENTLOOP_PORT)."),
    grpc_port: int = typer.Option(None, help="gRPC port (default AGENTLOOP_GRPC_PORT); 0 or negative: REST only."),
) -> None:
    """Run the API: REST and gRPC. With the embedded broker it also starts the workers (episodes; sweeps and
    beat) as child processes, which stop with it."""
    import asyncio

    from agentloop.api.serving import serve as serve_api

    settings = _setup()
    host, port = host or settings.host, port or settings.port
    grpc_port = settings.grpc_port if grpc_port is None else grpc_port
    key_file = _prepare_api(settings)
    typer.echo(f"agentloop serving on http://{host}:{port}  (API docs: http://{host}:{port}/docs)")
    if grpc_port > 0:
        typer.echo(f"gRPC on {host}:{grpc_port}  (agentloop.v1.AgentService, AdminService; reflection on)")
    if key_file:
        typer.echo(f"created an admin API key for tenant 'default' in {key_file}")
    asyncio.run(serve_api(settings, host, port, grpc_port if grpc_port > 0 else None))


@app.command("grpc")
def grpc_command(
    host: str = typer.Option(None, help="Bind address (default AGENTLOOP_HOST)."),
    port: int = typer.Option(None, help="gRPC port (default AGENTLOOP_GRPC_PORT)."),
) -> None:
    """Run the gRPC API alone (no REST). With the embedded broker it also starts a worker, as serve does."""
    import asyncio

    from agentloop.api.serving import serve as serve_api

    settings = _setup()
    host, port = host or settings.host, settings.grpc_port if port is None else port
    if port <= 0:
        raise typer.BadParameter("the gRPC port must be positive", param_hint="--port / AGENTLOOP_GRPC_PORT")
    key_file = _prepare_api(settings)
    typer.echo(f"agentloop gRPC on {host}:{port}  (agentloop.v1.AgentService, AdminService; reflection on)")
    if key_file:
        typer.echo(f"created an admin API key for tenant 'default' in {key_file}")
    asyncio.run(serve_api(settings, host, None, port))


class EmbeddedWorker:
    """A worker (or the beat) that `serve` runs as a child process with the embedded broker. If it exits, it
    is started again (after 1 s, doubling up to 30 s while it keeps dying young): queued tasks wait in the broker
    meanwhile, and the lease sweeper re-dispatches the ones it was running. The child dies with `serve`
    (worker/lifeline.py), even when `serve` is killed."""

    def __init__(self, name: str, *args: str) -> None:
        self.name, self.args = name, args
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # stop() and a restart never cross: no worker is left behind
        self.proc = self._spawn()
        threading.Thread(target=self._watch, name=f"embedded-{name}", daemon=True).start()
        atexit.register(self.stop)

    def _spawn(self) -> subprocess.Popen[bytes]:
        from agentloop.worker.lifeline import PARENT_ENV

        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        proc = subprocess.Popen([sys.executable, "-m", "agentloop.cli", *self.args], env=env)
        log.info("embedded %s started (pid %d)", self.name, proc.pid)
        return proc

    def _watch(self) -> None:
        delay = 1.0
        while True:
            started = time.monotonic()
            code = self.proc.wait()
            if self.stopping.is_set():
                return
            if time.monotonic() - started > 60:
                delay = 1.0
            log.error(
                "embedded %s (pid %d) exited with code %s; restarting in %.0f s", self.name, self.proc.pid, code, delay
            )
            if self.stopping.wait(delay):
                return
            with self.lock:
                if self.stopping.is_set():
                    return
                self.proc = self._spawn()
            delay = min(delay * 2, 30.0)

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
            proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


# The episode worker runs tasks on two threads; the lease sweeps and training triggers run in a light worker
# of their own (no model), so that busy episode threads never delay a sweep; the beat that schedules them is
# a process of its own (see `worker --beat`).
EPISODE_WORKER = ("worker", "--queues", "episodes,rollouts,learner", "--pool", "threads", "--concurrency", "2")
MAINTENANCE_WORKER = ("worker", "--queues", "maintenance", "--pool", "solo")


def _start_embedded_worker(settings: Settings) -> list[EmbeddedWorker]:
    from agentloop.worker.celery_app import app as celery_app
    from agentloop.worker.celery_app import declare_queues

    declare_queues(celery_app)  # before this process publishes and the workers consume
    return [
        EmbeddedWorker("worker", *EPISODE_WORKER),
        EmbeddedWorker("maintenance worker", *MAINTENANCE_WORKER),
        EmbeddedWorker("beat", "beat"),
    ]


@app.command()
def worker(
    queues: str = typer.Option(ALL_QUEUES, help="Comma-separated queues to consume."),
    pool: str = typer.Option("solo", help="Celery pool: solo, threads or prefork."),
    concurrency: int = typer.Option(1, help="Tasks run at once (threads/prefork)."),
    beat: bool = typer.Option(False, help="Also run the beat scheduler in this process."),
) -> None:
    """Run a Celery worker. One that runs episodes (queues episodes or rollouts) loads the policy model
    before it consumes, and logs when it is ready."""
    settings = _setup()
    if beat and settings.broker_is_embedded:
        raise typer.BadParameter(
            "with the embedded broker, run the beat as a process of its own (`agentloop beat`; `agentloop "
            "serve` starts one): a beat inside a worker sends its first task and then finds its broker "
            "channel closed",
            param_hint="--beat",
        )
    from agentloop.worker.lifeline import die_with_parent_if_asked

    die_with_parent_if_asked()  # a worker that `serve` started stops when `serve` does, killed or not
    _migrate_if_embedded(settings)
    from agentloop.worker.celery_app import app as celery_app
    from agentloop.worker.celery_app import declare_queues

    if settings.broker_is_embedded:
        declare_queues(celery_app)
    if pool != "prefork" and {"episodes", "rollouts"} & {q.strip() for q in queues.split(",")}:
        # Loaded now, the first task does not wait for it and a model that cannot load stops the worker
        # with the reason before it takes any task. (Prefork children load their own, after the fork.)
        from agentloop.policy import get_policy

        log.info("loading the policy model %s", settings.model)
        get_policy(settings)
    argv = [
        "worker",
        f"--queues={queues}",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--loglevel={settings.log_level}",
        "--without-gossip",
        "--without-mingle",
    ]
    if beat:
        argv += ["--beat", f"--schedule={settings.home.resolve() / 'celerybeat-schedule'}"]
    celery_app.worker_main(argv)


@app.command()
def inference(
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8100, help="Port."),
    api_key: str = typer.Option(
        "", envvar="AGENTLOOP_INFERENCE_API_KEY", help="Require `Authorization: Bearer <key>` on /v1 (as vLLM's)."
    ),
    max_loras: int = typer.Option(8, min=1, help="Adapters resident at once (more may be registered)."),
    max_rows: int = typer.Option(None, min=1, help="Rows decoded together (default AGENTLOOP_MAX_BATCH_SIZE)."),
    prefix_cache_tokens: int = typer.Option(32768, min=0, help="Tokens of finished sequences kept for reuse."),
    seed: int = typer.Option(None, help="Sampling seed (default: random)."),
) -> None:
    """Serve the configured model (AGENTLOOP_MODEL) over the endpoints of vLLM's OpenAI-compatible server that
    the `remote` policy backend uses: /v1/completions (token ids in, token ids and log-probs out),
    /v1/models, /v1/load_lora_adapter, /v1/unload_lora_adapter. Requests decode in one continuous batch."""
    import uvicorn

    from agentloop.policy.continuous import ContinuousBatcher
    from agentloop.policy.local import LocalPolicy
    from agentloop.policy.server import create_app

    settings = _setup()
    policy = LocalPolicy.from_settings(settings)
    engine = ContinuousBatcher(
        policy,
        max_rows=max_rows or settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        max_loras=max_loras,
        prefix_cache_tokens=prefix_cache_tokens,
        seed=seed,
    )
    typer.echo(f"agentloop inference: {settings.model_name} on http://{host}:{port}/v1")
    try:
        uvicorn.run(create_app(engine, settings.model_name, api_key or None), host=host, port=port, log_level="warning")
    finally:
        engine.stop()


@app.command()
def beat() -> None:
    """Run the Celery beat scheduler (lease sweeps, training triggers). One per deployment: a second one on the
    same home waits until the first stops."""
    settings = _setup()
    from agentloop.worker.lifeline import die_with_parent_if_asked

    die_with_parent_if_asked()  # the beat `serve` started stops when `serve` does, killed or not
    from agentloop.worker.celery_app import app as celery_app

    celery_app.start(
        ["beat", f"--loglevel={settings.log_level}", f"--schedule={settings.home.resolve() / 'celerybeat-schedule'}"]
    )


@app.command()
def migrate(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Upgrade the database schema."""
    settings = _setup()
    from agentloop.store.migrate import upgrade

    upgrade(settings.db_url, revision)
    typer.echo(f"database at {revision}")


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., help="Tenant name (created if new)."),
    role: str = typer.Option("client", help="client, admin (of the tenant) or operator (of the deployment)."),
    name: str = typer.Option("", help="A label for the key."),
) -> None:
    """Create an API key and print it. It is shown only this once."""
    settings = _setup()
    _migrate_if_embedded(settings)
    from agentloop.api.auth import ROLES, create_key
    from agentloop.store.db import session_scope

    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}", param_hint="--role")
    with session_scope() as s:
        row, key = create_key(s, tenant, role, name)
        typer.echo(key)
        typer.echo(f"(tenant {tenant}, role {role}, id {row.id}; store it now, it is not shown again)", err=True)


@keys_app.command("list")
def keys_list(tenant: str = typer.Option(None, help="Only this tenant.")) -> None:
    """List API keys (their prefixes, never the keys)."""
    _setup()
    import sqlalchemy as sa

    from agentloop.store.db import session_scope
    from agentloop.store.models import ApiKey, Tenant, utcnow

    with session_scope() as s:
        stmt = sa.select(ApiKey, Tenant.name).join(Tenant).order_by(ApiKey.created_at)
        if tenant:
            stmt = stmt.where(Tenant.name == tenant)
        now = utcnow()
        for key, tname in s.execute(stmt):
            if key.revoked_at:
                state = "revoked"
            elif key.expires_at is None:
                state = "active"
            else:
                state = (
                    "expired" if key.expires_at <= now else f"expires {key.expires_at.isoformat(timespec='seconds')}"
                )
            typer.echo(f"{key.id}  {key.prefix}…  tenant={tname}  role={key.role}  {state}  {key.name}")


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="Id shown by `keys list`.")) -> None:
    """Revoke an API key."""
    _setup()
    from agentloop.store.db import session_scope
    from agentloop.store.models import ApiKey, utcnow

    with session_scope() as s:
        key = s.get(ApiKey, key_id)
        if key is None:
            raise typer.BadParameter(f"no key with id {key_id}")
        key.revoked_at = utcnow()
    typer.echo(f"revoked {key_id}")


@keys_app.command("rotate")
def keys_rotate(
    key_id: str = typer.Argument(..., help="Id shown by `keys list`."),
    grace: str = typer.Option(
        ..., help="How long the old key keeps working: 30s, 15m, 2h, 1d, or 0 (revoked now). Never lengthens it."
    ),
) -> None:
    """Replace an API key: print a new one (same tenant, role and name) once; the old one ends after --grace."""
    _setup()
    from agentloop.api.auth import parse_grace, rotate_key
    from agentloop.api.errors import InvalidRequest, ServiceError
    from agentloop.store.db import session_scope
    from agentloop.store.models import ApiKey

    try:
        grace_s = parse_grace(grace)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message, param_hint="--grace") from None
    with session_scope() as s:
        try:
            row, key = rotate_key(s, key_id, grace_s)
        except ServiceError as exc:
            raise typer.BadParameter(exc.message, param_hint="KEY_ID") from None
        old = s.get_one(ApiKey, key_id)
        ends = f"works until {old.expires_at.isoformat(timespec='seconds')}" if old.expires_at else "was revoked now"
        typer.echo(key)
        typer.echo(
            f"(tenant {row.tenant.name}, role {row.role}, id {row.id}; the old key {key_id} {ends}; "
            "store the new one now, it is not shown again)",
            err=True,
        )


@demos_app.command("import")
def demos_import(
    file: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="JSON Lines: one POST /v1/demonstrations body per line."
    ),
    tenant: str = typer.Option(..., help="Tenant the demonstrations belong to."),
) -> None:
    """Upload demonstrations, each checked and replayed as POST /v1/demonstrations does. Prints each line's
    outcome; a bad line stores nothing and the others are kept. Exits with 1 if any line failed."""
    settings = _setup()
    _migrate_if_embedded(settings)
    from agentloop.api import demonstrations
    from agentloop.api.auth import tenant_admin
    from agentloop.api.errors import ServiceError
    from agentloop.store.db import session_scope

    with session_scope() as s:
        principal = tenant_admin(s, tenant)
    if principal is None:
        raise typer.BadParameter(f"no tenant named {tenant!r}", param_hint="--tenant")
    stored = failed = 0
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                with session_scope() as s:  # one transaction per line: a bad one rolls back alone
                    body = demonstrations.parse_upload(line)
                    row = demonstrations.create_demonstration(s, principal, body, settings.secret_key)
                    outcome = f"ok {row.id} ({len(row.steps)} steps, {'replayed' if row.replayed else 'not replayed'})"
            except ServiceError as exc:
                failed += 1
                typer.echo(f"line {number}: {exc.message}", err=True)
                continue
            stored += 1
            typer.echo(f"line {number}: {outcome}")
    typer.echo(f"{stored} demonstration(s) imported for tenant {tenant!r}, {failed} line(s) failed", err=True)
    if failed:
        raise typer.Exit(1)


@demos_app.command("export")
def demos_export(
    file: Path = typer.Argument(..., dir_okay=False, help="JSON Lines file to write (replaced if it exists)."),
    tenant: str = typer.Option(None, help="Only this tenant's (default: every tenant's)."),
    world: str = typer.Option(None, help="Only this world's."),
) -> None:
    """Write demonstrations, oldest first, one POST /v1/demonstrations body per line: `demos import` reads
    the file back (the observations of replayed steps are then replayed again)."""
    settings = _setup()
    _migrate_if_embedded(settings)
    from agentloop.api.auth import tenant_admin
    from agentloop.api.demonstrations import upload_body
    from agentloop.store import demonstrations as demo_store
    from agentloop.store.db import session_scope

    count = 0
    with session_scope() as s:
        tenant_id = None
        if tenant is not None:
            principal = tenant_admin(s, tenant)
            if principal is None:
                raise typer.BadParameter(f"no tenant named {tenant!r}", param_hint="--tenant")
            tenant_id = principal.tenant_id
        with file.open("w", encoding="utf-8") as out:
            for row in demo_store.oldest_first(s, tenant_id, world):
                out.write(json.dumps(upload_body(row), ensure_ascii=False) + "\n")
                count += 1
    typer.echo(f"{count} demonstration(s) written to {file}", err=True)


@app.command()
def demo(
    url: str = typer.Option("http://127.0.0.1:8000", help="A running service."),
    key: str = typer.Option(None, help="API key (default: $AGENTLOOP_HOME/admin.key)."),
    tasks: str = typer.Option("wallet_balance-1,notes_delete_titled-1", help="Comma-separated built-in task refs."),
    max_turns: int = typer.Option(6, help="Turn limit per task for the demo."),
) -> None:
    """Submit built-in tasks and print each episode step by step with its reward."""
    settings = _setup()
    from agentloop.demo import run_demo

    api_key = key or _read_key_file(settings)
    raise typer.Exit(run_demo(url, api_key, [t.strip() for t in tasks.split(",") if t.strip()], max_turns))


@world_app.command("stats")
def world_stats(
    world: str = typer.Option("builtin", help="World name."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Apps, APIs, scenarios and tasks of a world."""
    _setup()
    from collections import Counter

    from agentloop.apps.registry import get_world

    provider = get_world(world)
    tasks = provider.tasks()
    stats = {
        "world": world,
        "apps": len(provider.apps),
        "apis": sum(not a.hidden for spec in provider.apps.values() for a in spec.apis.values()),
        "scenarios": len({t.scenario_id for t in tasks}),
        "tasks": len(tasks),
        "splits": dict(sorted(Counter(t.split for t in tasks).items())),
        "difficulty": {str(k): v for k, v in sorted(Counter(t.difficulty for t in tasks).items())},
        "apis_per_app": {name: sum(not a.hidden for a in spec.apis.values()) for name, spec in provider.apps.items()},
    }
    if as_json:
        typer.echo(json.dumps(stats))
        return
    for key, value in stats.items():
        typer.echo(f"{key:>13}: {value}")


SPLITS_HELP = "Built-in: train, dev, test_normal, test_challenge; scienceworld: train, dev, test."


@world_app.command("tasks")
def world_tasks(
    world: str = typer.Option("builtin", help="World name."),
    split: str = typer.Option(None, help="Only this split. " + SPLITS_HELP),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """List a world's tasks."""
    _setup()
    from agentloop.apps.registry import get_world

    for task in get_world(world).tasks(split):
        if as_json:
            typer.echo(json.dumps(task.summary()))
        else:
            typer.echo(f"{task.id:<40} {task.split:<15} d{task.difficulty}  {task.instruction}")


@world_app.command("digest")
def world_digest_command(
    world: str = typer.Option("builtin", help="World name."),
    split: str = typer.Option(None, help="Only this split. " + SPLITS_HELP),
    as_json: bool = typer.Option(False, "--json", help="One JSON object, with every task's digest."),
) -> None:
    """Digest of every task (initial state, instruction, expected outcome, oracle run and verdict): equal
    digests on two machines or days mean the same tasks."""
    _setup()
    from agentloop.apps.digest import task_digests, world_digest
    from agentloop.apps.registry import get_world

    digests = task_digests(get_world(world), split)
    summary = {"world": world, "split": split, "tasks": len(digests), "digest": world_digest(digests)}
    if as_json:
        typer.echo(json.dumps({**summary, "per_task": digests}))
        return
    typer.echo(f"{summary['digest']}  {summary['tasks']} tasks of {world}" + (f" ({split})" if split else ""))


@app.command("eval")
def eval_command(
    world: str = typer.Option("builtin", help="World whose tasks to run."),
    split: str = typer.Option("dev", help="Split to run. " + SPLITS_HELP),
    policy: str = typer.Option("model", help="oracle, random, model, or model@<adapter name or directory>."),
    k: int = typer.Option(1, min=1, help="Episodes per task."),
    limit: int = typer.Option(None, min=1, help="Only the first N tasks of the split."),
    app_name: str = typer.Option(None, "--app", help="Evaluate on a registered external app instead."),
    tenant: str = typer.Option(
        None,
        help="The tenant whose run it is: it trains that tenant's adapter on its data only. Default: the app's "
        "tenant with --app, else a shared run (the shared adapter; data of tenants that share theirs).",
    ),
    task_refs: Path = typer.Option(
        None,
        help="File of task refs, one per line: run those tasks of the world or of --app instead of --split.",
    ),
    fresh: int = typer.Option(
        None,
        min=1,
        help="Instead of --split: N fresh instances of the world's train scenarios (each scenario in turn, new "
        "people and values on seeds drawn from --seed): how the model does on new tasks of the kinds it trains on.",
    ),
    seed: int = typer.Option(0, help="With --fresh: the seed the instances' seeds are drawn from."),
    max_turns: int = typer.Option(None, min=1, help="Turn limit (default AGENTLOOP_AGENT_MAX_TURNS)."),
    max_new_tokens: int = typer.Option(
        None, min=1, help="New tokens per turn (default AGENTLOOP_AGENT_MAX_NEW_TOKENS)."
    ),
    temperature: float = typer.Option(0.0, min=0.0, help="Sampling temperature (0 = greedy)."),
    batch_size: int = typer.Option(None, min=1, help="Episodes decoded together (default AGENTLOOP_MAX_BATCH_SIZE)."),
    as_json: bool = typer.Option(False, "--json", help="End with one JSON line of metrics."),
) -> None:
    """Run a policy over a split and print TGC/SGC (per split and difficulty). The run is stored."""
    from agentloop.agent.eval_runs import run_eval_command
    from agentloop.apps.remote_env import EnvironmentFailure

    settings = _setup()
    _migrate_if_embedded(settings)
    try:
        summary = run_eval_command(
            settings,
            world=world,
            split=split,
            policy=policy,
            k=k,
            limit=limit,
            app_name=app_name,
            tenant=tenant,
            task_refs=task_refs,
            fresh=fresh,
            seed=seed,
            max_turns=max_turns,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            batch_size=batch_size,
        )
    except EnvironmentFailure as exc:  # the app is down or refused: one line, not a traceback
        hint = "; start it (or check its base_url) and run again" if exc.retryable else ""
        typer.echo(f"agentloop eval: {exc.message}{hint}", err=True)
        raise typer.Exit(1) from None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(summary))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _learn_run(
    settings: Settings,
    resume: str | None,
    algo: str,
    iterations: int,
    overrides: dict[str, object],
    tenant: str | None,
    recipe: str | None = None,
) -> str:
    """The run to train: the one to resume (failed, cancelled, or lost with its lease expired), or a new one,
    checked first (its world, or its app: `tenant`'s, by name, when several tenants registered that name)."""
    import sqlalchemy as sa

    from agentloop.learner.config import LoopConfig
    from agentloop.learner.task_source import TaskSourceError, TaskSourceUnavailable, find_app, load_source
    from agentloop.store.db import session_scope
    from agentloop.store.models import Tenant, TrainingRun, TrainingRunStatus, utcnow
    from agentloop.store.training_runs import CLI_TRIGGER

    with session_scope() as s:
        if resume:
            run = s.get(TrainingRun, resume)
            if run is None:
                raise typer.BadParameter(f"no training run {resume}", param_hint="--resume")
            left = run.iteration < int(run.config.get("iterations", 1))
            if run.status == TrainingRunStatus.FINISHED and not left:
                raise typer.BadParameter(f"training run {resume} already finished", param_hint="--resume")
            if run.status == TrainingRunStatus.RUNNING and run.lease_expires_at and run.lease_expires_at > utcnow():
                raise typer.BadParameter(
                    f"training run {resume} is running in {run.lease_owner}; stop that process first (or cancel "
                    f"the run: POST /v1/admin/training-runs/{resume}/cancel)",
                    param_hint="--resume",
                )
            if run.status in TrainingRunStatus.TERMINAL:  # from its last checkpoint
                run.status, run.error, run.finished_at, run.cancel_requested = "queued", None, None, False
            run_id = run.id
        else:
            try:
                if recipe is not None:
                    config = LoopConfig.for_recipe(recipe, **overrides)
                else:
                    config = LoopConfig.for_algo(algo, iterations=iterations, **overrides)
            except (TypeError, ValueError) as exc:
                raise typer.BadParameter(str(exc)) from None
            tenant_id = None  # a shared run: the shared adapter, on the data of the tenants that share theirs
            if tenant is not None:
                tenant_id = s.scalar(sa.select(Tenant.id).where(Tenant.name == tenant))
                if tenant_id is None:
                    raise typer.BadParameter(f"no tenant named {tenant!r}", param_hint="--tenant")
            try:
                if tenant_id is None and config.app is not None:  # a run on an app is its tenant's
                    tenant_id = find_app(s, config.app, None).tenant_id
                load_source(s, config, tenant_id, settings.secret_key)
            except TaskSourceError as exc:
                raise typer.BadParameter(str(exc), param_hint="--app" if config.app else "--set world") from None
            except TaskSourceUnavailable as exc:
                typer.echo(f"cannot start training: {exc}", err=True)
                raise typer.Exit(1) from None
            run = TrainingRun(
                algo=config.label,
                status="queued",
                trigger=CLI_TRIGGER,
                tenant_id=tenant_id,
                config=config.to_dict(),
                progress={},
            )
            s.add(run)
            s.flush()
            run_id = run.id
    return run_id


@app.command()
def learn(
    algo: str = typer.Option(
        "loop", help="sft, stepagent-implicit, stepagent-irl, loop, loop+step, grpo or reinforce (docs/learning.md)."
    ),
    recipe: str = typer.Option(
        None, help="A recipe instead of --algo: `default` runs sft, then stepagent-implicit, then loop+step."
    ),
    iterations: int = typer.Option(1, min=1, help="Iterations to run (a recipe's phases say their own)."),
    tasks_per_iteration: int = typer.Option(None, min=1, help="N tasks per iteration (default 40)."),
    rollouts_per_task: int = typer.Option(None, min=1, help="K rollouts per task (default 6)."),
    max_turns: int = typer.Option(None, min=1, help="Turn limit of a rollout (default 40)."),
    max_new_tokens: int = typer.Option(None, min=1, help="New tokens per turn (default 1500)."),
    dev_limit: int = typer.Option(None, min=1, help="Evaluate candidates on the first N dev tasks only."),
    app_name: str = typer.Option(
        None, "--app", help="Train on a registered resettable app's train tasks instead of the world's."
    ),
    tenant: str = typer.Option(
        None,
        help="The tenant whose run it is: it trains that tenant's adapter on its data only. Default: the app's "
        "tenant with --app, else a shared run (the shared adapter; data of tenants that share theirs).",
    ),
    option: list[str] = typer.Option([], "--set", help="Any training option as key=value (JSON values)."),
    resume: str = typer.Option(None, help="Resume this training run from its last checkpoint."),
) -> None:
    """Run training iterations in this process, with progress, and print each iteration's metrics. Tasks
    come from the world's train split, or with --app from a registered app's (each rollout reset in the
    app and scored by it). Under `accelerate launch` (or torchrun) the processes share each update (DDP).

    Ctrl-C (SIGINT) or SIGTERM cancels the run at its next safe point (a second one: at once); either way
    the run ends `cancelled`, and `--resume` continues it from its last checkpoint. Only `--resume`
    resumes a run of `agentloop learn`: a server whose sweeper finds it lost marks it failed instead."""
    import socket

    from accelerate import PartialState

    from agentloop.learner.run import run_training
    from agentloop.learner.trainer import Cancellation
    from agentloop.store.db import session_scope
    from agentloop.store.models import TrainingRun

    settings = _setup()
    state = PartialState(cpu=not _cuda())
    if state.is_main_process:
        _migrate_if_embedded(settings)

    overrides: dict[str, object] = {}
    for item in option:
        key, sep, raw = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected key=value, not {item!r}", param_hint="--set")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    for key, value in (
        ("tasks_per_iteration", tasks_per_iteration),
        ("rollouts_per_task", rollouts_per_task),
        ("max_turns", max_turns),
        ("max_new_tokens", max_new_tokens),
        ("dev_limit", dev_limit),
        ("app", app_name),
    ):
        if value is not None:
            overrides[key] = value
    run_id = None
    if state.is_main_process:
        run_id = _learn_run(settings, resume, algo, iterations, overrides, tenant, recipe)
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        shared = [run_id]
        broadcast_object_list(shared, from_process=0)
        run_id = shared[0]
    assert run_id is not None
    owner = f"cli:{socket.gethostname()}:{os.getpid()}"
    cancellation = Cancellation()
    signals = _cancel_on_signals(run_id, cancellation, record=state.is_main_process)
    if not state.is_main_process:
        returned = False
        try:
            outcome = run_training(run_id, owner, settings, cancellation=cancellation)
            returned = True
        finally:
            _leave_process_group(state, returned)
        raise typer.Exit(0 if outcome == "finished" else 1)
    typer.echo(f"training run {run_id}", err=True)
    with session_scope() as s:
        run = s.get(TrainingRun, run_id)
        total = run.config.get("iterations", "?") if run is not None else "?"

    def show(progress: dict[str, Any]) -> None:
        if progress.get("phase") == "iteration_done":
            typer.echo(json.dumps(progress.get("metrics"), default=str))
        elif progress.get("plan"):  # what the iteration's rollouts are, client episodes included
            typer.echo(f"iteration {progress['iteration'] + 1}/{total}: {progress['plan']}", err=True)
        else:
            typer.echo(" ".join(f"{k}={v}" for k, v in progress.items()), err=True)

    returned = False
    try:
        outcome = run_training(run_id, owner, settings, report=show, cancellation=cancellation)
        returned = True
    except KeyboardInterrupt:  # a second signal: stopped at once (the run is recorded as cancelled)
        outcome = "cancelled"
    finally:
        _leave_process_group(state, returned)
    with session_scope() as s:
        run = s.get(TrainingRun, run_id)
        assert run is not None
        typer.echo(f"run {run_id}: {run.status}" + (f" ({run.error})" if run.error else ""), err=True)
    if outcome == "cancelled" and signals:
        typer.echo(f"resume it with: agentloop learn --resume {run_id}", err=True)
        raise typer.Exit(128 + signals[0])
    raise typer.Exit(0 if outcome == "finished" else 1)


def _leave_process_group(state: Any, returned: bool) -> None:
    """Destroy the process group before exit (else gloo's threads are torn down at interpreter exit and the
    process aborts). A run that returned first meets its peers at a barrier: a rank whose last iteration had
    no update to join may finish while rank 0 still saves and records, and tearing the group down under a
    peer aborts it. A run that raised or was stopped at once skips the barrier: its peers may be gone."""
    if returned and state.num_processes > 1:
        state.wait_for_everyone()
    state.destroy_process_group()


def _cancel_on_signals(run_id: str, cancellation: Cancellation, record: bool) -> list[int]:
    """SIGINT / SIGTERM: cancel the run at its next safe point (and say so in its row at once, so that it
    ends cancelled even if this process is killed next); a second one raises KeyboardInterrupt: stop now.
    Returns the signals received, as they come."""
    from agentloop.store.db import session_scope
    from agentloop.store.models import TrainingRun, TrainingRunStatus
    from agentloop.store.training_runs import request_cancel

    received: list[int] = []

    def record_request(reason: str) -> None:
        try:
            with session_scope() as s:
                run = s.get(TrainingRun, run_id, with_for_update=True)
                if run is not None and run.status not in TrainingRunStatus.TERMINAL and not run.cancel_requested:
                    request_cancel(s, run, reason)  # not yet claimed: cancelled now; else at the safe point
        except Exception as exc:  # the safe point still stops the run; only a kill -9 now would lose it
            log.warning("could not record the cancel request of run %s: %s", run_id, exc)

    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        received.append(signum)
        if len(received) > 1:
            raise KeyboardInterrupt(name)
        reason = f"cancelled: `agentloop learn` got {name}"
        cancellation.request(reason)
        typer.echo(f"{name}: run {run_id} stops at its next safe point ({name} again: at once)", err=True)
        if record:  # not here: the handler may have interrupted a transaction of this thread
            threading.Thread(target=record_request, args=(reason,), name="record-cancel", daemon=True).start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    return received


def _read_key_file(settings: Settings) -> str:
    path = settings.home.resolve() / "admin.key"
    if not path.exists():
        raise typer.BadParameter(f"no --key given and {path} does not exist (start `agentloop serve` once)")
    return path.read_text().strip()


def main() -> None:
    try:
        app()
    except Exception as exc:
        # a configuration error is the user's to fix: say what and how, without a traceback
        lines = config_error_lines(exc)
        if lines is None:
            raise
        for line in lines:
            typer.echo(f"agentloop: configuration error: {line}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
