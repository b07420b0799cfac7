"""Worked examples chosen per task: a bank of solved train instances, the nearest by apps then words, never
the task's own scenario when training asks so, and the setting that turns it on."""

import random

import pytest

from agentloop.agent.episode import Episode, Limits
from agentloop.agent.eval_runs import eval_task
from agentloop.agent.examples import ExampleBank, example_for, world_bank
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.builtin.prompt import EXAMPLE
from agentloop.learner.experts import expert_rollouts
from agentloop.learner.task_source import TaskSource


@pytest.fixture(scope="module")
def bank() -> ExampleBank:
    return ExampleBank.from_oracle(BUILTIN, per_scenario=1, max_chars=2500)


def test_the_bank_holds_each_train_scenario_solved_with_what_the_world_answered(bank):
    assert sorted({e.scenario for e in bank.examples}) == sorted(BUILTIN.procedural_scenarios())
    for banked in bank.examples[:10]:
        calls = [step.call for step in banked.example.steps]
        assert calls[-1].api == "complete_task"
        assert banked.apps == {c.app for c in calls} - {"supervisor", "api_docs"}
        # the observations are the world's real answers: a login answers a token the next calls pass on
        logins = [s for s in banked.example.steps if s.call.api == "login"]
        for login in logins:
            token = login.observation["access_token"]
            assert any(s.call.args.get("access_token") == token for s in banked.example.steps)
    assert ExampleBank.from_oracle(BUILTIN, per_scenario=1, max_chars=2500).examples[0] == bank.examples[0]


def test_nearest_shares_the_tasks_apps_and_skips_its_own_scenario(bank):
    dev = [eval_task(BUILTIN, t) for t in BUILTIN.tasks("dev")]
    for task in dev:
        world, _ = task.start()
        apps = set(world.available) - {"supervisor", "api_docs"}
        chosen = bank.nearest(task.instruction, world.available)
        banked = next(e for e in bank.examples if e.example is chosen)
        trained_apps = set().union(*(e.apps for e in bank.examples))
        if apps & trained_apps:  # some train scenario uses one of its apps: the example uses one too
            assert banked.apps & apps, (task.task_ref, apps, banked.scenario)
        assert banked.chars <= bank.max_chars
    train = TaskSource(world="builtin", train=[]).fresh(random.Random(5), 6)
    for task in train:
        world, _ = task.start()
        other = bank.nearest(task.instruction, world.available, exclude_scenario=task.scenario)
        assert next(e for e in bank.examples if e.example is other).scenario != task.scenario


def test_the_episode_shows_the_chosen_example_instead_of_the_worlds(bank, tokenizer):
    task = BUILTIN.task("wallet_send_money-1")
    chosen = bank.nearest(task.instruction, ["wallet"], exclude_scenario="wallet_send_money")
    fmt = ChatFormat(tokenizer)
    fixed = Episode(BUILTIN.task_world(task.id), fmt, task.instruction, Limits())
    nearest = Episode(BUILTIN.task_world(task.id), fmt, task.instruction, Limits(), example=chosen)
    as_text = [tokenizer.decode(ep.prompt_token_ids) for ep in (fixed, nearest)]
    assert EXAMPLE.instruction in as_text[0] and chosen.instruction not in as_text[0]
    assert chosen.instruction in as_text[1] and EXAMPLE.instruction not in as_text[1]
    assert as_text[1].rstrip().endswith("assistant") and task.instruction in as_text[1]


def test_the_setting_turns_it_on_for_evaluation_and_experts(configure_env, tokenizer):
    task = eval_task(BUILTIN, BUILTIN.task("wallet_send_money-1"))
    world, _ = task.start()
    assert example_for("builtin", task.instruction, world.available) is None  # `fixed`, the default
    configure_env(PROMPT_EXAMPLE="nearest", EXAMPLE_BANK_PER_SCENARIO=1)
    world_bank.cache_clear()
    chosen = example_for("builtin", task.instruction, world.available)
    assert chosen is not None and chosen.instruction != EXAMPLE.instruction
    assert example_for("app:todo", task.instruction, ["todo"]) is None  # an app's tasks: no bank
    (rollout,) = expert_rollouts(tokenizer, [task], Limits(max_turns=20, max_new_tokens=4096))
    prompt = tokenizer.decode(rollout.token_ids)
    shown = example_for("builtin", task.instruction, world.available, exclude_scenario=task.scenario)
    assert shown is not None and shown.instruction in prompt and EXAMPLE.instruction not in prompt
    world_bank.cache_clear()
