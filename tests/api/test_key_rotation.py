"""Key rotation (a new key, the old one until its grace ends) and keys that stop holding while a stream
is open: the SSE stream of a running task ends with an `error` event at its next event."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api import streams
from agentloop.api.app import create_app
from agentloop.api.auth import authenticate, hash_key, parse_grace, rotate_key, tenant_admin
from agentloop.api.errors import Conflict, InvalidRequest, NotFound, Unauthenticated
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import ApiKey, utcnow
from tests.factories import bearer, make_keys, tiny_policy
from tests.grpc.conftest import EpisodeThread, GatedPolicy


def key_id(key: str) -> str:
    with get_sessionmaker()() as s:
        return s.scalars(sa.select(ApiKey.id).where(ApiKey.key_hash == hash_key(key))).one()


def works(key: str) -> bool:
    with get_sessionmaker()() as s:
        try:
            authenticate(s, f"Bearer {key}")
        except Unauthenticated:
            return False
    return True


def rotate(old_key: str, grace_s: int) -> tuple[ApiKey, str]:
    with session_scope() as s:
        row, key = rotate_key(s, key_id(old_key), grace_s)
        s.expunge(row)
    return row, key


def set_key(key: str, **values) -> None:
    with session_scope() as s:
        s.execute(sa.update(ApiKey).where(ApiKey.key_hash == hash_key(key)).values(**values))


def old_row(key: str) -> ApiKey:
    with get_sessionmaker()() as s:
        row = s.scalars(sa.select(ApiKey).where(ApiKey.key_hash == hash_key(key))).one()
        s.expunge(row)
        return row


@pytest.fixture
def keys(db_url, configure_env):
    # these tests change keys in the database as another process would, and look at once: no process cache
    # (its window is tested in test_key_cache.py)
    configure_env(API_KEY_CACHE_S=0)
    with get_sessionmaker()() as s:
        return make_keys(s)


def test_both_keys_work_during_the_grace_then_only_the_new_one(keys):
    old = keys.tenant_a_admin
    with session_scope() as s:
        s.execute(sa.update(ApiKey).where(ApiKey.key_hash == hash_key(old)).values(name="ci deploy"))
    before = utcnow()
    row, new = rotate(old, 3600)
    assert new.startswith("al_") and new != old
    assert (row.tenant_id, row.role, row.name) == (old_row(old).tenant_id, "admin", "ci deploy")
    expires = old_row(old).expires_at
    assert before + timedelta(seconds=3600) <= expires <= utcnow() + timedelta(seconds=3600)
    assert works(old) and works(new)
    with get_sessionmaker()() as s:
        assert authenticate(s, f"Bearer {new}").tenant == "tenant-a"

    set_key(old, expires_at=utcnow() - timedelta(seconds=1))  # the grace is over
    assert not works(old) and works(new)


def test_a_grace_of_zero_revokes_the_old_key_at_once(keys):
    _, new = rotate(keys.tenant_a_client, 0)
    assert old_row(keys.tenant_a_client).revoked_at is not None
    assert not works(keys.tenant_a_client) and works(new)


def test_rotating_an_expiring_key_never_extends_its_life(keys):
    old = keys.tenant_a_client
    rotate(old, 3600)
    first = old_row(old).expires_at
    rotate(old, 86400)  # a longer grace: the earlier expiry stays
    assert old_row(old).expires_at == first
    rotate(old, 30)  # a shorter one shortens it
    assert old_row(old).expires_at < first - timedelta(seconds=3000)
    assert works(old)


def test_rotate_refuses_unknown_revoked_and_expired_keys(keys):
    set_key(keys.tenant_b_client, revoked_at=utcnow())
    set_key(keys.tenant_b_admin, expires_at=utcnow() - timedelta(seconds=1))
    with session_scope() as s:
        with pytest.raises(NotFound, match="no key with id 'nope'"):
            rotate_key(s, "nope", 60)
        with pytest.raises(Conflict, match="was revoked at"):
            rotate_key(s, key_id(keys.tenant_b_client), 60)
        with pytest.raises(Conflict, match="expired at"):
            rotate_key(s, key_id(keys.tenant_b_admin), 60)
        with pytest.raises(InvalidRequest, match="negative"):
            rotate_key(s, key_id(keys.tenant_a_client), -1)
    with get_sessionmaker()() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(ApiKey)) == 5  # no key was made


@pytest.mark.parametrize(("text", "seconds"), [("0", 0), ("30s", 30), ("15m", 900), ("2h", 7200), ("1d", 86400)])
def test_grace_durations(text, seconds):
    assert parse_grace(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "-5m", "1.5h", "2w", "h", "1h30m"])
def test_bad_grace_durations_say_what_is_expected(text):
    with pytest.raises(InvalidRequest, match="like 30s, 15m, 2h or 1d"):
        parse_grace(text)


def test_a_principal_without_a_key_is_never_rechecked(keys):
    with get_sessionmaker()() as s:
        principal = tenant_admin(s, "tenant-a")
        assert principal is not None
        watch = streams.KeyWatch(principal)
        assert not watch.due(sending=True)
        with pytest.raises(Unauthenticated):  # what a check would say: no key with an empty id
            watch.check(s)


# --- an open SSE stream --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_policy(tiny_model_dir)


def test_an_open_sse_stream_ends_with_an_error_event_at_its_next_event_after_a_revocation(
    sqlite_db, tiny, configure_env, monkeypatch
):
    configure_env(AGENT_MAX_NEW_TOKENS=16)
    monkeypatch.setattr(streams, "KEY_RECHECK_S", 3600.0)  # no idle re-check: the next event is what ends it
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    client = TestClient(create_app())
    task = client.post(
        "/v1/tasks", json={"task_ref": "wallet_balance-1", "max_turns": 4}, headers=bearer(keys.tenant_a_client)
    ).json()
    policy = GatedPolicy(tiny)
    episode = EpisodeThread(task["id"], policy)
    episode.start()
    policy.allow()
    events: list[tuple[str, dict]] = []
    with client.stream("GET", f"/v1/tasks/{task['id']}/events", headers=bearer(keys.tenant_a_client)) as resp:
        assert resp.status_code == 200
        kind = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((kind, json.loads(line.split(":", 1)[1])))
                if kind == "step":
                    set_key(keys.tenant_a_client, revoked_at=utcnow())
                    policy.allow()  # the next step is stored: the stream checks the key before sending it
    policy.allow(4)
    assert episode.finish() == "finished"  # the episode itself goes on
    assert [k for k, _ in events] == ["attempt", "step", "error"]
    assert events[-1][1] == {"error": {"code": "unauthenticated", "message": "the API key was revoked"}}
