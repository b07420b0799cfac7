import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.tasks import SPLITS, run_oracle


def test_same_seed_same_world_different_seed_different_world():
    a, b = BUILTIN.new_world(7, ["notes", "wallet"]), BUILTIN.new_world(7, ["notes", "wallet"])
    c = BUILTIN.new_world(8, ["notes", "wallet"])
    assert a.state == b.state
    assert a.state != c.state


@pytest.mark.parametrize("task", BUILTIN.tasks(), ids=lambda t: t.id)
def test_oracle_solves_every_task_and_doing_nothing_does_not(task):
    world = BUILTIN.task_world(task.id)
    before = world.copy_state()
    run_oracle(task, world)
    verdict = task.evaluator.evaluate(before, world.state, world.answer)
    assert verdict.success, verdict.to_dict()

    idle = BUILTIN.task_world(task.id)
    assert not task.evaluator.evaluate(idle.copy_state(), idle.state, None).success


def test_oracle_calls_list_their_arguments_in_declared_order():
    # paginated calls pass page_index/page_limit first in the solutions' code; the expert writes the token
    # first, then the API's parameters in the order its index shows
    seen = 0
    for task in BUILTIN.tasks("dev") + BUILTIN.tasks("train")[:30]:
        world = BUILTIN.task_world(task.id)
        for call in run_oracle(task, world).actions:
            declared = dict.fromkeys(
                ["access_token", *world.apps[call.app].apis[call.api].parameters.get("properties", {})]
            )
            assert list(call.args) == [name for name in declared if name in call.args], (task.id, call)
            seen += "page_index" in call.args and "access_token" in call.args
    assert seen > 10


def test_same_task_same_verdict():
    task = BUILTIN.tasks("test_normal")[0]
    verdicts = []
    for _ in range(2):
        world = BUILTIN.task_world(task.id)
        before = world.copy_state()
        run_oracle(task, world)
        verdicts.append(task.evaluator.evaluate(before, world.state, world.answer).to_dict())
    assert verdicts[0] == verdicts[1]


def test_tasks_have_splits_and_three_variants_per_scenario():
    tasks = BUILTIN.tasks()
    assert {t.split for t in tasks} <= set(SPLITS)
    per_scenario = {}
    for t in tasks:
        per_scenario.setdefault(t.scenario_id, []).append(t)
    assert all(len(v) == 3 for v in per_scenario.values())
    repeated = {
        sid: [t.instruction for t in v] for sid, v in per_scenario.items() if len({t.instruction for t in v}) < 3
    }
    assert not repeated  # a scenario's variants are three different tasks


def test_login_is_required_and_errors_are_plain():
    world = BUILTIN.new_world(3, ["notes"])
    with pytest.raises(ApiError) as exc:
        world.call("notes", "list_notes", {"access_token": "nope"})
    assert exc.value.status == 401 and "login" in exc.value.message
    with pytest.raises(ApiError) as exc:
        world.call("notes", "login", {"username": "x@y.z", "password": "wrong"})
    assert exc.value.status == 401
    with pytest.raises(ApiError) as exc:
        world.call("wallet", "show_balance", {})
    assert exc.value.kind == "unknown_app" and "Available apps" in exc.value.message
    with pytest.raises(ApiError) as exc:
        world.call("notes", "fly", {})
    assert exc.value.kind == "unknown_api"
    with pytest.raises(ApiError) as exc:
        world.call("notes", "login", {"username": "a"})
    assert exc.value.status == 422 and "password" in exc.value.message
    with pytest.raises(ApiError) as exc:
        world.call("notes", "login", {"username": "a", "password": "b", "extra": 1})
    assert exc.value.status == 422 and "extra" in exc.value.message


def test_pagination_caps_page_limit():
    world = BUILTIN.new_world(3, ["notes"])
    profile = world.state["supervisor"]["profile"]["1"]
    pw = world.state["supervisor"]["accounts"]["notes"]["password"]
    token = world.call("notes", "login", {"username": profile["email"], "password": pw})["access_token"]
    first = world.call("notes", "list_notes", {"access_token": token, "page_limit": 5})
    second = world.call("notes", "list_notes", {"access_token": token, "page_limit": 5, "page_index": 1})
    assert len(first) == 5 and not {n["note_id"] for n in first} & {n["note_id"] for n in second}
    with pytest.raises(ApiError):
        world.call("notes", "list_notes", {"access_token": token, "page_limit": 500})


def test_snapshot_restore_roundtrip():
    world = BUILTIN.task_world(BUILTIN.tasks()[0].id)
    snap = world.snapshot()
    original = world.copy_state()
    run_oracle(BUILTIN.tasks()[0], world)
    assert world.state != original
    world.restore(snap)
    assert world.state == original and not world.completed


def test_every_api_an_evaluation_task_needs_on_a_train_app_is_used_by_a_train_task():
    # dev and test_normal scenarios are new tasks, not new APIs: what their oracles call on the apps train
    # tasks use, some train oracle calls too (the held-out apps are test_challenge's, and dev's few tasks
    # on them)
    def called(split: str) -> set[str]:
        return {
            f"{a.app}.{a.api}" for t in BUILTIN.tasks(split) for a in run_oracle(t, BUILTIN.task_world(t.id)).actions
        }

    taught = called("train")
    train_apps = {name.split(".")[0] for name in taught}
    assert not train_apps & {"music", "files", "todo"}
    for split in ("dev", "test_normal"):
        assert {name for name in called(split) if name.split(".")[0] in train_apps} <= taught, split
