"""pytest-alembic's built-in checks against a real PostgreSQL database, and a full round trip on SQLite."""

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
