"""The REST API under load, beside a bare endpoint doing the same single insert: requests per second, p50/p99
latency and errors at rising concurrency, measured side by side in one run.

    python bench/api_load.py [--quick] [--levels 1,4,16,64] [--seconds S] [--rounds N] [--workers N] [--json]
        [--write-docs]

The production setup, each part its own process: the API under uvicorn (`--workers` processes,
`agentloop.api.app:create_app`), PostgreSQL (a fresh database on 127.0.0.1:5432, dropped afterwards), Redis
(127.0.0.1:6379 db 14, emptied before and after: the broker, step events and the rate limiter's counters)
and a Celery worker with the `replay` policy (no model: every episode looks up the supervisor's profile,
then completes), so that tasks created during the run are also run, stored and finished. Each level
measures the API twice: with the worker running the tasks as they come (the production setup: its episodes
share the two cores), then, once the worker has finished them, with the idle worker stopped (the request path
alone: its tasks wait in the queue, and are run after the level) and the bare endpoint, with the worker
stopped too, in `--rounds` rounds of one API turn then one bare turn, each level's ratio the median of its
rounds' (API / bare of the same round: turns next to each other in time, so a noisy minute on a shared machine
moves both). `api_bare_rps_ratio` compares the request path alone with the bare endpoint;
`api_with_worker_bare_rps_ratio` the production setup. Both
servers keep connections alive 60 s (uvicorn's 5 s default closes some under the client, which counts as an
error).

The bare endpoint: FastAPI under the same uvicorn settings, `POST /tasks` validating a body like
`POST /v1/tasks`'s and inserting one row into its own table of the same PostgreSQL server, `GET /tasks/{id}`
selecting it; no authentication, no rate limit, no broker.

Workload, the same for both: at each concurrency level, that many clients loop for `--seconds`, each
creating a task (a built-in task ref) and reading it back, over keep-alive connections. The API is called with
one client key whose rate limits are raised out of the way (600,000 a minute; the limiter still counts every
request in Redis) and a quota of active tasks the run cannot reach.

The ratios are taken at the highest level (the target for `api_bare_rps_ratio` is 0.7). Last line: a JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
POSTGRES = os.environ.get("AGENTLOOP_BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("AGENTLOOP_BENCH_REDIS", "redis://127.0.0.1:6379/14")
TASK = {"task_ref": "wallet_send_money-1"}
REPLAY = [{"app": "supervisor", "api": "show_profile", "args": {}}]
SECTION = "api_load"
ACTIVE = "status IN ('queued', 'running')"
BARE_TABLE = (
    "CREATE TABLE bare_tasks (id varchar(36) PRIMARY KEY, task_ref varchar(200), status varchar(16), "
    "created_at double precision)"
)

# --- the bare endpoint (run by uvicorn in its own processes: `api_load:bare_app`) ---------------------------------


class BareTask(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    task_ref: str = Field(..., min_length=1, max_length=200)


def bare_app() -> Any:
    """FastAPI with one table: what a single insert and a single select cost behind the same server."""
    from fastapi import FastAPI, HTTPException

    engine = sa.create_engine(os.environ["BARE_DATABASE_URL"], pool_pre_ping=True, pool_size=5, max_overflow=10)
    meta = sa.MetaData()
    rows = sa.Table(
        "bare_tasks",
        meta,
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("task_ref", sa.String(200)),
        sa.Column("status", sa.String(16)),
        sa.Column("created_at", sa.Float),
    )

    app = FastAPI()

    @app.post("/tasks", status_code=202)
    def create(body: BareTask) -> dict[str, Any]:
        row = {"id": str(uuid.uuid4()), "task_ref": body.task_ref, "status": "queued", "created_at": time.time()}
        with engine.begin() as conn:
            conn.execute(rows.insert().values(**row))
        return row

    @app.get("/tasks/{task_id}")
    def read(task_id: str) -> dict[str, Any]:
        with engine.connect() as conn:
            found = conn.execute(sa.select(rows).where(rows.c.id == task_id)).mappings().first()
        if found is None:
            raise HTTPException(404, "no such task")
        return dict(found)

    return app


# --- processes ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    """The processes of one run, stopped (and the database dropped) however the run ends."""

    def __init__(self, workers: int, home: Path, logs: Path | None = None) -> None:
        self.workers, self.home = workers, home
        self.procs: list[subprocess.Popen[bytes]] = []
        self.db_name = f"agentloop_load_{uuid.uuid4().hex[:10]}"
        self.admin = sa.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.db_name}"'))
        self.db_url = sa.make_url(POSTGRES).set(database=self.db_name).render_as_string(hide_password=False)
        self.env = {
            **os.environ,
            "AGENTLOOP_HOME": str(home),
            "AGENTLOOP_DATABASE_URL": self.db_url,
            "AGENTLOOP_BROKER_URL": REDIS,
            "AGENTLOOP_REDIS_URL": REDIS,
            "AGENTLOOP_POLICY_BACKEND": "replay",
            "AGENTLOOP_REPLAY_ACTIONS": json.dumps(REPLAY),
            "AGENTLOOP_RATE_LIMIT_PER_KEY": "600000/minute",
            "AGENTLOOP_RATE_LIMIT_PER_TENANT": "600000/minute",
            "AGENTLOOP_MAX_ACTIVE_TASKS_PER_TENANT": "100000000",
            "AGENTLOOP_LOG_LEVEL": "WARNING",
            "BARE_DATABASE_URL": self.db_url,
        }
        self.logs = logs or home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def run(self, *args: str) -> str:
        done = subprocess.run([PYTHON, "-m", "agentloop.cli", *args], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"agentloop {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout

    def start(self, name: str, *cmd: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT / "bench")
        self.procs.append(proc)
        return proc

    def uvicorn(self, name: str, target: str, port: int) -> str:
        self.start(
            name, PYTHON, "-m", "uvicorn", target, "--factory", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(self.workers), "--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "60",
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/openapi.json", timeout=2).status_code == 200, f"{name} on {url}")
        return url

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))
        self.admin.dispose()


def wait_until(ready: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not come up within {timeout_s:.0f} s")


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(REDIS).flushdb()


# --- load -------------------------------------------------------------------------------------------


async def drive(base: str, create: str, read: str, headers: dict[str, str], clients: int, seconds: float) -> dict:
    """`clients` loops of create-then-read for `seconds`; each request's latency and status."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=30) as http:
        stop_at = time.perf_counter() + seconds

        async def one(method: str, path: str, body: Any = None) -> Any:
            t0 = time.perf_counter()
            try:
                resp = await http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return None
            latencies.append(time.perf_counter() - t0)
            if resp.status_code >= 400:
                errors[str(resp.status_code)] = errors.get(str(resp.status_code), 0) + 1
                return None
            return resp.json()

        async def client() -> None:
            while time.perf_counter() < stop_at:
                made = await one("POST", create, TASK)
                if made is not None:
                    await one("GET", read.format(id=made["id"]))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    ok = len(latencies) - sum(errors.get(k, 0) for k in errors if k.isdigit())
    ordered = sorted(latencies) or [0.0]
    return {
        "clients": clients,
        "requests": len(latencies) + sum(v for k, v in errors.items() if not k.isdigit()),
        "ok": ok,
        "rps": round(ok / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "errors": errors,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    flush_redis()
    with tempfile.TemporaryDirectory(prefix="agentloop-load-") as tmp:
        stack = Stack(args.workers, Path(tmp), args.logs)
        try:
            stack.run("migrate")
            key = stack.run("keys", "create", "--tenant", "load", "--role", "client", "--name", "api_load").strip()
            api = stack.uvicorn("api", "agentloop.api.app:create_app", free_port())
            bare = stack.uvicorn("bare", "api_load:bare_app", free_port())
            with sa.create_engine(stack.db_url).begin() as conn:  # the bare table, made before any request
                conn.execute(sa.text(BARE_TABLE))
            worker = stack.start("worker", PYTHON, "-m", "agentloop.cli", "worker", "--queues",
                                 "episodes,maintenance", "--pool", "threads", "--concurrency", "4")  # fmt: skip
            levels: list[dict[str, Any]] = []
            for clients in args.levels:
                row: dict[str, Any] = {"clients": clients}
                api_call = ("/v1/tasks", "/v1/tasks/{id}", {"Authorization": f"Bearer {key}"})
                # 1. the production setup: the worker runs the tasks as they come, on the same two cores
                row["api_with_worker"] = asyncio.run(drive(api, *api_call, clients, args.seconds))
                row["drain_s"] = drain(stack.db_url, args.drain_timeout_s)  # it finishes what it took
                # 2. the request path alone: the idle worker stopped (SIGSTOP; it holds no transaction now), the
                # tasks wait in the queue and are run after the bare endpoint's turn
                os.kill(worker.pid, signal.SIGSTOP)
                turns: dict[str, list[dict[str, Any]]] = {"api": [], "bare": []}
                try:
                    for _ in range(args.rounds):
                        turns["api"].append(asyncio.run(drive(api, *api_call, clients, args.seconds)))
                        turns["bare"].append(
                            asyncio.run(drive(bare, "/tasks", "/tasks/{id}", {}, clients, args.seconds))
                        )
                finally:
                    os.kill(worker.pid, signal.SIGCONT)
                row["drain_after_s"] = drain(stack.db_url, args.drain_timeout_s)
                row["api"], row["bare"] = combined(turns["api"]), combined(turns["bare"])
                for name in ("api_with_worker", "api", "bare"):
                    print(f"  {clients} clients {name}: {row[name]}", file=sys.stderr, flush=True)
                ratios = [a["rps"] / b["rps"] for a, b in zip(turns["api"], turns["bare"], strict=True) if b["rps"]]
                row["round_ratios"] = [round(r, 3) for r in ratios]
                row["ratio"] = round(statistics.median(ratios), 3) if ratios else None
                bare_rps = row["bare"]["rps"]
                row["ratio_with_worker"] = round(row["api_with_worker"]["rps"] / bare_rps, 3) if bare_rps else None
                levels.append(row)
            finished = count_finished(stack.db_url)
        finally:
            stack.stop()
            flush_redis()
    return {"levels": levels, "tasks_finished_by_the_worker": finished}


def combined(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """A server's turns at one level as one figure: the median turn's req/s and latencies, every turn's req/s,
    and all their errors."""
    middle = sorted(turns, key=lambda t: t["rps"])[(len(turns) - 1) // 2]
    errors: dict[str, int] = {}
    for turn in turns:
        for kind, n in turn["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
    return {**middle, "errors": errors, "turns_rps": [t["rps"] for t in turns]}


def drain(db_url: str, timeout_s: float) -> float | None:
    """Seconds until no task is queued or running (None: still some after `timeout_s`)."""
    engine, started = sa.create_engine(db_url), time.perf_counter()
    try:
        while time.perf_counter() - started < timeout_s:
            with engine.connect() as conn:
                if not conn.execute(sa.text(f"SELECT count(*) FROM tasks WHERE {ACTIVE}")).scalar():
                    return round(time.perf_counter() - started, 1)
            time.sleep(0.5)
        return None
    finally:
        engine.dispose()


def count_finished(db_url: str) -> dict[str, int]:
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, count(*) FROM tasks GROUP BY status")).all()
    engine.dispose()
    return {status: int(n) for status, n in rows}


def docs_section(result: dict[str, Any], command: str) -> str:
    from report import machine

    lines = [
        "## REST API under load vs a bare endpoint (`bench/api_load.py`)",
        "",
        f"`{command}`",
        "",
        f"On {machine()}; {result['workers']} uvicorn worker processes each; PostgreSQL and Redis on the same "
        f"machine; a Celery worker (4 threads, replay policy). *API*: the request path alone (the idle worker "
        "stopped, the tasks run after the level); *API with the worker*: the production setup, the worker running "
        "the tasks as they come on the same cores, then finishing what it took (drain s); the load generator "
        f"(httpx, asyncio) in the same machine too; {result['seconds']:.0f} s a turn. A client creates a task, reads "
        f"it back, again. At each level: one turn of the API with the worker, then {result['rounds']} rounds of an "
        "API turn and a bare turn; API and bare are each their median round's figures, API / bare the median of "
        "the rounds' ratios (each round's in the last column).",
        "",
        "| clients | API req/s | API p50 / p99 ms | API errors | bare req/s | bare p50 / p99 ms | API / bare "
        "| API with the worker req/s (p99 ms) | with the worker / bare | drain s | rounds' API / bare |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["levels"]:
        a, b, w = row["api"], row["bare"], row["api_with_worker"]
        lines.append(
            f"| {row['clients']} | {a['rps']} | {a['p50_ms']} / {a['p99_ms']} | {sum(a['errors'].values())} | "
            f"{b['rps']} | {b['p50_ms']} / {b['p99_ms']} | {row['ratio']} | {w['rps']} ({w['p99_ms']}; "
            f"{sum(w['errors'].values())} errors) | {row['ratio_with_worker']} | {row['drain_s']} | "
            f"{', '.join(map(str, row['round_ratios']))} |"
        )
    lines += [
        "",
        f"Tasks by status in the API's database at the end: {result['tasks_finished_by_the_worker']}.",
        "",
        f"`api_bare_rps_ratio` {result['api_bare_rps_ratio']} at {result['levels'][-1]['clients']} clients "
        f"(target 0.7); with the worker, `api_with_worker_bare_rps_ratio` {result['api_with_worker_bare_rps_ratio']}.",
    ]
    return "\n".join(lines)


def main() -> None:
    from report import emit, machine, write_section  # (not at the top: uvicorn imports this module too)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two levels (1 and 8 clients), one round of 4-s turns")
    ap.add_argument("--levels", default="1,4,16,64", help="comma-separated client counts")
    ap.add_argument("--seconds", type=float, default=15.0, help="a turn: one server at one level")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of an API turn and a bare turn at each level")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes of each server")
    ap.add_argument("--logs", type=Path, default=None, help="keep the processes' logs in this folder")
    ap.add_argument(
        "--drain-timeout-s", type=float, default=300.0, help="most seconds to wait for the worker after each API level"
    )
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md's api_load section")
    args = ap.parse_args()
    if args.quick:
        args.levels, args.seconds, args.rounds = "1,8", 4.0, 1
    try:
        args.levels = [int(x) for x in str(args.levels).split(",") if x.strip()]
    except ValueError:
        ap.error("--levels takes comma-separated integers, e.g. 1,4,16")
    if not args.levels or min(args.levels) < 1 or args.seconds <= 0 or args.workers < 1 or args.rounds < 1:
        ap.error("--levels must be positive integers, --seconds, --rounds and --workers positive")
    command = ("python bench/api_load.py " + shlex.join(a for a in sys.argv[1:] if a != "--write-docs")).strip()
    measured = measure(args)
    top = measured["levels"][-1]
    result = {
        "api_bare_rps_ratio": top["ratio"],
        "api_with_worker_bare_rps_ratio": top["ratio_with_worker"],
        "workers": args.workers,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "quick": args.quick,
        "machine": machine(),
        "command": command,
        **measured,
    }
    if not args.json:
        for row in measured["levels"]:
            print(
                f"{row['clients']:>3} clients  API {row['api']['rps']:>7} req/s  bare {row['bare']['rps']:>7} req/s"
                f"  ratio {row['ratio']}  (with the worker {row['api_with_worker']['rps']} req/s, "
                f"{row['ratio_with_worker']})",
                file=sys.stderr,
            )
    if args.write_docs:
        write_section(SECTION, docs_section(result, command))
    emit(result)


if __name__ == "__main__":
    main()
