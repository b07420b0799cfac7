"""pytest-alembic's built-in checks against a real PostgreSQL database, and a full round trip on SQLite."""

import json

import pytest
import sqlalchemy as sa
from pytest_alembic.tests import (  # noqa: F401  (collected as tests of this module)
    test_model_definitions_match_ddl,
    test_single_head_revision,
    test_up_down_consistency,
    test_upgrade,
)

from agentloop.store.db import normalise_url
from agentloop.store.migrate import ROOT, upgrade


@pytest.fixture
def alembic_config():
    return {"file": str(ROOT / "alembic.ini"), "script_location": str(ROOT / "migrations")}


@pytest.fixture
def alembic_engine(postgres_url):
    engine = sa.create_engine(normalise_url(postgres_url))
    yield engine
    engine.dispose()


def test_sqlite_upgrade_and_downgrade_round_trip(tmp_path):
    from alembic import command

    from agentloop.store.migrate import alembic_config as cfg

    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    engine = sa.create_engine(url)
    tables = set(sa.inspect(engine).get_table_names())
    assert {"tasks", "episodes", "steps", "rewards", "adapters", "training_runs", "api_keys"} <= tables
    command.downgrade(cfg(url), "base")
    assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


def test_allow_private_becomes_named_private_networks_and_back(tmp_path):
    """0008: an app that had allow_private gets loopback and the private ranges (no link-local); one that had
    not gets none; downgrading turns a non-empty list back into allow_private."""
    from alembic import command

    from agentloop.store.migrate import alembic_config as cfg

    url = f"sqlite:///{tmp_path / 'm.db'}"
    command.upgrade(cfg(url), "0007")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO tenants (id, name, created_at) VALUES ('t', 'acme', '2026-01-01')"))
        for app_id, private in (("open", 1), ("closed", 0)):
            conn.execute(
                sa.text(
                    "INSERT INTO apps (id, tenant_id, name, description, kind, spec, base_url, allow_private, "
                    "created_at) VALUES (:id, 't', :id, '', 'openapi', '{}', 'http://10.0.0.5', :private, "
                    "'2026-01-01')"
                ),
                {"id": app_id, "private": private},
            )
    command.upgrade(cfg(url), "0008")
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text("SELECT id, allowed_networks FROM apps")).all())
    assert json.loads(rows["closed"]) == []
    assert "10.0.0.0/8" in json.loads(rows["open"]) and "127.0.0.0/8" in json.loads(rows["open"])
    assert not any(n.startswith(("169.254", "fe80")) for n in json.loads(rows["open"]))
    command.downgrade(cfg(url), "0007")
    with engine.connect() as conn:
        flags = dict(conn.execute(sa.text("SELECT id, allow_private FROM apps")).all())
    assert flags == {"open": 1, "closed": 0}
    engine.dispose()
