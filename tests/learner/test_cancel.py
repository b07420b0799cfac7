"""Stopping a training run: a real learner worker cancelled over REST, `agentloop learn` sent SIGINT. The run
ends cancelled at a safe point, the active adapter keeps serving, and no sweep brings the run back."""

import os
import signal
import subprocess
import sys

import pytest
import sqlalchemy as sa
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.learner.config import LoopConfig
from agentloop.policy.local import LocalPolicy
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, TrainingRun
from agentloop.store.training_runs import claim_run
from agentloop.worker.dispatch import sweep
from tests.api.test_admin_api import env, save_version
from tests.factories import bearer
from tests.learner.test_logged import feedback, make_trainer, serve
from tests.processes import wait_for

# long enough to be caught mid-run (5 iterations of 6 tasks x 4 rollouts, 4 episodes per batch); any
# iteration that got to its gate would be promoted (tolerance 100): a new active adapter would show it
CONFIG = {
    "world": "lights",
    "tasks_per_iteration": 6,
    "rollouts_per_task": 4,
    "max_turns": 1,
    "max_new_tokens": 40,
    "dev_limit": 2,
    "dev_max_turns": 1,
    "promotion_tolerance": 100.0,
}


def run_row(run_id=None):
    with session_scope() as s:
        run = s.get(TrainingRun, run_id) if run_id else s.scalars(sa.select(TrainingRun)).first()
        if run is not None:
            s.expunge(run)
        return run


def adapters():
    with session_scope() as s:
        return {a.name: (a.status, a.training_run_id) for a in s.scalars(sa.select(Adapter))}


def in_rollouts(run_id=None):
    run = run_row(run_id)
    return run if run is not None and run.status == "running" and run.progress.get("phase") == "rollouts" else None


def assert_stays_cancelled(run_id):
    settings = get_settings()
    swept = sweep(settings)
    assert swept["runs_requeued"] == 0 and swept["runs_interrupted"] == 0, swept
    assert claim_run(run_id, "another-learner", settings.lease_s) is None
    assert run_row(run_id).status == "cancelled"


@pytest.mark.timeout(300)
def test_cancel_stops_a_running_run_in_its_learner_worker(
    sqlite_db, lights_plugin, lights_model_dir, configure_env, processes
):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=4, LEASE_S=4)
    client, keys = env()
    admin = bearer(keys.tenant_a_admin)
    active, _ = save_version(lights_model_dir, activate=True)
    run = client.post("/v1/admin/train", json={"iterations": 5, "config": CONFIG}, headers=admin).json()
    processes.start("worker", "--queues", "learner", name="learner")
    wait_for(lambda: in_rollouts(run["id"]), 180, "the run's first rollouts", processes.logs)

    resp = client.post(f"/v1/admin/training-runs/{run['id']}/cancel", headers=admin)
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "running" and resp.json()["cancel_requested"]

    def ended():
        got = client.get(f"/v1/admin/training-runs/{run['id']}", headers=admin).json()
        return got if got["status"] != "running" else None

    done = wait_for(ended, 60, "the learner to stop the run", processes.logs)
    assert done["status"] == "cancelled" and done["finished_at"], done
    assert done["error"].startswith("cancelled by an admin of tenant 'tenant-a'; stopped in iteration 0"), done
    assert done["iteration"] == 0 and done["metrics"] == [] and done["adapter"] is None
    assert done["progress"]["phase"] == "cancelled"
    assert adapters() == {active: ("active", None)}  # nothing saved, nothing promoted: v1 keeps serving
    assert_stays_cancelled(run["id"])
    assert "resumes at iteration" not in processes.logs()


@pytest.mark.timeout(300)
def test_sigint_cancels_a_run_of_agentloop_learn(sqlite_db, lights_plugin, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=4, LEASE_S=4)
    args = ["learn", "--iterations", "5", *(f"--set={k}={v}" for k, v in CONFIG.items())]
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentloop.cli", *args], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        running = wait_for(in_rollouts, 180, "the run's first rollouts")
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert "iteration 1/5: 6 tasks \u00d7 4 rollouts" in err  # the plan of the iteration, in words
    assert "SIGINT: run" in err and "stops at its next safe point" in err
    assert f"agentloop learn --resume {running.id}" in err
    run = run_row(running.id)
    assert run.status == "cancelled" and run.trigger == "cli" and run.cancel_requested and run.finished_at
    assert run.error.startswith("cancelled: `agentloop learn` got SIGINT; stopped in iteration 0"), run.error
    assert run.iteration == 0 and run.lease_owner is None and out == ""  # no iteration finished
    assert adapters() == {}
    assert_stays_cancelled(run.id)


def test_the_rollout_plan_says_how_many_client_episodes_join(sqlite_db, lights_world, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir), AGENT_MAX_TURNS=1, AGENT_MAX_NEW_TOKENS=40)
    policy = LocalPolicy(
        AutoModelForCausalLM.from_pretrained(lights_model_dir), AutoTokenizer.from_pretrained(lights_model_dir), "m"
    )
    for ref in ("lights-2", "lights-3", "lights-3"):
        serve(policy, "a", task_ref=ref)
    feedback(*serve(policy, "a", instruction="Lights please."), 1.0)  # no task to replay: used as it is
    config = LoopConfig(world="lights", tasks_per_iteration=1, rollouts_per_task=2, max_turns=1, max_new_tokens=24)
    trainer = make_trainer(config, lights_model_dir, tenant="a")  # tenant a's run reads its episodes
    reports = []
    trainer.report = reports.append
    _, by_task = trainer.samples(0)
    (plan,) = [r for r in reports if "plan" in r]
    from_logged = len(by_task) - 1  # lights-2 and lights-3, but for one the sampled task may be
    assert {"lights-2", "lights-3"} <= set(by_task)
    assert plan["tasks_sampled"] == 1 and plan["tasks_from_logged"] == from_logged
    assert plan["logged_joined"] == 3 and plan["logged_feedback_only"] == 1
    assert plan["rollouts_total"] == len(by_task) * 2
    assert plan["plan"] == (
        f"1 task \u00d7 2 rollouts + {from_logged} task{'s' * (from_logged > 1)} clients ran \u00d7 2 rollouts = "
        f"{plan['rollouts_total']} rollouts; 3 logged client episodes joined (one more sample in their task's group); "
        "1 client episode with feedback used alone (no task to replay)"
    )
    assert sum(len(g) for g in by_task.values()) == plan["rollouts_total"] + 3  # the client's episodes joined
