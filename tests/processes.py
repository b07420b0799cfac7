"""Real agentloop processes (serve, worker, beat) for end-to-end tests, and waiting helpers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentloop.store.db import get_sessionmaker
from agentloop.store.models import Task, TaskStatus


class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, name: str = "worker") -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentloop.cli", *args],
            env=os.environ.copy(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        """The end of each process's log (for failure messages)."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.log_dir.glob("*.log")))

    def everything(self) -> str:
        """Every line the processes wrote, to search in (`logs` keeps the end of each file only)."""
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob("*.log")))

    def stop_all(self) -> None:
        """The test is over: each process group is killed at once (a graceful stop would wait for a worker's
        running episode to end, which is what no test measures here: seconds of every test's teardown)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):  # the group: children its leader left behind too
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


def wait_for(predicate: Callable[[], object], timeout: float, what: str, logs: Callable[[], str] = str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs()}")


def task_row(task_id: str) -> Task:
    with get_sessionmaker()() as s:
        task = s.get(Task, task_id)
        assert task is not None
        s.expunge(task)
        return task


def ended(task_id: str) -> Task | None:
    task = task_row(task_id)
    return task if task.status in TaskStatus.TERMINAL else None
