"""The Python client in docs/grpc.md, run as written against a live server while a worker runs the
task (the expert policy, so the episode succeeds)."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import sqlalchemy as sa

from agentloop.agent.runner import run_served_task
from agentloop.policy.scripted import oracle_policy, plan_oracle
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import Task, TaskStatus

ROOT = Path(__file__).resolve().parents[2]


def documented_client() -> str:
    text = (ROOT / "docs" / "grpc.md").read_text()
    block = text.split("<!-- grpc:client -->")[1].split("<!-- /grpc:client -->")[0]
    return block.split("```python\n", 1)[1].rsplit("```", 1)[0]


def run_queued_tasks(stop: threading.Event, tokenizer) -> None:
    """A worker's loop, in a thread: claim each queued task and run it with the oracle."""
    policy = oracle_policy(tokenizer)
    while not stop.is_set():
        with get_sessionmaker()() as s:
            queued = s.execute(sa.select(Task.id, Task.task_ref).where(Task.status == TaskStatus.QUEUED)).all()
        for task_id, task_ref in queued:
            plan_oracle(policy, task_id, task_ref)
            run_served_task(task_id, "docs-worker", policy, get_settings())
        stop.wait(0.05)


def test_the_documented_client_submits_and_streams_a_task(api, tokenizer, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(documented_client())
    stop = threading.Event()
    worker = threading.Thread(target=run_queued_tasks, args=(stop, tokenizer), daemon=True)
    worker.start()
    try:
        env = {
            **os.environ,
            "AGENTLOOP_GRPC_TARGET": api.server.target,
            "AGENTLOOP_API_KEY": api.keys.tenant_a_client,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        worker.join(30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("task ") and lines[0].endswith("TASK_STATUS_QUEUED")
    steps = [line for line in lines if line.startswith("step ")]
    assert steps[0].startswith("step 0: supervisor.show_account_passwords")  # the expert's first call
    assert any(": wallet.show_balance ->" in s for s in steps)
    assert [int(s.split()[1].rstrip(":")) for s in steps] == list(range(len(steps)))
    assert lines[-1] == "result TASK_STATUS_FINISHED reward 1.0"
