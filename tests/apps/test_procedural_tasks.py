"""Procedural tasks: a train scenario set up on a fresh seed, named `<scenario>@<seed>`, is a task ref like
a fixed one (same ref, same task), served through the API and drawn for training by `TaskSource.fresh`."""

import random
import zlib

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import agentloop.apps.builtin as builtin
from agentloop.agent.runner import run_served_task
from agentloop.api.app import create_app
from agentloop.apps import registry
from agentloop.apps.builtin import BUILTIN, BuiltinWorld
from agentloop.apps.digest import task_fingerprint
from agentloop.apps.tasks import SEED_LIMIT, SPLITS, ScenarioSetupError, procedural_ref, run_oracle
from agentloop.learner.task_source import TaskSource, TaskSourceError, rollout_task
from agentloop.policy.scripted import oracle_policy, plan_oracle
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import Task, TaskStatus
from tests.apps.toy_world_plugin import ToyWorld
from tests.factories import bearer, make_keys

TRAIN = BUILTIN.procedural_scenarios()
HELD_OUT = {split: next(s.id for s in BUILTIN.scenarios if s.split == split) for split in SPLITS if split != "train"}


def fresh_seed(scenario: str) -> int:
    """A seed per scenario far from the pooled worlds (0..23) fixed tasks use, the same on every run."""
    return zlib.crc32(f"procedural:{scenario}".encode()) % SEED_LIMIT


def test_train_scenarios_are_the_procedural_ones_and_no_listing_grows():
    assert [s.id for s in BUILTIN.scenarios if s.split == "train"] == TRAIN and len(TRAIN) >= 40
    assert all("@" not in tid for tid in BUILTIN.task_ids())
    assert len(BUILTIN.task_ids("train")) == sum(s.variants for s in BUILTIN.scenarios if s.split == "train")


@pytest.mark.parametrize("ref", ["notes_count_tag@1234", "wallet_send_money@7", f"shop_add_to_cart@{SEED_LIMIT - 1}"])
def test_the_same_ref_is_the_same_task_in_another_provider(ref):
    """Instruction, initial state, expected outcome and the oracle's run: a pure function of the ref, not
    of what this process cached (a second provider builds it again)."""
    first, again = task_fingerprint(BUILTIN, BUILTIN.task(ref)), task_fingerprint(BUILTIN, BUILTIN.task(ref))
    other = BuiltinWorld()
    rebuilt = task_fingerprint(other, other.task(ref))
    assert first == again == rebuilt
    assert first["task"] == ref and first["verdict"]["success"] and first["oracle_actions"]


def test_other_seeds_are_other_tasks():
    states = {task_fingerprint(BUILTIN, BUILTIN.task(f"contacts_phone_of@{seed}"))["initial_state"] for seed in (1, 2)}
    assert len(states) == 2


@pytest.mark.parametrize("scenario", TRAIN)
def test_the_oracle_solves_every_train_scenario_on_a_fresh_seed(scenario):
    ref = procedural_ref(scenario, fresh_seed(scenario))
    task = BUILTIN.task(ref)
    assert (task.id, task.scenario_id, task.split) == (ref, scenario, "train")
    world = BUILTIN.task_world(ref)
    before = world.copy_state()
    assert not task.evaluator.evaluate(before, world.state, None).success, "doing nothing passes"
    run_oracle(task, world)
    verdict = task.evaluator.evaluate(before, world.state, world.answer)
    assert verdict.success, verdict.to_dict()
    assert BUILTIN.task_world(ref).copy_state() == before  # the run changed its own world only


def test_fresh_seeds_span_every_train_scenario_on_distinct_worlds():
    seeds = {fresh_seed(s) for s in TRAIN}
    assert len(seeds) == len(TRAIN) and min(seeds) >= builtin.WORLD_POOL


@pytest.mark.parametrize("split", sorted(HELD_OUT))
def test_dev_and_test_scenarios_take_no_seed(split):
    scenario = HELD_OUT[split]
    with pytest.raises(KeyError, match=rf"{scenario!r} is a {split} scenario: only train scenarios"):
        BUILTIN.task(f"{scenario}@5")
    with pytest.raises(KeyError, match="only train scenarios"):
        BUILTIN.task_world(f"{scenario}@5")


@pytest.mark.parametrize(
    "seed", ["-1", "01", "+1", " 1", "1.0", "1_000", "", "x", "\u0661", str(SEED_LIMIT), str(2**64)]
)
def test_a_bad_seed_is_refused_with_what_a_seed_is(seed):
    with pytest.raises(KeyError, match=rf"bad seed .* whole number from 0 to {SEED_LIMIT - 1}"):
        BUILTIN.task(f"notes_count_tag@{seed}")


@pytest.mark.parametrize("ref", ["no_such_scenario@3", "@3", "notes_count_tag-1@3"])
def test_an_unknown_scenario_is_refused(ref):
    with pytest.raises(KeyError, match="no built-in scenario"):
        BUILTIN.task(ref)


def test_built_instances_are_kept_in_a_bounded_cache(monkeypatch):
    monkeypatch.setattr(builtin, "PROCEDURAL_CACHE", 2)
    provider = BuiltinWorld()
    refs = [f"notes_count_tag@{seed}" for seed in (11, 12, 13)]
    instructions = [provider.task(ref).instruction for ref in refs]
    assert provider._procedural.cache_info().currsize == 2
    assert provider.task(refs[0]).instruction == instructions[0]  # dropped, then built again the same


# --- served ---------------------------------------------------------------------------------


@pytest.fixture
def env(sqlite_db):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


def post_task(client, key, ref):
    return client.post("/v1/tasks", json={"task_ref": ref}, headers=bearer(key))


def count_tasks() -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Task))


def test_a_served_procedural_task_runs_and_is_evaluated(env, tokenizer):
    client, keys = env
    ref = "mail_send_simple@424242"
    resp = post_task(client, keys.tenant_a_client, ref)
    assert resp.status_code == 202, resp.text
    task = resp.json()
    assert (task["task_ref"], task["instruction"]) == (ref, BUILTIN.task(ref).instruction)
    assert task["apps"] == list(BUILTIN.task(ref).apps)
    policy = oracle_policy(tokenizer)
    plan_oracle(policy, task["id"], ref)
    assert run_served_task(task["id"], "w", policy, get_settings()) == TaskStatus.FINISHED
    with session_scope() as s:
        row = s.get(Task, task["id"])
        assert (row.success, row.reward) == (True, 1.0)


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        (f"{HELD_OUT['dev']}@5", "only train scenarios take '<scenario>@<seed>' refs"),
        ("notes_count_tag@01", "bad seed '01'"),
        ("no_such_scenario@5", "no built-in scenario 'no_such_scenario'"),
    ],
)
def test_a_procedural_ref_that_names_no_task_gets_422_saying_why(env, ref, needle):
    client, keys = env
    resp = post_task(client, keys.tenant_a_client, ref)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_request" and error["message"].startswith("unknown task_ref")
    assert needle in error["message"]
    assert count_tasks() == 0


# --- training -------------------------------------------------------------------------------


def test_fresh_draws_the_same_tasks_from_the_same_rng_each_with_an_expert():
    source = TaskSource("builtin", train=[])
    tasks = source.fresh(random.Random(7), 6)
    again = source.fresh(random.Random(7), 6)
    assert [(t.task_ref, t.instruction) for t in tasks] == [(t.task_ref, t.instruction) for t in again]
    assert [t.task_ref for t in source.fresh(random.Random(8), 6)] != [t.task_ref for t in tasks]
    assert source.fresh(random.Random(7), 0) == []
    for t in tasks:
        scenario, seed = t.task_ref.split("@")
        assert scenario in TRAIN and 0 <= int(seed) < SEED_LIMIT and (t.scenario, t.split) == (scenario, "train")
        world, evaluator = t.start()
        before = world.copy_state()
        actions = t.expert(world)
        assert actions[-1].api == "complete_task"
        for call in actions:  # the expert's calls, made on the task's own fresh world
            world.call(call.app, call.api, call.args)
        assert evaluator.evaluate(before, world.state, world.answer).success, t.task_ref


def test_a_rollout_worker_rebuilds_a_fresh_task_from_its_ref():
    (drawn,) = TaskSource("builtin", train=[]).fresh(random.Random(3), 1)
    rebuilt = rollout_task(None, "builtin", None, None, drawn.task_ref, "unused")
    assert (rebuilt.task_ref, rebuilt.instruction) == (drawn.task_ref, drawn.instruction)
    with pytest.raises(TaskSourceError, match="only train scenarios"):
        rollout_task(None, "builtin", None, None, f"{HELD_OUT['dev']}@1", "unused")


def test_fresh_refuses_sources_without_procedural_tasks(monkeypatch):
    builtin_source = TaskSource("builtin", train=[])
    assert builtin_source.procedural and builtin_source.provider is BUILTIN
    app_source = TaskSource("app:crm", train=[], app="crm")
    assert not app_source.procedural
    with pytest.raises(TaskSourceError, match="'app:crm' has no procedural tasks"):
        app_source.fresh(random.Random(0), 1)
    monkeypatch.setitem(registry.worlds(), "toy", ToyWorld())
    toy_source = TaskSource("toy", train=[])
    assert not toy_source.procedural
    with pytest.raises(TaskSourceError, match="'toy' has no procedural tasks"):
        toy_source.fresh(random.Random(0), 1)


def test_fresh_instances_take_each_train_scenario_in_turn_on_seeds_of_their_own():
    n = len(TRAIN) + 2
    specs = registry.fresh_instances(BUILTIN, n, seed=11)
    assert [s.scenario_id for s in specs] == TRAIN + TRAIN[:2]  # every scenario once before any twice
    assert [s.id for s in registry.fresh_instances(BUILTIN, n, seed=11)] == [s.id for s in specs]
    assert [s.id for s in registry.fresh_instances(BUILTIN, 5, seed=12)] != [s.id for s in specs[:5]]
    listed = set(BUILTIN.task_ids())
    assert all("@" in s.id and s.id not in listed and s.split == "train" for s in specs)
    with pytest.raises(ValueError, match="1 or more"):
        registry.fresh_instances(BUILTIN, 0, seed=11)


def test_fresh_instances_of_a_world_without_procedural_scenarios_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="'toy' has no procedural train scenarios"):
        registry.fresh_instances(ToyWorld(), 3, seed=0)


def test_a_scenario_no_seed_sets_up_is_a_setup_error_after_a_few_draws():
    class NeverSetsUp:
        name = "never"
        draws = 0

        def task(self, ref):
            self.draws += 1
            raise ScenarioSetupError(f"nothing to set {ref} up on")

    world = NeverSetsUp()
    with pytest.raises(ScenarioSetupError, match="could not be set up on 8 seeds in a row"):
        registry.draw_instance(world, "x", random.Random(0))  # type: ignore[arg-type]
    assert world.draws == registry.SEED_DRAWS


def test_a_run_named_scenarios_trains_and_measures_on_those_only():
    from agentloop.learner.config import LoopConfig
    from agentloop.learner.task_source import load_source

    train, dev = TRAIN[:2], HELD_OUT["dev"]
    config = LoopConfig(scenarios=[*train, dev], procedural=False)
    assert config.scenarios == (*train, dev)
    source = load_source(None, config, None, "unused")
    assert source.train and {t.scenario for t in source.train} == set(train)
    assert {t.scenario for t in source.dev} == {dev}
    # procedural draws keep to the named train scenarios too
    assert {t.scenario for t in source.fresh(random.Random(0), 12)} == set(train)
    assert len(load_source(None, LoopConfig(scenarios=[*train, dev], dev_limit=1), None, "unused").dev) == 1

    with pytest.raises(TaskSourceError, match=r"no tasks of scenario\(s\) 'bake_bread'; its scenarios: "):
        load_source(None, LoopConfig(scenarios=[train[0], "bake_bread"]), None, "unused")
    with pytest.raises(TaskSourceError, match=r"no dev tasks of scenario\(s\)"):
        load_source(None, LoopConfig(scenarios=[train[0]]), None, "unused")
    with pytest.raises(TaskSourceError, match=r"no tasks of scenario\(s\) .* in split\(s\) train"):
        load_source(None, LoopConfig(scenarios=[dev], procedural=False), None, "unused")
    with pytest.raises(ValueError, match="scenarios must be a list of scenario names"):
        LoopConfig(scenarios=train[0])
