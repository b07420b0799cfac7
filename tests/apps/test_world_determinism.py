"""A built-in world is a pure function of its seed and the frozen NOW: not of today's date, the
process's hash seed or which thread built it; and every scenario sets up on any seed."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import time_machine

from agentloop.apps import builtin
from agentloop.apps.builtin import BUILTIN, BuiltinWorld
from agentloop.apps.builtin.people import make_world_data
from agentloop.apps.builtin.scenarios.common import people_of
from agentloop.apps.digest import task_digests, world_digest
from agentloop.apps.tasks import Scenario, ScenarioSetupError, run_oracle

# spread over two years, around month ends, a leap day's neighbours and the day a relative date broke
DATES = ["2025-12-31", "2026-02-28", "2026-12-01", "2027-03-01", "2027-11-30"]


def fresh_digests() -> dict[str, str]:
    """Every task built from scratch: no world, person or task cached from an earlier build."""
    builtin._base_state.cache_clear()
    people_of.cache_clear()
    return task_digests(BuiltinWorld())


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    return fresh_digests()


def test_every_task_is_the_same_on_every_date(reference):
    assert len(reference) == len(BUILTIN.task_ids())
    for day in DATES:
        with time_machine.travel(datetime.fromisoformat(day).replace(hour=13, tzinfo=UTC), tick=False):
            assert datetime.now().date().isoformat() == day  # the clock really moved
            digests = fresh_digests()
        changed = sorted(t for t in reference if digests[t] != reference[t])
        assert not changed, f"on {day} these tasks differ: {changed[:10]}"


def test_another_process_with_another_hash_seed_and_date_builds_the_same_tasks(reference):
    code = (
        "import json, time_machine\n"
        "from agentloop.apps.builtin import BUILTIN\n"
        "from agentloop.apps.digest import task_digests\n"
        "with time_machine.travel('2028-07-04 03:00Z', tick=False):\n"
        "    print(json.dumps(task_digests(BUILTIN)))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    other = json.loads(out.stdout.strip().splitlines()[-1])
    assert world_digest(other) == world_digest(reference)


def test_worlds_built_in_threads_at_once_are_the_worlds_built_alone():
    seeds = [101, 102, 103, 104]
    alone = [make_world_data(s) for s in seeds]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(make_world_data, seeds * 3))
    assert together == alone * 3


def test_digest_tells_tasks_apart(reference):
    assert len(set(reference.values())) == len(reference)


@pytest.mark.parametrize("seed", range(50))
def test_every_scenario_sets_up_on_fifty_seeds(seed: int):
    """Fresh seeds, beyond the pooled worlds the fixed task list uses: every scenario sets up, and on
    one seed in five (a different fifth per scenario) the oracle solves it and doing nothing does not."""
    for index, scenario in enumerate(BUILTIN.scenarios):
        task, world = BUILTIN.instance(scenario.id, seed)
        assert task.id == f"{scenario.id}@{seed}" and task.split == scenario.split and task.instruction
        if (seed + index) % 5:
            continue
        before = world.copy_state()
        assert not task.evaluator.evaluate(before, world.state, None).success, (task.id, "idle passes")
        run_oracle(task, world)
        verdict = task.evaluator.evaluate(before, world.state, world.answer)
        assert verdict.success, (task.id, verdict.to_dict())


def test_a_scenario_that_finds_nothing_says_which_scenario_and_seed():
    def setup(world, rng):
        return rng.choice([])  # the IndexError a bare choice gives

    broken = Scenario(id="broken_demo", difficulty=1, apps=("notes",), split="train", setup=setup)
    provider = BuiltinWorld()
    provider.__dict__["scenarios"] = [broken]
    with pytest.raises(ScenarioSetupError, match=r"scenario 'broken_demo' .* world seed 77") as exc:
        provider.instance("broken_demo", 77)
    assert isinstance(exc.value.__cause__, IndexError)
    with pytest.raises(KeyError, match="unknown built-in scenario"):
        provider.instance("nope", 1)


def test_a_world_whose_person_has_one_relative_builds():
    """Seed 367's person has exactly one family member: the family photos then come from everyone they
    know (the files app asked that one relative for two, and the world could not be built)."""
    world = BUILTIN.new_world(367, ["files"])
    family = [name for name in world.state["files"]["files"].values() if "/Photos/Family/" in str(name)]
    assert len(family) == 2, family
