"""The process's key cache (`api_key_cache_s`): a burst of requests looks its key up once; a key revoked or
rotated by this process is refused at once, one revoked by another (here: the database changed directly) within
the cache's window; an entry never outlives its key's expiry; a refused key is never kept."""

import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.api.auth import hash_key, key_cache, rotate_key
from agentloop.store.db import get_engine, get_sessionmaker, session_scope
from agentloop.store.models import ApiKey, utcnow
from tests.factories import bearer, make_keys


@pytest.fixture
def api(sqlite_db, configure_env):
    """start(cache_s) -> (client, keys, lookups): lookups["n"] counts the statements that read api_keys."""
    listening = []

    def start(cache_s: float):
        configure_env(API_KEY_CACHE_S=cache_s)
        key_cache.forget()
        with get_sessionmaker()() as s:
            keys = make_keys(s)
        lookups = {"n": 0}

        def count(conn, cursor, statement, parameters, context, executemany):
            if "FROM api_keys" in statement:
                lookups["n"] += 1

        engine = get_engine()
        sa.event.listen(engine, "before_cursor_execute", count)
        listening.append((engine, count))
        return TestClient(create_app()), keys, lookups

    yield start
    for engine, count in listening:
        sa.event.remove(engine, "before_cursor_execute", count)
    key_cache.forget()


def tasks_status(client, key) -> int:
    return client.get("/v1/tasks", headers=bearer(key)).status_code


def change_key(key: str, **values) -> None:
    """What another process does (the CLI, another API worker): this process's cache is not told."""
    with session_scope() as s:
        s.execute(sa.update(ApiKey).where(ApiKey.key_hash == hash_key(key)).values(**values))


def test_a_burst_looks_its_key_up_once(api):
    client, keys, lookups = api(60)
    assert [tasks_status(client, keys.tenant_a_client) for _ in range(5)] == [200] * 5
    assert lookups["n"] == 1
    assert tasks_status(client, keys.tenant_b_client) == 200  # another key: its own lookup
    assert lookups["n"] == 2


def test_without_the_cache_every_request_looks_its_key_up(api):
    client, keys, lookups = api(0)
    assert [tasks_status(client, keys.tenant_a_client) for _ in range(3)] == [200] * 3
    assert lookups["n"] == 3
    change_key(keys.tenant_a_client, revoked_at=utcnow())
    assert tasks_status(client, keys.tenant_a_client) == 401


def test_a_key_revoked_elsewhere_is_refused_once_the_window_ends(api):
    client, keys, _lookups = api(0.5)
    assert tasks_status(client, keys.tenant_a_client) == 200
    change_key(keys.tenant_a_client, revoked_at=utcnow())
    time.sleep(0.6)
    assert tasks_status(client, keys.tenant_a_client) == 401
    assert tasks_status(client, keys.tenant_b_client) == 200


def test_a_key_rotated_by_this_process_is_refused_at_once(api):
    client, keys, _lookups = api(60)
    assert tasks_status(client, keys.tenant_a_client) == 200
    with session_scope() as s:
        old_id = s.scalars(sa.select(ApiKey.id).where(ApiKey.key_hash == hash_key(keys.tenant_a_client))).one()
        _, new = rotate_key(s, old_id, 0)
    assert tasks_status(client, keys.tenant_a_client) == 401
    assert tasks_status(client, new) == 200


def test_an_entry_never_outlives_its_keys_expiry(api):
    client, keys, _lookups = api(60)
    change_key(keys.tenant_a_client, expires_at=utcnow() + timedelta(seconds=0.8))
    assert tasks_status(client, keys.tenant_a_client) == 200  # cached for what is left of its life
    time.sleep(1.0)
    assert tasks_status(client, keys.tenant_a_client) == 401


def test_a_refused_key_is_never_kept(api):
    client, keys, lookups = api(60)
    change_key(keys.tenant_a_client, revoked_at=utcnow())
    assert tasks_status(client, keys.tenant_a_client) == 401
    change_key(keys.tenant_a_client, revoked_at=None)  # (un-revoking is not a feature: it shows no 401 was kept)
    assert tasks_status(client, keys.tenant_a_client) == 200
    assert lookups["n"] == 2
