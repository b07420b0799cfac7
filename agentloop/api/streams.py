"""Following a task's steps and a training run's progress as they are stored: the one waiting loop
behind the SSE route and the gRPC streams.

The database holds the facts; a notice (`events.Waiter`) only says when to look again. Every read
runs in a worker thread (the event loop never waits on the database) and is authorised afresh with
the caller's principal, as a REST request would be. The key that opened a stream is checked again
(`KeyWatch`) before each batch of events and while it waits: a revoked or expired key ends the stream
with Unauthenticated at its next event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session

from agentloop import events
from agentloop.api import auth, service
from agentloop.api.auth import Principal
from agentloop.api.errors import DeadlineExceeded
from agentloop.api.schemas import StepPublic, TaskPublic, TrainingRunPublic
from agentloop.settings import get_settings
from agentloop.store import episodes as episode_store
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import TaskStatus, TrainingRunStatus

NOTICE_WAIT_S = 1.0  # with pub/sub a notice wakes the reader; look anyway this often (a notice can be lost)
TRAINING_POLL_S = 1.0  # without pub/sub: training progress moves in seconds, not milliseconds
KEY_RECHECK_S = 1.0  # a waiting stream checks its key this often (one that is sending: before each batch)


class KeyWatch:
    """Whether the key that opened a stream still holds. Its caller was authenticated just before, so the
    first check is due before the first event or after KEY_RECHECK_S. A principal without a key (a command
    run on the deployment) is never checked."""

    def __init__(self, principal: Principal) -> None:
        self.key_id = principal.key_id
        self.checked_at = time.monotonic()

    def due(self, sending: bool) -> bool:
        return bool(self.key_id) and (sending or time.monotonic() - self.checked_at >= KEY_RECHECK_S)

    def check(self, session: Session) -> None:
        """Unauthenticated when the key was revoked or expired."""
        auth.check_key(session, self.key_id)
        self.checked_at = time.monotonic()

    def check_now(self) -> None:
        with get_sessionmaker()() as session:
            self.check(session)


@dataclass(frozen=True)
class Position:
    """Where a reader of a task's stream is: the last step `index` it saw of `attempt`.
    Attempt 0: not following an attempt yet; it starts with the latest one, after `index`."""

    attempt: int = 0
    index: int = -1


@dataclass(frozen=True)
class TaskEvent:
    """`attempt` (an attempt started), `step`, or `result` (the task ended; always the last)."""

    kind: Literal["attempt", "step", "result"]
    position: Position
    step: StepPublic | None = None
    task: TaskPublic | None = None


def check_task_access(principal: Principal, task_id: str) -> None:
    """NotFound unless the caller may read the task (before a stream's first byte is sent)."""
    with get_sessionmaker()() as session:
        service.get_task(session, principal, task_id)


def read_task_progress(
    principal: Principal, task_id: str, position: Position, key: KeyWatch | None = None
) -> tuple[list[TaskEvent], bool]:
    """Events after `position`, ending with `result` when the task has ended (then the stream is
    over). The task's status is read before its steps: a task seen ended has all its steps committed.
    With `key`: Unauthenticated instead of events when the key no longer holds (checked when `key` is due)."""
    with get_sessionmaker()() as session:
        task = service.get_task(session, principal, task_id)
        finished = task.status in TaskStatus.TERMINAL
        episode = episode_store.latest_episode(session, task_id)
        out: list[TaskEvent] = []
        if episode is not None:
            if episode.attempt > position.attempt:
                # a new attempt starts from its first step; a reader that named no attempt keeps its index
                position = Position(episode.attempt, position.index if position.attempt == 0 else -1)
                out.append(TaskEvent("attempt", position))
            if episode.attempt == position.attempt:
                for step in episode_store.steps_of(session, episode.id, position.index):
                    position = Position(position.attempt, step.index)
                    out.append(TaskEvent("step", position, step=service.step_public(step, position.attempt)))
        if finished:
            out.append(TaskEvent("result", position, task=service.task_public(task)))
        if key is not None and key.due(sending=bool(out)):
            key.check(session)
        return out, finished


def _time_left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the call's deadline passed before the stream ended; call again to resume")
    return left


def _wait_s(period: float, deadline: float | None) -> float:
    left = _time_left(deadline)
    return period if left is None else min(period, left)


async def follow_task(
    principal: Principal,
    task_id: str,
    position: Position = Position(),
    *,
    deadline: float | None = None,
    stopped: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[TaskEvent]:
    """The task's events from `position` on, as they are stored, until its `result`.

    `deadline` (time.monotonic()) raises DeadlineExceeded before any read after it; `stopped`
    (e.g. "the client went away") ends the stream quietly."""
    poll = get_settings().events_poll_interval_s
    key = KeyWatch(principal)
    async with events.Waiter(events.task_channel(task_id)) as waiter:
        while True:
            _time_left(deadline)
            chunk, finished = await asyncio.to_thread(read_task_progress, principal, task_id, position, key)
            for event in chunk:
                position = event.position
                yield event
            if finished:
                return
            if stopped is not None and await stopped():
                return
            await waiter.wait(_wait_s(NOTICE_WAIT_S if waiter.subscribed else poll, deadline))


def read_training_run(principal: Principal, run_id: str) -> TrainingRunPublic:
    with get_sessionmaker()() as session:
        return service.training_run_public(service.get_training_run(session, principal, run_id))


async def follow_training_run(
    principal: Principal, run_id: str, *, deadline: float | None = None
) -> AsyncIterator[TrainingRunPublic]:
    """The run now, then each time it changes, until it reaches a final status (Unauthenticated once the key
    no longer holds)."""
    last: TrainingRunPublic | None = None
    key = KeyWatch(principal)
    async with events.Waiter(events.run_channel(run_id)) as waiter:
        while True:
            _time_left(deadline)
            run = await asyncio.to_thread(read_training_run, principal, run_id)
            if key.due(sending=run != last):
                await asyncio.to_thread(key.check_now)
            if run != last:
                last = run
                yield run
            if run.status in TrainingRunStatus.TERMINAL:
                return
            await waiter.wait(_wait_s(NOTICE_WAIT_S if waiter.subscribed else TRAINING_POLL_S, deadline))
