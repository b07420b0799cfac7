"""Shared fixtures: an isolated AGENTLOOP_HOME per test, real PostgreSQL/Redis when present, and small
real models (a tiny random Llama with SmolLM2's tokenizer; the real SmolLM2 for `slow` tests).

PostgreSQL and Redis come from AGENTLOOP_TEST_POSTGRES_URL / AGENTLOOP_TEST_REDIS_URL (defaults: the
local servers). Without them those tests skip, unless AGENTLOOP_REQUIRE_SERVICES=1 (CI), where a
missing service is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REQUIRE_SERVICES = os.environ.get("AGENTLOOP_REQUIRE_SERVICES") == "1"
POSTGRES_URL = os.environ.get("AGENTLOOP_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AGENTLOOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

ENV_KEYS = [k for k in os.environ if k.startswith("AGENTLOOP_") and not k.startswith("AGENTLOOP_TEST_")]


def service_missing(what: str, reason: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"{what} is required (AGENTLOOP_REQUIRE_SERVICES=1) but unavailable: {reason}")
    pytest.skip(f"{what} unavailable ({reason}); start it or set AGENTLOOP_TEST_{what.upper()}_URL")


@pytest.fixture(scope="session")
def simulator_ready() -> None:
    """ScienceWorld's simulator can start here (its package and a Java runtime)."""
    from agentloop.apps.scienceworld import missing

    reason = missing()
    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(f"the ScienceWorld simulator is required (AGENTLOOP_REQUIRE_SERVICES=1), unavailable: {reason}")
        pytest.skip(reason)


# --- settings isolation ---------------------------------------------------------------------


def refresh_settings() -> None:
    """Re-read AGENTLOOP_* into every cached piece: settings, engines, the Celery app."""
    from agentloop.settings import get_settings
    from agentloop.store.db import reset_engines
    from agentloop.worker.celery_app import app, configure

    get_settings.cache_clear()
    reset_engines()
    configure(app, get_settings())


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("AGENTLOOP_HOME", str(home))
    refresh_settings()
    yield home
    monkeypatch.undo()
    refresh_settings()


@pytest.fixture
def configure_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """`configure_env(DATABASE_URL=..., LEASE_S=4)` sets AGENTLOOP_* and refreshes cached settings."""

    def apply(**values: Any) -> None:
        for key, value in values.items():
            name = f"AGENTLOOP_{key.upper()}"
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))
        refresh_settings()

    return apply


# --- databases --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> str:
    import sqlalchemy as sa

    from agentloop.store.db import normalise_url

    try:
        engine = sa.create_engine(normalise_url(POSTGRES_URL), connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        service_missing("postgres", f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    return POSTGRES_URL


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the test server, dropped afterwards."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    from agentloop.store.db import normalise_url

    name = f"agentloop_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(normalise_url(postgres_server), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(normalise_url(postgres_server)).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        from agentloop.store.db import reset_engines

        reset_engines()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path, configure_env: Callable[..., None]) -> str:
    """A migrated database, once on SQLite and once on PostgreSQL; the settings point at it."""
    from agentloop.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'test.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    configure_env(DATABASE_URL=url)
    upgrade(url)
    return url


@pytest.fixture
def sqlite_db(tmp_path: Path, configure_env: Callable[..., None]) -> str:
    from agentloop.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'test.db'}"
    configure_env(DATABASE_URL=url)
    upgrade(url)
    return url


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The test Redis, empty: what an earlier test left there (a killed worker's record, queued messages) is not
    this test's."""
    import redis

    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
    except Exception as exc:
        service_missing("redis", f"{type(exc).__name__}: {exc}")
    client.flushdb()  # the test database index (15 by default) belongs to the tests
    yield REDIS_URL
    client.flushdb()
    client.close()


# --- models -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def model_cache(request: pytest.FixtureRequest) -> Path:
    return Path(request.config.cache.mkdir("agentloop-models"))


@pytest.fixture(scope="session")
def tokenizer_dir(model_cache: Path) -> Path:
    from tests.factories import save_smollm2_tokenizer

    return save_smollm2_tokenizer(model_cache / "smollm2-tokenizer")


@pytest.fixture(scope="session")
def tiny_model_dir(model_cache: Path, tokenizer_dir: Path) -> Path:
    from tests.factories import save_tiny_model

    return save_tiny_model(model_cache / "tiny-llama-v1", tokenizer_dir)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def smollm2_dir(model_cache: Path) -> Path:
    from agentloop.policy.models import DEFAULT_MODEL, resolve_model_dir

    return resolve_model_dir(DEFAULT_MODEL, model_cache)


@pytest.fixture
def production_keys(postgres_url: str, redis_url: str, tiny_model_dir: Path, configure_env: Callable[..., None]) -> Any:
    """Production wiring (Postgres, Redis broker, the tiny model, short episodes), migrated, with API keys."""
    from agentloop.store.db import get_sessionmaker
    from agentloop.store.migrate import upgrade
    from tests.factories import make_keys

    configure_env(
        DATABASE_URL=postgres_url,
        BROKER_URL=redis_url,
        MODEL=tiny_model_dir,
        AGENT_MAX_TURNS=3,
        AGENT_MAX_NEW_TOKENS=16,
        TORCH_THREADS=1,
    )
    upgrade(postgres_url)
    with get_sessionmaker()() as s:
        return make_keys(s)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Any]:
    """Start `agentloop ...` subprocesses with the test's environment; all are stopped afterwards."""
    from tests.processes import Processes

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    procs = Processes(log_dir)
    yield procs
    procs.stop_all()
