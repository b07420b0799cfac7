"""Data functions against SQLite and PostgreSQL: leases, sweeps, steps."""

import threading
from datetime import timedelta

from agentloop.agent.episode import Turn
from agentloop.api.auth import get_or_create_tenant
from agentloop.settings import get_settings
from agentloop.store import episodes as episode_store
from agentloop.store import tasks as task_store
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import Episode, Task, TaskStatus, utcnow
from agentloop.worker.dispatch import sweep


def new_task(**overrides) -> str:
    with session_scope() as s:
        tenant = get_or_create_tenant(s, "t")
        task = Task(
            tenant_id=tenant.id,
            world="builtin",
            task_ref="wallet_balance-1",
            instruction="x",
            apps=["wallet"],
            options={},
            request_hash="h",
            **overrides,
        )
        s.add(task)
        s.flush()
        return task.id


def test_only_one_of_many_concurrent_claims_wins(db_url):
    task_id = new_task()
    winners = []
    barrier = threading.Barrier(6)

    def claim(i):
        barrier.wait()
        with session_scope() as s:
            if task_store.claim_task(s, task_id, f"w{i}", 30) is not None:
                winners.append(i)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    with session_scope() as s:
        task = task_store.get_task(s, task_id)
        assert task.status == TaskStatus.RUNNING and task.attempts == 1
        assert task.lease_owner == f"w{winners[0]}"
        assert task.lease_expires_at > utcnow()


def test_renew_reports_cancel_and_lost_lease(db_url):
    task_id = new_task()
    with session_scope() as s:
        assert task_store.claim_task(s, task_id, "me", 30)
    with session_scope() as s:
        assert task_store.renew_lease(s, task_id, "me", 30) == (True, False)
        assert task_store.renew_lease(s, task_id, "someone-else", 30) == (False, False)
        s.get(Task, task_id).cancel_requested = True
    with session_scope() as s:
        assert task_store.renew_lease(s, task_id, "me", 30) == (True, True)


def test_expired_lease_can_be_claimed_again(db_url):
    task_id = new_task()
    with session_scope() as s:
        task_store.claim_task(s, task_id, "dead", 30)
    with session_scope() as s:
        assert task_store.claim_task(s, task_id, "other", 30) is None  # lease still valid
        s.get(Task, task_id).lease_expires_at = utcnow() - timedelta(seconds=1)
    with session_scope() as s:
        task = task_store.claim_task(s, task_id, "other", 30)
        assert task is not None and task.attempts == 2


def test_sweep_requeues_lost_tasks_then_gives_up(db_url, configure_env):
    configure_env(MAX_ATTEMPTS=2)
    task_id = new_task()
    for attempt in (1, 2):
        with session_scope() as s:
            assert task_store.claim_task(s, task_id, f"w{attempt}", 30)
            s.add(
                Episode(
                    task_id=task_id, attempt=attempt, world="builtin", instruction="x", policy="p", prompt_token_ids=[1]
                )
            )
        with session_scope() as s:
            s.get(Task, task_id).lease_expires_at = utcnow() - timedelta(seconds=1)
        result = sweep(get_settings())
        with session_scope() as s:
            task = s.get(Task, task_id)
            episodes = s.query(Episode).filter_by(task_id=task_id).all()
            assert all(e.status == "abandoned" and e.finish_reason == "worker_lost" for e in episodes)
            if attempt == 1:
                assert result["requeued"] == 1 and task.status == TaskStatus.QUEUED
                assert "re-dispatched" in task.error and task.lease_owner is None
            else:
                assert result["failed"] == 1 and task.status == TaskStatus.FAILED
                assert "gave up after 2 attempts" in task.error and task.finished_at is not None


def test_sweep_ends_a_lost_task_whose_cancel_was_asked_for_as_cancelled(db_url):
    task_id = new_task()
    with session_scope() as s:
        assert task_store.claim_task(s, task_id, "w1", 30)
        task = s.get(Task, task_id)
        task.cancel_requested = True
        task.lease_expires_at = utcnow() - timedelta(seconds=1)
    result = sweep(get_settings())
    assert result["cancelled"] == 1 and result["requeued"] == 0
    with session_scope() as s:
        task = s.get(Task, task_id)
        assert task.status == TaskStatus.CANCELLED and task.finished_at is not None
        assert "worker was lost" in task.error and task.lease_owner is None
    assert sweep(get_settings())["cancelled"] == 0  # ended once


def test_sweep_republishes_queued_tasks_whose_message_was_lost(db_url):
    old = utcnow() - timedelta(hours=1)
    never_sent = new_task(created_at=old)
    sent_long_ago = new_task(created_at=old, dispatched_at=old)
    fresh = new_task()
    result = sweep(get_settings())
    assert result["republished"] == 2
    with session_scope() as s:
        assert s.get(Task, never_sent).dispatched_at > old
        assert s.get(Task, sent_long_ago).dispatched_at > old
        assert s.get(Task, fresh).dispatched_at is None


def turn(**fields) -> Turn:
    """One agent turn as the episode loop hands it to the store; `fields` override the defaults."""
    defaults = dict(
        index=0,
        prompt_token_count=5,
        output_token_ids=[10, 20, 2],
        output_logprobs=[-1.0, -2.0, -3.0],
        output_text="hi",
        finish_reason="stop",
        action={"app": "a", "api": "b", "args": {"k": [1]}},
        observation="obs",
        observation_token_ids=[7, 8],
        error_kind=None,
        n_actions=1,
        gen_s=0.5,
        env_s=0.1,
    )
    return Turn(**{**defaults, **fields})


def stored_episode(step: Turn) -> str:
    """A new episode holding `step`, committed; its id."""
    task_id = new_task()
    with session_scope() as s:
        ep = Episode(task_id=task_id, world="builtin", instruction="x", policy="p", prompt_token_ids=[1, 2, 3, 4, 5])
        s.add(ep)
        s.flush()
        episode_store.add_step(s, ep.id, step)
        return ep.id


def test_steps_keep_exact_token_ids_and_logprobs(db_url):
    logprobs = [-0.123456789012345, -1e-9, -17.25]
    ep_id = stored_episode(turn(output_logprobs=logprobs))
    with get_sessionmaker()() as s:
        (step,) = episode_store.steps_of(s, ep_id)
        assert step.output_token_ids == [10, 20, 2]
        assert step.output_logprobs == logprobs  # floats survive exactly
        assert step.action == {"app": "a", "api": "b", "args": {"k": [1]}}
        episode = s.get(Episode, ep_id)
        assert (episode.num_steps, episode.tokens_generated) == (1, 3)
        assert episode.created_at.tzinfo is not None


def test_a_step_whose_text_holds_nul_is_stored(db_url):
    """A model can write any byte, NUL too, which PostgreSQL's text and jsonb refuse: the episode must not
    fail on it. NUL is stored as U+FFFD (the token ids are exact anyway)."""
    ep_id = stored_episode(
        turn(
            output_token_ids=[10, 0, 2],
            output_text="rpm\x00 super",
            finish_reason="length",
            action={"app": "a", "api": "b", "args": {"k\x00": ["v\x00", 1]}},
            observation="Error: no tool call in 'rpm\x00 super'",
            error_kind="parse_error",
            n_actions=0,
        )
    )
    with get_sessionmaker()() as s:
        (step,) = episode_store.steps_of(s, ep_id)
        assert step.output_text == "rpm\ufffd super"
        assert step.observation == "Error: no tool call in 'rpm\ufffd super'"
        assert step.action == {"app": "a", "api": "b", "args": {"k\ufffd": ["v\ufffd", 1]}}
        assert step.output_token_ids == [10, 0, 2]


def test_finish_task_only_while_holding_the_lease(db_url):
    task_id = new_task()
    with session_scope() as s:
        task_store.claim_task(s, task_id, "me", 30)
    with session_scope() as s:
        assert not task_store.finish_task(s, task_id, "impostor", TaskStatus.FINISHED)
        assert task_store.finish_task(s, task_id, "me", TaskStatus.FINISHED, reward=0.5, success=False)
        assert not task_store.finish_task(s, task_id, "me", TaskStatus.FAILED)  # already ended
    with session_scope() as s:
        task = s.get(Task, task_id)
        assert (task.status, task.reward, task.lease_owner) == (TaskStatus.FINISHED, 0.5, None)
