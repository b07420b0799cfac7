"""An external app that goes down, restarts or misbehaves at reset and evaluation: the episode is an error
with the reason, never a zero reward, and the task gets a new attempt that succeeds once the app is back.
Also: agentloop_release once per episode, a 503 at submission, `agentloop eval --app` with the app down,
and free instructions on an app that is an environment. The app is a real process, killed and restarted
(tests/apps/loopback_app.py); episodes run in this process (the runner a worker calls); a real worker
process meets an outage in tests/worker/test_app_outage_worker.py."""

import asyncio
import os
import subprocess
import sys

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.agent.actions import render_action
from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import external_tasks
from agentloop.agent.evaluate import run_eval, summarize
from agentloop.agent.runner import run_served_task
from agentloop.api.app import create_app
from agentloop.api.auth import create_key
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.external import ExternalApp
from agentloop.apps.tasks import ToolCall
from agentloop.policy.scripted import ScriptedPolicy
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import App, Episode, Reward, Step, Task
from tests.apps.loopback_app import API_KEY, LOOPBACK_NETWORKS, LoopbackProcess
from tests.factories import bearer, make_keys
from tests.grpc.conftest import ServerThread, auth

SOLVE_ADD_TWO = [ToolCall("todolite", "add_item", {"name": n}) for n in ("bread", "milk")]
RETRY_AFTER_S = 7


@pytest.fixture
def fast_retries(sqlite_db, configure_env):
    configure_env(
        APP_CONTROL_ATTEMPTS=3,
        APP_CONTROL_BACKOFF_S=0.05,
        APP_RETRY_AFTER_S=RETRY_AFTER_S,
        APP_SUBMIT_TIMEOUT_S=1,
        APP_RELEASE_TIMEOUT_S=1,
    )


@pytest.fixture
def todo():
    app = LoopbackProcess()
    app.start()
    yield app
    app.stop()


@pytest.fixture
def api(fast_retries):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), bearer(keys.operator)


def register(client, headers, app: LoopbackProcess, environment: bool = True) -> None:
    doc = app.document
    if not environment:  # the same app without the agentloop_* operations
        paths = {p: item for p, item in doc["paths"].items() if not p.startswith("/agentloop/")}
        doc = {**doc, "paths": paths}
    body = {
        "name": "todolite",
        "description": "A to-do list.",
        "openapi": doc,
        "base_url": app.base_url,
        "auth_header": {"name": "X-Api-Key", "value": API_KEY},
        "allowed_networks": LOOPBACK_NETWORKS,
    }
    resp = client.post("/v1/apps", json=body, headers=headers)
    assert resp.status_code == 201, resp.text


def submit(client, headers, task_ref: str = "todolite:add-two") -> str:
    resp = client.post("/v1/tasks", json={"task_ref": task_ref}, headers=headers)
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def task_row(task_id: str) -> Task:
    with get_sessionmaker()() as s:
        task = s.get(Task, task_id)
        s.expunge(task)
        return task


def episodes_of(task_id: str) -> list[tuple[int, str, str | None, str | None]]:
    with get_sessionmaker()() as s:
        rows = s.scalars(sa.select(Episode).where(Episode.task_id == task_id).order_by(Episode.attempt)).all()
        return [(e.attempt, e.status, e.finish_reason, e.error) for e in rows]


def rewards_of(task_id: str) -> list[Reward]:
    with get_sessionmaker()() as s:
        rows = s.scalars(sa.select(Reward).where(Reward.task_id == task_id)).all()
        s.expunge_all()
        return list(rows)


def observations(task_id: str, attempt: int) -> list[str]:
    with get_sessionmaker()() as s:
        return list(
            s.scalars(
                sa.select(Step.observation)
                .join(Episode, Episode.id == Step.episode_id)
                .where(Episode.task_id == task_id, Episode.attempt == attempt)
                .order_by(Step.index)
            )
        )


class OutageAt(ScriptedPolicy):
    """Replays its plan, and runs `outage` once, just before it samples turn `turn` of the first episode."""

    def __init__(self, tokenizer, turn: int, outage) -> None:
        super().__init__(tokenizer)
        self.turn, self.outage, self.sampled = turn, outage, 0

    def generate(self, requests):
        if self.sampled == self.turn:
            self.outage()
        self.sampled += 1
        return super().generate(requests)


def plan(policy: ScriptedPolicy, key: str, calls: list[ToolCall]) -> None:
    policy.plan(key, [render_action(c) for c in calls])


@pytest.mark.parametrize("outage", ["down", "restarted"])
def test_an_app_lost_mid_episode_makes_an_error_and_a_new_attempt_succeeds(api, todo, tokenizer, outage):
    """Down: the agent's call and the evaluation cannot reach the app. Restarted: the app forgot the
    episode, so both get 404 unknown episode. Either way no reward is recorded for attempt 1; attempt 2,
    reset afresh, is scored by the app."""
    client, admin = api
    register(client, admin, todo)
    task_id = submit(client, admin)

    def lose_the_app() -> None:
        todo.stop()
        if outage == "restarted":
            todo.start()

    policy = OutageAt(tokenizer, turn=1, outage=lose_the_app)
    plan(policy, task_id, SOLVE_ADD_TWO)
    assert run_served_task(task_id, "w1", policy, get_settings()) == "retrying"

    seen = "could not reach the app" if outage == "down" else "the app answered 404: unknown episode"
    assert seen in observations(task_id, 1)[1]  # the agent's own call: an observation, the episode went on
    task = task_row(task_id)
    assert (task.status, task.attempts, task.reward, task.success) == ("queued", 1, None, None)
    assert "attempt 1 was not evaluated" in task.error and "agentloop_evaluate" in task.error
    assert ("could not reach the app" if outage == "down" else "may have restarted") in task.error
    assert f"retrying as attempt 2 in {RETRY_AFTER_S} s" in task.error
    ((attempt, status, finish_reason, error),) = episodes_of(task_id)
    assert (attempt, status, finish_reason) == (1, "failed", "completed") and error in task.error
    assert rewards_of(task_id) == []  # no zero reward, or any other

    if outage == "down":
        todo.start()
    plan(policy, task_id, SOLVE_ADD_TWO)
    assert run_served_task(task_id, "w2", policy, get_settings()) == "finished"
    task = task_row(task_id)
    assert (task.status, task.attempts, task.reward, task.success, task.error) == ("finished", 2, 1.0, True, None)
    assert [e[:2] for e in episodes_of(task_id)] == [(1, "failed"), (2, "finished")]
    (reward,) = rewards_of(task_id)
    assert reward.value == 1.0

    calls = todo.calls()  # of the process now up: it saw attempt 2 (and, restarted, attempt 1's end)
    second = calls["evaluations"][-1][1]
    if outage == "down":
        assert calls["releases"] == [second]  # attempt 1's release could not reach the app; it is not retried
    else:
        first = calls["headers_seen"][0]  # attempt 1's add_item for milk, answered 404
        assert first != second and calls["releases"] == [first, second]


@pytest.mark.parametrize(
    ("faults", "outcome", "resets", "needle"),
    [
        ([503, 503], "finished", 3, None),  # two 5xx, then the third try resets it
        ([503, 503, 503], "failed", 3, "agentloop_reset: the app answered 503"),  # every try: the task fails
        ([409], "failed", 1, "agentloop_reset: the app answered 409"),  # a 4xx is not tried again
    ],
)
def test_a_reset_outage_is_tried_again_with_backoff_a_refusal_is_not(
    api, todo, tokenizer, faults, outcome, resets, needle
):
    client, admin = api
    register(client, admin, todo)
    task_id = submit(client, admin)
    todo.fail_next("reset", *faults)
    policy = ScriptedPolicy(tokenizer)
    plan(policy, task_id, SOLVE_ADD_TWO)
    assert run_served_task(task_id, "w", policy, get_settings()) == outcome
    calls = todo.calls()
    assert len(calls["injected"]) + len(calls["resets"]) == resets
    task = task_row(task_id)
    if outcome == "failed":
        assert task.status == "failed" and task.error.startswith("could not start the episode: app 'todolite'")
        assert needle in task.error and (" (3 tries)" in task.error) == (len(faults) == 3)
        assert episodes_of(task_id) == [] and rewards_of(task_id) == []
    else:
        assert (task.status, task.reward) == ("finished", 1.0)


def test_an_app_down_through_the_whole_reset_fails_the_task_with_the_reason(api, todo, tokenizer):
    client, admin = api
    register(client, admin, todo)
    task_id = submit(client, admin)
    todo.stop()
    policy = ScriptedPolicy(tokenizer)
    plan(policy, task_id, SOLVE_ADD_TWO)
    assert run_served_task(task_id, "w", policy, get_settings()) == "failed"
    task = task_row(task_id)
    assert task.status == "failed" and "agentloop_reset: could not reach the app at 127.0.0.1:" in task.error
    assert "(3 tries)" in task.error
    assert episodes_of(task_id) == [] and rewards_of(task_id) == []


@pytest.mark.parametrize(
    ("faults", "max_attempts", "needle"),
    [
        ([503, 503, 503], 1, "the app answered 503"),  # an outage on the last attempt: the task gives up
        ([422], 3, "the app answered 422"),  # a refusal is not an outage: no new attempt would change it
    ],
)
def test_an_evaluation_that_fails_for_good_fails_the_task_without_a_reward(
    api, todo, tokenizer, configure_env, faults, max_attempts, needle
):
    configure_env(MAX_ATTEMPTS=max_attempts)
    client, admin = api
    register(client, admin, todo)
    task_id = submit(client, admin)
    todo.fail_next("evaluate", *faults)
    policy = ScriptedPolicy(tokenizer)
    plan(policy, task_id, SOLVE_ADD_TWO)
    assert run_served_task(task_id, "w", policy, get_settings()) == "failed"
    task = task_row(task_id)
    assert task.status == "failed" and task.reward is None and needle in task.error
    assert ("gave up after 1 attempts" in task.error) == (max_attempts == 1)
    assert len(todo.calls()["injected"]) == len(faults)  # an outage was tried again, a refusal was not
    assert [e[:2] for e in episodes_of(task_id)] == [(1, "failed")]
    assert rewards_of(task_id) == []


def test_release_follows_an_episode_that_crashed(api, todo, tokenizer):
    client, admin = api
    register(client, admin, todo)
    task_id = submit(client, admin)

    def crash() -> None:
        raise RuntimeError("the policy fell over")

    policy = OutageAt(tokenizer, turn=1, outage=crash)
    plan(policy, task_id, SOLVE_ADD_TWO)
    assert run_served_task(task_id, "w", policy, get_settings()) == "failed"
    assert "episode failed: RuntimeError" in task_row(task_id).error
    calls = todo.calls()
    assert calls["releases"] == calls["headers_seen"][:1]  # the episode the first call ran in, released once


def test_eval_runs_leave_unevaluated_episodes_out_and_release_each_episode(fast_retries, todo, tokenizer):
    app = ExternalApp.build(
        "todolite",
        "",
        todo.document,
        todo.base_url,
        allowed_networks=LOOPBACK_NETWORKS,
        auth_header=("X-Api-Key", API_KEY),
    )
    tasks = external_tasks(app, lambda: BUILTIN.new_world(0, []), ["add-apple"])
    policy = ScriptedPolicy(tokenizer)
    for rep in range(2):
        plan(policy, f"add-apple#{rep}", [ToolCall("todolite", "add_item", {"name": "apple"})])
    todo.fail_next("evaluate", 503, 503, 503)  # the first episode's every try
    results = run_eval(policy, tasks, k=2, limits=Limits(max_turns=3), batch_size=2)
    assert [r.error is not None for r in results] == [True, False]
    assert "agentloop_evaluate: the app answered 503" in results[0].error and results[0].verdict is None
    with pytest.raises(ValueError, match="was not evaluated"):
        _ = results[0].reward  # no reward at all, rather than a zero
    summary = summarize(results)
    assert (summary["episodes"], summary["errors"], summary["tgc"], summary["mean_reward"]) == (1, 1, 100.0, 1.0)
    calls = todo.calls()
    assert sorted(calls["releases"]) == sorted(calls["headers_seen"]) and len(set(calls["releases"])) == 2


def test_submitting_a_task_of_an_app_that_is_down_is_503_with_retry_after(api, todo):
    """REST 503 + Retry-After, gRPC UNAVAILABLE + retry-after; nothing stored; accepted once the app is up."""
    client, admin = api
    register(client, admin, todo)
    todo.stop()
    resp = client.post("/v1/tasks", json={"task_ref": "todolite:add-two"}, headers=admin)
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"] == str(RETRY_AFTER_S)
    message = resp.json()["error"]["message"]
    assert "app 'todolite' cannot be reached, so the task was not queued" in message and "127.0.0.1" in message
    with session_scope() as s:
        _, key = create_key(s, "tenant-a", "client")
    server = ServerThread()  # gRPC: UNAVAILABLE, with the same wait as trailing metadata

    async def submit_over_grpc() -> grpc.aio.AioRpcError:
        async with server.connect() as c:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await c.agent.SubmitTask(pb.SubmitTaskRequest(task_ref="todolite:add-two"), metadata=auth(key))
            return info.value

    try:
        error = asyncio.run(submit_over_grpc())
    finally:
        server.close()
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "cannot be reached" in error.details()
    assert dict(error.trailing_metadata())["retry-after"] == str(RETRY_AFTER_S)
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Task)) == 0
    todo.start()
    assert client.post("/v1/tasks", json={"task_ref": "todolite:add-two"}, headers=admin).status_code == 202


def test_a_free_instruction_cannot_use_an_app_that_is_an_environment(api, todo, tokenizer):
    client, admin = api
    register(client, admin, todo)
    free = {"instruction": "List my items.", "apps": ["todolite", "notes"]}
    resp = client.post("/v1/tasks", json=free, headers=admin)
    assert resp.status_code == 422
    assert "is an environment" in resp.json()["error"]["message"]
    assert "task_ref 'todolite:<task>'" in resp.json()["error"]["message"]

    # a task queued before that rule fails at its start, with the same reason, and never calls the app
    with session_scope() as s:
        tenant_id = s.scalars(sa.select(App.tenant_id)).one()
        task = Task(
            tenant_id=tenant_id,
            world="builtin",
            instruction="List my items.",
            apps=["todolite"],
            options={},
            request_hash="h",
        )
        s.add(task)
        s.flush()
        task_id = task.id
    policy = ScriptedPolicy(tokenizer)
    plan(policy, task_id, [ToolCall("todolite", "list_items", {})])
    assert run_served_task(task_id, "w", policy, get_settings()) == "failed"
    assert "is an environment" in task_row(task_id).error and todo.calls()["headers_seen"] == []

    # registered without the agentloop_* operations it is a plain app, which a free instruction may use
    assert client.delete("/v1/apps/todolite", headers=admin).status_code == 204
    register(client, admin, todo, environment=False)
    resp = client.post("/v1/tasks", json=free, headers=admin)
    assert resp.status_code == 202 and resp.json()["apps"] == ["todolite", "notes"]


def test_eval_command_with_the_app_down_prints_one_line_and_exits_non_zero(api, todo):
    client, admin = api
    register(client, admin, todo)
    todo.stop()
    done = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "eval", "--app", "todolite", "--policy", "random"],
        env={**os.environ, "AGENTLOOP_LOG_LEVEL": "WARNING"},  # the migration's INFO lines are not the point
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("agentloop eval: app 'todolite': agentloop_tasks: could not reach the app at 127.0.0.1:")
    assert lines[0].endswith("Connection refused); start it (or check its base_url) and run again")
