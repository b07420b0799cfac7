"""POST /v1/admin/train: the run goes through the broker to a real learner worker process and trains."""

import sqlalchemy as sa

from agentloop.store.db import session_scope
from agentloop.store.models import Episode
from tests.api.test_admin_api import TRAIN, env
from tests.factories import bearer
from tests.processes import wait_for

TASKS, K = 4, 4
# Seeded (task sampling and the learner's sampler): on this model the 16 rollouts earn unequal rewards
# within some task, so the iteration updates and saves a version. Tolerance 100 makes the gate accept it.
RUN = {**TRAIN, "config": {**TRAIN["config"], "tasks_per_iteration": TASKS, "rollouts_per_task": K, "seed": 0}}


def test_train_now_runs_in_a_learner_worker(
    sqlite_db,
    lights_plugin,
    lights_model_dir,
    configure_env,
    processes,
):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=16)
    client, keys = env()
    admin = bearer(keys.tenant_a_admin)
    resp = client.post("/v1/admin/train", json=RUN, headers=admin)
    assert resp.status_code == 202, resp.text
    run = resp.json()
    assert run["status"] == "queued" and run["trigger"] == "admin"
    processes.start("worker", "--queues", "learner", name="learner")

    def finished():
        got = client.get(f"/v1/admin/training-runs/{run['id']}", headers=admin).json()
        return got if got["status"] in ("finished", "failed") else None

    done = wait_for(finished, 240, "the training run to finish", processes.logs)
    assert done["status"] == "finished", done
    assert done["iteration"] == 1 and len(done["metrics"]) == 1
    metrics = done["metrics"][0]
    assert metrics["rollouts"] == TASKS * K, metrics
    assert metrics["adv/filtered_frac"] < 1.0, metrics  # some rollouts had an advantage: it updated
    assert "behaviour/api_docs_calls_per_episode" in metrics  # the candidate's dev behaviour was measured
    assert metrics["adapter/promoted"] == 1.0 and done["adapter"] == metrics["adapter"], metrics
    with session_scope() as s:  # every rollout the iteration trained on is stored, K per task
        per_task = s.execute(
            sa.select(Episode.task_ref, sa.func.count())
            .where(Episode.training_run_id == run["id"], Episode.iteration == 0)
            .group_by(Episode.task_ref)
        ).all()
    assert sorted(n for _, n in per_task) == [K] * TASKS
    adapters = {a["name"]: a for a in client.get("/v1/admin/adapters", headers=admin).json()}
    assert list(adapters) == [done["adapter"]]
    saved = adapters[done["adapter"]]
    assert saved["training_run_id"] == run["id"] and saved["status"] == "active"
    assert saved["metrics"]["dev_tgc"] == metrics["dev/tgc"]
