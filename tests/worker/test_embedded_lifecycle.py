"""`agentloop serve` in embedded mode with real processes: its workers and beat die with it even when it is
killed, a killed beat is replaced by one, never two, a second beat on a home waits for the first, a worker
`--beat` dies with its beat, and the lease sweeps run while every episode thread is busy."""

import os
import re
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from agentloop.store.db import session_scope
from agentloop.store.models import Task, TaskStatus, Tenant, utcnow
from tests.apps.loopback_app import LOOPBACK_NETWORKS, serve_app
from tests.processes import task_row, wait_for
from tests.test_cli import free_port, start_serve


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def started(logs: str, what: str) -> list[int]:
    return [int(pid) for pid in re.findall(rf"embedded {what} started \(pid (\d+)\)", logs)]


def beats(logs: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"beat lock on \S+ held \(pid (\d+)\)", logs)]


@pytest.fixture
def embedded(isolated_home, tiny_model_dir, configure_env):
    configure_env(MODEL=tiny_model_dir, SWEEP_INTERVAL_S=2, LOG_LEVEL="INFO")


def test_a_killed_serve_takes_its_workers_and_their_beat_with_it(embedded, processes):
    start_serve(processes, free_port())
    serve = processes.procs[0]
    wait_for(lambda: beats(processes.everything()), 120, "the beat", processes.logs)
    logs = processes.everything()
    children = [*started(logs, "worker"), *started(logs, "maintenance worker"), *started(logs, "beat")]
    assert len(children) == 3 and all(alive(p) for p in children), logs
    assert beats(logs) == started(logs, "beat")
    os.kill(serve.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in children), 60, "serve's children to stop", processes.logs)


def test_a_killed_beat_is_replaced_by_one(embedded, processes):
    start_serve(processes, free_port())
    wait_for(lambda: beats(processes.everything()), 120, "the beat", processes.logs)
    for kill in range(1, 4):
        (beat, *_) = started(processes.everything(), "beat")[-1:]
        os.kill(beat, signal.SIGKILL)
        wait_for(lambda k=kill: len(beats(processes.everything())) == k + 1, 120, f"beat {kill + 1}", processes.logs)
        live = [p for p in beats(processes.everything()) if alive(p)]
        assert len(live) == 1, (live, processes.logs())
    assert "another beat runs" not in processes.everything()  # each old beat was gone before the new one started


@pytest.fixture
def stalling_app():
    """An app whose reset takes 25 s: a task on it holds an episode thread that long."""
    resets: list[float] = []
    release = threading.Event()
    app = FastAPI()

    @app.get("/agentloop/tasks", operation_id="agentloop_tasks")
    def tasks() -> list[dict[str, str]]:
        return [{"task_ref": "wait", "instruction": "Wait.", "split": "train"}]

    @app.post("/agentloop/reset", operation_id="agentloop_reset")
    def reset(body: dict[str, Any]) -> dict[str, str]:
        resets.append(time.monotonic())
        release.wait(25)
        return {"episode": "e"}

    @app.post("/agentloop/evaluate", operation_id="agentloop_evaluate")
    def evaluate(body: dict[str, Any]) -> dict[str, int]:
        return {"passed": 0, "total": 1}

    @app.get("/ping", operation_id="ping", summary="Ping.")
    def ping() -> str:
        return "pong"

    with serve_app(app) as base_url:
        yield base_url, app.openapi(), resets
        release.set()


def test_lease_sweeps_run_while_every_episode_thread_is_busy(
    embedded, processes, isolated_home, stalling_app, configure_env
):
    configure_env(APP_CONTROL_TIMEOUT_S=30, APP_CONTROL_ATTEMPTS=1)
    base_url, document, resets = stalling_app
    base = start_serve(processes, free_port())
    auth = {"Authorization": f"Bearer {(isolated_home / 'admin.key').read_text().strip()}"}
    registration = {"name": "stall", "openapi": document, "base_url": base_url, "allowed_networks": LOOPBACK_NETWORKS}
    assert httpx.post(f"{base}/v1/apps", json=registration, headers=auth).status_code == 201
    for _ in range(2):  # the episode worker's two threads, each held in a reset
        assert httpx.post(f"{base}/v1/tasks", json={"task_ref": "stall:wait"}, headers=auth).status_code == 202
    wait_for(lambda: len(resets) == 2, 120, "both threads in a reset", processes.logs)
    with session_scope() as s:  # a task whose worker died: its lease ran out a second ago
        lost = Task(
            tenant_id=s.scalars(sa.select(Tenant.id).where(Tenant.name == "default")).one(),
            world="builtin",
            task_ref="wallet_balance-1",
            instruction="Check my wallet.",
            apps=["wallet"],
            options={},
            request_hash="lost",
            status=TaskStatus.RUNNING,
            attempts=1,
            lease_owner="gone",
            lease_expires_at=utcnow() - timedelta(seconds=1),
        )
        s.add(lost)
        s.flush()
        lost_id = lost.id
    took = time.monotonic()
    wait_for(lambda: task_row(lost_id).status == TaskStatus.QUEUED, 15, "the sweep", processes.logs)
    assert time.monotonic() - took < 15 and time.monotonic() - resets[0] < 25  # both threads still held
    assert "lost its worker (lease expired)" in (task_row(lost_id).error or "")


def test_a_second_beat_on_a_home_waits_for_the_first(isolated_home, configure_env, processes):
    configure_env(LOG_LEVEL="INFO")
    first = processes.start("beat", name="beat-a")
    wait_for(lambda: beats(processes.everything()) == [first.pid], 60, "the first beat", processes.logs)
    second = processes.start("beat", name="beat-b")
    wait_for(lambda: "another beat runs" in processes.everything(), 60, "the second to wait", processes.logs)
    assert beats(processes.everything()) == [first.pid] and second.poll() is None
    os.killpg(first.pid, signal.SIGKILL)
    wait_for(lambda: beats(processes.everything()) == [first.pid, second.pid], 60, "the second beat", processes.logs)


def test_worker_beat_is_refused_with_the_embedded_broker(isolated_home):
    from tests.test_cli import run_cli

    out = run_cli("worker", "--queues", "maintenance", "--beat")
    said = " ".join((out.stdout + out.stderr).replace("│", " ").split())
    assert out.returncode != 0
    assert "run the beat as a process of its own (`agentloop beat`; `agentloop serve` starts one)" in said
    assert not (isolated_home / "agentloop.db").exists()  # refused before anything was done


def test_the_beat_of_a_worker_dies_with_it(production_keys, processes, configure_env):
    configure_env(LOG_LEVEL="INFO")
    worker = processes.start("worker", "--queues", "maintenance", "--beat")
    wait_for(lambda: beats(processes.everything()), 60, "the beat", processes.logs)
    (beat,) = beats(processes.everything())
    assert beat != worker.pid and alive(beat)
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: not alive(beat), 30, "the beat to stop with its worker", processes.logs)
