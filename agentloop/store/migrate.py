"""Alembic from code: `agentloop migrate`, readiness checks, and the embedded auto-upgrade."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory


def _root() -> Path:
    """Where alembic.ini and migrations/ are: the source tree, or the working directory (the image's /app)."""
    for candidate in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (candidate / "alembic.ini").exists() and (candidate / "migrations").is_dir():
            return candidate
    raise FileNotFoundError(
        "alembic.ini and migrations/ not found: run agentloop from its source tree, or from the directory "
        "that holds them (/app in the image)"
    )


ROOT = _root()


def alembic_config(url: str | None = None) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    if url:
        cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(conn: sa.Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()
