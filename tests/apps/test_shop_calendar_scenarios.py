"""The shop and calendar scenarios as a set: sizes, splits, difficulty mix, varied instances."""

from collections import Counter

from agentloop.apps.builtin import BUILTIN

MINE = [s for s in BUILTIN.scenarios if s.id.startswith(("shop_", "calendar_"))]


def test_scenario_mix() -> None:
    assert len(MINE) == 29
    assert Counter(s.split for s in MINE) == {"train": 18, "dev": 4, "test_normal": 7}
    difficulty = Counter(s.difficulty for s in MINE)
    assert difficulty[1] >= 8 and difficulty[2] >= 8 and difficulty[3] >= 4
    assert sum(len(s.apps) > 1 for s in MINE) == 4


def test_my_scenarios_vary_between_instances() -> None:
    mine = [t for t in BUILTIN.tasks() if t.scenario_id.startswith(("shop_", "calendar_"))]
    per_scenario: dict[str, set[str]] = {}
    for t in mine:
        per_scenario.setdefault(t.scenario_id, set()).add(t.instruction)
    assert len(per_scenario) == 29
    assert all(len(v) == 3 for v in per_scenario.values()), per_scenario
