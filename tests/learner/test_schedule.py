"""Beat starts training on a period or once enough new client episodes exist; one run at a time."""

from datetime import timedelta

import sqlalchemy as sa

from agentloop.learner.schedule import maybe_start_training
from agentloop.settings import get_settings
from agentloop.store import episodes as episode_store
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, Task, Tenant, TrainingRun, utcnow


def add_episode(task_ref=None, feedback=None):
    with session_scope() as s:
        if s.get(Tenant, "t") is None:
            s.add(Tenant(id="t", name="t"))
            s.flush()
        task = Task(
            tenant_id="t", world="builtin", task_ref=task_ref, instruction="x", apps=[], options={}, request_hash="-"
        )
        s.add(task)
        s.flush()
        ep = Episode(
            task_id=task.id,
            world="builtin",
            task_ref=task_ref,
            instruction="x",
            policy="p",
            status="finished",
            prompt_token_ids=[1],
        )
        s.add(ep)
        s.flush()
        if feedback is not None:
            episode_store.add_reward(s, source="client", value=feedback, task_id=task.id, episode_id=ep.id)


def runs():
    with session_scope() as s:
        return [
            (r.trigger, r.status, r.config["tasks_per_iteration"])
            for r in s.scalars(sa.select(TrainingRun).order_by(TrainingRun.created_at))
        ]


def finish_all():
    with session_scope() as s:
        s.execute(sa.update(TrainingRun).values(status="finished"))


def test_enough_new_episodes_start_one_run(sqlite_db, configure_env):
    configure_env(TRAIN_MIN_NEW_EPISODES=3, TRAIN_CONFIG='{"tasks_per_iteration": 5}')
    add_episode("wallet_balance-1")
    add_episode(None)  # a free instruction without feedback: nothing to learn from
    add_episode(None, feedback=1.0)
    assert maybe_start_training(get_settings()) is None  # 2 usable so far
    add_episode("wallet_balance-2")
    run_id = maybe_start_training(get_settings())
    assert run_id is not None and runs() == [("schedule:episodes", "queued", 5)]
    add_episode("wallet_balance-3")
    add_episode("wallet_balance-3")
    add_episode("wallet_balance-3")
    assert maybe_start_training(get_settings()) is None  # one queued or running at a time
    finish_all()
    assert maybe_start_training(get_settings()) is not None  # those three arrived after the last run
    finish_all()
    assert maybe_start_training(get_settings()) is None and len(runs()) == 2  # nothing new since


def test_period_trigger(sqlite_db, configure_env):
    configure_env(TRAIN_EVERY_S=3600)
    first = maybe_start_training(get_settings())
    assert first is not None and runs()[0][0] == "schedule:period"
    finish_all()
    assert maybe_start_training(get_settings()) is None  # not an hour yet
    assert maybe_start_training(get_settings(), now=utcnow() + timedelta(seconds=3601)) is not None


def test_both_triggers_off_by_default(sqlite_db):
    for _ in range(50):
        add_episode("wallet_balance-1")
    assert maybe_start_training(get_settings()) is None and runs() == []
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Episode)) == 50
