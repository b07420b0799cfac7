"""POST /v1/admin/train: the run goes through the broker to a real learner worker process and trains."""

from tests.api.test_admin_api import TRAIN, env
from tests.factories import bearer
from tests.processes import wait_for


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
    resp = client.post("/v1/admin/train", json=TRAIN, headers=admin)
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
    assert (metrics["rollouts"] == 9 and "behaviour/api_docs_calls_per_episode" in metrics) or metrics[
        "adv/filtered_frac"
    ] == 1.0
    if done["adapter"]:
        statuses = {a["name"]: a for a in client.get("/v1/admin/adapters", headers=admin).json()}
        assert statuses[done["adapter"]]["training_run_id"] == run["id"]
