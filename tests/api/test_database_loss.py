"""The database connection dropped in the middle of a request (PostgreSQL terminates the request's own
backend as it writes): a clean 503 with Retry-After, REST and gRPC, nothing of the request written, and the
retry succeeds on a fresh connection."""

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store.db import get_engine, get_sessionmaker
from agentloop.store.migrate import upgrade
from agentloop.store.models import Task
from tests.factories import bearer, make_keys
from tests.grpc.conftest import Api, ServerThread, auth

TASK = {"task_ref": "wallet_balance-1"}


@pytest.fixture
def postgres(postgres_url, configure_env):
    configure_env(DATABASE_URL=postgres_url)
    upgrade(postgres_url)
    with get_sessionmaker()() as s:
        return make_keys(s)


@pytest.fixture
def drop_on_insert(postgres_url) -> Iterator[dict[str, int]]:
    """The next INSERT INTO tasks kills its own connection's backend first (pg_terminate_backend from another
    connection): the connection is lost mid-request, as when the server restarts or a proxy drops it."""
    engine = get_engine()
    state = {"armed": 1, "killed": 0}

    def kill(conn, cursor, statement, parameters, context, executemany):
        if state["armed"] and statement.lstrip().upper().startswith("INSERT INTO TASKS"):
            state["armed"] = 0
            pid = conn.connection.dbapi_connection.info.backend_pid
            admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
            with admin.connect() as other:
                state["killed"] = int(other.scalar(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}))
            admin.dispose()

    sa.event.listen(engine, "before_cursor_execute", kill)
    yield state
    sa.event.remove(engine, "before_cursor_execute", kill)


def tasks() -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Task))


def test_rest_a_lost_connection_is_a_503_and_the_retry_succeeds(postgres, drop_on_insert):
    client = TestClient(create_app())
    headers = bearer(postgres.tenant_a_client)
    resp = client.post("/v1/tasks", json=TASK, headers=headers)
    assert drop_on_insert["killed"] == 1
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "unavailable"
    assert resp.json()["error"]["message"].startswith("the database is unavailable (")
    assert resp.json()["error"]["message"].endswith("); nothing was written, retry")
    assert tasks() == 0
    assert client.post("/v1/tasks", json=TASK, headers=headers).status_code == 202
    assert tasks() == 1


def test_grpc_a_lost_connection_is_unavailable_and_the_retry_succeeds(postgres, drop_on_insert):
    server = ServerThread()
    api = Api(server, postgres)
    try:

        async def scenario() -> tuple[grpc.aio.AioRpcError, pb.SubmitTaskResponse]:
            async with api.connect() as c:
                key = auth(postgres.tenant_a_client)
                request = pb.SubmitTaskRequest(task_ref="wallet_balance-1")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await c.agent.SubmitTask(request, metadata=key)
                return info.value, await c.agent.SubmitTask(request, metadata=key)

        error, retried = asyncio.run(scenario())
    finally:
        server.close()
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "the database is unavailable (" in error.details()
    assert dict(error.trailing_metadata())["retry-after"] == "1"
    assert retried.task.id and tasks() == 1


def test_no_free_connection_in_time_is_a_503_not_a_crash(postgres, configure_env):
    """Every connection of the process's pool is taken (here: the one there is, held by the test) for longer
    than a request waits for one: 503 with Retry-After and a reason; once one is free, the same request works."""
    configure_env(DATABASE_POOL_SIZE=1, DATABASE_MAX_OVERFLOW=0, DATABASE_POOL_TIMEOUT_S=0.5)
    keys = postgres
    client = TestClient(create_app(), raise_server_exceptions=False)
    holder = get_engine().connect()  # the pool's only connection
    try:
        resp = client.post("/v1/tasks", json=TASK, headers=bearer(keys.tenant_a_client))
        assert resp.status_code == 503, resp.text
        assert resp.headers["Retry-After"] == "1"
        assert "no database connection was free in time" in resp.json()["error"]["message"]
    finally:
        holder.close()
    resp = client.post("/v1/tasks", json=TASK, headers=bearer(keys.tenant_a_client))
    assert resp.status_code == 202, resp.text
    with get_sessionmaker()() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Task)) == 1


def terminate_pooled_connections(postgres_url) -> int:
    """Every other backend of the test database ended, as a server restart or an idle timeout would: the
    process's pooled connections are dead without knowing it."""
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        ended = conn.scalar(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    admin.dispose()
    return int(ended)


@pytest.mark.parametrize("ping_after_idle_s", [0.2, 0])
def test_connections_dropped_while_idle_are_replaced_before_a_request_uses_them(
    postgres, postgres_url, configure_env, ping_after_idle_s
):
    """A pooled connection idle longer than `database_ping_after_idle_s` is checked before use (0: every
    checkout is), so a request after the server dropped the pool's connections works the first time."""
    configure_env(DATABASE_PING_AFTER_IDLE_S=ping_after_idle_s)
    client = TestClient(create_app())
    headers = bearer(postgres.tenant_a_client)
    assert client.post("/v1/tasks", json=TASK, headers=headers).status_code == 202
    assert terminate_pooled_connections(postgres_url) >= 1
    time.sleep(0.3)
    assert client.post("/v1/tasks", json=TASK, headers=headers).status_code == 202
    assert tasks() == 2


def test_a_connection_in_steady_use_is_not_pinged_so_its_loss_is_one_503(postgres, postgres_url, configure_env):
    """The other side of the idle check: a connection back in the pool a moment ago is used without a ping;
    if the server dropped it meanwhile, that one request is a clean 503 and the pool is replaced, so the retry
    works."""
    configure_env(DATABASE_PING_AFTER_IDLE_S=3600)
    client = TestClient(create_app())
    headers = bearer(postgres.tenant_a_client)
    assert client.post("/v1/tasks", json=TASK, headers=headers).status_code == 202
    assert terminate_pooled_connections(postgres_url) >= 1
    resp = client.post("/v1/tasks", json=TASK, headers=headers)
    assert resp.status_code == 503 and resp.json()["error"]["message"].endswith("); nothing was written, retry")
    assert client.post("/v1/tasks", json=TASK, headers=headers).status_code == 202
    assert tasks() == 2
