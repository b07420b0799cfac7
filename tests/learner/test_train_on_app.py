"""Training on an external app (a real HTTP app on loopback, tests/apps/loopback_app.py): `agentloop learn
--app` and POST /v1/admin/train {"config": {"app": ...}} sample the app's train tasks, reset the app for
every rollout (an episode of its own) and let it score each one; a run naming a world or an app it cannot
train on is refused before anything is stored."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from agentloop.api.app import create_app
from agentloop.api.auth import create_key
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import Adapter, Episode, Reward, Tenant, TrainingRun
from tests.apps.loopback_app import LIGHTS_DESCRIPTION, LIGHTS_TASKS, LOOPBACK_NETWORKS, serve_lights_app
from tests.factories import bearer, make_keys
from tests.processes import wait_for

TASKS, K, DEV = 4, 4, 2
TRAIN_REFS = {t["task_ref"] for t in LIGHTS_TASKS if t["split"] == "train"}
DEV_REFS = {t["task_ref"] for t in LIGHTS_TASKS if t["split"] == "dev"}
# seeded (task sampling and the sampler): the warm-started lights model turns the lights on in some of a
# task's rollouts and off in others, so the iteration updates; tolerance 100 makes the gate accept it
CONFIG = {
    "app": "lights",
    "tasks_per_iteration": TASKS,
    "rollouts_per_task": K,
    "max_turns": 1,
    "max_new_tokens": 40,
    "dev_limit": DEV,
    "dev_max_turns": 1,
    "promotion_tolerance": 100.0,
    "seed": 0,
}


@pytest.fixture
def lights_app():
    with serve_lights_app() as served:
        yield served


@pytest.fixture
def api(sqlite_db):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


def register(client, key, base_url, doc, name="lights"):
    body = {"name": name, "description": LIGHTS_DESCRIPTION, "openapi": doc, "base_url": base_url}
    resp = client.post("/v1/apps", json={**body, "allowed_networks": LOOPBACK_NETWORKS}, headers=bearer(key))
    assert resp.status_code == 201, resp.text
    return resp.json()


def run_count() -> int:
    with session_scope() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(TrainingRun))


def without_environment(doc):
    """The app's document minus agentloop_reset and agentloop_evaluate: an app that cannot be reset."""
    paths = {p: item for p, item in doc["paths"].items() if p not in ("/agentloop/reset", "/agentloop/evaluate")}
    return {**doc, "paths": paths}


def check_rollouts_went_through_the_app(log, run_id):
    """The iteration's K x N rollouts: each reset in the app (an episode of its own), scored by the app in
    that episode, and stored with the app's verdict as its reward."""
    train_resets = [(ref, ep) for ref, ep in log.resets if ref in TRAIN_REFS]
    assert len(train_resets) == TASKS * K, log.resets
    per_task = Counter(ref for ref, _ in train_resets)
    assert sorted(per_task.values()) == [K] * len(per_task), per_task  # K rollouts of each sampled task
    episodes = {ep for _, ep in train_resets}
    assert len(episodes) == TASKS * K  # a distinct Agentloop-Episode for every rollout
    scored = {ep: passed for ref, ep, passed in log.evaluations if ref in TRAIN_REFS}
    assert set(scored) == episodes  # each evaluated in its own episode, once
    assert len([e for ref, e, _ in log.evaluations if ref in TRAIN_REFS]) == TASKS * K
    # the agent's calls of the app carried their episode's header, never none
    calls = [ep for method, path, ep in log.requests if path.startswith("/lights/")]
    assert calls and set(calls) <= {ep for _, ep in log.resets}, calls
    assert 0 < sum(scored.values()) < TASKS * K, scored  # mixed: some rollouts passed, some failed
    with session_scope() as s:
        stored = s.execute(
            sa.select(Episode.task_ref, Episode.world, Reward.value)
            .join(Reward, Reward.episode_id == Episode.id)
            .where(Episode.training_run_id == run_id, Episode.iteration == 0, Reward.source == "evaluator")
        ).all()
    assert sorted(ref for ref, _, _ in stored) == sorted(f"lights:{ref}" for ref, _ in train_resets)
    assert {world for _, world, _ in stored} == {"app:lights"}
    assert sorted(v for _, _, v in stored) == sorted(float(p) for p in scored.values())  # the app's verdicts


def check_gate_used_the_apps_dev_tasks(log, metrics):
    dev_resets = [ref for ref, _ in log.resets if ref in DEV_REFS]
    assert len(dev_resets) == 2 * DEV and set(dev_resets) <= DEV_REFS  # the bar (base model), the candidate
    assert metrics["dev/set"] == "app:lights/dev", metrics


def test_the_apps_episodes_see_the_prompt_the_lights_model_was_warm_started_on(lights_app, tiny_model_dir):
    """What the training tests below rest on: the app, attached to the built-in world's base, gives the
    agent token for token the opening of a lights-world task (so the warm start's mixed behaviour holds)."""
    from transformers import AutoTokenizer

    from agentloop.agent.episode import Episode, Limits
    from agentloop.agent.external_episode import start_external_episode
    from agentloop.agent.prompt import ChatFormat
    from agentloop.apps.builtin import BUILTIN
    from agentloop.apps.external import ExternalApp
    from tests.learner.lights_world import LightsWorld

    base_url, doc, log = lights_app
    fmt = ChatFormat(AutoTokenizer.from_pretrained(tiny_model_dir))
    app = ExternalApp.build("lights", LIGHTS_DESCRIPTION, doc, base_url, allowed_networks=LOOPBACK_NETWORKS)
    started = start_external_episode(app, "lights-0", BUILTIN.new_world(0, []))
    instruction = LIGHTS_TASKS[0]["instruction"]
    on_app = Episode(started.world, fmt, instruction, Limits())
    on_world = Episode(LightsWorld().task_world("lights-0"), fmt, instruction, Limits())
    assert on_app.prompt_token_ids == on_world.prompt_token_ids
    assert log.resets == [("lights-0", started.episode)]


def test_a_rollout_worker_runs_k_rollouts_of_an_apps_task(api, lights_app, tiny_model_dir, tmp_path):
    """rollout_mode=celery: the job a `rollouts` worker runs for an app's task loads the app of the run's
    tenant, resets it for each of the K rollouts and stores what the app scored."""
    from agentloop.agent.episode import Limits
    from agentloop.learner.rollouts import run_rollout_job, stored_rollouts
    from tests.factories import save_random_lora, tiny_policy

    client, keys = api
    base_url, doc, log = lights_app
    register(client, keys.operator, base_url, doc)
    with session_scope() as s:
        tenant_a = s.scalars(sa.select(Tenant.id).where(Tenant.name == "tenant-a")).one()
        run = TrainingRun(algo="loop", status="running", trigger="test", config={}, tenant_id=tenant_a)
        s.add(run)
        s.flush()
        run_id = run.id
    limits = Limits(max_turns=1, max_new_tokens=8, wall_time_s=1e9, temperature=1.0)
    stored = run_rollout_job(
        tiny_policy(tiny_model_dir),
        run_id=run_id,
        iteration=0,
        task_ref="lights:lights-1",
        k=3,
        adapter="run-it0",
        adapter_path=str(save_random_lora(tiny_model_dir, tmp_path / "it0")),
        limits=limits.__dict__,
        world="builtin",
        app="lights",
        tenant_id=tenant_a,
    )
    assert stored == 3
    assert [ref for ref, _ in log.resets] == ["lights-1"] * 3 and len({ep for _, ep in log.resets}) == 3
    assert sorted(ep for _, ep, _ in log.evaluations) == sorted(ep for _, ep in log.resets)
    with session_scope() as s:
        rows = s.scalars(sa.select(Episode).where(Episode.training_run_id == run_id)).all()
        assert {(e.kind, e.world, e.task_ref, e.adapter) for e in rows} == {
            ("rollout", "app:lights", "lights:lights-1", "run-it0")
        }
        by_task = stored_rollouts(s, run_id, 0)
    assert list(by_task) == ["lights:lights-1"] and len(by_task["lights:lights-1"]) == 3


def test_client_episodes_of_the_apps_train_tasks_join_their_group(api, lights_app, lights_model_dir, configure_env):
    """A task a client of the app's tenant sent ("lights:<task>", served in the built-in world) is one more
    sample of its task's group; another tenant's episode of its own "lights" app, or a dev task's, is not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentloop.agent.runner import run_served_task
    from agentloop.learner.config import LoopConfig
    from agentloop.learner.model import lora_model
    from agentloop.learner.rl import LoopTrainer
    from agentloop.policy.local import LocalPolicy
    from agentloop.settings import get_settings

    configure_env(MODEL=str(lights_model_dir), AGENT_MAX_TURNS=1, AGENT_MAX_NEW_TOKENS=40)
    client, keys = api
    base_url, doc, log = lights_app
    other_admin = tenant_b_key()
    register(client, keys.operator, base_url, doc)
    register(client, tenant_b_key("operator"), base_url, doc)  # tenant b's own app of that name
    tok = AutoTokenizer.from_pretrained(lights_model_dir)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(lights_model_dir), tok, "m", seed=0)

    def served(key, task_ref):
        task = client.post("/v1/tasks", json={"task_ref": task_ref}, headers=bearer(key)).json()
        assert run_served_task(task["id"], "w", policy, get_settings()) == "finished"
        with session_scope() as s:
            return s.scalar(sa.select(Episode.id).where(Episode.task_id == task["id"]))

    ours = served(keys.tenant_a_admin, "lights:lights-2")
    served(other_admin, "lights:lights-2")
    served(keys.tenant_a_admin, "lights:lights-6")  # a dev task: never trained on
    config = LoopConfig(
        app="lights", tasks_per_iteration=1, rollouts_per_task=2, max_turns=1, max_new_tokens=40, promote=False
    )
    with session_scope() as s:
        tenant_a = s.scalars(sa.select(Tenant.id).where(Tenant.name == "tenant-a")).one()
        run = TrainingRun(algo="loop", status="running", trigger="test", config=config.to_dict(), tenant_id=tenant_a)
        s.add(run)
        s.flush()
        run_id = run.id
    torch.manual_seed(0)
    model = lora_model(AutoModelForCausalLM.from_pretrained(lights_model_dir), config, None)
    trainer = LoopTrainer(get_settings(), config, run_id, model=model, tokenizer=tok)
    trainer.setup()
    assert [item.rollout.episode_id for item in trainer.logged_episodes()] == [ours]
    resets = len(log.resets)
    _, by_task = trainer.samples(0)
    group = by_task["lights:lights-2"]
    assert len(group) == 2 + 1 and ours in {r.episode_id for r in group}  # K fresh rollouts + the client's
    assert [ref for ref, _ in log.resets[resets:]].count("lights-2") == 2  # each fresh one reset in the app


def test_learn_with_app_trains_on_rollouts_the_app_reset_and_scored(
    api, lights_app, lights_model_dir, configure_env, tmp_path
):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=16)
    client, keys = api
    base_url, doc, log = lights_app
    register(client, keys.operator, base_url, doc)
    args = ["learn", "--app", "lights", "--tenant", "tenant-a", "--iterations", "1"]
    args += ["--tasks-per-iteration", str(TASKS), "--rollouts-per-task", str(K), "--max-turns", "1"]
    args += ["--max-new-tokens", "40", "--dev-limit", str(DEV)]
    args += ["--set", "dev_max_turns=1", "--set", "promotion_tolerance=100", "--set", "seed=0"]
    done = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", *args], capture_output=True, text=True, timeout=400, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (metrics,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    with session_scope() as s:
        run = s.scalars(sa.select(TrainingRun)).one()
        run_id, tenant_id, config = run.id, run.tenant_id, run.config
        tenant_a = s.scalars(sa.select(Tenant.id).where(Tenant.name == "tenant-a")).one()
        saved = s.scalars(sa.select(Adapter).where(Adapter.training_run_id == run_id)).all()
    assert config["app"] == "lights" and tenant_id == tenant_a  # a run on an app is its tenant's
    check_rollouts_went_through_the_app(log, run_id)
    check_gate_used_the_apps_dev_tasks(log, metrics)
    assert metrics["rollouts"] == TASKS * K and metrics["adv/filtered_frac"] < 1.0, metrics  # it updated
    assert [a.name for a in saved] == [metrics["adapter"]] and saved[0].metrics["dev_set"] == "app:lights/dev"


def test_train_now_with_app_runs_in_a_learner_worker(api, lights_app, lights_model_dir, configure_env, processes):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=16)
    client, keys = api
    admin = bearer(keys.tenant_a_admin)
    base_url, doc, log = lights_app
    register(client, keys.operator, base_url, doc)
    resp = client.post("/v1/admin/train", json={"algo": "loop", "iterations": 1, "config": CONFIG}, headers=admin)
    assert resp.status_code == 202, resp.text
    run = resp.json()
    assert run["status"] == "queued" and run["config"]["app"] == "lights"
    assert log.resets == []  # queued: nothing reset yet (the check only listed the app's tasks)
    processes.start("worker", "--queues", "learner", name="learner")

    def finished():
        got = client.get(f"/v1/admin/training-runs/{run['id']}", headers=admin).json()
        return got if got["status"] in ("finished", "failed") else None

    done = wait_for(finished, 300, "the training run to finish", processes.logs)
    assert done["status"] == "finished", done
    (metrics,) = done["metrics"]
    check_rollouts_went_through_the_app(log, run["id"])
    check_gate_used_the_apps_dev_tasks(log, metrics)
    assert metrics["rollouts"] == TASKS * K and metrics["adv/filtered_frac"] < 1.0, metrics
    assert metrics["adapter/promoted"] == 1.0 and done["adapter"] == metrics["adapter"], metrics


def tenant_b_key(role: str = "admin") -> str:
    with get_sessionmaker()() as s:
        key = create_key(s, "tenant-b", role)[1]
        s.commit()
    return key


@pytest.mark.parametrize(
    ("config", "who", "status", "needle"),
    [
        ({"world": "nowhere"}, "a", 422, "unknown world 'nowhere'"),
        ({"app": "nope"}, "a", 422, "no registered app named 'nope' for this tenant"),
        ({"app": "lights"}, "b", 422, "no registered app named 'lights' for this tenant"),  # tenant a's
        ({"app": "plain"}, "a", 422, "cannot be trained on: its OpenAPI document declares no agentloop_reset"),
        ({"app": "lights", "splits": ["nosuch"]}, "a", 422, "offers no tasks in split(s) nosuch"),
        ({"app": "gone"}, "a", 503, "could not list the tasks of app 'gone'"),
    ],
)
def test_a_train_request_that_could_not_train_is_refused_and_stores_nothing(
    api, lights_app, configure_env, config, who, status, needle
):
    from tests.apps.loopback_app import free_port

    configure_env(APP_CONTROL_ATTEMPTS=1)  # the unreachable app: no retries
    client, keys = api
    base_url, doc, log = lights_app
    register(client, keys.operator, base_url, doc)
    register(client, keys.operator, base_url, without_environment(doc), name="plain")
    register(client, keys.operator, f"http://127.0.0.1:{free_port()}", doc, name="gone")  # nothing listens
    key = keys.tenant_a_admin if who == "a" else tenant_b_key()
    resp = client.post("/v1/admin/train", json={"config": config}, headers=bearer(key))
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["error"]["message"]
    assert run_count() == 0 and log.resets == []


def test_learn_refuses_an_app_it_cannot_train_on_before_storing_a_run(api, lights_app):
    from agentloop.cli import app as cli

    client, keys = api
    base_url, doc, _ = lights_app
    register(client, keys.operator, base_url, without_environment(doc), name="plain")
    runner = CliRunner()
    for args, needle in [
        (["--app", "nope"], "no registered app named 'nope'"),
        (["--app", "plain"], "cannot be trained on"),
        (["--app", "plain", "--tenant", "nobody"], "no tenant named 'nobody'"),
        (["--app", "nope", "--tenant", "tenant-a"], "no registered app named 'nope' for this tenant"),
        (["--set", "world=nowhere"], "unknown world 'nowhere'"),
    ]:
        result = runner.invoke(cli, ["learn", *args])
        assert result.exit_code == 2, (args, result.output)
        assert needle in " ".join(result.output.replace("\u2502", " ").split()), result.output  # rich's box
    assert run_count() == 0
