"""POST /v1/admin/training-runs/{id}/cancel: who may cancel which run, and what each status becomes."""

from datetime import timedelta

import pytest
import sqlalchemy as sa

from agentloop.api.auth import create_key
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun, utcnow
from agentloop.store.training_runs import claim_run
from agentloop.worker.dispatch import sweep_training_runs
from tests.api.test_admin_api import TRAIN, env
from tests.factories import bearer
from tests.learner.conftest import lights_world  # noqa: F401 (fixture, by name)


@pytest.fixture(autouse=True)
def _lights_registered(lights_world):  # noqa: F811 (TRAIN names the lights world, checked at request time)
    yield


def row(run_id):
    with session_scope() as s:
        run = s.get(TrainingRun, run_id)
        s.expunge(run)
        return run


def update(run_id, **values):
    with session_scope() as s:
        s.execute(sa.update(TrainingRun).where(TrainingRun.id == run_id).values(**values))


def cancel(client, run_id, key):
    return client.post(f"/v1/admin/training-runs/{run_id}/cancel", headers=bearer(key))


def test_a_queued_run_is_cancelled_at_once_and_never_claimed(sqlite_db):
    client, keys = env()
    run = client.post("/v1/admin/train", json=TRAIN, headers=bearer(keys.tenant_a_admin)).json()
    resp = cancel(client, run["id"], keys.tenant_a_admin)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "cancelled" and body["cancel_requested"] and body["finished_at"]
    assert "cancelled by an admin of tenant 'tenant-a'" in body["error"]
    assert claim_run(run["id"], "a-learner", 60) is None  # the message a learner may still get does nothing
    again = cancel(client, run["id"], keys.tenant_a_admin)
    assert again.status_code == 409 and "already ended (cancelled)" in again.json()["error"]["message"]


def test_a_running_run_is_marked_and_its_learner_stops_it(sqlite_db):
    client, keys = env()
    run = client.post("/v1/admin/train", json=TRAIN, headers=bearer(keys.tenant_a_admin)).json()
    assert claim_run(run["id"], "a-learner", 60) is not None
    resp = cancel(client, run["id"], keys.tenant_a_admin)
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "running" and resp.json()["cancel_requested"]
    assert row(run["id"]).lease_owner == "a-learner"  # the learner records the end, at its next safe point


def test_a_running_run_whose_learner_is_gone_is_cancelled_at_once(sqlite_db):
    client, keys = env()
    run = client.post("/v1/admin/train", json=TRAIN, headers=bearer(keys.tenant_a_admin)).json()
    claim_run(run["id"], "a-lost-learner", 60)
    update(run["id"], lease_expires_at=utcnow() - timedelta(seconds=1))
    resp = cancel(client, run["id"], keys.tenant_a_admin)
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert sweep_training_runs(get_settings(), utcnow())["runs_requeued"] == 0
    assert row(run["id"]).status == "cancelled"


def test_a_cancel_request_whose_learner_was_lost_ends_cancelled_not_resumed(sqlite_db):
    """Cancel asked while the learner ran; then the learner died before its next safe point."""
    client, keys = env()
    run = client.post("/v1/admin/train", json=TRAIN, headers=bearer(keys.tenant_a_admin)).json()
    claim_run(run["id"], "a-learner", 60)
    assert cancel(client, run["id"], keys.tenant_a_admin).status_code == 202
    update(run["id"], lease_expires_at=utcnow() - timedelta(seconds=1))  # its heartbeat stopped
    assert claim_run(run["id"], "another-learner", 60) is None
    swept = sweep_training_runs(get_settings(), utcnow())
    assert swept["runs_cancelled"] == 1 and swept["runs_requeued"] == 0
    ended = row(run["id"])
    assert ended.status == "cancelled" and ended.finished_at and ended.lease_owner is None
    assert "cancelled by an admin" in ended.error and "lease expired" in ended.error


def test_who_may_cancel_what(sqlite_db):
    client, keys = env()
    with session_scope() as s:
        _, other_admin = create_key(s, "tenant-b", "admin")
    run = client.post("/v1/admin/train", json=TRAIN, headers=bearer(keys.tenant_a_admin)).json()

    resp = cancel(client, run["id"], keys.tenant_a_client)
    assert resp.status_code == 403 and "admin" in resp.json()["error"]["message"]
    assert client.post(f"/v1/admin/training-runs/{run['id']}/cancel").status_code == 401
    for key in (keys.tenant_a_admin, other_admin):
        resp = cancel(client, "no-such-run", key)
        assert resp.status_code == 404 and "no training run 'no-such-run'" in resp.json()["error"]["message"]
    # another tenant's run does not exist for this tenant's admins: not cancelled, not shown
    assert cancel(client, run["id"], other_admin).status_code == 404
    assert client.get(f"/v1/admin/training-runs/{run['id']}", headers=bearer(other_admin)).status_code == 404
    assert client.get("/v1/admin/training-runs", headers=bearer(other_admin)).json() == []
    assert row(run["id"]).status == "queued" and not row(run["id"]).cancel_requested

    # the deployment's runs (`agentloop learn`, the schedule) are the operator's, not a tenant admin's
    with session_scope() as s:
        cli_run = TrainingRun(algo="loop", status="queued", trigger="cli", config={"iterations": 1})
        s.add(cli_run)
        s.flush()
        cli_id = cli_run.id
    assert client.get("/v1/admin/training-runs", headers=bearer(other_admin)).json() == []
    assert cancel(client, cli_id, other_admin).status_code == 404
    assert cancel(client, cli_id, keys.tenant_a_admin).status_code == 404
    listed = {r["id"] for r in client.get("/v1/admin/training-runs", headers=bearer(keys.operator)).json()}
    assert listed == {cli_id, run["id"]}
    assert cancel(client, cli_id, keys.operator).status_code == 200

    for status in ("finished", "failed"):
        update(run["id"], status=status, finished_at=utcnow())
        resp = cancel(client, run["id"], keys.tenant_a_admin)
        assert resp.status_code == 409, resp.text
        assert resp.json()["error"]["message"] == (
            f"training run {run['id']} already ended ({status}); nothing to cancel"
        )
        assert not row(run["id"]).cancel_requested
